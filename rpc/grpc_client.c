/* grpc_client.c — the gRPC client of grpc_client.h: one channel (plaintext
 * or mutual TLS); blocking unary / server-streaming calls, one pluck
 * completion queue per call; asynchronous unary calls on the caller's queue.
 */
#include "rpc/grpc_client.h"
#include "rpc/grpc_absl.h"
#include "rpc/grpc_log.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct rpc_client {
    grpc_channel *ch;
    char *target;
};

/* Plaintext, or mutual TLS with tls's files. */
static grpc_channel_credentials *channel_creds(const rpc_tls *tls, st_err *err) {
    if (!tls) return grpc_insecure_credentials_create();
    rpc_tls_pem pem;
    if (rpc_tls_load(tls, &pem, err) != 0) return NULL;
    grpc_ssl_pem_key_cert_pair pair = {.private_key = pem.key, .cert_chain = pem.cert};
    /* Default verification: the chain to pem.ca and the target's host name. */
    grpc_channel_credentials *c = grpc_ssl_credentials_create(pem.ca, &pair, NULL, NULL);
    rpc_tls_pem_free(&pem);
    if (!c) st_errf(err, "rpc: gRPC refused the TLS credentials (%s, %s)", tls->cert, tls->key);
    return c;
}

/* own_connection: a TCP connection of its own (no global subchannel pool),
 * no retry machinery. small_calls: no BDP probing either. */
static rpc_client *create(const char *target, const rpc_tls *tls, bool own_connection, bool small_calls,
                          st_err *err) {
    if (!target || !*target) {
        st_errf(err, "rpc: empty server address");
        return NULL;
    }
    rpc_client *c = calloc(1, sizeof *c);
    if (!c || !(c->target = strdup(target))) {
        free(c);
        st_errf(err, "rpc: out of memory");
        return NULL;
    }
    rpc_log_install();
    rpc_absl_debug_off();
    grpc_init();
    grpc_channel_credentials *creds = channel_creds(tls, err);
    if (!creds) {
        free(c->target);
        free(c);
        grpc_shutdown();
        return NULL;
    }
    /* gRPC's default 4 MiB cap on a received message would make ListNodes
     * fail somewhere past 30k nodes (about 120 bytes each); the limit is
     * RPC_CLIENT_MAX_REPLY (grpc_client.h), reported as RESOURCE_EXHAUSTED. */
    grpc_arg a[4];
    size_t n = 0;
    a[n++] = (grpc_arg){.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
                        .value.integer = RPC_CLIENT_MAX_REPLY};
    if (own_connection)
        a[n++] = (grpc_arg){.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL,
                            .value.integer = 1};
    if (own_connection || small_calls)
        a[n++] = (grpc_arg){.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_ENABLE_RETRIES, .value.integer = 0};
    /* BDP probing pings the server whenever a reply arrives, to grow the
     * flow-control window for large transfers; for a heartbeat it only costs
     * the coordinator a ping-ack write and a read per call. */
    if (small_calls)
        a[n++] = (grpc_arg){.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_HTTP2_BDP_PROBE, .value.integer = 0};
    grpc_channel_args args = {.num_args = n, .args = a};
    c->ch = grpc_channel_create(target, creds, &args);
    grpc_channel_credentials_release(creds);
    if (!c->ch) {
        st_errf(err, "rpc: cannot create a channel to %s", target);
        free(c->target);
        free(c);
        grpc_shutdown();
        return NULL;
    }
    return c;
}

rpc_client *rpc_client_create(const char *target, const rpc_tls *tls, st_err *err) {
    return create(target, tls, false, false, err);
}

rpc_client *rpc_client_create_small(const char *target, const rpc_tls *tls, st_err *err) {
    return create(target, tls, false, true, err);
}

rpc_client *rpc_client_create_own(const char *target, const rpc_tls *tls, st_err *err) {
    return create(target, tls, true, true, err);
}

void rpc_client_destroy(rpc_client *c) {
    if (!c) return;
    grpc_channel_destroy(c->ch);
    free(c->target);
    free(c);
    grpc_shutdown();
}

static void set_status(rpc_status *st, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_status(rpc_status *st, int code, const char *fmt, ...) {
    if (!st) return;
    st->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->msg, sizeof st->msg, fmt, ap);
    va_end(ap);
}

/* Copies a byte buffer into malloc'd memory (at least 1 byte allocated). */
static uint8_t *bb_to_bytes(grpc_byte_buffer *bb, size_t *len) {
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb)) return NULL;
    grpc_slice sl = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    size_t n = GRPC_SLICE_LENGTH(sl);
    uint8_t *out = malloc(n ? n : 1);
    if (out) {
        memcpy(out, GRPC_SLICE_START_PTR(sl), n);
        *len = n;
    }
    grpc_slice_unref(sl);
    return out;
}

/* The state of one call, shared by unary and streaming. */
typedef struct call_ctx {
    grpc_completion_queue *cq;
    bool own_cq; /* the blocking calls' pluck queue; else the caller's (rpc_client_start) */
    const char *method;
    grpc_call *call;
    gpr_timespec deadline;
    grpc_metadata_array md_initial, md_trailing;
    grpc_status_code status;
    grpc_slice details;
    grpc_byte_buffer *recv;
} call_ctx;

