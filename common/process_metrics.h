/* process_metrics.h — the metrics every Strata daemon exports about itself,
 * on a common/metrics.h registry:
 *
 *   process_cpu_seconds_total       counter  user + system CPU time
 *   process_resident_memory_bytes   gauge    resident set size
 *   process_virtual_memory_bytes    gauge    virtual memory size
 *   process_open_fds                gauge    open file descriptors
 *   process_max_fds                 gauge    RLIMIT_NOFILE (soft)
 *   process_start_time_seconds      gauge    start time, Unix seconds
 *   strata_build_info{version,commit,build_type}  gauge, always 1
 *
 * The process_* set and its meaning are those of the Prometheus client
 * libraries' process collector (client_golang, client_python), read the same
 * way from /proc/self/stat, /proc/stat (btime), /proc/self/fd and
 * getrlimit(2), so dashboards written for any Prometheus-instrumented Linux
 * process work unchanged. Values are read at each scrape (a collector).
 */
#ifndef STRATA_COMMON_PROCESS_METRICS_H
#define STRATA_COMMON_PROCESS_METRICS_H

#include "common/err.h"
#include "common/metrics.h"

/* Registers the families above and their collector on r. The collector's
 * state is a static record (at most METRICS_MAX_COLLECTORS registrations per
 * process: one per daemon, a few in tests); start-up only. 0, or -1 + err. */
int process_metrics_register(metrics_registry *r, st_err *err);

/* What /proc says about this process (exposed for tests). */
typedef struct process_facts {
    double cpu_seconds;      /* utime + stime */
    double resident_bytes;   /* rss pages * page size */
    double virtual_bytes;    /* vsize */
    double start_time_s;     /* btime + starttime / ticks */
    double open_fds, max_fds;
} process_facts;

/* Parses the text of /proc/<pid>/stat (stat, NUL-terminated) with the
 * system's boot time btime (seconds), clock ticks per second and page size
 * into the cpu, memory and start fields of *out. 0, or -1 when stat is
 * malformed. */
int process_facts_parse_stat(const char *stat, double btime, long ticks, long page_size,
                             process_facts *out);
/* Reads every fact of this process. 0, or -1 when /proc cannot be read. */
int process_facts_read(process_facts *out);

#endif
