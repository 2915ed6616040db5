/* fleet_sim_workers.c — strata-fleet-sim's simulated workers (fleet_sim.h):
 * each one's Register / Heartbeat calls on its thread's completion queue, the
 * threads' timer heaps, and the latency samples. */
#include "bench/fleet_sim.h"

#include <grpc/grpc.h>
#include <grpc/support/time.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "daemon/registration.h"
#include "proto/control.pb-c.h"

#define SVC "/strata.v1.Control/"
#define GOLDEN 0.6180339887498949

enum { TAG_WORKER = 1, TAG_SIDE = 2 };
enum { CALL_REGISTER = 1, CALL_HEARTBEAT = 2, CALL_CONNECT = 3 };

struct sim_worker {
    int tag;            /* TAG_WORKER; the queue's tag is the worker */
    uint32_t idx;       /* its number in the fleet (the name is PREFIX-(first + idx)) */
    uint32_t local;     /* its index in its thread */
    rpc_client *cl;
    rpc_async *call;    /* in flight, or NULL */
    int kind;           /* of the call in flight */
    bool hb_due;        /* a heartbeat came due while the call was out */
    double due_slot;    /* ... at this time */
    bool ever;          /* registered at least once */
    bool connected;     /* --preconnect: its GetStatus came back */
    uint64_t lease;     /* 0: must register */
    uint32_t interval_ms;
    uint32_t gen;       /* the armed timer's generation (older heap entries are stale) */
    double t_call, next_hb;
    uint64_t n_hb, bytes_sent;
};

typedef struct side_call {
    int tag; /* TAG_SIDE */
    rpc_async *call;
    sim_call_done done;
    void *ud;
} side_call;

/* ---------------------------------------------------------------- samples */

int sim_samples_add(sim_samples *s, double t, double ms) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 4096;
        float *m = realloc(s->ms, cap * sizeof *m);
        if (!m) return -1;
        s->ms = m;
        double *tt = realloc(s->t, cap * sizeof *tt);
        if (!tt) return -1;
        s->t = tt;
        s->cap = cap;
    }
    s->ms[s->n] = (float)ms;
    s->t[s->n++] = t;
    return 0;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

float *sim_samples_window(sim_samples *const *s, int n_sets, double t_lo, double t_hi, size_t *count) {
    size_t n = 0;
    for (int k = 0; k < n_sets; k++)
        for (size_t i = 0; i < s[k]->n; i++) n += s[k]->t[i] >= t_lo && s[k]->t[i] < t_hi;
    *count = n;
    float *v = n ? malloc(n * sizeof *v) : NULL;
    if (!v) return NULL;
    n = 0;
    for (int k = 0; k < n_sets; k++)
        for (size_t i = 0; i < s[k]->n; i++)
            if (s[k]->t[i] >= t_lo && s[k]->t[i] < t_hi) v[n++] = s[k]->ms[i];
    qsort(v, n, sizeof *v, cmp_float);
    return v;
}

double sim_pct(const float *v, size_t n, double p) {
    if (!n) return NAN;
    size_t k = (size_t)llround(p / 100.0 * (double)(n - 1));
    return v[k < n ? k : n - 1];
}

void sim_samples_free(sim_samples *s) {
    free(s->ms);
    free(s->t);
    memset(s, 0, sizeof *s);
}

/* ---------------------------------------------------------------- timers */

static void heap_push(sim_thread *t, sim_timer e) {
    uint32_t i = t->heap_n++;
    while (i > 0) {
        uint32_t p = (i - 1) / 2;
        if (t->heap[p].due <= e.due) break;
        t->heap[i] = t->heap[p];
        i = p;
    }
    t->heap[i] = e;
}

static sim_timer heap_pop(sim_thread *t) {
    sim_timer top = t->heap[0], last = t->heap[--t->heap_n];
    uint32_t i = 0, n = t->heap_n;
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && t->heap[c + 1].due < t->heap[c].due) c++;
        if (last.due <= t->heap[c].due) break;
        t->heap[i] = t->heap[c];
        i = c;
    }
    if (n) t->heap[i] = last;
    return top;
}

/* Arms w's one timer at due; an entry armed before is stale from now on
 * (skipped when it comes up). A worker has at most one stale entry besides
 * its live one (left by a registration after a reregister, and due before
 * the next heartbeat), so the heap is sized 2 per worker; it grows anyway
 * rather than lose a timer. */
