/* fleet_sim.c — strata-fleet-sim: N simulated workers against a live
 * coordinator over the real gRPC control API (issue 18's load generator; the
 * workers themselves are fleet_sim_workers.c, see fleet_sim.h).
 *
 *   strata-fleet-sim --addr HOST:PORT --model FILE [-n N] [--first K] [--prefix P]
 *                    [--threads T] [--ramp S] [--settle S] [--window S] [--cold-max S]
 *                    [--cores C] [--memory-gib G] [--sha HEX] [--load]
 *                    [--coordinator-pid PID] [--shared-connections] [--preconnect]
 *                    [--ca F --cert F --key F]
 *
 * The run, in phases (all times from the first Register, t0):
 *   connect with --preconnect only: every worker makes its connection first
 *           (a GetStatus), and t0 is when all are back ({"event":
 *           "connected"}): the cold start is then the registrations alone,
 *           without the connections' set-up (a diagnostic; daemons that
 *           start register at once).
 *   cold    every worker registers (all at once, or spread over --ramp s);
 *           once all have a lease, ListNodes every 250 ms until it shows all
 *           N of them ready (a node is ready from its first heartbeat): the
 *           cold start. Gives up after --cold-max s (cold_s null) and goes on.
 *   settle  --settle s
 *   window  --window s of steady state: heartbeat latency, this process's
 *           CPU and, with --coordinator-pid, the coordinator's CPU and RSS.
 *   final   one ListNodes: how many of the N are ready / suspect / dead;
 *           then no new calls, the calls out come back, and the report.
 * Lines on stdout, JSON, one each: {"event":"listed",...} at the cold start,
 * {"event":"window","seconds":W} when the window opens (bench/control_scale.py
 * times `stratactl nodes` in it), {"event":"window_end"}, and last the
 * report (its keys are those of report() below; latencies in ms, from the
 * call's start to its end as this process sees it, so they include its own
 * delay; sim_lag_* is how late the window's heartbeats went out after their
 * slot: large when this process cannot keep up). Progress and errors
 * on stderr. Exit 0 with a report (whatever the figures), 1 when the fleet
 * cannot run, 2 on a usage error or a too-low open-file limit.
 *
 * Plaintext by default; --ca/--cert/--key for mutual TLS (the certificate
 * must allow every simulated node's name, docs/security.md).
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench/fleet_sim.h"
#include "common/clock.h"
#include "daemon/registration.h"
#include "proto/control.pb-c.h"
#include "rpc/grpc_absl.h"

#define LIST_EVERY_S 0.25
#define LIST_TIMEOUT_S 30.0

enum phase { P_CONNECT, P_COLD, P_SETTLE, P_WINDOW, P_FINAL, P_DONE };

typedef struct run_opts {
    const char *addr, *model, *sha, *prefix;
    const char *ca, *cert, *key;
    long n, first, threads, cores, coord_pid;
    double ramp, settle, window, cold_max, memory_gib;
    bool load, shared, preconnect;
} run_opts;

typedef struct list_counts {
    long ours, ready, registered, suspect, dead, draining;
} list_counts;

typedef struct run {
    run_opts o;
    sim_fleet f;
    rpc_client *ctl; /* ListNodes */
    enum phase phase;
    bool list_out;
    double next_list;
    int final_tries;
    bool cold_ok;
    double cold_end, w0, w1;
    long list_calls, list_errors;
    list_counts final;
    bool final_ok;
    char list_error[256];
    struct rusage ru_t0, ru_cold, ru0, ru1; /* at t0, at the cold start's end, the window's ends */
    long long coord_t0, coord_cold, coord0, coord1; /* the coordinator's CPU then, clock ticks; -1 unknown */
    double coord_rss_mb, load1;
} run;

static volatile sig_atomic_t interrupted;
static void on_signal(int sig) {
    (void)sig;
    interrupted = 1;
}

/* ---------------------------------------------------------------- options */

