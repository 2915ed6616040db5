/* grpc_loop.c — the rpc-thread -> libevent-loop bridge of grpc_loop.h: two
 * locked queues of calls (urgent and ordinary), an eventfd that wakes the
 * loop, and a pool of job slots so that a small call crosses the bridge
 * without an allocation.
 */
#include "rpc/grpc_loop.h"

#include <errno.h>
#include <event2/event.h>
#include <protobuf-c/protobuf-c.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/log.h"

/* A request of up to JOB_INLINE bytes is copied into its job slot, and its
 * unpacked message is carved out of the slot's arena (a heartbeat needs about
 * 100 bytes of each); bigger ones use malloc. Free slots are kept up to
 * POOL_MAX (about 4 MiB). */
#define JOB_INLINE 512
#define JOB_ARENA 1024
#define POOL_MAX 4096

typedef struct loop_method {
    rpc_loop *b;
    char *name;
    rpc_handler_fn fn;
    void *ud;
    const ProtobufCMessageDescriptor *request;
    bool urgent;
} loop_method;

typedef struct job {
    rpc_call *call;
    const loop_method *lm;
    uint8_t *bytes; /* inline_bytes, or malloc'd */
    size_t len;
    struct job *next;
    size_t arena_used;
    alignas(max_align_t) uint8_t arena[JOB_ARENA];
    uint8_t inline_bytes[JOB_INLINE];
} job;

typedef struct job_queue {
    job *head, *tail;
} job_queue;

struct rpc_loop {
    struct event_base *base;
    int efd;
    struct event *ev;
    pthread_mutex_t mu; /* urgent, normal, closed, pool, n_pool */
    job_queue urgent, normal;
    atomic_bool urgent_waiting; /* urgent.head != NULL, read without the lock */
    bool closed;
    job *pool;
    size_t n_pool;
    loop_method **methods; /* owned, freed by rpc_loop_destroy */
    size_t n_methods;
    atomic_uint_fast64_t calls, job_mallocs, bytes_mallocs, arena_mallocs; /* rpc_loop_stats */
};

/* ------------------------------------------------------------------ job slots */

static job *job_get(rpc_loop *b) {
    pthread_mutex_lock(&b->mu);
    job *j = b->pool;
    if (j) {
        b->pool = j->next;
        b->n_pool--;
    }
    pthread_mutex_unlock(&b->mu);
    if (!j) {
        if (!(j = malloc(sizeof *j))) return NULL;
        atomic_fetch_add(&b->job_mallocs, 1);
    }
    j->next = NULL;
    j->bytes = NULL;
    j->arena_used = 0;
    return j;
}

static void job_put(rpc_loop *b, job *j) {
    if (j->bytes != j->inline_bytes) free(j->bytes);
    j->bytes = NULL;
    pthread_mutex_lock(&b->mu);
    bool keep = b->n_pool < POOL_MAX;
    if (keep) {
        j->next = b->pool;
        b->pool = j;
        b->n_pool++;
    }
    pthread_mutex_unlock(&b->mu);
    if (!keep) free(j);
}

/* protobuf-c's allocator over the job's arena (malloc once it is full). */
static void *arena_alloc(void *ud, size_t size) {
    job *j = ud;
    size_t a = alignof(max_align_t), at = (j->arena_used + a - 1) / a * a;
    if (size <= JOB_ARENA && at <= JOB_ARENA - size) {
        j->arena_used = at + size;
        return j->arena + at;
    }
    atomic_fetch_add(&j->lm->b->arena_mallocs, 1);
    return malloc(size);
}

static void arena_free(void *ud, void *p) {
    job *j = ud;
    if ((uint8_t *)p >= j->arena && (uint8_t *)p < j->arena + JOB_ARENA) return;
    free(p);
}

/* ------------------------------------------------------------------ queues */

static void q_push(job_queue *q, job *j) {
    if (q->tail) q->tail->next = j;
    else q->head = j;
    q->tail = j;
}

