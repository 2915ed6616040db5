/* grpc_server.c — the generic gRPC server of grpc_server.h on gRPC's C core:
 * the completion-queue loop on the rpc thread, method dispatch, and the
 * thread-safe call handle (send queue, status, cancellation, deadline).
 *
 * Life of a call (all gRPC completions arrive on the rpc thread):
 *   NEW     grpc_server_request_call completed: start RECV_CLOSE_ON_SERVER
 *           (tells us about cancellation) and RECV_MESSAGE.
 *   RECV    the request is here: answer errors ourselves or call the handler.
 *   SEND    one SEND_MESSAGE (with the initial metadata the first time) is
 *           done: start the next queued message, or the status.
 *   STATUS  SEND_STATUS_FROM_SERVER done.
 * At most one send batch is in flight per call, and every
 * grpc_call_start_batch on a call happens under the call's mutex (gRPC asks
 * for that synchronisation). A call is freed when its reference count (one
 * per batch in flight, one while a handler holds it) drops to zero.
 */
#include "rpc/grpc_server.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <protobuf-c/protobuf-c.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "rpc/grpc_absl.h"
#include "rpc/grpc_log.h"

enum tag_kind { TAG_NEW, TAG_SHUTDOWN, TAG_CLOSE, TAG_RECV, TAG_SEND, TAG_STATUS };

typedef struct rpc_tag {
    enum tag_kind kind;
    rpc_call *call;
} rpc_tag;

typedef struct outmsg {
    grpc_byte_buffer *bb;
    struct outmsg *next;
} outmsg;

typedef struct method_entry {
    char *name;
    rpc_kind kind;
    rpc_handler_fn fn;
    void *ud;
    const ProtobufCMessageDescriptor *request;
} method_entry;

struct rpc_call {
    rpc_server *srv;
    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array md;
    char *method;             /* malloc'd copy of details.method */
    const method_entry *m;    /* NULL: unknown method */
    rpc_peer peer;            /* set on the rpc thread before dispatch, then read-only */
    grpc_byte_buffer *recv;
    int close_cancelled;
    rpc_tag t_new, t_close, t_recv, t_send, t_status;

    pthread_mutex_t mu;       /* everything below, and grpc_call_start_batch */
    int refs;
    bool counted;             /* included in srv->live */
    bool md_sent, send_busy, finishing, status_started, cancelled;
    int n_sent;
    outmsg *head, *tail;
    grpc_byte_buffer *sending;
    bool has_details;
    grpc_slice status_details;
    int code;
    char *msg;
};

struct rpc_server {
    grpc_server *server;
    grpc_completion_queue *cq;
    int port;
    bool tls;                 /* mutual TLS: calls without a client certificate are refused */
    rpc_tls_watch *watch;     /* the TLS files, read again when they change */
    bool started;
    pthread_t thread;
    method_entry *methods;
    size_t n_methods;
    rpc_call *pending;        /* the slot of the outstanding request_call (rpc thread) */
    rpc_tag t_shutdown;
    bool shutdown_done;       /* rpc thread only */
    bool cq_shut;             /* rpc thread only */
    atomic_bool stopping;
    pthread_mutex_t mu;       /* live */
    int live;                 /* calls accepted and not yet freed */
};

/* ------------------------------------------------------------------ helpers */

static double time_left_s(gpr_timespec deadline) {
    gpr_timespec d = gpr_convert_clock_type(deadline, GPR_CLOCK_MONOTONIC);
    if (gpr_time_cmp(d, gpr_inf_future(GPR_CLOCK_MONOTONIC)) == 0) return 1e9;
    gpr_timespec left = gpr_time_sub(d, gpr_now(GPR_CLOCK_MONOTONIC));
    double s = (double)left.tv_sec + (double)left.tv_nsec * 1e-9;
    return s > 1e9 ? 1e9 : s;
}

