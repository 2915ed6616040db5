/* fleet_sim.h — strata-fleet-sim's pieces: the simulated workers and their
 * call loop (fleet_sim_workers.c) and the run that drives and measures them
 * (fleet_sim.c: options, the phases cold start / settle / window, the report).
 *
 * One simulated worker is what one strata-worker's registration thread does
 * (daemon/registration.c), without the thread: a gRPC channel of its own (its
 * own TCP connection), Register with a CPU node's description, then a
 * Heartbeat every heartbeat_interval_ms of the RegisterReply; a heartbeat
 * answered `reregister` or NOT_FOUND registers again at once; a failed
 * Register is retried after REG_RETRY_UNREACHABLE_MS (unreachable, deadline)
 * or REG_RETRY_REFUSED_MS (refused); every call has the daemon's deadline
 * REG_CALL_TIMEOUT_S. At most one call per worker is in flight, as in the
 * daemon: a heartbeat that comes due while the previous call is still out is
 * sent when it returns (counted as delayed). Unlike the daemon, whose period
 * is the interval plus the round trip, a simulated worker keeps a fixed
 * schedule: its first heartbeat at interval x frac(i x golden ratio) after
 * its registration (phases spread over the interval, as independent daemons
 * have them), then every interval.
 *
 * The workers are split over sim_threads, each with its completion queue (all
 * calls asynchronous, rpc_client_start) and a heap of timers; no thread per
 * worker. Times are st_now_s() seconds (common/clock.h).
 */
#ifndef STRATA_BENCH_FLEET_SIM_H
#define STRATA_BENCH_FLEET_SIM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rpc/grpc_client.h"

/* What every simulated worker sends (the node description and the load). */
typedef struct sim_node_desc {
    const char *prefix;       /* node names PREFIX-NNNNN */
    uint32_t first;           /* the first worker's number */
    uint32_t cores;           /* Device kind "cpu": count */
    uint64_t memory_bytes;    /* host memory; per device: memory / cores */
    uint32_t numa_nodes;
    const char *model_name;   /* basename */
    uint64_t model_size;
    char model_sha[65];
    bool load;                /* heartbeats carry a varying load report */
} sim_node_desc;

/* A growable array of float samples (ms) with the time each was taken. */
typedef struct sim_samples {
    float *ms;
    double *t;
    size_t n, cap;
} sim_samples;

/* One thread's counts (summed over threads for the report). */
typedef struct sim_counts {
    uint64_t reg_sent, reg_ok, reg_misses, reg_errors;
    uint64_t hb_sent, hb_ok, hb_misses, hb_errors, hb_delayed, hb_skipped;
    uint64_t reregisters;     /* heartbeats answered reregister or NOT_FOUND */
    uint64_t start_failures;  /* calls gRPC would not start */
    uint64_t connect_errors;  /* --preconnect: GetStatus calls that failed */
} sim_counts;

typedef struct sim_worker sim_worker;
typedef struct sim_timer {
    double due;
    uint32_t w;   /* index into the thread's workers */
    uint32_t gen; /* the worker's timer generation when armed (older: stale) */
} sim_timer;

typedef struct sim_fleet sim_fleet;

typedef struct sim_thread {
    sim_fleet *fleet;
    int id;
    struct grpc_completion_queue *cq;
    sim_worker *w; /* this thread's workers: global index id, id + T, ... */
    uint32_t n;
    sim_timer *heap;
    uint32_t heap_n, heap_cap;
    uint32_t in_flight;
    sim_counts c;
    sim_samples hb, reg;     /* answered heartbeats / Registers: latency, start time */
    sim_samples lag;         /* heartbeats sent: how late after their slot (ms), the slot's time */
    char first_error[256];
    pthread_t th;
    /* thread 0 only: the run's phases (fleet_sim.c), called on every turn */
    void (*on_turn)(struct sim_thread *t, double now);
    double next_turn;        /* on_turn wants to run again by then */
} sim_thread;

struct sim_fleet {
    const char *addr;
    const rpc_tls *tls;       /* NULL: plaintext */
    bool shared_connections;  /* gRPC's sharing of one connection (not the daemons' way) */
    uint32_t n;               /* workers */
    int n_threads;
    double ramp_s;            /* the workers start over this many seconds (0: all at once) */
    bool preconnect;          /* connect every worker (GetStatus) before the first Register */
    sim_node_desc desc;
    sim_thread *threads;
    double t0;                /* the first Register (with preconnect: set before `go`) */
    atomic_uint connected;    /* preconnect: GetStatus calls back */
    atomic_bool go;           /* preconnect: register now */
    atomic_uint registered;   /* workers with a lease (now) */
    atomic_uint ever_registered;
    atomic_bool stopping;     /* no new calls; the threads end when theirs are back */
};

/* Creates every worker's channel and the threads' queues (no call yet). -1
 * and a message on stderr when a channel cannot be made. */
int sim_fleet_init(sim_fleet *f);
/* Starts the threads: the Registers go out from f->t0 on. */
int sim_fleet_start(sim_fleet *f);
/* Waits for the threads (after f->stopping, within a call deadline), then
 * closes every channel and queue. */
void sim_fleet_join(sim_fleet *f);
void sim_fleet_free(sim_fleet *f);

/* An asynchronous call of thread 0 outside the fleet (the run's ListNodes):
 * done(ud, ok, reply, len, st) runs on thread 0 when it is over. */
typedef void (*sim_call_done)(void *ud, int ok, const uint8_t *reply, size_t len, const rpc_status *st);
int sim_side_call(sim_thread *t, rpc_client *c, const char *method, const void *req, size_t len,
                  double timeout_s, sim_call_done done, void *ud);

int sim_samples_add(sim_samples *s, double t, double ms);
/* The samples of n_sets arrays taken in [t_lo, t_hi), sorted (malloc'd, free
 * it; NULL when none or out of memory); *count: how many. */
float *sim_samples_window(sim_samples *const *s, int n_sets, double t_lo, double t_hi, size_t *count);
/* The p-th percentile of sorted v[0..n) by nearest rank (as
 * tests/control/fleet_sim.py's percentile); NaN when n is 0. */
double sim_pct(const float *v, size_t n, double p);
void sim_samples_free(sim_samples *s);

#endif