static job *take_all(rpc_loop *b, job_queue *q) {
    pthread_mutex_lock(&b->mu);
    job *j = q->head;
    q->head = q->tail = NULL;
    if (q == &b->urgent) atomic_store(&b->urgent_waiting, false);
    pthread_mutex_unlock(&b->mu);
    return j;
}

/* On the loop's thread: runs one call's handler (or answers it). */
static void run_job(rpc_loop *b, job *j) {
    const loop_method *lm = j->lm;
    ProtobufCMessage *pm = NULL;
    ProtobufCAllocator al = {arena_alloc, arena_free, j};
    /* The client gave up while the call waited for the loop: answering it
     * is wasted work that delays the calls behind it. */
    bool expired = rpc_call_time_left(j->call) <= 0;
    if (!expired && lm->request) pm = protobuf_c_message_unpack(lm->request, &al, j->len, j->bytes);
    if (expired) {
        rpc_call_finishf(j->call, RPC_DEADLINE_EXCEEDED, "%s: deadline exceeded while queued for the loop",
                         lm->name);
    } else if (lm->request && !pm) {
        rpc_call_finishf(j->call, RPC_INTERNAL, "%s: request no longer decodes", lm->name);
    } else {
        rpc_request req = {.method = lm->name, .bytes = j->bytes, .len = j->len, .msg = pm};
        lm->fn(j->call, &req, lm->ud);
    }
    if (pm) protobuf_c_message_free_unpacked(pm, &al);
    job_put(b, j);
}

static void run_urgent(rpc_loop *b) {
    if (!atomic_load(&b->urgent_waiting)) return;
    for (job *j = take_all(b, &b->urgent), *next; j; j = next) {
        next = j->next;
        run_job(b, j);
    }
}

/* On the loop's thread. The ordinary calls queued at the wake-up run in
 * order, and before each of them every urgent call that has arrived: an
 * urgent call waits for at most one ordinary handler. Ordinary calls that
 * arrive meanwhile wait for the next wake-up, so the loop's other events
 * (timers, connections) get their turn. */
static void on_wake(evutil_socket_t fd, short what, void *arg) {
    rpc_loop *b = arg;
    uint64_t n;
    while (read(fd, &n, sizeof n) < 0 && errno == EINTR) {
    }
    run_urgent(b);
    for (job *j = take_all(b, &b->normal), *next; j; j = next) {
        next = j->next;
        run_job(b, j);
        run_urgent(b);
    }
}