/* cq NULL: a pluck queue of the call's own. */
static int ctx_open(call_ctx *x, rpc_client *c, const char *method, double timeout_s,
                    grpc_completion_queue *cq, rpc_status *st) {
    memset(x, 0, sizeof *x);
    x->method = method;
    if (!method || method[0] != '/') {
        set_status(st, RPC_INVALID_ARGUMENT, "rpc: bad method name \"%s\"", method ? method : "");
        return -1;
    }
    x->own_cq = !cq;
    x->cq = cq ? cq : grpc_completion_queue_create_for_pluck(NULL);
    if (timeout_s > 0) {
        int64_t ms = (int64_t)(timeout_s * 1000.0 + 0.5);
        x->deadline = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                   gpr_time_from_millis(ms, GPR_TIMESPAN));
    } else {
        x->deadline = gpr_inf_future(GPR_CLOCK_MONOTONIC);
    }
    grpc_slice m = grpc_slice_from_copied_string(method);
    x->call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, x->cq, m, NULL,
                                       x->deadline, NULL);
    grpc_slice_unref(m);
    grpc_metadata_array_init(&x->md_initial);
    grpc_metadata_array_init(&x->md_trailing);
    x->details = grpc_empty_slice();
    if (!x->call) {
        set_status(st, RPC_INTERNAL, "rpc: cannot create a call to %s", method);
        return -1;
    }
    return 0;
}

/* Waits for tag. The core enforces the deadline; as a guard against a stuck
 * call we cancel it 5 s after the deadline and wait for the completion. */
static void ctx_wait(call_ctx *x, void *tag, int *success) {
    gpr_timespec guard = gpr_inf_future(GPR_CLOCK_MONOTONIC);
    if (gpr_time_cmp(x->deadline, gpr_inf_future(GPR_CLOCK_MONOTONIC)) != 0)
        guard = gpr_time_add(x->deadline, gpr_time_from_millis(5000, GPR_TIMESPAN));
    for (;;) {
        grpc_event ev = grpc_completion_queue_pluck(x->cq, tag, guard, NULL);
        if (ev.type == GRPC_OP_COMPLETE) {
            if (success) *success = ev.success;
            return;
        }
        grpc_call_cancel(x->call, NULL);
        guard = gpr_inf_future(GPR_CLOCK_MONOTONIC);
    }
}

static int ctx_close(call_ctx *x, rpc_status *st, int rc_if_ok) {
    int rc = -1;
    if (x->call) {
        if (x->status == GRPC_STATUS_OK && rc_if_ok == 0) {
            set_status(st, RPC_OK, "%s", "");
            rc = 0;
        } else if (x->status != GRPC_STATUS_OK) {
            char *d = grpc_slice_to_c_string(x->details);
            set_status(st, (int)x->status, "%s", d && *d ? d : rpc_code_name((int)x->status));
            gpr_free(d);
        }
        grpc_call_unref(x->call);
    }
    if (x->recv) grpc_byte_buffer_destroy(x->recv);
    grpc_slice_unref(x->details);
    grpc_metadata_array_destroy(&x->md_initial);
    grpc_metadata_array_destroy(&x->md_trailing);
    if (x->cq && x->own_cq) {
        grpc_completion_queue_shutdown(x->cq);
        while (grpc_completion_queue_pluck(x->cq, NULL, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL)
                   .type != GRPC_QUEUE_SHUTDOWN) {
        }
        grpc_completion_queue_destroy(x->cq);
    }
    return rc;
}

static grpc_byte_buffer *make_bb(const void *req, size_t len) {
    grpc_slice sl = grpc_slice_from_copied_buffer(req ? (const char *)req : "", len);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    return bb;
}

/* The unary call's one batch: send the request, receive the reply and the
 * status; tag comes back on x->cq when it is over. */
static grpc_call_error start_unary(call_ctx *x, grpc_byte_buffer *bb, void *tag) {
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &x->md_initial;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &x->recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &x->md_trailing;
    ops[5].data.recv_status_on_client.status = &x->status;
    ops[5].data.recv_status_on_client.status_details = &x->details;
    return grpc_call_start_batch(x->call, ops, 6, tag, NULL);
}

/* The outcome of a unary call that is over; closes x. */
static int unary_result(call_ctx *x, uint8_t **reply, size_t *reply_len, rpc_status *st) {
    int ok = -1;
    if (x->status == GRPC_STATUS_OK) {
        if (!x->recv) {
            set_status(st, RPC_INTERNAL, "rpc: %s: OK without a reply message", x->method);
            ctx_close(x, NULL, -1);
            return -1;
        }
        *reply = bb_to_bytes(x->recv, reply_len);
        if (!*reply) {
            set_status(st, RPC_INTERNAL, "rpc: %s: cannot read the reply", x->method);
            ctx_close(x, NULL, -1);
            return -1;
        }
        ok = 0;
    }
    return ctx_close(x, st, ok);
}