static void usage(FILE *to) {
    fprintf(to,
            "usage: strata-fleet-sim --addr HOST:PORT --model FILE [-n N] [--first K] [--prefix P]\n"
            "         [--threads T] [--ramp S] [--settle S] [--window S] [--cold-max S]\n"
            "         [--cores C] [--memory-gib G] [--sha HEX] [--load] [--coordinator-pid PID]\n"
            "         [--shared-connections] [--preconnect] [--ca F --cert F --key F]\n");
}

static int num(const char *flag, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "strata-fleet-sim: %s: expected a number in [%g, %g], got '%s'\n", flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int integer(const char *flag, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "strata-fleet-sim: %s: expected an integer in [%ld, %ld], got '%s'\n", flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse(int argc, char **argv, run_opts *o) {
    static const struct option lo[] = {
        {"addr", required_argument, 0, 'a'},      {"model", required_argument, 0, 'm'},
        {"first", required_argument, 0, 'f'},     {"prefix", required_argument, 0, 'p'},
        {"threads", required_argument, 0, 't'},   {"ramp", required_argument, 0, 'r'},
        {"settle", required_argument, 0, 's'},    {"window", required_argument, 0, 'w'},
        {"cold-max", required_argument, 0, 'c'},  {"cores", required_argument, 0, 'C'},
        {"memory-gib", required_argument, 0, 'M'}, {"sha", required_argument, 0, 'S'},
        {"load", no_argument, 0, 'l'},            {"coordinator-pid", required_argument, 0, 'P'},
        {"shared-connections", no_argument, 0, 'x'}, {"ca", required_argument, 0, 1},
        {"cert", required_argument, 0, 2},        {"key", required_argument, 0, 3},
        {"preconnect", no_argument, 0, 'X'},      {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    *o = (run_opts){.n = 100, .prefix = "sim", .threads = 1, .settle = 3, .window = 15, .cold_max = 120};
    opterr = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, "n:h", lo, NULL)) != -1) {
        int bad = 0;
        switch (ch) {
        case 'a': o->addr = optarg; break;
        case 'm': o->model = optarg; break;
        case 'n': bad = integer("-n", optarg, 1, 1000000, &o->n); break;
        case 'f': bad = integer("--first", optarg, 0, 99999999, &o->first); break;
        case 'p': o->prefix = optarg; break;
        case 't': bad = integer("--threads", optarg, 1, 64, &o->threads); break;
        case 'r': bad = num("--ramp", optarg, 0, 3600, &o->ramp); break;
        case 's': bad = num("--settle", optarg, 0, 3600, &o->settle); break;
        case 'w': bad = num("--window", optarg, 0.1, 86400, &o->window); break;
        case 'c': bad = num("--cold-max", optarg, 0.1, 86400, &o->cold_max); break;
        case 'C': bad = integer("--cores", optarg, 1, 1 << 16, &o->cores); break;
        case 'M': bad = num("--memory-gib", optarg, 1.0 / 1024, 1 << 20, &o->memory_gib); break;
        case 'S': o->sha = optarg; break;
        case 'l': o->load = true; break;
        case 'P': bad = integer("--coordinator-pid", optarg, 1, 1L << 30, &o->coord_pid); break;
        case 'x': o->shared = true; break;
        case 'X': o->preconnect = true; break;
        case 1: o->ca = optarg; break;
        case 2: o->cert = optarg; break;
        case 3: o->key = optarg; break;
        case 'h': usage(stdout); exit(0);
        default:
            fprintf(stderr, "strata-fleet-sim: unknown or incomplete option '%s'\n", argv[optind - 1]);
            bad = 1;
        }
        if (bad) return -1;
    }
    if (optind < argc) {
        fprintf(stderr, "strata-fleet-sim: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (!o->addr || !o->model) {
        fprintf(stderr, "strata-fleet-sim: --addr and --model are required\n");
        return -1;
    }
    if (!*o->prefix || strlen(o->prefix) > 48) {
        fprintf(stderr, "strata-fleet-sim: --prefix: 1 to 48 characters\n");
        return -1;
    }
    if (o->first + o->n > 100000000) {
        fprintf(stderr, "strata-fleet-sim: --first + -n must stay below 100000000\n");
        return -1;
    }
    if (o->threads > o->n) o->threads = o->n;
    if (o->sha) {
        bool ok = strlen(o->sha) == 64;
        for (int i = 0; ok && i < 64; i++) ok = strchr("0123456789abcdef", o->sha[i]) != NULL;
        if (!ok) {
            fprintf(stderr, "strata-fleet-sim: --sha: 64 lowercase hex digits\n");
            return -1;
        }
    }
    return 0;
}

/* One connection per worker needs one descriptor each in this process (and
 * as many in the coordinator): the soft limit goes up to the hard one. */
static int raise_nofile(const run_opts *o) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
    if (rl.rlim_cur != rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    unsigned long long need = (o->shared ? 0ull : (unsigned long long)o->n) + 64ull + 8ull * (unsigned long long)o->threads;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
        fprintf(stderr,
                "strata-fleet-sim: %ld simulated workers need about %llu open files here (one connection "
                "each), but the open-file limit is %llu (hard limit %llu): raise the hard limit (as root: "
                "ulimit -Hn, or LimitNOFILE= of the unit / limits.conf) or simulate fewer workers; the "
                "coordinator needs as many\n",
                o->n, need, (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- measurements */

static long long proc_ticks(long pid) {
    if (pid <= 0) return -1;
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    unsigned long long ut, st;
    /* after the name: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
    if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2) return -1;
    return (long long)(ut + st);
}

static double proc_rss_mb(long pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%ld/status", pid);
    FILE *f = fopen(path, "r");
    if (!f) return NAN;
    double mb = NAN;
    unsigned long kb;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %lu kB", &kb) == 1) mb = (double)kb / 1024.0;
    fclose(f);
    return mb;
}

static double ru_cpu_s(const struct rusage *r) {
    return (double)r->ru_utime.tv_sec + (double)r->ru_utime.tv_usec * 1e-6 + (double)r->ru_stime.tv_sec +
           (double)r->ru_stime.tv_usec * 1e-6;
}

/* ---------------------------------------------------------------- the run's phases (thread 0) */

static void event(json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(6));
    if (s) {
        printf("%s\n", s);
        fflush(stdout);
        free(s);
    }
    json_decref(j);
}

/* Counts the fleet's own nodes in a ListNodes reply (names PREFIX-NNNNN in
 * [first, first + n), each once). */
static int count_ours(run *r, const uint8_t *rep, size_t len, list_counts *c) {
    Strata__V1__ListNodesReply *l = strata__v1__list_nodes_reply__unpack(NULL, len, rep);
    if (!l) return -1;
    memset(c, 0, sizeof *c);
    size_t plen = strlen(r->o.prefix);
    unsigned char *seen = calloc((size_t)r->o.n, 1);
    for (size_t i = 0; seen && i < l->n_nodes; i++) {
        const char *name = l->nodes[i]->name;
        if (strncmp(name, r->o.prefix, plen) || name[plen] != '-') continue;
        char *end;
        long k = strtol(name + plen + 1, &end, 10) - r->o.first;
        if (*end || k < 0 || k >= r->o.n || seen[k]) continue;
        seen[k] = 1;
        c->ours++;
        switch (l->nodes[i]->state) {
        case STRATA__V1__NODE_STATE__NODE_STATE_READY: c->ready++; break;
        case STRATA__V1__NODE_STATE__NODE_STATE_REGISTERED: c->registered++; break;
        case STRATA__V1__NODE_STATE__NODE_STATE_SUSPECT: c->suspect++; break;
        case STRATA__V1__NODE_STATE__NODE_STATE_DEAD: c->dead++; break;
        case STRATA__V1__NODE_STATE__NODE_STATE_DRAINING: c->draining++; break;
        default: break;
        }
    }
    free(seen);
    strata__v1__list_nodes_reply__free_unpacked(l, NULL);
    return 0;
}

static void open_window(run *r, double now);

static void on_list(void *ud, int ok, const uint8_t *rep, size_t len, const rpc_status *st) {
    run *r = ud;
    double now = st_now_s();
    r->list_out = false;
    list_counts c;
    if (!ok || count_ours(r, rep, len, &c) != 0) {
        r->list_errors++;
        if (!r->list_error[0])
            snprintf(r->list_error, sizeof r->list_error, "ListNodes: %s: %.200s", rpc_code_name(st->code),
                     ok ? "undecodable reply" : st->msg);
        r->next_list = now + LIST_EVERY_S;
        if (r->phase == P_FINAL && ++r->final_tries >= 3) { /* report without the final counts */
            r->phase = P_DONE;
            atomic_store(&r->f.stopping, true);
        }
        return;
    }
    if (r->phase == P_COLD && c.ready == r->o.n) {
        r->cold_ok = true;
        r->cold_end = now;
        getrusage(RUSAGE_SELF, &r->ru_cold);
        r->coord_cold = proc_ticks(r->o.coord_pid);
        r->phase = P_SETTLE;
        event(json_pack("{s:s, s:f, s:i}", "event", "listed", "cold_s", now - r->f.t0, "ready", (json_int_t)c.ready));
    } else if (r->phase == P_FINAL) {
        r->final = c;
        r->final_ok = true;
        r->phase = P_DONE;
        atomic_store(&r->f.stopping, true);
    }
    r->next_list = now + LIST_EVERY_S;
}

static void list_nodes(sim_thread *t, run *r) {
    Strata__V1__ListNodesRequest q = STRATA__V1__LIST_NODES_REQUEST__INIT;
    uint8_t buf[16];
    size_t len = strata__v1__list_nodes_request__pack(&q, buf);
    r->list_calls++;
    if (sim_side_call(t, r->ctl, "/strata.v1.Control/ListNodes", buf, len, LIST_TIMEOUT_S, on_list, r) == 0)
        r->list_out = true;
    else
        r->list_errors++;
}

static run *the_run; /* thread 0's on_turn has only its thread */

static void open_window(run *r, double now) {
    r->w0 = now;
    getrusage(RUSAGE_SELF, &r->ru0);
    r->coord0 = proc_ticks(r->o.coord_pid);
    double la[1];
    r->load1 = getloadavg(la, 1) == 1 ? la[0] : NAN;
    r->phase = P_WINDOW;
    event(json_pack("{s:s, s:f}", "event", "window", "seconds", r->o.window));
}

static void on_turn(sim_thread *t, double now) {
    run *r = the_run;
    t->next_turn = now + 0.05;
    if (interrupted && r->phase != P_DONE) {
        if (r->phase == P_WINDOW) {
            r->w1 = now;
            getrusage(RUSAGE_SELF, &r->ru1);
            r->coord1 = proc_ticks(r->o.coord_pid);
        }
        r->phase = P_DONE;
        atomic_store(&r->f.stopping, true);
        return;
    }
    switch (r->phase) {
    case P_CONNECT:
        if (atomic_load(&r->f.connected) == (unsigned)r->o.n || now - r->f.t0 > r->o.cold_max) {
            event(json_pack("{s:s, s:f, s:i}", "event", "connected", "connect_s", now - r->f.t0, "connected",
                            (json_int_t)atomic_load(&r->f.connected)));
            getrusage(RUSAGE_SELF, &r->ru_t0);
            r->coord_t0 = proc_ticks(r->o.coord_pid);
            r->f.t0 = now;
            r->phase = P_COLD;
            atomic_store(&r->f.go, true);
        }
        break;
    case P_COLD:
        if (now - r->f.t0 > r->o.cold_max) {
            fprintf(stderr, "strata-fleet-sim: no cold start within %.0f s (%u of %ld workers registered)\n",
                    r->o.cold_max, atomic_load(&r->f.registered), r->o.n);
            r->cold_end = now;
            getrusage(RUSAGE_SELF, &r->ru_cold);
            r->coord_cold = proc_ticks(r->o.coord_pid);
            r->phase = P_SETTLE;
        } else if (atomic_load(&r->f.ever_registered) == (unsigned)r->o.n && !r->list_out && now >= r->next_list) {
            list_nodes(t, r);
        }
        break;
    case P_SETTLE:
        if (now >= r->cold_end + r->o.settle) open_window(r, now);
        break;
    case P_WINDOW:
        if (now >= r->w0 + r->o.window) {
            r->w1 = now;
            getrusage(RUSAGE_SELF, &r->ru1);
            r->coord1 = proc_ticks(r->o.coord_pid);
            r->coord_rss_mb = r->o.coord_pid ? proc_rss_mb(r->o.coord_pid) : NAN;
            r->phase = P_FINAL;
            event(json_pack("{s:s}", "event", "window_end"));
            r->next_list = now;
        }
        break;
    case P_FINAL:
        if (!r->list_out && now >= r->next_list) list_nodes(t, r);
        break;
    case P_DONE: break;
    }
}

/* ---------------------------------------------------------------- report */

static json_t *jnum(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static void put_latency(json_t *j, const char *prefix, sim_samples *const *sets, int k, double lo, double hi) {
    size_t n = 0;
    float *v = sim_samples_window(sets, k, lo, hi, &n);
    char key[64];
    snprintf(key, sizeof key, "%s_p50_ms", prefix);
    json_object_set_new(j, key, jnum(sim_pct(v, n, 50)));
    snprintf(key, sizeof key, "%s_p99_ms", prefix);
    json_object_set_new(j, key, jnum(sim_pct(v, n, 99)));
    snprintf(key, sizeof key, "%s_max_ms", prefix);
    json_object_set_new(j, key, jnum(n ? v[n - 1] : NAN));
    snprintf(key, sizeof key, "%s_samples", prefix);
    json_object_set_new(j, key, json_integer((json_int_t)n));
    free(v);
}

static void report(run *r) {
    sim_fleet *f = &r->f;
    sim_counts c = {0};
    const char *first_error = r->list_error[0] ? r->list_error : NULL;
    sim_samples *hb[64], *reg[64], *lag[64];
    for (int k = 0; k < f->n_threads; k++) {
        sim_counts *x = &f->threads[k].c;
        c.reg_sent += x->reg_sent, c.reg_ok += x->reg_ok, c.reg_misses += x->reg_misses;
        c.reg_errors += x->reg_errors, c.hb_sent += x->hb_sent, c.hb_ok += x->hb_ok;
        c.hb_misses += x->hb_misses, c.hb_errors += x->hb_errors, c.hb_delayed += x->hb_delayed;
        c.hb_skipped += x->hb_skipped, c.reregisters += x->reregisters, c.start_failures += x->start_failures;
        c.connect_errors += x->connect_errors;
        if (f->threads[k].first_error[0] && !first_error) first_error = f->threads[k].first_error;
        hb[k] = &f->threads[k].hb;
        reg[k] = &f->threads[k].reg;
        lag[k] = &f->threads[k].lag;
    }
    json_t *j = json_object();
    json_object_set_new(j, "n", json_integer(r->o.n));
    json_object_set_new(j, "threads", json_integer(f->n_threads));
    json_object_set_new(j, "connections", json_string(r->o.shared ? "shared" : "own"));
    json_object_set_new(j, "registered", json_integer(atomic_load(&f->registered)));
    json_object_set_new(j, "cold_s", r->cold_ok ? json_real(r->cold_end - f->t0) : json_null());
    double cold_end = r->cold_end > 0 ? r->cold_end : st_now_s();
    put_latency(j, "reg", reg, f->n_threads, f->t0 - 1, cold_end);
    put_latency(j, "cold_hb", hb, f->n_threads, f->t0 - 1, cold_end);
    double w1 = r->w1 > 0 ? r->w1 : r->w0;
    put_latency(j, "hb", hb, f->n_threads, r->w0 > 0 ? r->w0 : 1e300, w1);
    put_latency(j, "sim_lag", lag, f->n_threads, r->w0 > 0 ? r->w0 : 1e300, w1);
    json_object_set_new(j, "window_s", jnum(r->w0 > 0 ? w1 - r->w0 : NAN));
    json_object_set_new(j, "reg_sent", json_integer((json_int_t)c.reg_sent));
    json_object_set_new(j, "reg_ok", json_integer((json_int_t)c.reg_ok));
    json_object_set_new(j, "reg_misses", json_integer((json_int_t)c.reg_misses));
    json_object_set_new(j, "reg_errors", json_integer((json_int_t)c.reg_errors));
    json_object_set_new(j, "hb_sent", json_integer((json_int_t)c.hb_sent));
    json_object_set_new(j, "hb_ok", json_integer((json_int_t)c.hb_ok));
    json_object_set_new(j, "hb_misses", json_integer((json_int_t)c.hb_misses));
    json_object_set_new(j, "hb_errors", json_integer((json_int_t)c.hb_errors));
    json_object_set_new(j, "hb_delayed", json_integer((json_int_t)c.hb_delayed));
    json_object_set_new(j, "hb_skipped", json_integer((json_int_t)c.hb_skipped));
    json_object_set_new(j, "reregisters", json_integer((json_int_t)c.reregisters));
    json_object_set_new(j, "preconnect", json_boolean(r->o.preconnect));
    if (r->o.preconnect) json_object_set_new(j, "connect_errors", json_integer((json_int_t)c.connect_errors));
    json_object_set_new(j, "errors", json_integer((json_int_t)(c.reg_errors + c.hb_errors + c.start_failures)));
    json_object_set_new(j, "first_error", first_error ? json_string(first_error) : json_null());
    json_object_set_new(j, "list_calls", json_integer(r->list_calls));
    json_object_set_new(j, "list_errors", json_integer(r->list_errors));
    if (r->final_ok) {
        json_object_set_new(j, "listed", json_integer(r->final.ours));
        json_object_set_new(j, "listed_ready", json_integer(r->final.ready));
        json_object_set_new(j, "listed_registered", json_integer(r->final.registered));
        json_object_set_new(j, "listed_suspect", json_integer(r->final.suspect));
        json_object_set_new(j, "listed_dead", json_integer(r->final.dead));
    } else {
        json_object_set_new(j, "listed", json_null());
    }
    double win = r->w1 > r->w0 && r->w0 > 0 ? r->w1 - r->w0 : NAN;
    json_object_set_new(j, "sim_cpu_pct", jnum(100.0 * (ru_cpu_s(&r->ru1) - ru_cpu_s(&r->ru0)) / win));
    struct rusage all;
    getrusage(RUSAGE_SELF, &all);
    json_object_set_new(j, "sim_cpu_s", json_real(ru_cpu_s(&all)));
    json_object_set_new(j, "sim_rss_mb", json_real((double)all.ru_maxrss / 1024.0));
    double tck = (double)sysconf(_SC_CLK_TCK);
    json_object_set_new(j, "cpu_pct",
                        jnum(r->coord0 >= 0 && r->coord1 >= 0 ? 100.0 * (double)(r->coord1 - r->coord0) / tck / win
                                                              : NAN));
    /* the cold start's CPU: who was busy while the fleet registered */
    double cold = r->cold_end > 0 ? r->cold_end - f->t0 : NAN;
    json_object_set_new(j, "cold_cpu_pct", jnum(r->coord_t0 >= 0 && r->coord_cold >= 0
                                                    ? 100.0 * (double)(r->coord_cold - r->coord_t0) / tck / cold
                                                    : NAN));
    json_object_set_new(j, "sim_cold_cpu_pct", jnum(100.0 * (ru_cpu_s(&r->ru_cold) - ru_cpu_s(&r->ru_t0)) / cold));
    json_object_set_new(j, "rss_mb", jnum(r->o.coord_pid ? r->coord_rss_mb : NAN));
    json_object_set_new(j, "load1", jnum(r->load1));
    json_object_set_new(j, "interrupted", json_boolean(interrupted));
    event(j);
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv) {
    run r;
    memset(&r, 0, sizeof r);
    if (parse(argc, argv, &r.o) != 0) {
        usage(stderr);
        return 2;
    }
    if (raise_nofile(&r.o) != 0) return 2;
    signal(SIGPIPE, SIG_IGN);
    rpc_absl_debug_off(); /* before the first channel: rpc/grpc_absl.h */
    sim_node_desc *d = &r.f.desc;
    d->prefix = r.o.prefix;
    d->first = (uint32_t)r.o.first;
    long cores = r.o.cores ? r.o.cores : sysconf(_SC_NPROCESSORS_ONLN);
    d->cores = (uint32_t)(cores > 0 ? cores : 1);
    d->memory_bytes = r.o.memory_gib > 0 ? (uint64_t)(r.o.memory_gib * (double)(1ull << 30)) : reg_host_memory();
    if (d->memory_bytes < d->cores) d->memory_bytes = (uint64_t)d->cores << 30;
    d->numa_nodes = reg_numa_nodes();
    d->load = r.o.load;
    const char *base = strrchr(r.o.model, '/');
    d->model_name = base ? base + 1 : r.o.model;
    st_err err = {{0}};
    if (r.o.sha) {
        FILE *mf = fopen(r.o.model, "rb");
        if (!mf || fseek(mf, 0, SEEK_END) != 0) {
            fprintf(stderr, "strata-fleet-sim: %s: %s\n", r.o.model, strerror(errno));
            if (mf) fclose(mf);
            return 1;
        }
        d->model_size = (uint64_t)ftell(mf);
        fclose(mf);
        memcpy(d->model_sha, r.o.sha, 65);
    } else if (reg_file_sha256(r.o.model, d->model_sha, &d->model_size, &err) != 0) {
        fprintf(stderr, "strata-fleet-sim: %s\n", err.msg);
        return 1;
    }
    rpc_tls tls = {r.o.ca, r.o.cert, r.o.key};
    int given = rpc_tls_given(&tls, "--", &err);
    if (given < 0) {
        fprintf(stderr, "strata-fleet-sim: %s\n", err.msg);
        return 2;
    }
    r.f.addr = r.o.addr;
    r.f.tls = given ? &tls : NULL;
    r.f.shared_connections = r.o.shared;
    r.f.n = (uint32_t)r.o.n;
    r.f.n_threads = (int)r.o.threads;
    r.f.ramp_s = r.o.ramp;
    r.f.preconnect = r.o.preconnect;
    r.phase = r.o.preconnect ? P_CONNECT : P_COLD;
    r.coord_t0 = r.coord_cold = r.coord0 = r.coord1 = -1;
    r.coord_rss_mb = NAN;
    r.load1 = NAN;
    int rc = 1;
    if (!(r.ctl = rpc_client_create(r.o.addr, r.f.tls, &err))) {
        fprintf(stderr, "strata-fleet-sim: %s\n", err.msg);
        return 1;
    }
    if (sim_fleet_init(&r.f) != 0) goto out;
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    the_run = &r;
    r.f.threads[0].on_turn = on_turn;
    getrusage(RUSAGE_SELF, &r.ru_t0);
    r.coord_t0 = proc_ticks(r.o.coord_pid);
    r.f.t0 = st_now_s();
    if (sim_fleet_start(&r.f) != 0) {
        fprintf(stderr, "strata-fleet-sim: cannot start the threads\n");
        goto out;
    }
    sim_fleet_join(&r.f);
    report(&r);
    rc = 0;
out:
    sim_fleet_free(&r.f);
    rpc_client_destroy(r.ctl);
    return rc;
}
