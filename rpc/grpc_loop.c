/* grpc_loop.c — the rpc-thread -> libevent-loop bridge of grpc_loop.h: a
 * locked queue of calls and an eventfd that wakes the loop.
 */
#include "rpc/grpc_loop.h"

#include <errno.h>
#include <event2/event.h>
#include <protobuf-c/protobuf-c.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/log.h"

typedef struct loop_method {
    rpc_loop *b;
    char *name;
    rpc_handler_fn fn;
    void *ud;
    const ProtobufCMessageDescriptor *request;
} loop_method;

typedef struct job {
    rpc_call *call;
    const loop_method *lm;
    uint8_t *bytes;
    size_t len;
    struct job *next;
} job;

struct rpc_loop {
    struct event_base *base;
    int efd;
    struct event *ev;
    pthread_mutex_t mu; /* head, tail, closed */
    job *head, *tail;
    bool closed;
    loop_method **methods; /* owned, freed by rpc_loop_destroy */
    size_t n_methods;
};

static job *take_all(rpc_loop *b) {
    pthread_mutex_lock(&b->mu);
    job *j = b->head;
    b->head = b->tail = NULL;
    pthread_mutex_unlock(&b->mu);
    return j;
}

/* On the loop's thread. */
static void on_wake(evutil_socket_t fd, short what, void *arg) {
    rpc_loop *b = arg;
    uint64_t n;
    while (read(fd, &n, sizeof n) < 0 && errno == EINTR) {
    }
    for (job *j = take_all(b), *next; j; j = next) {
        next = j->next;
        const loop_method *lm = j->lm;
        ProtobufCMessage *pm = NULL;
        /* The client gave up while the call waited for the loop: answering it
         * is wasted work that delays the calls behind it. */
        bool expired = rpc_call_time_left(j->call) <= 0;
        if (!expired && lm->request) pm = protobuf_c_message_unpack(lm->request, NULL, j->len, j->bytes);
        if (expired) {
            rpc_call_finishf(j->call, RPC_DEADLINE_EXCEEDED, "%s: deadline exceeded while queued for the loop",
                             lm->name);
        } else if (lm->request && !pm) {
            rpc_call_finishf(j->call, RPC_INTERNAL, "%s: request no longer decodes", lm->name);
        } else {
            rpc_request req = {
                .method = lm->name, .bytes = j->bytes, .len = j->len, .msg = pm};
            lm->fn(j->call, &req, lm->ud);
        }
        if (pm) protobuf_c_message_free_unpacked(pm, NULL);
        free(j->bytes);
        free(j);
    }
}

/* On the rpc thread: queue the call for the loop. */
static void trampoline(rpc_call *call, const rpc_request *req, void *ud) {
    const loop_method *lm = ud;
    rpc_loop *b = lm->b;
    job *j = calloc(1, sizeof *j);
    uint8_t *bytes = malloc(req->len ? req->len : 1);
    if (!j || !bytes) {
        free(j);
        free(bytes);
        rpc_call_finish(call, RPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    if (req->len) memcpy(bytes, req->bytes, req->len);
    j->call = call;
    j->lm = lm;
    j->bytes = bytes;
    j->len = req->len;
    pthread_mutex_lock(&b->mu);
    bool closed = b->closed;
    if (!closed) {
        if (b->tail) b->tail->next = j;
        else b->head = j;
        b->tail = j;
    }
    pthread_mutex_unlock(&b->mu);
    if (closed) {
        free(bytes);
        free(j);
        rpc_call_finish(call, RPC_UNAVAILABLE, "server stopping");
        return;
    }
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

int rpc_loop_add_method(rpc_loop *b, rpc_server *s, const rpc_method *m, st_err *err) {
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

void rpc_loop_close(rpc_loop *b) {
    pthread_mutex_lock(&b->mu);
    b->closed = true;
    pthread_mutex_unlock(&b->mu);
    for (job *j = take_all(b), *next; j; j = next) {
        next = j->next;
        rpc_call_finish(j->call, RPC_UNAVAILABLE, "server stopping");
        free(j->bytes);
        free(j);
    }
}

void rpc_loop_destroy(rpc_loop *b) {
    if (!b) return;
    rpc_loop_close(b);
    event_free(b->ev);
    close(b->efd);
    for (size_t i = 0; i < b->n_methods; i++) {
        free(b->methods[i]->name);
        free(b->methods[i]);
    }
    free(b->methods);
    pthread_mutex_destroy(&b->mu);
    free(b);
}
