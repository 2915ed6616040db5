/* xport_auth.c — see xport_auth.h. */
#include "ib/xport_auth.h"

#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "ib/xport_wire.h"

#define AUTH_MAGIC 0x31415453u /* "STA1" little-endian */
#define AUTH_TIMEOUT_S 5.0
enum auth_type { AUTH_CHALLENGE = 1, AUTH_RESPONSE = 2, AUTH_CONFIRM = 3, AUTH_REFUSED = 4 };

void xauth_init(xauth *a, const xauth_io *io)
{
    a->io = *io;
    a->unauth_lim = (st_log_limit)ST_LOG_LIMIT_INIT(1.0);
    a->fail_lim = (st_log_limit)ST_LOG_LIMIT_INIT(1.0);
}

void xauth_configure(xauth *a, const cluster_key *key, enum xport_role role, double timeout_s)
{
    a->key = key;
    a->role = key ? role : XPORT_ROLE_NONE;
    a->timeout_s = timeout_s > 0 ? timeout_s : AUTH_TIMEOUT_S;
}

void xauth_peer_start(const xauth *a, xauth_peer *ap, xport_peer *peer, const char *name, bool inbound)
{
    ap->peer = peer;
    ap->name = name;
    ap->inbound = inbound;
    if (a->key) {
        ap->state = inbound ? AUTH_SERVER_START : AUTH_WAIT_CHALLENGE;
        ap->deadline = st_now_s() + a->timeout_s;
    }
}

bool xauth_pending(const xauth_peer *ap) { return ap->state != AUTH_OFF && ap->state != AUTH_DONE; }

bool xauth_has_work(const xauth_peer *ap) { return xauth_pending(ap) || ap->in_ready; }

enum xport_role xauth_proven_role(const xauth_peer *ap) { return ap->state == AUTH_DONE ? ap->role : XPORT_ROLE_NONE; }

const char *xauth_role_name(enum xport_role r)
{
    return r == XPORT_ROLE_COORDINATOR ? "coordinator" : r == XPORT_ROLE_STAGE ? "stage" : "unauthenticated";
}

void xauth_drop_frame(xauth *a, const xauth_peer *ap)
{
    a->unauth_frames++;
    unsigned long quiet;
    if (st_log_limit_allow(&a->unauth_lim, st_now_s(), &quiet))
        ST_WARN("xport: dropped a frame from %s: it has not authenticated (%llu dropped so far, %lu such "
                "lines left out)", ap->name, (unsigned long long)a->unauth_frames, quiet);
}

/* The handshake failed: counted and logged (rate-limited). */
static void fail_note(xauth *a, xauth_peer *ap, const char *why)
{
    ap->state = AUTH_FAILED;
    a->failures++;
    unsigned long quiet;
    if (st_log_limit_allow(&a->fail_lim, st_now_s(), &quiet))
        ST_WARN("xport: %s: authentication failed: %s (%lu such lines left out)", ap->name, why, quiet);
}

/* ... and the peer disconnected. */
static void fail(xauth *a, xauth_peer *ap, const char *why)
{
    if (ap->state == AUTH_FAILED) return;
    fail_note(a, ap, why);
    char reason[160];
    snprintf(reason, sizeof reason, "authentication failed: %.130s", why);
    a->io.fail(ap->peer, reason);
}

bool xauth_receive(xauth *a, xauth_peer *ap, size_t header_length, const void *data, size_t length)
{
    if (header_length != 0 || length != XAUTH_MSG_LEN || xw_get_le32(data) != AUTH_MAGIC) {
        fail(a, ap, "malformed handshake message");
        return false;
    }
    if (ap->in_ready || ap->state == AUTH_DONE) {
        fail(a, ap, "handshake message out of turn");
        return false;
    }
    memcpy(ap->in, data, XAUTH_MSG_LEN);
    ap->in_ready = true;
    return true;
}

static void send_msg(xauth *a, xauth_peer *ap, enum auth_type type, const uint8_t *nonce, const uint8_t *mac)
{
    uint8_t m[XAUTH_MSG_LEN] = {0};
    xw_put_le32(m, AUTH_MAGIC);
    m[4] = (uint8_t)type;
    m[5] = (uint8_t)a->role;
    if (nonce) memcpy(m + 8, nonce, CLUSTER_NONCE_LEN);
    if (mac) memcpy(m + 8 + CLUSTER_NONCE_LEN, mac, CLUSTER_MAC_LEN);
    st_err err;
    if (a->io.send(ap->peer, m, sizeof m, &err)) fail(a, ap, err.msg);
}