static rpc_call *call_new(rpc_server *s) {
    rpc_call *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->srv = s;
    grpc_call_details_init(&c->details);
    grpc_metadata_array_init(&c->md);
    pthread_mutex_init(&c->mu, NULL);
    c->t_new = (rpc_tag){TAG_NEW, c};
    c->t_close = (rpc_tag){TAG_CLOSE, c};
    c->t_recv = (rpc_tag){TAG_RECV, c};
    c->t_send = (rpc_tag){TAG_SEND, c};
    c->t_status = (rpc_tag){TAG_STATUS, c};
    return c;
}

static void drop_queue(rpc_call *c) {
    while (c->head) {
        outmsg *o = c->head;
        c->head = o->next;
        grpc_byte_buffer_destroy(o->bb);
        free(o);
    }
    c->tail = NULL;
}

static void call_free(rpc_call *c) {
    rpc_server *s = c->srv;
    if (c->call) grpc_call_unref(c->call);
    grpc_call_details_destroy(&c->details);
    grpc_metadata_array_destroy(&c->md);
    if (c->recv) grpc_byte_buffer_destroy(c->recv);
    drop_queue(c);
    if (c->sending) grpc_byte_buffer_destroy(c->sending);
    if (c->has_details) grpc_slice_unref(c->status_details);
    free(c->msg);
    free(c->method);
    pthread_mutex_destroy(&c->mu);
    bool counted = c->counted;
    free(c);
    if (counted) {
        pthread_mutex_lock(&s->mu);
        s->live--;
        pthread_mutex_unlock(&s->mu);
    }
}

/* Drops one reference; true when it was the last (free after unlocking). */
static bool unref_locked(rpc_call *c) {
    return --c->refs == 0;
}

static void unref(rpc_call *c) {
    pthread_mutex_lock(&c->mu);
    bool dead = unref_locked(c);
    pthread_mutex_unlock(&c->mu);
    if (dead) call_free(c);
}

/* ------------------------------------------------------------------ sending */

static int start_send_locked(rpc_call *c, grpc_byte_buffer *bb) {
    grpc_op ops[2];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    if (!c->md_sent) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[n].data.send_initial_metadata.count = 0;
        n++;
    }
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = bb;
    n++;
    c->refs++;
    c->send_busy = true;
    c->sending = bb;
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, &c->t_send, NULL);
    if (e != GRPC_CALL_OK) {
        ST_WARN("rpc: %s: cannot start send (grpc_call_error %d)", c->method, (int)e);
        c->refs--;
        c->send_busy = false;
        c->sending = NULL;
        grpc_byte_buffer_destroy(bb);
        c->cancelled = true;
        return -1;
    }
    c->md_sent = true;
    return 0;
}

static void start_status_locked(rpc_call *c) {
    int code = c->code;
    const char *msg = c->msg ? c->msg : "";
    if (code == RPC_OK && time_left_s(c->details.deadline) <= 0) {
        code = RPC_DEADLINE_EXCEEDED;
        msg = "deadline exceeded before the reply was complete";
    }
    grpc_op ops[2];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    if (!c->md_sent) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[n].data.send_initial_metadata.count = 0;
        n++;
    }
    c->status_details = grpc_slice_from_copied_string(msg);
    c->has_details = true;
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.trailing_metadata_count = 0;
    ops[n].data.send_status_from_server.status = (grpc_status_code)code;
    ops[n].data.send_status_from_server.status_details = &c->status_details;
    n++;
    c->refs++;
    c->status_started = true;
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, &c->t_status, NULL);
    if (e != GRPC_CALL_OK) {
        ST_WARN("rpc: %s: cannot send status (grpc_call_error %d)", c->method, (int)e);
        c->refs--;
        return;
    }
    c->md_sent = true;
    if (code != RPC_OK)
        ST_DEBUG("rpc: %s -> %s: %s", c->method, rpc_code_name(code), msg);
}

/* Marks the call finishing with (code, msg) and starts the status unless a
 * message is still going out (on_send starts it then). */
