/* xport_auth.h — the data plane's authentication handshake
 * (docs/protocol.md, "Handshake"; docs/security.md): a mutual HMAC-SHA256
 * challenge-response over the cluster key, one state machine per peer.
 *
 * The handshake does no I/O of its own: it sends its 72-byte messages and
 * disconnects a peer through the callbacks of xauth_io, and is handed the
 * messages that arrive (xauth_receive). Everything runs on the loop thread,
 * except xauth_receive and xauth_drop_frame, which run inside UCX progress. */
#ifndef STRATA_IB_XPORT_AUTH_H
#define STRATA_IB_XPORT_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/log_limit.h"
#include "ib/cluster_key.h"
#include "ib/transport.h"

#define XAUTH_MSG_LEN 72 /* magic 4, type 1, role 1, zero 2, nonce 32, mac 32 */

/* Where a peer is in the handshake. AUTH_OFF: no key on this transport. */
enum xauth_state { AUTH_OFF, AUTH_SERVER_START, AUTH_WAIT_RESPONSE, AUTH_WAIT_CHALLENGE, AUTH_WAIT_CONFIRM,
                   AUTH_FAILED, AUTH_DONE };

/* What the handshake asks of the transport, for one peer. */
typedef struct xauth_io {
    /* Sends a handshake message of len bytes. 0, or -1 + err. */
    int (*send)(xport_peer *peer, const uint8_t *msg, size_t len, st_err *err);
    /* Disconnects the peer, with reason (at the transport's next drain). */
    void (*fail)(xport_peer *peer, const char *reason);
    /* Whether the peer is being disconnected. */
    bool (*failing)(const xport_peer *peer);
    /* The peer proved the key: the sends queued meanwhile go out. */
    void (*proven)(xport_peer *peer);
} xauth_io;

typedef struct xauth {
    const cluster_key *key; /* NULL: no authentication */
    enum xport_role role;   /* what this process is */
    double timeout_s;
    xauth_io io;
    st_log_limit unauth_lim, fail_lim; /* the warnings an outsider can cause: one a second */
    uint64_t unauth_frames, failures;  /* xport_stats' unauth_frames, auth_failures */
} xauth;

typedef struct xauth_peer {
    xport_peer *peer; /* the handle passed to xauth_io */
    const char *name; /* for logs */
    bool inbound;
    enum xauth_state state;
    enum xport_role role; /* proven by the peer */
    double deadline;
    uint8_t ns[CLUSTER_NONCE_LEN], nc[CLUSTER_NONCE_LEN]; /* the server's and the client's nonce */
    uint8_t in[XAUTH_MSG_LEN]; /* a received message, handled by xauth_step */
    bool in_ready;
} xauth_peer;

void xauth_init(xauth *a, const xauth_io *io);
/* xport_require_auth: key (NULL: off), this process's role, the deadline (<= 0: 5 s). */
void xauth_configure(xauth *a, const cluster_key *key, enum xport_role role, double timeout_s);
/* A new peer: with a key, its handshake starts (the server sends the challenge). */
void xauth_peer_start(const xauth *a, xauth_peer *ap, xport_peer *peer, const char *name, bool inbound);

/* The peer has not proven the key (yet, or it failed): its frames are dropped. */
bool xauth_pending(const xauth_peer *ap);
/* xauth_step has something to do. */
bool xauth_has_work(const xauth_peer *ap);
/* The role the peer proved (XPORT_ROLE_NONE until done or without a key). */
enum xport_role xauth_proven_role(const xauth_peer *ap);
const char *xauth_role_name(enum xport_role role);

/* A handshake message arrived (inside progress): kept for xauth_step. Returns
 * true when kept; false when malformed or out of turn (the peer failed). */
bool xauth_receive(xauth *a, xauth_peer *ap, size_t header_length, const void *data, size_t length);
/* Runs the handshake one step: the server's challenge, then the message
 * received. Returns true when it did something. */
bool xauth_step(xauth *a, xauth_peer *ap);
/* Disconnects a peer whose handshake failed or has not finished by its deadline. */
void xauth_check_deadline(xauth *a, xauth_peer *ap, double now);
/* A frame from a peer that has not authenticated is dropped: counted and
 * logged (at most once a second). */
void xauth_drop_frame(xauth *a, const xauth_peer *ap);

#endif