/* The peer proved the key. */
static void proven(const xauth *a, xauth_peer *ap)
{
    ap->state = AUTH_DONE;
    ST_DEBUG("xport: %s authenticated as %s", ap->name, xauth_role_name(ap->role));
    a->io.proven(ap->peer);
}

bool xauth_step(xauth *a, xauth_peer *ap)
{
    bool did = false;
    if (ap->state == AUTH_SERVER_START) {
        did = true;
        if (cluster_random(ap->ns, CLUSTER_NONCE_LEN)) {
            fail(a, ap, "no random bytes (RAND_bytes)");
            return true;
        }
        ap->state = AUTH_WAIT_RESPONSE;
        send_msg(a, ap, AUTH_CHALLENGE, ap->ns, NULL);
    }
    if (!ap->in_ready || a->io.failing(ap->peer)) return did;
    ap->in_ready = false;
    const uint8_t *m = ap->in;
    uint8_t type = m[4], role = m[5];
    const uint8_t *nonce = m + 8, *mac = m + 8 + CLUSTER_NONCE_LEN;
    uint8_t mine[CLUSTER_MAC_LEN];
    if (ap->state == AUTH_OFF) {
        if (!ap->inbound && type == AUTH_CHALLENGE) {
            a->failures++;
            unsigned long quiet;
            if (st_log_limit_allow(&a->fail_lim, st_now_s(), &quiet))
                ST_ERROR("xport: %s requires data-plane authentication, and this process has no cluster key "
                         "(cluster_key_file / --cluster-key-file; docs/security.md)", ap->name);
            a->io.fail(ap->peer, "the peer requires the cluster key and none is configured");
        }
        return true; /* anything else from a peer when we have no key: ignored */
    }
    if (role != XPORT_ROLE_COORDINATOR && role != XPORT_ROLE_STAGE) {
        fail(a, ap, "handshake with an unknown role");
        return true;
    }
    int idx;
    switch (ap->state) {
    case AUTH_WAIT_CHALLENGE:
        if (type != AUTH_CHALLENGE) break;
        memcpy(ap->ns, nonce, CLUSTER_NONCE_LEN);
        if (cluster_random(ap->nc, CLUSTER_NONCE_LEN)) {
            fail(a, ap, "no random bytes (RAND_bytes)");
            return true;
        }
        ap->role = (enum xport_role)role;
        if (cluster_handshake_proof(a->key, 0, 'C', (uint8_t)a->role, role, ap->ns, ap->nc, mine)) {
            fail(a, ap, "HMAC failed (libcrypto)");
            return true;
        }
        ap->state = AUTH_WAIT_CONFIRM;
        send_msg(a, ap, AUTH_RESPONSE, ap->nc, mine);
        return true;
    case AUTH_WAIT_RESPONSE:
        if (type != AUTH_RESPONSE) break;
        memcpy(ap->nc, nonce, CLUSTER_NONCE_LEN);
        idx = cluster_handshake_verify(a->key, 'C', role, (uint8_t)a->role, ap->ns, ap->nc, mac);
        if (idx < 0) { /* tell it (its operator sees why); disconnected when it leaves, or at the deadline */
            fail_note(a, ap, "its proof does not match the cluster key (a different key, or none)");
            ap->deadline = st_now_s() + 1.0;
            send_msg(a, ap, AUTH_REFUSED, NULL, NULL);
            return true;
        }
        ap->role = (enum xport_role)role;
        if (cluster_handshake_proof(a->key, idx, 'S', role, (uint8_t)a->role, ap->ns, ap->nc, mine)) {
            fail(a, ap, "HMAC failed (libcrypto)");
            return true;
        }
        send_msg(a, ap, AUTH_CONFIRM, NULL, mine);
        if (a->io.failing(ap->peer)) return true;
        proven(a, ap);
        return true;
    case AUTH_WAIT_CONFIRM:
        if (type == AUTH_REFUSED) {
            fail(a, ap, "the peer refused our proof: the cluster keys differ");
            return true;
        }
        if (type != AUTH_CONFIRM) break;
        if (cluster_handshake_verify(a->key, 'S', (uint8_t)a->role, (uint8_t)ap->role, ap->ns, ap->nc, mac) < 0) {
            fail(a, ap, "the peer did not prove the cluster key");
            return true;
        }
        proven(a, ap);
        return true;
    default: break;
    }
    fail(a, ap, "handshake message out of turn");
    return true;
}

void xauth_check_deadline(xauth *a, xauth_peer *ap, double now)
{
    if (now < ap->deadline) return;
    if (ap->state == AUTH_FAILED)
        a->io.fail(ap->peer, "authentication failed");
    else if (xauth_pending(ap))
        fail(a, ap, ap->inbound ? "no proof of the cluster key in time"
                                : "no handshake from the listener in time (has it the cluster key?)");
}
