/* grpc_server.h — a generic gRPC server on gRPC's C core (libgrpc).
 *
 * It owns: one grpc_server listening on an HTTP/2 port (plaintext, or mutual
 * TLS with the files of grpc_tls.h), one
 * completion queue, and ONE thread (the "rpc thread", started by
 * rpc_server_start) that runs the completion-queue loop. It dispatches calls
 * by full method name ("/strata.v1.Control/Register") to handlers registered
 * by the embedding program. It knows nothing of the messages: requests arrive
 * as bytes and replies leave as bytes, so protobuf-c stays in the caller
 * (optionally the server validates the request against a protobuf-c
 * descriptor first, see rpc_method).
 *
 * Call model (unary and server-streaming):
 *   - When a call's request message has arrived, the handler runs ON THE RPC
 *     THREAD with the call handle. It must not block for long: to run on the
 *     owner's event loop (the coordinator's libevent loop) it hands the call
 *     over (e.g. a locked queue + event_active) and returns at once.
 *   - Any thread may later answer through the thread-safe rpc_call_* API:
 *     rpc_call_send() pushes a message (once for unary, any number for
 *     streaming, delivered in order), then rpc_call_finish() ends the call with
 *     a gRPC status. rpc_call_reply() = send + finish(OK) for unary calls.
 *   - Every call handed to a handler must be finished exactly once, also when
 *     the client went away (rpc_call_cancelled()); the handle is invalid after
 *     rpc_call_finish returns.
 *
 * Errors the server produces itself (the handler is not called):
 *   UNAUTHENTICATED   with TLS: the client presented no certificate (one that
 *                     the CA does not verify fails the TLS handshake itself,
 *                     which the client sees as UNAVAILABLE);
 *   UNIMPLEMENTED     unknown method, with the method name;
 *   INVALID_ARGUMENT  no request message, or bytes that do not decode as the
 *                     method's request type (when it has a descriptor);
 *   DEADLINE_EXCEEDED the deadline passed before dispatch, or before an OK
 *                     finish (an OK status is never sent after the deadline);
 *   INTERNAL          a unary handler finished OK without a reply message.
 * The client also enforces its own deadline (gRPC core), so a slow handler
 * yields DEADLINE_EXCEEDED at the client whatever it answers.
 *
 * Transport settings (a control plane's calls are small and many): no HTTP/2
 * BDP probing and no deadline filter (no timer per call); the deadlines are
 * enforced here as listed above.
 *
 * Not covered: client streaming, compression, metadata, flow control of
 * rpc_call_send (messages queue in memory until the transport takes them).
 * Errors: -1 / NULL with a one-line message in the caller's st_err.
 */
#ifndef STRATA_RPC_GRPC_SERVER_H
#define STRATA_RPC_GRPC_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "rpc/grpc_tls.h"
#include "rpc/rpc_code.h"

struct ProtobufCMessageDescriptor;
struct ProtobufCMessage;

typedef struct rpc_server rpc_server;
typedef struct rpc_call rpc_call;

/* What a handler receives. Valid until the handler returns (copy what you
 * keep). */
typedef struct rpc_request {
    const char *method;              /* full name, "/strata.v1.Control/Register" */
    const uint8_t *bytes;            /* the serialized request message */
    size_t len;                      /* bytes; 0 is a valid (empty) message */
    const struct ProtobufCMessage *msg; /* unpacked with rpc_method.request, else NULL */
} rpc_request;

typedef void (*rpc_handler_fn)(rpc_call *call, const rpc_request *req, void *ud);

typedef enum rpc_kind {
    RPC_KIND_UNARY = 0,         /* exactly one reply message on OK */
    RPC_KIND_SERVER_STREAM = 1, /* zero or more reply messages */
} rpc_kind;

typedef struct rpc_method {
    const char *name;           /* full method name; copied */
    rpc_kind kind;
    rpc_handler_fn handler;
    void *ud;
    /* Optional protobuf-c descriptor of the request type: the server unpacks
     * the request with it and answers INVALID_ARGUMENT ("malformed
     * strata.v1.RegisterRequest (5 bytes)") instead of calling the handler
     * when it does not decode. NULL: the handler gets raw bytes only. */
    const struct ProtobufCMessageDescriptor *request;
} rpc_method;

/* Creates a server bound to addr ("127.0.0.1:0", "0.0.0.0:7070", "[::]:0";
 * port 0 = ephemeral, see rpc_server_port). Nothing runs until
 * rpc_server_start. tls NULL: plaintext. tls given (all three files,
 * rpc_tls_load checks them): mutual TLS; clients must present a certificate
 * issued by tls->ca, and every call's rpc_call_peer names it. The files are
 * checked here (a wrong one fails the creation) and read again at a new
 * connection when they changed (rpc_tls_watch_poll: rotation without a
 * restart). Fails when the address cannot be bound or a TLS file is wrong. */
rpc_server *rpc_server_create(const char *addr, const rpc_tls *tls, st_err *err);

/* Registers a method (before rpc_server_start). Fails on a duplicate name or
 * a missing handler. */
int rpc_server_add_method(rpc_server *s, const rpc_method *m, st_err *err);

/* Starts the gRPC server and the rpc thread. */
int rpc_server_start(rpc_server *s, st_err *err);

/* The bound TCP port. */
int rpc_server_port(const rpc_server *s);

/* Stops accepting calls, cancels the calls in flight (rpc_call_cancelled
 * turns true; rpc_call_send fails), waits until every handed-out call has been
 * finished by its owner and all gRPC work is done, joins the rpc thread and
 * frees everything. Callable before start. Never from a handler (the rpc
 * thread), and not from a thread that must still finish calls it holds:
 * finish them first. NULL is a no-op. */
void rpc_server_destroy(rpc_server *s);

/* ---- the call handle: every function below is thread-safe ---- */

/* Queues one reply message (copied) and returns 0; -1 (nothing sent) when the
 * call was cancelled, is already finishing, or is unary and already has its
 * reply. Messages go out in the order of the calls. */
int rpc_call_send(rpc_call *c, const void *msg, size_t len);

/* Ends the call with a status (msg: one line, may be NULL or ""; copied).
 * Queued messages go out first. Exactly once per handed call; the handle is
 * invalid afterwards. */
void rpc_call_finish(rpc_call *c, int code, const char *msg);
/* printf-style rpc_call_finish. */
void rpc_call_finishf(rpc_call *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Unary success: rpc_call_send(msg) then rpc_call_finish(OK), in one batch
 * (one write on the connection, one completion) when nothing was sent yet. */
void rpc_call_reply(rpc_call *c, const void *msg, size_t len);

/* True once the client cancelled, the deadline passed, the connection broke or
 * the server is stopping: stop producing and finish the call. */
bool rpc_call_cancelled(rpc_call *c);
/* Seconds left until the call's deadline (may be negative); a large value
 * (1e9) when the client set none. */
double rpc_call_time_left(rpc_call *c);
/* The full method name (valid while the handle is). */
const char *rpc_call_method(rpc_call *c);

/* Who is calling. With TLS every call that reaches a handler has
 * authenticated = true and the verified client certificate's subject CN
 * (the server answers UNAUTHENTICATED itself otherwise); on a plaintext
 * server authenticated is false and cn "". */
typedef struct rpc_peer {
    bool authenticated;  /* a client certificate verified against the CA */
    char cn[256];        /* its subject common name */
    char addr[96];       /* gRPC's peer string, "ipv4:127.0.0.1:40522" (for logs) */
} rpc_peer;
/* Valid while the handle is. */
const rpc_peer *rpc_call_peer(rpc_call *c);

#endif