/* On the rpc thread: queue the call for the loop. */
static void trampoline(rpc_call *call, const rpc_request *req, void *ud) {
    const loop_method *lm = ud;
    rpc_loop *b = lm->b;
    job *j = job_get(b);
    uint8_t *bytes = !j ? NULL : req->len <= JOB_INLINE ? j->inline_bytes : malloc(req->len);
    atomic_fetch_add(&b->calls, 1);
    if (j && req->len > JOB_INLINE) atomic_fetch_add(&b->bytes_mallocs, 1);
    if (!j || !bytes) {
        if (j) job_put(b, j);
        rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    if (req->len) memcpy(bytes, req->bytes, req->len);
    j->call = call;
    j->lm = lm;
    j->bytes = bytes;
    j->len = req->len;
    pthread_mutex_lock(&b->mu);
    bool closed = b->closed, wake = false;
    if (!closed) {
        job_queue *q = lm->urgent ? &b->urgent : &b->normal;
        /* A queue that was not empty has a wake-up on its way since the loop
         * last took it (take_all empties it): one write per batch of calls. */
        wake = !q->head;
        q_push(q, j);
        if (lm->urgent) atomic_store(&b->urgent_waiting, true);
    }
    pthread_mutex_unlock(&b->mu);
    if (closed) {
        job_put(b, j);
        rpc_call_finish(call, RPC_UNAVAILABLE, "server stopping");
        return;
    }
    if (!wake) return;
    uint64_t one = 1;
    while (write(b->efd, &one, sizeof one) < 0 && errno == EINTR) {
    }
}

rpc_loop *rpc_loop_create(struct event_base *base, st_err *err) {
    rpc_loop *b = calloc(1, sizeof *b);
    if (!b) {
        st_errf(err, "rpc: out of memory");
        return NULL;
    }
    b->base = base;
    pthread_mutex_init(&b->mu, NULL);
    atomic_init(&b->urgent_waiting, false);
    b->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (b->efd < 0) {
        st_errf(err, "rpc: eventfd: %s", strerror(errno));
        pthread_mutex_destroy(&b->mu);
        free(b);
        return NULL;
    }
    b->ev = event_new(base, b->efd, EV_READ | EV_PERSIST, on_wake, b);
    if (!b->ev || event_add(b->ev, NULL) != 0) {
        st_errf(err, "rpc: cannot add the wake-up event to the loop");
        if (b->ev) event_free(b->ev);
        close(b->efd);
        pthread_mutex_destroy(&b->mu);
        free(b);
        return NULL;
    }
    return b;
}

static int add_method(rpc_loop *b, rpc_server *s, const rpc_method *m, bool urgent, st_err *err) {
    if (!m || !m->name || !m->handler)
        return st_errf(err, "rpc: a method needs a name and a handler");
    loop_method **nm = realloc(b->methods, (b->n_methods + 1) * sizeof *nm);
    if (!nm) return st_errf(err, "rpc: out of memory");
    b->methods = nm;
    loop_method *lm = calloc(1, sizeof *lm);
    if (!lm || !(lm->name = strdup(m->name))) {
        free(lm);
        return st_errf(err, "rpc: out of memory");
    }
    lm->b = b;
    lm->fn = m->handler;
    lm->ud = m->ud;
    lm->request = m->request;
    lm->urgent = urgent;
    rpc_method t = *m;
    t.handler = trampoline;
    t.ud = lm;
    if (rpc_server_add_method(s, &t, err) != 0) {
        free(lm->name);
        free(lm);
        return -1;
    }
    b->methods[b->n_methods++] = lm;
    return 0;
}

int rpc_loop_add_method(rpc_loop *b, rpc_server *s, const rpc_method *m, st_err *err) {
    return add_method(b, s, m, false, err);
}

int rpc_loop_add_urgent_method(rpc_loop *b, rpc_server *s, const rpc_method *m, st_err *err) {
    return add_method(b, s, m, true, err);
}

void rpc_loop_get_stats(rpc_loop *b, rpc_loop_stats *out) {
    out->calls = atomic_load(&b->calls);
    out->job_mallocs = atomic_load(&b->job_mallocs);
    out->bytes_mallocs = atomic_load(&b->bytes_mallocs);
    out->arena_mallocs = atomic_load(&b->arena_mallocs);
}

static void finish_all(rpc_loop *b, job_queue *q) {
    for (job *j = take_all(b, q), *next; j; j = next) {
        next = j->next;
        rpc_call_finish(j->call, RPC_UNAVAILABLE, "server stopping");
        job_put(b, j);
    }
}

void rpc_loop_close(rpc_loop *b) {
    pthread_mutex_lock(&b->mu);
    b->closed = true;
    pthread_mutex_unlock(&b->mu);
    finish_all(b, &b->urgent);
    finish_all(b, &b->normal);
}

void rpc_loop_destroy(rpc_loop *b) {
    if (!b) return;
    rpc_loop_close(b);
    event_free(b->ev);
    close(b->efd);
    while (b->pool) {
        job *j = b->pool;
        b->pool = j->next;
        free(j);
    }
    for (size_t i = 0; i < b->n_methods; i++) {
        free(b->methods[i]->name);
        free(b->methods[i]);
    }
    free(b->methods);
    pthread_mutex_destroy(&b->mu);
    free(b);
}