static void arm(sim_thread *t, sim_worker *w, double due) {
    if (t->heap_n == t->heap_cap) {
        uint32_t cap = t->heap_cap ? 2 * t->heap_cap : 64;
        sim_timer *h = realloc(t->heap, cap * sizeof *h);
        if (!h) {
            fprintf(stderr, "strata-fleet-sim: out of memory (timers)\n");
            abort();
        }
        t->heap = h;
        t->heap_cap = cap;
    }
    heap_push(t, (sim_timer){due, w->local, ++w->gen});
}

/* ---------------------------------------------------------------- calls */

static void note_error(sim_thread *t, const sim_worker *w, const char *what, const rpc_status *st) {
    if (t->first_error[0]) return;
    snprintf(t->first_error, sizeof t->first_error, "%s-%05u: %s: %s: %.160s", t->fleet->desc.prefix,
             t->fleet->desc.first + w->idx, what, rpc_code_name(st->code), st->msg);
}

static int start(sim_thread *t, sim_worker *w, int kind, const char *method, const ProtobufCMessage *m) {
    uint8_t stackbuf[1024], *buf = stackbuf;
    size_t len = protobuf_c_message_get_packed_size(m);
    if (len > sizeof stackbuf && !(buf = malloc(len))) return -1;
    protobuf_c_message_pack(m, buf);
    rpc_status st = {0};
    w->t_call = st_now_s(); /* not the turn's start: a turn may start thousands of calls */
    w->call = rpc_client_start(w->cl, t->cq, method, buf, len, REG_CALL_TIMEOUT_S, w, &st);
    if (buf != stackbuf) free(buf);
    if (!w->call) {
        t->c.start_failures++;
        note_error(t, w, method + sizeof SVC - 1, &st);
        return -1;
    }
    w->kind = kind;
    t->in_flight++;
    return 0;
}

/* Register as registration.c's do_register sends it for a CPU node. */
static void start_register(sim_thread *t, sim_worker *w, double now) {
    const sim_node_desc *d = &t->fleet->desc;
    char name[96], data[32];
    snprintf(name, sizeof name, "%s-%05u", d->prefix, d->first + w->idx);
    snprintf(data, sizeof data, "127.0.0.1:%u", 20000 + (d->first + w->idx) % 40000); /* nobody listens */
    Strata__V1__Device dev = STRATA__V1__DEVICE__INIT, *devp = &dev;
    dev.kind = "cpu";
    dev.count = d->cores;
    dev.memory_bytes = d->memory_bytes / d->cores;
    Strata__V1__ModelFile mf = STRATA__V1__MODEL_FILE__INIT, *mfp = &mf;
    mf.name = (char *)d->model_name;
    mf.size_bytes = d->model_size;
    mf.sha256 = (char *)d->model_sha;
    Strata__V1__RegisterRequest q = STRATA__V1__REGISTER_REQUEST__INIT;
    q.node = name;
    q.devices = &devp;
    q.n_devices = 1;
    q.host_memory_bytes = d->memory_bytes;
    q.numa_nodes = d->numa_nodes;
    q.data_address = data;
    q.models = &mfp;
    q.n_models = 1;
    q.link_summary = "";
    if (start(t, w, CALL_REGISTER, SVC "Register", &q.base) == 0)
        t->c.reg_sent++;
    else
        arm(t, w, now + REG_RETRY_REFUSED_MS / 1000.0);
}

/* slot: when the heartbeat was due; how late it goes out is this process's
 * own lag (its timers behind, or the previous call still out). */
static void start_heartbeat(sim_thread *t, sim_worker *w, double slot) {
    const sim_node_desc *d = &t->fleet->desc;
    char name[96];
    snprintf(name, sizeof name, "%s-%05u", d->prefix, d->first + w->idx);
    Strata__V1__HeartbeatRequest q = STRATA__V1__HEARTBEAT_REQUEST__INIT;
    q.node = name;
    q.lease_id = w->lease;
    if (d->load) { /* a worker serving: figures that change every beat */
        uint64_t k = w->idx + w->n_hb;
        q.running_sequences = (uint32_t)(k % 9);
        q.kv_blocks_used = (uint32_t)((w->idx * 7 + w->n_hb * 13) % 4096);
        q.kv_blocks_free = 4096 - q.kv_blocks_used;
        q.busy_fraction = (double)(k % 100) / 100.0;
        w->bytes_sent += (k % 64) << 16;
        q.bytes_sent = w->bytes_sent;
    }
    w->n_hb++;
    if (start(t, w, CALL_HEARTBEAT, SVC "Heartbeat", &q.base) == 0) {
        t->c.hb_sent++;
        sim_samples_add(&t->lag, slot, (w->t_call - slot) * 1000.0);
    }
}

