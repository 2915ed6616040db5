/* process_metrics.c — process_* from /proc and strata_build_info (see
 * process_metrics.h). */
#include "common/process_metrics.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/version.h"

int process_facts_parse_stat(const char *stat, double btime, long ticks, long page_size,
                             process_facts *out) {
    /* "pid (comm) state ppid ...": comm may hold spaces and ')', so fields
     * are counted from the last ')'. Field 3 (state) is the first after it. */
    const char *p = stat ? strrchr(stat, ')') : NULL;
    if (!p || ticks <= 0 || page_size <= 0) return -1;
    p++;
    unsigned long long v[24] = {0}; /* v[k] = field k + 3 for k >= 1 */
    int k = 0;
    while (*p && k < 24) {
        while (*p == ' ') p++;
        if (!*p) break;
        char *end;
        if (k == 0) { /* the state letter */
            end = (char *)p;
            while (*end && *end != ' ') end++;
        } else {
            v[k] = strtoull(p, &end, 10);
            if (end == p) return -1;
        }
        p = end;
        k++;
    }
    if (k < 22) return -1; /* up to rss (field 24) */
    /* field n is v[n - 3]: utime 14, stime 15, starttime 22, vsize 23, rss 24 */
    out->cpu_seconds = (double)(v[11] + v[12]) / (double)ticks;
    out->start_time_s = btime + (double)v[19] / (double)ticks;
    out->virtual_bytes = (double)v[20];
    out->resident_bytes = (double)v[21] * (double)page_size;
    return 0;
}

static double boot_time(void) {
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return 0;
    char line[256];
    double bt = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "btime ", 6)) {
            bt = strtod(line + 6, NULL);
            break;
        }
    fclose(f);
    return bt;
}

int process_facts_read(process_facts *out) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f) return -1;
    char buf[1024];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    if (process_facts_parse_stat(buf, boot_time(), sysconf(_SC_CLK_TCK), sysconf(_SC_PAGESIZE),
                                 out) != 0)
        return -1;
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)))
            if (e->d_name[0] != '.') out->open_fds++;
        closedir(d);
        out->open_fds--; /* the directory's own descriptor */
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
        out->max_fds = rl.rlim_cur == RLIM_INFINITY ? -1 : (double)rl.rlim_cur;
    return 0;
}

/* The series (one process; a registry per daemon). */
typedef struct pm {
    metrics_series *cpu, *rss, *vsz, *fds, *max_fds, *start;
    double last_cpu;
} pm;

static void collect(metrics_registry *r, void *ud) {
    (void)r;
    pm *m = ud;
    process_facts pf;
    if (process_facts_read(&pf) != 0) return;
    if (pf.cpu_seconds > m->last_cpu) {
        metrics_counter_add(m->cpu, pf.cpu_seconds - m->last_cpu);
        m->last_cpu = pf.cpu_seconds;
    }
    metrics_gauge_set(m->rss, pf.resident_bytes);
    metrics_gauge_set(m->vsz, pf.virtual_bytes);
    metrics_gauge_set(m->fds, pf.open_fds);
    metrics_gauge_set(m->max_fds, pf.max_fds);
    metrics_gauge_set(m->start, pf.start_time_s);
}

int process_metrics_register(metrics_registry *r, st_err *err) {
    /* One record per registry would need a free hook; a daemon has one
     * registry, and tests register at most a few: keep them static. */
    static pm records[METRICS_MAX_COLLECTORS];
    static int n_records;
    if (n_records == METRICS_MAX_COLLECTORS) return st_errf(err, "process metrics: too many registries");
    pm *m = &records[n_records];
    memset(m, 0, sizeof *m);
    metrics_family *f;
#define ONE(expr, dst)                                                           \
    do {                                                                         \
        if (!(f = (expr)) || !((dst) = metrics_with(f, NULL, err))) return -1;   \
    } while (0)
    ONE(metrics_counter(r, "process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
                        NULL, err),
        m->cpu);
    ONE(metrics_gauge(r, "process_resident_memory_bytes", "Resident memory size in bytes.", NULL, err), m->rss);
    ONE(metrics_gauge(r, "process_virtual_memory_bytes", "Virtual memory size in bytes.", NULL, err), m->vsz);
    ONE(metrics_gauge(r, "process_open_fds", "Number of open file descriptors.", NULL, err), m->fds);
    ONE(metrics_gauge(r, "process_max_fds", "Maximum number of open file descriptors.", NULL, err), m->max_fds);
    ONE(metrics_gauge(r, "process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
                      NULL, err),
        m->start);
#undef ONE
    metrics_family *bi = metrics_gauge(r, "strata_build_info",
                                       "Always 1; the labels say which build this is (common/version.h).",
                                       "version,commit,build_type", err);
    const char *v[] = {st_version(), st_git_commit(), st_build_type()};
    metrics_series *s = bi ? metrics_with(bi, v, err) : NULL;
    if (!s) return -1;
    metrics_gauge_set(s, 1);
    if (metrics_registry_add_collector(r, collect, m, err) != 0) return -1;
    n_records++;
    collect(r, m);
    return 0;
}
