/* transport.h — the activation data plane: frames (protobuf header + tensor
 * payload, ib/frame.h) between stages and the coordinator, over UCX (ucp).
 *
 * One xport per process, on a libevent event_base: it owns a ucp context
 * (features AM + WAKEUP), one ucp worker whose progress is driven by the loop
 * (ucp_worker_get_efd + ucp_worker_arm), an optional listener, and the peers.
 * Transports come from UCX's environment (UCX_TLS, UCX_NET_DEVICES, ...):
 * nothing here names TCP, so the same code runs over RDMA on IB/RoCE. The wire
 * format is in docs/protocol.md.
 *
 * Adaptive polling: the loop learns the gap from the last data frame (batch
 * id != 0) it sent or delivered to the next data frame's arrival, and spins
 * on the worker over a window around the expected arrival, woken by a timer
 * shortly before it, instead of sleeping until the frame wakes it (a wake-up
 * of an idle CPU costs 100+ us on a VM). At most one spin per gap, of at most
 * STRATA_XPORT_POLL_US=N us (0..10000; default 0 = never spin, always
 * sleep in epoll); xport_stats counts the spins, their CPU time and hits.
 * docs/protocol.md, "Polling".
 *
 * Threading: single-threaded; every call and every callback happens on the
 * event_base's thread. Callbacks are never called from inside an xport_*
 * call; they run from the loop.
 *
 * Peers: every peer that is reported by on_connect gets exactly one
 * on_disconnect (peer failure, a malformed frame from it, xport_peer_close, or
 * a failed outbound connect); after on_disconnect returns, the handle is
 * invalid. All send callbacks of a peer run before its on_disconnect.
 *
 * Frames from one peer are delivered in the order they were sent. A frame
 * that fails to decode or validate (frame_validate) is logged and dropped and
 * its sender is disconnected. Epoch checks are the caller's business.
 *
 * Errors: -1 / NULL with a one-line message in the caller's st_err.
 */
#ifndef STRATA_IB_TRANSPORT_H
#define STRATA_IB_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "ib/cluster_key.h"
#include "ib/frame.h"

struct event_base;

typedef struct xport xport;
typedef struct xport_peer xport_peer;
typedef struct xport_mem xport_mem;

typedef struct xport_callbacks {
    /* A peer is up: inbound (accepted by the listener) or outbound (endpoint
     * created by xport_connect; a connect that then fails is reported with
     * on_disconnect). May be NULL. */
    void (*on_connect)(xport_peer *peer, bool inbound, void *ud);
    /* The peer is gone; reason is a short text. May be NULL. */
    void (*on_disconnect)(xport_peer *peer, const char *reason, void *ud);
    /* A valid frame. hdr and payload (payload_bytes bytes, row-major
     * [hdr->shape[0], hdr->shape[1]] of hdr->dtype; NULL when 0 bytes) are
     * valid until the callback returns; copy what you keep. */
    void (*on_frame)(xport_peer *peer, const frame_header *hdr, const void *payload,
                     size_t payload_bytes, void *ud);
    void *ud;
} xport_callbacks;

/* Completion of xport_send: status 0 = sent (handed to the peer's UCX),
 * -1 = failed or cancelled (peer gone). Called exactly once, from the loop. */
typedef void (*xport_send_cb)(xport_peer *peer, int status, void *arg);

/* Creates the transport on base. With listen_host non-NULL, listens on
 * listen_host:listen_port (port 0 = ephemeral; see xport_port). cb is copied. */
xport *xport_create(struct event_base *base, const char *listen_host, int listen_port,
                    const xport_callbacks *cb, st_err *err);
/* Closes every peer (no on_disconnect; pending send callbacks run, with -1
 * unless already completed),
 * the listener, the worker and the context. Not from inside a callback. */
void xport_destroy(xport *x);

/* What a process is on the data plane, proven in the handshake. */
enum xport_role { XPORT_ROLE_NONE = 0, XPORT_ROLE_COORDINATOR = 1, XPORT_ROLE_STAGE = 2 };

/* Authentication (docs/security.md, docs/protocol.md "Handshake"). Call right
 * after xport_create, before the loop runs. From then on every peer, inbound
 * or outbound, must prove the cluster key in a mutual HMAC-SHA256
 * challenge-response (fresh random nonces from both sides; each proof binds
 * both nonces, both roles and its direction) before on_connect reports it:
 *   - frames from a peer that has not proven it are dropped unread and
 *     counted (xport_stats.unauth_frames), logged at most once a second;
 *   - a peer that fails the handshake, or has not finished it within
 *     timeout_s (<= 0: 5 s), is disconnected (xport_stats.auth_failures);
 *   - xport_send to an outbound peer still in the handshake is queued and
 *     sent once the listener proved the key too (failed with -1 if not).
 * key must outlive x; role is what this process is. Without this call the
 * transport is open to anyone who can connect (as a loopback-only test
 * setup is), and an outbound peer that asks for the handshake is refused
 * with a message naming the missing key. */
void xport_require_auth(xport *x, const cluster_key *key, enum xport_role role, double timeout_s);
/* The role the peer proved (XPORT_ROLE_NONE without authentication). */
enum xport_role xport_peer_role(const xport_peer *peer);
/* "coordinator", "stage" or "unauthenticated". */
const char *xport_role_name(enum xport_role role);

/* Sets the longest spin (as STRATA_XPORT_POLL_US does; 0 = never spin).
 * -1 + err outside [0, 10000] us. */