int rpc_client_unary(rpc_client *c, const char *method, const void *req, size_t req_len,
                     double timeout_s, uint8_t **reply, size_t *reply_len, rpc_status *st) {
    *reply = NULL;
    *reply_len = 0;
    call_ctx x;
    if (ctx_open(&x, c, method, timeout_s, NULL, st) != 0) return ctx_close(&x, NULL, -1);
    grpc_byte_buffer *bb = make_bb(req, req_len);
    int tag = 1;
    grpc_call_error e = start_unary(&x, bb, &tag);
    if (e != GRPC_CALL_OK) {
        grpc_byte_buffer_destroy(bb);
        set_status(st, RPC_INTERNAL, "rpc: %s: cannot start the call (%d)", method, (int)e);
        ctx_close(&x, NULL, -1);
        return -1;
    }
    ctx_wait(&x, &tag, NULL);
    grpc_byte_buffer_destroy(bb);
    return unary_result(&x, reply, reply_len, st);
}

struct rpc_async {
    call_ctx x;
    grpc_byte_buffer *bb; /* the request: the core may use it until the call is over */
};

rpc_async *rpc_client_start(rpc_client *c, grpc_completion_queue *cq, const char *method,
                            const void *req, size_t req_len, double timeout_s, void *tag, rpc_status *st) {
    rpc_async *a = malloc(sizeof *a);
    if (!a) {
        set_status(st, RPC_RESOURCE_EXHAUSTED, "rpc: out of memory");
        return NULL;
    }
    if (ctx_open(&a->x, c, method, timeout_s, cq, st) != 0) {
        ctx_close(&a->x, NULL, -1);
        free(a);
        return NULL;
    }
    a->bb = make_bb(req, req_len);
    grpc_call_error e = start_unary(&a->x, a->bb, tag);
    if (e != GRPC_CALL_OK) {
        set_status(st, RPC_INTERNAL, "rpc: %s: cannot start the call (%d)", method, (int)e);
        grpc_byte_buffer_destroy(a->bb);
        ctx_close(&a->x, NULL, -1);
        free(a);
        return NULL;
    }
    return a;
}

int rpc_async_finish(rpc_async *a, uint8_t **reply, size_t *reply_len, rpc_status *st) {
    *reply = NULL;
    *reply_len = 0;
    grpc_byte_buffer_destroy(a->bb);
    int rc = unary_result(&a->x, reply, reply_len, st);
    free(a);
    return rc;
}

void rpc_async_cancel(rpc_async *a) {
    grpc_call_cancel(a->x.call, NULL);
}

int rpc_client_stream(rpc_client *c, const char *method, const void *req, size_t req_len,
                      double timeout_s, rpc_stream_fn on_msg, void *ud, rpc_status *st) {
    call_ctx x;
    if (ctx_open(&x, c, method, timeout_s, NULL, st) != 0) return ctx_close(&x, NULL, -1);
    grpc_byte_buffer *bb = make_bb(req, req_len);
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &x.md_initial;
    int tag_start = 1, tag_msg = 2, tag_status = 3;
    if (grpc_call_start_batch(x.call, ops, 4, &tag_start, NULL) != GRPC_CALL_OK) {
        grpc_byte_buffer_destroy(bb);
        set_status(st, RPC_INTERNAL, "rpc: %s: cannot start the call", method);
        ctx_close(&x, NULL, -1);
        return -1;
    }
    ctx_wait(&x, &tag_start, NULL);
    grpc_byte_buffer_destroy(bb);

    bool cancelled_by_us = false;
    for (;;) {
        memset(ops, 0, sizeof ops);
        ops[0].op = GRPC_OP_RECV_MESSAGE;
        ops[0].data.recv_message.recv_message = &x.recv;
        if (grpc_call_start_batch(x.call, ops, 1, &tag_msg, NULL) != GRPC_CALL_OK) break;
        int success = 0;
        ctx_wait(&x, &tag_msg, &success);
        if (!success || !x.recv) break;
        size_t n = 0;
        uint8_t *m = bb_to_bytes(x.recv, &n);
        grpc_byte_buffer_destroy(x.recv);
        x.recv = NULL;
        int stop = m ? on_msg(m, n, ud) : 1;
        free(m);
        if (stop) {
            grpc_call_cancel(x.call, NULL);
            cancelled_by_us = true;
            break;
        }
    }
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[0].data.recv_status_on_client.trailing_metadata = &x.md_trailing;
    ops[0].data.recv_status_on_client.status = &x.status;
    ops[0].data.recv_status_on_client.status_details = &x.details;
    if (grpc_call_start_batch(x.call, ops, 1, &tag_status, NULL) != GRPC_CALL_OK) {
        set_status(st, RPC_INTERNAL, "rpc: %s: cannot receive the status", method);
        ctx_close(&x, NULL, -1);
        return -1;
    }
    ctx_wait(&x, &tag_status, NULL);
    if (cancelled_by_us && x.status == GRPC_STATUS_OK) x.status = GRPC_STATUS_CANCELLED;
    return ctx_close(&x, st, 0);
}