/* --preconnect: a GetStatus makes the connection before the fleet registers. */
static void start_connect(sim_thread *t, sim_worker *w) {
    Strata__V1__GetStatusRequest q = STRATA__V1__GET_STATUS_REQUEST__INIT;
    if (start(t, w, CALL_CONNECT, SVC "GetStatus", &q.base) != 0) {
        w->connected = true; /* it connects with its Register then */
        atomic_fetch_add(&t->fleet->connected, 1);
    }
}

static void lost_lease(sim_thread *t, sim_worker *w) {
    if (!w->lease) return;
    w->lease = 0;
    atomic_fetch_sub(&t->fleet->registered, 1);
}

static void on_timer(sim_thread *t, sim_worker *w, double now) {
    if (t->fleet->preconnect && !w->connected) {
        if (!w->call) start_connect(t, w);
        return;
    }
    if (!w->lease) {
        if (!w->call) start_register(t, w, now);
        return;
    }
    double iv = w->interval_ms / 1000.0;
    if (w->call) {
        if (w->hb_due) {
            t->c.hb_skipped++;
        } else {
            t->c.hb_delayed++;
            w->due_slot = w->next_hb;
        }
        w->hb_due = true;
    } else {
        start_heartbeat(t, w, w->next_hb);
    }
    w->next_hb += iv;
    if (w->next_hb <= now) { /* far behind: keep the phase, skip the slots gone */
        double k = floor((now - w->next_hb) / iv) + 1;
        t->c.hb_skipped += (uint64_t)k;
        w->next_hb += k * iv;
    }
    arm(t, w, w->next_hb);
}

static void registered(sim_thread *t, sim_worker *w, const uint8_t *rep, size_t len, double now) {
    Strata__V1__RegisterReply *r = strata__v1__register_reply__unpack(NULL, len, rep);
    if (!r || !r->lease_id) {
        rpc_status st = {.code = RPC_INTERNAL};
        snprintf(st.msg, sizeof st.msg, "%s", r ? "lease 0" : "undecodable reply");
        note_error(t, w, "Register", &st);
        t->c.reg_errors++;
        if (r) strata__v1__register_reply__free_unpacked(r, NULL);
        arm(t, w, now + REG_RETRY_REFUSED_MS / 1000.0);
        return;
    }
    t->c.reg_ok++;
    sim_samples_add(&t->reg, w->t_call, (now - w->t_call) * 1000.0);
    w->lease = r->lease_id;
    w->interval_ms = r->heartbeat_interval_ms ? r->heartbeat_interval_ms : 1000;
    strata__v1__register_reply__free_unpacked(r, NULL);
    atomic_fetch_add(&t->fleet->registered, 1);
    double iv = w->interval_ms / 1000.0;
    if (!w->ever) {
        w->ever = true;
        atomic_fetch_add(&t->fleet->ever_registered, 1);
        w->next_hb = now + iv * fmod((double)w->idx * GOLDEN, 1.0);
    } else {
        w->next_hb = now + iv;
    }
    w->hb_due = false;
    arm(t, w, w->next_hb);
}