static void finish_locked(rpc_call *c, int code, const char *msg) {
    c->finishing = true;
    if (code == RPC_OK && c->m && c->m->kind == RPC_KIND_UNARY && c->n_sent == 0) {
        code = RPC_INTERNAL;
        msg = "handler finished a unary call without a reply";
    }
    /* A handler that stops because the deadline passed sees "cancelled"; the
     * client must still get DEADLINE_EXCEEDED, whichever status arrives first. */
    if (code == RPC_CANCELLED && !c->cancelled && time_left_s(c->details.deadline) <= 0) {
        code = RPC_DEADLINE_EXCEEDED;
        msg = "deadline exceeded";
    }
    c->code = code;
    c->msg = strdup(msg ? msg : "");
    if (!c->send_busy && !c->status_started) start_status_locked(c);
}

/* A status the server decides itself (no handler holds the call). */
static void server_finish(rpc_call *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void server_finish(rpc_call *c, int code, const char *fmt, ...) {
    char buf[ST_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&c->mu);
    finish_locked(c, code, buf);
    pthread_mutex_unlock(&c->mu);
}

/* ------------------------------------------------------------------ public call API */

int rpc_call_send(rpc_call *c, const void *msg, size_t len) {
    pthread_mutex_lock(&c->mu);
    if (c->finishing || c->cancelled || atomic_load(&c->srv->stopping) ||
        (c->m->kind == RPC_KIND_UNARY && c->n_sent >= 1)) {
        pthread_mutex_unlock(&c->mu);
        return -1;
    }
    grpc_slice sl = grpc_slice_from_copied_buffer(msg ? (const char *)msg : "", len);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    int rc = 0;
    c->n_sent++;
    if (c->send_busy) {
        outmsg *o = malloc(sizeof *o);
        if (!o) {
            grpc_byte_buffer_destroy(bb);
            c->n_sent--;
            rc = -1;
        } else {
            o->bb = bb;
            o->next = NULL;
            if (c->tail) c->tail->next = o;
            else c->head = o;
            c->tail = o;
        }
    } else {
        rc = start_send_locked(c, bb);
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

void rpc_call_finish(rpc_call *c, int code, const char *msg) {
    pthread_mutex_lock(&c->mu);
    if (c->finishing) {
        pthread_mutex_unlock(&c->mu);
        ST_ERROR("rpc: %s finished twice (ignored)", c->method);
        return;
    }
    finish_locked(c, code, msg);
    bool dead = unref_locked(c); /* the handler's reference */
    pthread_mutex_unlock(&c->mu);
    if (dead) call_free(c);
}

void rpc_call_finishf(rpc_call *c, int code, const char *fmt, ...) {
    char buf[ST_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    rpc_call_finish(c, code, buf);
}

/* A unary reply in one batch (initial metadata, message and OK status): one
 * write on the connection and one completion, where send + finish take two
 * of each. The deadline rule of start_status_locked holds: past it, the
 * client gets DEADLINE_EXCEEDED and no message. */
static bool reply_one_batch_locked(rpc_call *c, const void *msg, size_t len) {
    if (c->finishing || c->cancelled || atomic_load(&c->srv->stopping) || c->m->kind != RPC_KIND_UNARY ||
        c->n_sent || c->send_busy || c->md_sent)
        return false;
    if (time_left_s(c->details.deadline) <= 0) {
        c->finishing = true;
        c->code = RPC_DEADLINE_EXCEEDED;
        c->msg = strdup("deadline exceeded before the reply was complete");
        start_status_locked(c);
        return true;
    }
    grpc_slice sl = grpc_slice_from_copied_buffer(msg ? (const char *)msg : "", len);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    c->status_details = grpc_empty_slice();
    c->has_details = true;
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = bb;
    ops[2].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[2].data.send_status_from_server.status = GRPC_STATUS_OK;
    ops[2].data.send_status_from_server.status_details = &c->status_details;
    c->finishing = true;
    c->status_started = true;
    c->code = RPC_OK;
    c->n_sent = 1;
    c->refs++;
    if (grpc_call_start_batch(c->call, ops, 3, &c->t_status, NULL) != GRPC_CALL_OK) {
        ST_WARN("rpc: %s: cannot send the reply", c->method);
        c->refs--;
        grpc_byte_buffer_destroy(bb);
        c->cancelled = true;
        return true;
    }
    c->md_sent = true;
    c->sending = bb; /* freed with the call (call_free) */
    return true;
}

void rpc_call_reply(rpc_call *c, const void *msg, size_t len) {
    pthread_mutex_lock(&c->mu);
    if (reply_one_batch_locked(c, msg, len)) {
        bool dead = unref_locked(c); /* the handler's reference */
        pthread_mutex_unlock(&c->mu);
        if (dead) call_free(c);
        return;
    }
    pthread_mutex_unlock(&c->mu);
    if (rpc_call_send(c, msg, len) != 0) {
        rpc_call_finish(c, RPC_CANCELLED, "call cancelled before the reply");
        return;
    }
    rpc_call_finish(c, RPC_OK, NULL);
}

bool rpc_call_cancelled(rpc_call *c) {
    pthread_mutex_lock(&c->mu);
    bool v = c->cancelled;
    pthread_mutex_unlock(&c->mu);
    return v || atomic_load(&c->srv->stopping) || time_left_s(c->details.deadline) <= 0;
}

double rpc_call_time_left(rpc_call *c) {
    return time_left_s(c->details.deadline);
}

const char *rpc_call_method(rpc_call *c) {
    return c->method;
}

const rpc_peer *rpc_call_peer(rpc_call *c) {
    return &c->peer;
}

/* ------------------------------------------------------------------ completions (rpc thread) */

static const method_entry *find_method(const rpc_server *s, const char *name) {
    for (size_t i = 0; i < s->n_methods; i++)
        if (strcmp(s->methods[i].name, name) == 0) return &s->methods[i];
    return NULL;
}

static void request_next(rpc_server *s) {
    if (atomic_load(&s->stopping)) return;
    rpc_call *c = call_new(s);
    if (!c) {
        ST_ERROR("rpc: out of memory: not accepting calls");
        return;
    }
    grpc_call_error e = grpc_server_request_call(s->server, &c->call, &c->details, &c->md,
                                                 s->cq, s->cq, &c->t_new);
    if (e != GRPC_CALL_OK) {
        ST_ERROR("rpc: grpc_server_request_call failed (%d)", (int)e);
        call_free(c);
        return;
    }
    s->pending = c;
}

/* The caller's address and, over TLS, its verified certificate's CN. */
static void read_peer(rpc_call *c) {
    char *p = grpc_call_get_peer(c->call);
    snprintf(c->peer.addr, sizeof c->peer.addr, "%s", p ? p : "");
    gpr_free(p);
    grpc_auth_context *ctx = grpc_call_auth_context(c->call);
    if (!ctx) return;
    c->peer.authenticated = grpc_auth_context_peer_is_authenticated(ctx) != 0;
    grpc_auth_property_iterator it = grpc_auth_context_find_properties_by_name(ctx, GRPC_X509_CN_PROPERTY_NAME);
    const grpc_auth_property *prop = grpc_auth_property_iterator_next(&it);
    if (prop && prop->value_length < sizeof c->peer.cn && !memchr(prop->value, 0, prop->value_length)) {
        memcpy(c->peer.cn, prop->value, prop->value_length);
        c->peer.cn[prop->value_length] = 0;
    }
    /* A second CN would make the identity ambiguous: refuse it. */
    if (prop && grpc_auth_property_iterator_next(&it)) c->peer.cn[0] = 0;
    if (!c->peer.cn[0]) c->peer.authenticated = false;
    grpc_auth_context_release(ctx);
}

static void on_new(rpc_server *s, rpc_call *c) {
    char *m = grpc_slice_to_c_string(c->details.method);
    c->method = strdup(m ? m : "");
    gpr_free(m);
    read_peer(c);
    c->m = find_method(s, c->method);
    pthread_mutex_lock(&s->mu);
    s->live++;
    pthread_mutex_unlock(&s->mu);
    c->counted = true;

    pthread_mutex_lock(&c->mu);
    c->refs = 1; /* held by this function */
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->close_cancelled;
    c->refs++;
    if (grpc_call_start_batch(c->call, &op, 1, &c->t_close, NULL) != GRPC_CALL_OK) c->refs--;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->recv;
    c->refs++;
    if (grpc_call_start_batch(c->call, &op, 1, &c->t_recv, NULL) != GRPC_CALL_OK) {
        c->refs--;
        finish_locked(c, RPC_INTERNAL, "cannot receive the request");
    }
    bool dead = unref_locked(c);
    pthread_mutex_unlock(&c->mu);
    if (dead) call_free(c);
}

static void on_recv(rpc_server *s, rpc_call *c, int success) {
    if (s->tls && !c->peer.authenticated) {
        ST_INFO("rpc: %s from %s: no client certificate: UNAUTHENTICATED", c->method, c->peer.addr);
        server_finish(c, RPC_UNAUTHENTICATED,
                      "%s: this server requires a client certificate issued by the cluster CA "
                      "(docs/security.md)", c->method);
    } else if (!c->m) {
        server_finish(c, RPC_UNIMPLEMENTED, "unknown method %s", c->method);
    } else if (!success || !c->recv) {
        server_finish(c, RPC_INVALID_ARGUMENT, "%s: no request message", c->method);
    } else if (time_left_s(c->details.deadline) <= 0) {
        server_finish(c, RPC_DEADLINE_EXCEEDED, "%s: deadline exceeded before dispatch",
                      c->method);
    } else {
        grpc_byte_buffer_reader r;
        if (!grpc_byte_buffer_reader_init(&r, c->recv)) {
            server_finish(c, RPC_INTERNAL, "%s: cannot read the request", c->method);
        } else {
            grpc_slice sl = grpc_byte_buffer_reader_readall(&r);
            grpc_byte_buffer_reader_destroy(&r);
            rpc_request req = {
                .method = c->method,
                .bytes = GRPC_SLICE_START_PTR(sl),
                .len = GRPC_SLICE_LENGTH(sl),
                .msg = NULL,
            };
            ProtobufCMessage *pm = NULL;
            if (c->m->request) {
                pm = protobuf_c_message_unpack(c->m->request, NULL, req.len, req.bytes);
                req.msg = pm;
            }
            if (c->m->request && !pm) {
                server_finish(c, RPC_INVALID_ARGUMENT, "malformed %s (%zu bytes)",
                              c->m->request->name, req.len);
            } else {
                pthread_mutex_lock(&c->mu);
                c->refs++; /* the handler's reference, dropped by rpc_call_finish */
                pthread_mutex_unlock(&c->mu);
                c->m->fn(c, &req, c->m->ud);
            }
            if (pm) protobuf_c_message_free_unpacked(pm, NULL);
            grpc_slice_unref(sl);
        }
    }
    unref(c); /* the RECV batch */
}

static void on_send(rpc_call *c, int success) {
    pthread_mutex_lock(&c->mu);
    grpc_byte_buffer_destroy(c->sending);
    c->sending = NULL;
    c->send_busy = false;
    if (!success) c->cancelled = true;
    if (c->cancelled) drop_queue(c);
    while (c->head && !c->send_busy) {
        outmsg *o = c->head;
        c->head = o->next;
        if (!c->head) c->tail = NULL;
        grpc_byte_buffer *bb = o->bb;
        free(o);
        if (start_send_locked(c, bb) != 0) drop_queue(c);
    }
    if (!c->send_busy && c->finishing && !c->status_started) start_status_locked(c);
    bool dead = unref_locked(c);
    pthread_mutex_unlock(&c->mu);
    if (dead) call_free(c);
}

static void on_close(rpc_call *c) {
    pthread_mutex_lock(&c->mu);
    if (c->close_cancelled) c->cancelled = true;
    bool dead = unref_locked(c);
    pthread_mutex_unlock(&c->mu);
    if (dead) call_free(c);
}

static void maybe_shutdown_cq(rpc_server *s) {
    if (!s->shutdown_done || s->pending || s->cq_shut) return;
    pthread_mutex_lock(&s->mu);
    int live = s->live;
    pthread_mutex_unlock(&s->mu);
    if (live == 0) {
        grpc_completion_queue_shutdown(s->cq);
        s->cq_shut = true;
    }
}

static void *server_thread(void *arg) {
    rpc_server *s = arg;
    for (;;) {
        gpr_timespec dl = atomic_load(&s->stopping)
                              ? gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                             gpr_time_from_millis(50, GPR_TIMESPAN))
                              : gpr_inf_future(GPR_CLOCK_MONOTONIC);
        grpc_event ev = grpc_completion_queue_next(s->cq, dl, NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
        if (ev.type == GRPC_OP_COMPLETE) {
            rpc_tag *t = ev.tag;
            rpc_call *c = t->call;
            switch (t->kind) {
            case TAG_NEW:
                s->pending = NULL;
                if (ev.success) {
                    request_next(s);
                    on_new(s, c);
                } else {
                    call_free(c); /* the server is shutting down */
                }
                break;
            case TAG_SHUTDOWN: s->shutdown_done = true; break;
            case TAG_CLOSE: on_close(c); break;
            case TAG_RECV: on_recv(s, c, ev.success); break;
            case TAG_SEND: on_send(c, ev.success); break;
            case TAG_STATUS: unref(c); break;
            }
        }
        maybe_shutdown_cq(s);
    }
    return NULL;
}

/* ------------------------------------------------------------------ server */

/* gRPC asks at every TLS handshake: new files, if they changed (rotation
 * without a restart, docs/security.md). */
static grpc_ssl_certificate_config_reload_status fetch_certs(void *ud, grpc_ssl_server_certificate_config **config) {
    rpc_tls_pem pem;
    if (rpc_tls_watch_poll(ud, &pem) != 1) return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
    grpc_ssl_pem_key_cert_pair pair = {.private_key = pem.key, .cert_chain = pem.cert};
    *config = grpc_ssl_server_certificate_config_create(pem.ca, &pair, 1);
    rpc_tls_pem_free(&pem);
    return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
}

/* The server's credentials: plaintext, or mutual TLS with tls's files
 * (checked here once so that a wrong file is a start-up error). */
static grpc_server_credentials *server_creds(rpc_server *s, const rpc_tls *tls, st_err *err) {
    if (!tls) return grpc_insecure_server_credentials_create();
    rpc_tls_pem pem;
    if (rpc_tls_load(tls, &pem, err) != 0) return NULL;
    rpc_tls_pem_free(&pem);
    if (!(s->watch = rpc_tls_watch_new(tls))) return st_errf(err, "rpc: out of memory"), NULL;
    /* Request a certificate and verify it when given, but let the handshake
     * finish without one: the call then gets UNAUTHENTICATED from on_recv,
     * which tells the client what is missing. */
    grpc_ssl_server_credentials_options *o = grpc_ssl_server_credentials_create_options_using_config_fetcher(
        GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY, fetch_certs, s->watch);
    grpc_server_credentials *c = o ? grpc_ssl_server_credentials_create_with_options(o) : NULL;
    if (!c) st_errf(err, "rpc: gRPC refused the TLS credentials (%s, %s)", tls->cert, tls->key);
    return c;
}

rpc_server *rpc_server_create(const char *addr, const rpc_tls *tls, st_err *err) {
    if (!addr || !*addr) {
        st_errf(err, "rpc: empty listen address");
        return NULL;
    }
    rpc_server *s = calloc(1, sizeof *s);
    if (!s) {
        st_errf(err, "rpc: out of memory");
        return NULL;
    }
    rpc_log_install();
    rpc_absl_debug_off();
    grpc_init();
    grpc_server_credentials *creds = server_creds(s, tls, err);
    if (!creds) {
        rpc_tls_watch_free(s->watch);
        free(s);
        grpc_shutdown();
        return NULL;
    }
    s->tls = tls != NULL;
    pthread_mutex_init(&s->mu, NULL);
    atomic_init(&s->stopping, false);
    s->t_shutdown = (rpc_tag){TAG_SHUTDOWN, NULL};
    s->cq = grpc_completion_queue_create_for_next(NULL);
    /* gRPC turns SO_REUSEPORT on by default: two servers could then share a
     * port silently. A busy port must be an error.
     * A control plane's calls are small and frequent (a fleet's heartbeats,
     * docs/control-api.md "What a heartbeat costs"), so two per-call costs go:
     * BDP probing (a ping, its ack and a timer on the timer thread after reads,
     * to size windows for bulk transfers we do not make), and the deadline
     * filter's timer per call (this file enforces deadlines itself: a call is
     * not dispatched past its deadline, OK is never sent after it, and
     * rpc_call_cancelled turns true at it; the client's own deadline cancels
     * the stream, which RECV_CLOSE_ON_SERVER reports). */
    grpc_arg a[] = {
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_ALLOW_REUSEPORT, .value.integer = 0},
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_HTTP2_BDP_PROBE, .value.integer = 0},
        {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_ENABLE_DEADLINE_CHECKS, .value.integer = 0},
    };
    grpc_channel_args args = {.num_args = sizeof a / sizeof a[0], .args = a};
    s->server = grpc_server_create(&args, NULL);
    grpc_server_register_completion_queue(s->server, s->cq, NULL);
    s->port = grpc_server_add_http2_port(s->server, addr, creds);
    grpc_server_credentials_release(creds);
    if (s->port == 0) {
        st_errf(err, "rpc: cannot listen on %s (address in use or invalid)", addr);
        rpc_server_destroy(s);
        return NULL;
    }
    return s;
}

int rpc_server_add_method(rpc_server *s, const rpc_method *m, st_err *err) {
    if (s->started) return st_errf(err, "rpc: add_method after start");
    if (!m || !m->name || m->name[0] != '/' || !m->handler)
        return st_errf(err, "rpc: a method needs a \"/pkg.Service/Method\" name and a handler");
    if (find_method(s, m->name)) return st_errf(err, "rpc: method %s registered twice", m->name);
    method_entry *nm = realloc(s->methods, (s->n_methods + 1) * sizeof *nm);
    if (!nm) return st_errf(err, "rpc: out of memory");
    s->methods = nm;
    method_entry *e = &s->methods[s->n_methods];
    e->name = strdup(m->name);
    if (!e->name) return st_errf(err, "rpc: out of memory");
    e->kind = m->kind;
    e->fn = m->handler;
    e->ud = m->ud;
    e->request = m->request;
    s->n_methods++;
    return 0;
}

int rpc_server_start(rpc_server *s, st_err *err) {
    if (s->started) return st_errf(err, "rpc: server already started");
    grpc_server_start(s->server);
    request_next(s);
    if (!s->pending) return st_errf(err, "rpc: cannot request calls");
    if (pthread_create(&s->thread, NULL, server_thread, s) != 0) {
        return st_errf(err, "rpc: cannot start the rpc thread");
    }
    s->started = true;
    ST_DEBUG("rpc: serving %zu methods on port %d", s->n_methods, s->port);
    return 0;
}

int rpc_server_port(const rpc_server *s) {
    return s->port;
}

void rpc_server_destroy(rpc_server *s) {
    if (!s) return;
    atomic_store(&s->stopping, true);
    grpc_server_shutdown_and_notify(s->server, s->cq, &s->t_shutdown);
    grpc_server_cancel_all_calls(s->server);
    if (s->started) {
        pthread_join(s->thread, NULL);
    } else {
        /* No rpc thread: drain the queue here (shutdown tag, pending request). */
        for (;;) {
            grpc_event ev = grpc_completion_queue_next(
                s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
            if (ev.type != GRPC_OP_COMPLETE) break;
            rpc_tag *t = ev.tag;
            if (t->kind == TAG_NEW) {
                call_free(t->call);
                s->pending = NULL;
            } else if (t->kind == TAG_SHUTDOWN) {
                s->shutdown_done = true;
            }
            if (s->shutdown_done && !s->pending) break;
        }
        grpc_completion_queue_shutdown(s->cq);
        while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL)
                   .type != GRPC_QUEUE_SHUTDOWN) {
        }
    }
    grpc_server_destroy(s->server);
    grpc_completion_queue_destroy(s->cq);
    rpc_tls_watch_free(s->watch); /* after the server: its credentials call the fetcher */
    for (size_t i = 0; i < s->n_methods; i++) free(s->methods[i].name);
    free(s->methods);
    pthread_mutex_destroy(&s->mu);
    free(s);
    grpc_shutdown();
}