int xport_set_poll_us(xport *x, long us, st_err *err);
/* The longest spin now, us (0: polling off). */
long xport_poll_us(const xport *x);

/* The bound listening port, or 0 without a listener. */
int xport_port(const xport *x);
/* Whether this UCX context takes CUDA device memory (ucp_context_query's
 * memory_types has UCS_MEMORY_TYPE_CUDA): a UCX built with CUDA, as HPC-X
 * and MOFED ship it, with its cuda transports loaded. Debian's UCX 1.13 is
 * built without CUDA: false. (ib/act_transport.h uses it per boundary.) */
bool xport_memory_cuda(const xport *x);
/* The largest packed FrameHeader sent inline in the UCX AM header (the
 * worker's max AM header minus the 24-byte prefix); frames with a larger
 * header carry it in the data, and their payload is copied. */
size_t xport_max_inline_header(const xport *x);

/* Connects to host:port (numeric or resolvable; blocking resolve). Returns
 * the peer at once; on_connect follows from the loop. */
xport_peer *xport_connect(xport *x, const char *host, int port, st_err *err);
/* Disconnects the peer (pending sends fail); on_disconnect follows. */
void xport_peer_close(xport_peer *peer);
/* "host:port" of the remote side, for logs. */
const char *xport_peer_name(const xport_peer *peer);
void xport_peer_set_user(xport_peer *peer, void *user);
void *xport_peer_user(const xport_peer *peer);

/* Sends a frame: hdr is validated (frame_validate against payload_bytes) and
 * packed (copied) before return. payload (payload_bytes, may be 0/NULL) must
 * stay valid and unchanged until cb runs: it is sent without copying. When
 * mem is non-NULL, payload must lie inside it: UCX then uses the registered
 * memory handle (rendezvous reads it directly, RDMA on IB). Payloads up to
 * 128 KiB go eagerly, larger ones by rendezvous (UCX's choice instead when
 * UCX_RNDV_THRESH is set; docs/protocol.md, "Zero copy"). Returns 0 (cb
 * will run, may be NULL) or -1 (invalid frame / peer down / peer NULL, as a
 * caller's handle is after on_disconnect; cb will not run). */
int xport_send(xport_peer *peer, const frame_header *hdr, const void *payload,
               size_t payload_bytes, const xport_mem *mem, xport_send_cb cb, void *arg,
               st_err *err);
/* Like xport_send but sends hdr_bytes as the packed header without checking
 * it (for tests and tools that exercise the receiver's validation). */
int xport_send_raw(xport_peer *peer, const void *hdr_bytes, size_t hdr_len, const void *payload,
                   size_t payload_bytes, xport_send_cb cb, void *arg, st_err *err);

/* Registered memory for zero-copy sends (ucp_mem_map). register: the caller
 * keeps owning [ptr, ptr+len); alloc: a page-aligned buffer owned by the
 * xport_mem. unregister releases the registration (and the buffer if
 * allocated); not while a send from it is in flight. */
xport_mem *xport_mem_register(xport *x, void *ptr, size_t len, st_err *err);
xport_mem *xport_mem_alloc(xport *x, size_t len, st_err *err);
void *xport_mem_ptr(const xport_mem *m);
size_t xport_mem_len(const xport_mem *m);
/* Device memory (ib/act_transport.h "ucx-cuda"): [ptr, ptr+len) registered
 * as UCS_MEMORY_TYPE_CUDA (cuda false: as host memory; the test hook that
 * stands host memory in for a device, tests/backend/fake_gpu_module.c). A
 * send from it goes by rendezvous only, so the receiver always chooses where
 * it lands (xport_set_rx_sink); its FrameHeader must fit the AM header. The
 * caller keeps owning the memory. NULL + err on failure. */
xport_mem *xport_mem_register_device(xport *x, void *ptr, size_t len, bool cuda, st_err *err);

/* Where a rendezvous payload lands, asked on the loop thread once its
 * FrameHeader is decoded and validated: a registered region of at least
 * `bytes` (the payload is received at its start, with the region's memory
 * type), or NULL for the transport's own host buffers. A region handed out
 * is lent to the transport until `put` gives it back (the receive failed or
 * the peer went: delivered false) or on_frame is called with payload at its
 * start (delivered true, put called after on_frame returns). */
typedef struct xport_rx_sink {
    xport_mem *(*get)(xport_peer *peer, const frame_header *hdr, size_t bytes, void *arg);
    void (*put)(xport_mem *m, bool delivered, void *arg);
    void *arg;
} xport_rx_sink;
void xport_set_rx_sink(xport *x, const xport_rx_sink *sink);
void xport_mem_unregister(xport *x, xport_mem *m);

/* Counters since create. */
typedef struct xport_stats {
    uint64_t frames_sent, frames_recv, bytes_sent, bytes_recv;
    uint64_t rndv_recv;   /* frames whose payload came by rendezvous into the pool */
    uint64_t bad_frames;  /* dropped malformed frames (sender disconnected) */
    uint64_t peers_accepted, peers_lost;
    uint64_t unauth_frames;  /* frames dropped from peers that had not authenticated */
    uint64_t auth_failures;  /* handshakes that failed or timed out */
    uint64_t poll_spins;     /* spins run (adaptive polling: at most one per gap between data frames) */
    uint64_t poll_hits;      /* spins that found work (a frame taken without a wake-up) */
    uint64_t poll_spin_ns;   /* CPU time the spins took (the loop thread's), ns: what polling costs */
} xport_stats;
void xport_get_stats(const xport *x, xport_stats *out);

#endif