static void on_done(sim_thread *t, sim_worker *w, double now) {
    rpc_async *a = w->call;
    w->call = NULL;
    t->in_flight--;
    uint8_t *rep = NULL;
    size_t len = 0;
    rpc_status st = {0};
    int rc = rpc_async_finish(a, &rep, &len, &st);
    bool stopping = atomic_load(&t->fleet->stopping);
    if (w->kind == CALL_CONNECT) { /* whatever the answer: the fleet registers once all are back */
        if (rc != 0) t->c.connect_errors++;
        w->connected = true;
        atomic_fetch_add(&t->fleet->connected, 1);
        if (atomic_load(&t->fleet->go) && !stopping) start_register(t, w, now); /* released before it was back */
    } else if (w->kind == CALL_REGISTER) {
        if (rc == 0) {
            registered(t, w, rep, len, now);
        } else {
            unsigned ms = REG_RETRY_UNREACHABLE_MS;
            if (st.code == RPC_DEADLINE_EXCEEDED) {
                t->c.reg_misses++;
            } else {
                t->c.reg_errors++;
                note_error(t, w, "Register", &st);
                if (st.code != RPC_UNAVAILABLE) ms = REG_RETRY_REFUSED_MS;
            }
            arm(t, w, now + ms / 1000.0);
        }
    } else {
        bool again = false;
        if (rc == 0) {
            Strata__V1__HeartbeatReply *r = strata__v1__heartbeat_reply__unpack(NULL, len, rep);
            if (r) {
                t->c.hb_ok++;
                sim_samples_add(&t->hb, w->t_call, (now - w->t_call) * 1000.0);
                again = r->reregister;
                strata__v1__heartbeat_reply__free_unpacked(r, NULL);
            } else {
                t->c.hb_errors++;
                st.code = RPC_INTERNAL;
                snprintf(st.msg, sizeof st.msg, "undecodable reply");
                note_error(t, w, "Heartbeat", &st);
            }
        } else if (st.code == RPC_DEADLINE_EXCEEDED) {
            t->c.hb_misses++;
        } else {
            t->c.hb_errors++;
            note_error(t, w, "Heartbeat", &st);
            again = st.code == RPC_NOT_FOUND;
        }
        if (again) { /* the coordinator lost the lease (declared the node dead, restarted): at once */
            t->c.reregisters++;
            lost_lease(t, w);
            if (!stopping) start_register(t, w, now);
        } else if (w->hb_due && !stopping) {
            w->hb_due = false;
            start_heartbeat(t, w, w->due_slot);
        }
    }
    free(rep);
}

int sim_side_call(sim_thread *t, rpc_client *c, const char *method, const void *req, size_t len,
                  double timeout_s, sim_call_done done, void *ud) {
    side_call *s = calloc(1, sizeof *s);
    if (!s) return -1;
    s->tag = TAG_SIDE;
    s->done = done;
    s->ud = ud;
    rpc_status st = {0};
    if (!(s->call = rpc_client_start(c, t->cq, method, req, len, timeout_s, s, &st))) {
        free(s);
        return -1;
    }
    t->in_flight++;
    return 0;
}

static void side_done(sim_thread *t, side_call *s) {
    t->in_flight--;
    uint8_t *rep = NULL;
    size_t len = 0;
    rpc_status st = {0};
    int rc = rpc_async_finish(s->call, &rep, &len, &st);
    s->done(s->ud, rc == 0, rep, len, &st);
    free(rep);
    free(s);
}

/* ---------------------------------------------------------------- threads */

static gpr_timespec in_s(double s) {
    if (s < 0) s = 0;
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_micros((int64_t)(s * 1e6), GPR_TIMESPAN));
}

static void cancel_all(sim_thread *t) {
    for (uint32_t i = 0; i < t->n; i++)
        if (t->w[i].call) rpc_async_cancel(t->w[i].call);
}

