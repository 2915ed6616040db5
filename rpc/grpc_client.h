/* grpc_client.h — a small blocking gRPC client on gRPC's C core (libgrpc):
 * unary and server-streaming calls over an HTTP/2 channel (plaintext, or
 * mutual TLS with the files of grpc_tls.h), with deadlines. Used by stratactl (cli/) and by workers (Register, Heartbeat).
 *
 * Messages are bytes: encode and decode them with protobuf-c in the caller.
 * Each call blocks the calling thread until the call is over (it plucks its
 * own completion queue); rpc_client_start runs a unary call asynchronously on
 * the caller's queue instead (one thread driving many channels: the fleet
 * simulator, bench/fleet_sim.c). One rpc_client may be used by several threads at
 * once (the gRPC channel is thread-safe; every call has its own queue).
 *
 * Status: every call returns 0 when the server answered OK, -1 otherwise, and
 * fills `st` (caller-owned, may be NULL) with the gRPC status code and message
 * either way. A server that cannot be reached gives UNAVAILABLE at once (calls
 * fail fast, they do not wait for the connection); a call still running at
 * its deadline gives DEADLINE_EXCEEDED. Over TLS, a failed handshake (the
 * server's certificate is not from our CA or does not name the target's host,
 * or the server refused ours) also gives UNAVAILABLE.
 */
#ifndef STRATA_RPC_GRPC_CLIENT_H
#define STRATA_RPC_GRPC_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "rpc/grpc_tls.h"
#include "rpc/rpc_code.h"

typedef struct rpc_client rpc_client;

/* The largest reply message a client accepts (bytes): 256 MiB, room for
 * ListNodes of about two million nodes. A bigger one fails the call with
 * RESOURCE_EXHAUSTED and gRPC's message naming both sizes. */
#define RPC_CLIENT_MAX_REPLY (256 << 20)

/* A channel to target ("host:port", "127.0.0.1:7070", "[::1]:7070", or any
 * gRPC target URI such as "dns:///coord:7070"). Connects lazily, on the first
 * call. tls NULL: plaintext; else mutual TLS: the server's certificate must
 * be issued by tls->ca and name the target's host (a DNS or IP subject
 * alternative name), and tls->cert / tls->key are our identity. NULL with a
 * message on a bad target or a wrong TLS file (rpc_tls_load). */
rpc_client *rpc_client_create(const char *target, const rpc_tls *tls, st_err *err);
/* As rpc_client_create, for a channel that carries only small unary calls at
 * a steady rate (a worker's Register/Heartbeat/Leave): no BDP probing (a
 * ping per reply, acked by the server: one write and one read of the
 * coordinator's per heartbeat) and no retry machinery. Large replies (a
 * stratactl ListNodes of thousands of nodes) want rpc_client_create. */
rpc_client *rpc_client_create_small(const char *target, const rpc_tls *tls, st_err *err);
/* As rpc_client_create_small, with a TCP connection of its own: gRPC otherwise
 * shares one connection among a process's channels to the same target (its
 * global subchannel pool), so that a process standing for many nodes would
 * open one connection for all of them (the fleet simulator's workers). Like
 * rpc_client_create_small, its calls skip gRPC's retry machinery (no retry
 * policy is ever configured, so nothing is retried either way; it only costs
 * client CPU per call: about 17% of the fleet simulator's). */
rpc_client *rpc_client_create_own(const char *target, const rpc_tls *tls, st_err *err);
/* Closes the channel. NULL is a no-op. */
void rpc_client_destroy(rpc_client *c);

/* One unary call of `method` ("/strata.v1.Control/GetStatus") with the
 * serialized request req[0..req_len). timeout_s > 0 sets the deadline
 * (seconds from now); <= 0 means none. On OK, *reply (malloc'd, free() it;
 * non-NULL even for an empty message) and *reply_len receive the reply. */
int rpc_client_unary(rpc_client *c, const char *method, const void *req, size_t req_len,
                     double timeout_s, uint8_t **reply, size_t *reply_len, rpc_status *st);

/* Called for each streamed message, in order; msg is valid until it returns.
 * Return 0 to go on, non-zero to cancel the call (the call then ends with
 * CANCELLED). */
typedef int (*rpc_stream_fn)(const uint8_t *msg, size_t len, void *ud);

/* One server-streaming call: sends the request, then calls on_msg for every
 * message until the server finishes; the final status goes to st. */
int rpc_client_stream(rpc_client *c, const char *method, const void *req, size_t req_len,
                      double timeout_s, rpc_stream_fn on_msg, void *ud, rpc_status *st);

/* ---- asynchronous unary calls ---- */

struct grpc_completion_queue;
typedef struct rpc_async rpc_async; /* one call in flight */

/* Starts one unary call as rpc_client_unary does, on cq, a completion queue
 * of the caller's (grpc_completion_queue_create_for_next), which returns tag
 * once the call is over (success or not, deadline included). method must
 * stay valid until rpc_async_finish (a string literal). NULL with st filled
 * when the call cannot start (then nothing comes back on cq). */
rpc_async *rpc_client_start(rpc_client *c, struct grpc_completion_queue *cq, const char *method,
                            const void *req, size_t req_len, double timeout_s, void *tag, rpc_status *st);
/* After cq returned the call's tag: the call's outcome as rpc_client_unary
 * gives it (0 and *reply on OK, -1 and st otherwise). Frees a. */
int rpc_async_finish(rpc_async *a, uint8_t **reply, size_t *reply_len, rpc_status *st);
/* Cancels a call in flight (it ends with CANCELLED; its tag still comes
 * back and it still needs rpc_async_finish). */
void rpc_async_cancel(rpc_async *a);

#endif
