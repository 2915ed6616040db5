/* grpc_loop.h — runs rpc_server handlers on the owner's libevent loop.
 *
 * The coordinator and the workers are single-threaded around one
 * event_base; the gRPC server dispatches on its own rpc thread. A bridge
 * closes that gap: methods registered through rpc_loop_add_method get a
 * trampoline on the rpc thread that copies the request, queues the call, and
 * wakes the loop through an eventfd (no evthread locking needed on the base;
 * one write per batch: a call queued behind others that the loop has not
 * taken yet rides on their wake-up).
 * The loop then calls the method's handler with the call, on the loop's
 * thread, unless the call's deadline passed while it was queued: then it is
 * answered DEADLINE_EXCEEDED without running the handler. The handler answers
 * at once or later (timers, other events) with the thread-safe rpc_call_*
 * functions of grpc_server.h.
 *
 * Priority: methods added with rpc_loop_add_urgent_method (the coordinator's
 * Heartbeat under --etcd; otherwise it answers heartbeats on the rpc thread,
 * coordinator/control/hb_inbox.h) have their own queue, drained before every ordinary call, so an
 * urgent call waits for at most the one ordinary handler that is running,
 * never behind a burst of queued ones (a fleet's cold start of Registers).
 * Ordinary calls run in arrival order. Both run on the loop's thread, so the
 * handlers share the loop's data without locks.
 *
 * Allocation: a request of up to 512 bytes is copied into a pooled job slot
 * and unpacked into that slot's arena, so a small call (a heartbeat) crosses
 * the bridge without malloc; gRPC core and rpc_call_reply still allocate
 * per call.
 *
 * Shutdown order (from the loop's thread):
 *   1. rpc_loop_close(b): finishes queued calls with UNAVAILABLE and refuses
 *      new ones the same way;
 *   2. finish every call your handlers still hold (e.g. open Generate
 *      streams), since rpc_server_destroy waits for them;
 *   3. rpc_server_destroy(server), then rpc_loop_destroy(b).
 * Errors: -1 / NULL with a one-line message in the caller's st_err.
 */
#ifndef STRATA_RPC_GRPC_LOOP_H
#define STRATA_RPC_GRPC_LOOP_H

#include "common/err.h"
#include "rpc/grpc_server.h"

struct event_base;

typedef struct rpc_loop rpc_loop;

/* A bridge onto base (the bridge's event lives there). */
rpc_loop *rpc_loop_create(struct event_base *base, st_err *err);

/* Like rpc_server_add_method, but m->handler runs on base's thread. The
 * rpc_request it gets is a copy, valid until the handler returns; its msg is
 * unpacked again with m->request when set. m->name is copied. */
int rpc_loop_add_method(rpc_loop *b, rpc_server *s, const rpc_method *m, st_err *err);

/* Like rpc_loop_add_method, but the method's calls jump the queue (see
 * Priority above). For short handlers only: each one delays every ordinary
 * call queued behind it. */
int rpc_loop_add_urgent_method(rpc_loop *b, rpc_server *s, const rpc_method *m, st_err *err);

/* What crossed the bridge, for tests and benchmarks (any thread): calls
 * queued, and the mallocs on their way: new job slots (the pool grows to the
 * most calls queued at once, then stays), copies of requests over 512 bytes,
 * unpacked messages that outgrew a slot's 1 KiB arena. */
typedef struct rpc_loop_stats {
    uint64_t calls, job_mallocs, bytes_mallocs, arena_mallocs;
} rpc_loop_stats;
void rpc_loop_get_stats(rpc_loop *b, rpc_loop_stats *out);

/* Finishes queued calls with UNAVAILABLE ("server stopping") and answers new
 * ones that way from now on. Idempotent. */
void rpc_loop_close(rpc_loop *b);

/* Closes (if not done) and frees the bridge. After rpc_server_destroy of every
 * server it feeds. NULL is a no-op. */
void rpc_loop_destroy(rpc_loop *b);

#endif