static void *thread_main(void *arg) {
    sim_thread *t = arg;
    sim_fleet *f = t->fleet;
    /* the Registers from f->t0 on (with --preconnect: first the connections, at once) */
    bool released = !f->preconnect;
    for (uint32_t i = 0; i < t->n; i++)
        arm(t, &t->w[i], released ? f->t0 + f->ramp_s * (double)t->w[i].idx / (double)f->n : 0);
    double stop_since = 0;
    bool cancelled = false;
    for (;;) {
        double now = st_now_s();
        bool stopping = atomic_load(&f->stopping);
        if (stopping) {
            if (!t->in_flight) break;
            if (!stop_since) stop_since = now;
            if (!cancelled && now - stop_since > REG_CALL_TIMEOUT_S + 5.0) { /* a call past its deadline */
                cancel_all(t);
                cancelled = true;
            }
        }
        if (!released && atomic_load(&f->go)) { /* connected: f->t0 is set */
            released = true;
            for (uint32_t i = 0; i < t->n; i++)
                arm(t, &t->w[i], f->t0 + f->ramp_s * (double)t->w[i].idx / (double)f->n);
        }
        while (!stopping && t->heap_n && t->heap[0].due <= now) {
            sim_timer e = heap_pop(t);
            sim_worker *w = &t->w[e.w];
            if (e.gen != w->gen) continue; /* stale: re-armed since */
            on_timer(t, w, now);
        }
        if (t->on_turn && now >= t->next_turn) t->on_turn(t, now);
        double next = now + 0.1;
        if (!stopping && t->heap_n && t->heap[0].due < next) next = t->heap[0].due;
        if (t->on_turn && t->next_turn < next) next = t->next_turn;
        grpc_event ev = grpc_completion_queue_next(t->cq, in_s(next - st_now_s()), NULL);
        for (int k = 0; ev.type == GRPC_OP_COMPLETE; k++) {
            double done = st_now_s();
            if (*(int *)ev.tag == TAG_WORKER)
                on_done(t, ev.tag, done);
            else
                side_done(t, ev.tag);
            if (k == 256) break; /* the timers' turn */
            ev = grpc_completion_queue_next(t->cq, gpr_inf_past(GPR_CLOCK_MONOTONIC), NULL);
        }
    }
    return NULL;
}

int sim_fleet_init(sim_fleet *f) {
    grpc_init();
    atomic_init(&f->registered, 0);
    atomic_init(&f->ever_registered, 0);
    atomic_init(&f->stopping, false);
    atomic_init(&f->connected, 0);
    atomic_init(&f->go, false);
    if (!(f->threads = calloc((size_t)f->n_threads, sizeof *f->threads))) return -1;
    for (int k = 0; k < f->n_threads; k++) {
        sim_thread *t = &f->threads[k];
        t->fleet = f;
        t->id = k;
        t->n = (f->n - (uint32_t)k + (uint32_t)f->n_threads - 1) / (uint32_t)f->n_threads;
        t->w = calloc(t->n ? t->n : 1, sizeof *t->w);
        t->heap_cap = 2 * t->n + 1;
        t->heap = calloc(t->heap_cap, sizeof *t->heap);
        t->cq = grpc_completion_queue_create_for_next(NULL);
        if (!t->w || !t->heap || !t->cq) return -1;
        for (uint32_t i = 0; i < t->n; i++) {
            sim_worker *w = &t->w[i];
            w->tag = TAG_WORKER;
            w->idx = (uint32_t)k + i * (uint32_t)f->n_threads;
            w->local = i;
            st_err err = {{0}};
            w->cl = f->shared_connections ? rpc_client_create_small(f->addr, f->tls, &err)
                                          : rpc_client_create_own(f->addr, f->tls, &err);
            if (!w->cl) {
                fprintf(stderr, "strata-fleet-sim: worker %u: %s\n", w->idx, err.msg);
                return -1;
            }
        }
    }
    return 0;
}

int sim_fleet_start(sim_fleet *f) {
    for (int k = 0; k < f->n_threads; k++)
        if (pthread_create(&f->threads[k].th, NULL, thread_main, &f->threads[k]) != 0) {
            atomic_store(&f->stopping, true);
            for (int j = 0; j < k; j++) pthread_join(f->threads[j].th, NULL);
            f->n_threads = k;
            return -1;
        }
    return 0;
}

void sim_fleet_join(sim_fleet *f) {
    for (int k = 0; k < f->n_threads; k++) pthread_join(f->threads[k].th, NULL);
}

void sim_fleet_free(sim_fleet *f) {
    if (!f->threads) return;
    for (int k = 0; k < f->n_threads; k++) {
        sim_thread *t = &f->threads[k];
        for (uint32_t i = 0; t->w && i < t->n; i++) rpc_client_destroy(t->w[i].cl);
        if (t->cq) {
            grpc_completion_queue_shutdown(t->cq);
            while (grpc_completion_queue_next(t->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
                   GRPC_QUEUE_SHUTDOWN) {
            }
            grpc_completion_queue_destroy(t->cq);
        }
        free(t->w);
        free(t->heap);
        sim_samples_free(&t->hb);
        sim_samples_free(&t->reg);
        sim_samples_free(&t->lag);
    }
    free(f->threads);
    f->threads = NULL;
    grpc_shutdown();
}
