/* xport_ucx.c — ib/transport.h over UCX ucp active messages: the owner. It
 * holds the connection lifecycle (context, worker, listener, connect,
 * disconnect, teardown), the loop's event handler and drain, and implements
 * the public interface, calling the parts below it:
 *   xport_peers.c  the peer table; xp_kick / xp_fail report work to the loop
 *   xport_send.c   frames and handshake messages to UCX, completions
 *   xport_recv.c   the AM handlers, rendezvous into the rx sink, in-order delivery
 *   xport_auth.c   the handshake (through callbacks: it does no I/O itself)
 *   xport_poll.c   adaptive polling of the worker
 *   xport_mem.c    registered memory, host and device, and the receive pool
 * Their shared state is plain data in xport_types.h.
 *
 * Everything user-visible (send completions, frames, connects, disconnects)
 * is queued from UCX callbacks and delivered by drain() after progress, on
 * the libevent loop.
 */
#include "ib/transport.h"

#include <event2/event.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <ucp/api/ucp.h>

#include "common/clock.h"
#include "common/hop_trace.h"
#include "common/log.h"
#include "ib/listen_guard.h"
#include "ib/xport_auth.h"
#include "ib/xport_mem.h"
#include "ib/xport_peers.h"
#include "ib/xport_poll.h"
#include "ib/xport_recv.h"
#include "ib/xport_send.h"
#include "ib/xport_types.h"
#include "ib/xport_wire.h"

/* Payloads up to this many bytes go eagerly (UCP_AM_SEND_FLAG_EAGER) unless
 * UCX_RNDV_THRESH is set: UCX's automatic rendezvous threshold (8 KiB on TCP,
 * one token of a 2048-wide f32 activation) assumes a polling receiver; with
 * an event-driven one each extra rendezvous message (RTS, data, ATS) costs a
 * wake-up on both sides (8 KiB: ~250 us by rendezvous vs ~35 us eager). */
#define XPORT_EAGER_MAX (128u << 10)
/* on_event: progress / deliver rounds before it yields to the loop */
#define XPORT_EVENT_ROUNDS 64
#define AUTH_TICK_US 200000 /* handshake deadline checks */

/* ---- peers: accept, error, close ---- */

static void sockaddr_name(const struct sockaddr_storage *ss, char *out, size_t n)
{
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *s = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &s->sin_addr, host, sizeof host);
        port = ntohs(s->sin_port);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &s->sin6_addr, host, sizeof host);
        port = ntohs(s->sin6_port);
    }
    snprintf(out, n, "%s:%d", host, port);
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    xport_peer *p = arg;
    char why[120];
    snprintf(why, sizeof why, "peer error: %s", ucs_status_string(status));
    xp_fail(p, why);
}

static void on_close_cb(void *request, ucs_status_t status, void *user_data)
{
    xport_peer *p = user_data;
    p->state = PEER_CLOSED;
    ucp_request_free(request);
}

static void peer_start_close(xport *x, xport_peer *p)
{
    if (p->state != PEER_OPEN) return;
    p->state = PEER_CLOSING;
    ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                                              UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = UCP_EP_CLOSE_FLAG_FORCE,
                              .cb.send = on_close_cb,
                              .user_data = p};
    ucs_status_ptr_t sp = ucp_ep_close_nbx(p->ep, &cp);
    if (sp == NULL || UCS_PTR_IS_ERR(sp)) p->state = PEER_CLOSED;
}

/* Accepts a connection request of the listener: a new inbound peer. */
static void on_conn_request(ucp_conn_request_h req, void *arg)
{
    xport *x = arg;
    char name[80] = "inbound";
    ucp_conn_request_attr_t ca = {.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR};
    if (ucp_conn_request_query(req, &ca) == UCS_OK) sockaddr_name(&ca.client_address, name, sizeof name);
    if (x->destroying || x->n_peers >= XPORT_MAX_PEERS) {
        ST_WARN("xport: rejecting connection from %s", name);
        ucp_listener_reject(x->listener, req);
        return;
    }
    xport_peer *p = xp_new(x, true, name);
    if (!p) {
        ucp_listener_reject(x->listener, req);
        return;
    }
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                          .conn_request = req,
                          .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                          .err_handler = {.cb = on_ep_error, .arg = p}};
    ucs_status_t st = ucp_ep_create(x->worker, &ep, &p->ep);
    if (st != UCS_OK) {
        ST_WARN("xport: accepting %s: %s", name, ucs_status_string(st));
        free(p);
        return;
    }
    x->stats.peers_accepted++;
    ST_DEBUG("xport: accepted %s", name);
    xp_link(x, p);
    xp_kick(x);
}

/* ---- the loop ---- */

/* Delivers everything queued. Returns true when it called anything. */
static bool drain(xport *x)
{
    bool did = xsend_run_completions(x);
    /* connects and frames */
    for (xport_peer *p = x->peers; p; p = p->next) {
        if (p->state != PEER_OPEN || p->fail) continue;
        if (xauth_has_work(&p->auth) && xauth_step(&x->auth, &p->auth)) did = true;
        if (xauth_pending(&p->auth) || p->fail) continue;
        if (!p->connect_reported) {
            p->connect_reported = true;
            p->user_knows = true;
            did = true;
            if (x->cb.on_connect) x->cb.on_connect(p, p->inbound, x->cb.ud);
        }
        if (xrecv_deliver(x, p)) did = true;
    }
    /* closes */
    for (xport_peer *p = x->peers; p; p = p->next) {
        if (p->fail && p->deferred_head) {
            xsend_fail_deferred(p);
            did = true;
        }
        if (p->fail && p->state == PEER_OPEN) {
            /* An outbound endpoint that never carried a frame is a connect
             * attempt that failed (a peer not up yet, retried by the caller):
             * debug level, so waiting for workers does not flood the log. */
            if (p->inbound || p->tx_seq > 0 || p->rx_next > 0)
                ST_INFO("xport: disconnecting %s: %s", p->name, p->reason);
            else
                ST_DEBUG("xport: disconnecting %s: %s", p->name, p->reason);
            peer_start_close(x, p);
            did = true;
        }
    }
    /* finished peers: report and free */
    for (xport_peer **pp = &x->peers; *pp;) {
        xport_peer *p = *pp;
        if (p->state != PEER_CLOSED || p->ops > 0) {
            pp = &p->next;
            continue;
        }
        *pp = p->next;
        x->n_peers--;
        x->stats.peers_lost++;
        xrecv_free_all(x, p);
        if (p->user_knows && x->cb.on_disconnect) x->cb.on_disconnect(p, p->reason, x->cb.ud);
        free(p);
        did = true;
    }
    return did;
}

/* The worker's fd is readable, or xp_kick(). Progress and deliver in rounds
 * until nothing happens, then arm the worker (UCX: after progress returned 0;
 * BUSY = more events). Each frame is delivered right after the progress call
 * that completed it, before the next progress or the arm (a receiver starts
 * its work one round sooner), and work started by the callbacks (a send
 * from on_frame) is progressed in the same call rather than in another pass
 * of the loop: each pass costs an epoll_wait, and on a loopback hop the
 * woken peer often waits for this thread's CPU. Progress is skipped when
 * the previous round neither progressed nor started a UCX operation. After
 * XPORT_EVENT_ROUNDS busy rounds it yields to the loop (xp_kick). */
static void on_event(evutil_socket_t fd, short what, void *arg)
{
    xport *x = arg;
    xpoll_woke(&x->poll, st_now_ns());
    x->in_event = true;
    bool need_progress = true;
    for (int round = 0; round < XPORT_EVENT_ROUNDS; round++) {
        x->issued = false;
        unsigned n = need_progress ? ucp_worker_progress(x->worker) : 0;
        bool did = drain(x);
        need_progress = n > 0 || x->issued;
        if (n > 0 || did) continue;
        if (x->issued) continue; /* drain started something without delivering: progress it */
        ucs_status_t st = ucp_worker_arm(x->worker);
        if (st == UCS_ERR_BUSY) {
            need_progress = true;
            continue;
        }
        if (st != UCS_OK) ST_WARN("xport: ucp_worker_arm: %s", ucs_status_string(st));
        x->in_event = false;
        xpoll_plan(&x->poll);
        return;
    }
    x->in_event = false;
    xp_kick(x);
}

/* xport_poll's on_work: a spin found work. */
static void on_poll_work(void *arg) { on_event(-1, 0, arg); }

/* Handshake deadlines. */
static void on_auth_tick(evutil_socket_t fd, short what, void *arg)
{
    xport *x = arg;
    double now = st_now_s();
    for (xport_peer *p = x->peers; p; p = p->next) {
        if (p->state != PEER_OPEN || p->fail) continue;
        xauth_check_deadline(&x->auth, &p->auth, now);
    }
}

/* ---- create and destroy ---- */

static int resolve(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len, bool passive, st_err *err)
{
    char svc[16];
    snprintf(svc, sizeof svc, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0)};
    struct addrinfo *ai = NULL;
    int rc = getaddrinfo(host, svc, &hints, &ai);
    if (rc || !ai) return st_errf(err, "xport: cannot resolve %s:%d: %s", host ? host : "*", port, gai_strerror(rc));
    memcpy(ss, ai->ai_addr, ai->ai_addrlen);
    *len = ai->ai_addrlen;
    freeaddrinfo(ai);
    return 0;
}

/* SO_REUSEADDR on the listening socket of UCX's TCP connection manager
 * (UCX_TCP_CM_REUSEADDR=y), unless the user set it. UCX leaves it off, so a
 * worker restarted on its address (systemd's Restart=, a crash, SIGKILL)
 * failed to bind ("xport: listen on H:P: Device is busy") for as long as the
 * connections of its previous process sat in TIME_WAIT on that port (60 s):
 * every try of systemd's restart burst failed and the unit gave up. The
 * option only lets a new listener take a port whose old connections are
 * closing; a port that another process listens on still fails (Linux refuses
 * a second listener). Set in the environment because UCX reads the connection
 * manager's options from there when ucp_init opens it (ucp_config_modify does
 * not reach them: "invalid configuration"), and from a constructor because
 * setenv is not safe while other threads may read the environment: this runs
 * before main, before any thread and before the first ucp_init. */
__attribute__((constructor)) static void xport_env_defaults(void)
{
    setenv("UCX_TCP_CM_REUSEADDR", "y", 0 /* keep the user's value */);
}

/* Listens on host:port; x->port is the bound port. */
static int listen_on(xport *x, const char *host, int port, st_err *err)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    if (resolve(host, port, &ss, &sl, true, err)) return -1;
    ucp_listener_params_t lp = {.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR |
                                              UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
                                .sockaddr = {.addr = (const struct sockaddr *)&ss, .addrlen = sl},
                                .conn_handler = {.cb = on_conn_request, .arg = x}};
    ucs_status_t st = ucp_listener_create(x->worker, &lp, &x->listener);
    if (st != UCS_OK) return st_errf(err, "xport: listen on %s:%d: %s", host, port, ucs_status_string(st));
    ucp_listener_attr_t la = {.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR};
    st = ucp_listener_query(x->listener, &la);
    if (st != UCS_OK) return st_errf(err, "xport: ucp_listener_query: %s", ucs_status_string(st));
    if (la.sockaddr.ss_family == AF_INET)
        x->port = ntohs(((struct sockaddr_in *)&la.sockaddr)->sin_port);
    else if (la.sockaddr.ss_family == AF_INET6)
        x->port = ntohs(((struct sockaddr_in6 *)&la.sockaddr)->sin6_port);
    return 0;
}

/* The AM handlers of frames and handshake messages (xport_recv.c). */
static ucs_status_t set_am_handlers(xport *x)
{
    ucp_am_handler_param_t ap = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                                               UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG,
                                 .id = XPORT_AM_FRAME,
                                 .flags = UCP_AM_FLAG_WHOLE_MSG | UCP_AM_FLAG_PERSISTENT_DATA,
                                 .cb = xrecv_frame_am,
                                 .arg = x};
    ucs_status_t st = ucp_worker_set_am_recv_handler(x->worker, &ap);
    if (st == UCS_OK) {
        ucp_am_handler_param_t aa = ap;
        aa.id = XPORT_AM_AUTH;
        aa.flags = UCP_AM_FLAG_WHOLE_MSG;
        aa.cb = xrecv_auth_am;
        st = ucp_worker_set_am_recv_handler(x->worker, &aa);
    }
    return st;
}

xport *xport_create(struct event_base *base, const char *listen_host, int listen_port, const xport_callbacks *cb,
                    st_err *err)
{
    if (!base) {
        st_errf(err, "xport: no event base");
        return NULL;
    }
    if (listen_host && (listen_port < 0 || listen_port > 65535)) {
        st_errf(err, "xport: bad port %d", listen_port);
        return NULL;
    }
    xport *x = calloc(1, sizeof *x);
    if (!x) {
        st_errf(err, "xport: out of memory");
        return NULL;
    }
    x->base = base;
    if (cb) x->cb = *cb;
    xpoll_init(&x->poll);
    xauth_init(&x->auth, &(xauth_io){.send = xsend_handshake,
                                     .fail = xp_fail,
                                     .failing = xp_failing,
                                     .proven = xsend_flush_deferred});

    ucp_config_t *cfg = NULL;
    ucs_status_t st = ucp_config_read(NULL, NULL, &cfg); /* UCX_* environment */
    if (st != UCS_OK) {
        st_errf(err, "xport: ucp_config_read: %s", ucs_status_string(st));
        goto fail;
    }
    ucp_params_t pp = {.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME,
                       .features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
                       .name = "strata"};
    st = ucp_init(&pp, cfg, &x->ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK) {
        st_errf(err, "xport: ucp_init: %s", ucs_status_string(st));
        goto fail;
    }
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE, .thread_mode = UCS_THREAD_MODE_SINGLE};
    st = ucp_worker_create(x->ctx, &wp, &x->worker);
    if (st != UCS_OK) {
        st_errf(err, "xport: ucp_worker_create: %s", ucs_status_string(st));
        goto fail;
    }
    ucp_worker_attr_t wa = {.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER};
    if (ucp_worker_query(x->worker, &wa) == UCS_OK)
        x->max_am_header = wa.max_am_header;
    x->eager_max = getenv("UCX_RNDV_THRESH") ? 0 : XPORT_EAGER_MAX;
    if (xpoll_read_env(&x->poll, err)) goto fail;
    st = set_am_handlers(x);
    if (st != UCS_OK) {
        st_errf(err, "xport: ucp_worker_set_am_recv_handler: %s", ucs_status_string(st));
        goto fail;
    }
    int efd = -1;
    st = ucp_worker_get_efd(x->worker, &efd);
    if (st != UCS_OK) {
        st_errf(err, "xport: ucp_worker_get_efd: %s", ucs_status_string(st));
        goto fail;
    }
    x->ev = event_new(base, efd, EV_READ | EV_PERSIST, on_event, x);
    if (!x->ev || event_add(x->ev, NULL)) {
        st_errf(err, "xport: cannot add the worker's event fd to the loop");
        goto fail;
    }
    if (xpoll_start(&x->poll, base, x->worker, on_poll_work, x, err)) goto fail;
    if (listen_host && listen_on(x, listen_host, listen_port, err)) goto fail;
    xp_kick(x); /* arm the worker from the loop */
    return x;
fail:
    xport_destroy(x);
    return NULL;
}

/* Test hook (docs/worker.md): STRATA_TEST_LISTENER_GAP_MS=N sleeps N ms
 * between destroying the listener and the worker, the window of UCX 1.13.1's
 * listener race, so that test_xport can deliver requests inside it. */
static void test_listener_gap(void)
{
    const char *gap = getenv("STRATA_TEST_LISTENER_GAP_MS");
    if (gap && atoi(gap) > 0) usleep(1000u * (unsigned)atoi(gap));
}

/* Teardown order. UCX may call back from its own thread until the worker is
 * destroyed: in UCX 1.13 a TCP connection the listener accepted but whose
 * request data had not been read yet keeps a pointer to the listener, and
 * delivers it (ucp_cm_server_conn_request_cb) even after
 * ucp_listener_destroy freed it; only ucp_worker_destroy (closing the
 * connection manager, with UCX's async thread blocked) removes those.
 * So: refuse new requests first (destroying: on_conn_request rejects them
 * with ucp_listener_reject) and new connections (listen_guard_block), close
 * the peers, end every connection the listener accepted and wait until none
 * is left (then none can still deliver a request), destroy the listener and the worker
 * back to back, and free what a callback could still name (the peers, their
 * pending receives, the loop event) only after the worker. */
void xport_destroy(xport *x)
{
    if (!x) return;
    x->destroying = true;
    x->poll.stopped = true;
    if (x->worker) {
        for (xport_peer *p = x->peers; p; p = p->next) {
            if (!p->fail) snprintf(p->reason, sizeof p->reason, "transport destroyed");
            p->fail = true;
            xsend_fail_deferred(p);
            peer_start_close(x, p);
        }
        /* No new connection reaches the listener from here on; the ones it
         * accepted are ended below (listen_guard.h). */
        if (x->listener) listen_guard_block(x->port);
        /* Let closes and cancelled operations complete (bounded), running
         * the send callbacks as they complete. */
        double t0 = st_now_s();
        for (;;) {
            while (ucp_worker_progress(x->worker)) {
            }
            xsend_run_completions_final(x);
            bool busy = false;
            for (xport_peer *p = x->peers; p; p = p->next)
                if (p->state != PEER_CLOSED || p->ops > 0) busy = true;
            if (!busy || st_now_s() - t0 > 5.0) break;
        }
        /* Then end every connection the listener accepted (a peer's, one
         * whose request is refused, one that never sent all of it) and let
         * UCX's thread drop them (bounded): none can deliver a request to the
         * destroyed listener. */
        if (x->listener) {
            double t1 = st_now_s();
            while (listen_guard_end_accepted(x->port) > 0 && st_now_s() - t1 < 2.0) {
                while (ucp_worker_progress(x->worker)) {
                }
                usleep(1000);
            }
        }
        for (xport_peer *p = x->peers; p; p = p->next) {
            if (p->state != PEER_CLOSED || p->ops > 0) ST_WARN("xport: %s did not close cleanly", p->name);
            xrecv_free_settled(x, p);
        }
        if (x->listener) ucp_listener_destroy(x->listener);
        test_listener_gap();
        ucp_worker_destroy(x->worker);
        /* No UCX callback from here on. Sends the worker cancelled while
         * closing report -1. */
        xsend_run_completions_final(x);
        while (x->peers) {
            xport_peer *p = x->peers;
            x->peers = p->next;
            xrecv_free_after_worker(x, p);
            free(p);
        }
    }
    if (x->ev) event_free(x->ev);
    xpoll_close(&x->poll);
    if (x->auth_ev) event_free(x->auth_ev);
    xm_pool_free(x->ctx, &x->pool);
    if (x->ctx) ucp_cleanup(x->ctx);
    free(x);
}

/* ---- connections ---- */

xport_peer *xport_connect(xport *x, const char *host, int port, st_err *err)
{
    if (!host || port <= 0 || port > 65535) {
        st_errf(err, "xport: bad address %s:%d", host ? host : "(null)", port);
        return NULL;
    }
    if (x->n_peers >= XPORT_MAX_PEERS) {
        st_errf(err, "xport: too many peers");
        return NULL;
    }
    struct sockaddr_storage ss;
    socklen_t sl;
    if (resolve(host, port, &ss, &sl, false, err)) return NULL;
    char name[80];
    snprintf(name, sizeof name, "%s:%d", host, port);
    xport_peer *p = xp_new(x, false, name);
    if (!p) {
        st_errf(err, "xport: out of memory");
        return NULL;
    }
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                          .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
                          .sockaddr = {.addr = (const struct sockaddr *)&ss, .addrlen = sl},
                          .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                          .err_handler = {.cb = on_ep_error, .arg = p}};
    ucs_status_t st = ucp_ep_create(x->worker, &ep, &p->ep);
    if (st != UCS_OK) {
        free(p);
        st_errf(err, "xport: connect %s: %s", name, ucs_status_string(st));
        return NULL;
    }
    xp_link(x, p);
    xp_kick(x);
    return p;
}

void xport_peer_close(xport_peer *p)
{
    if (p) xp_fail(p, "closed locally");
}
const char *xport_peer_name(const xport_peer *p) { return p->name; }
void xport_peer_set_user(xport_peer *p, void *user) { p->user = user; }
void *xport_peer_user(const xport_peer *p) { return p->user; }

int xport_port(const xport *x) { return x->port; }

bool xport_memory_cuda(const xport *x)
{
    ucp_context_attr_t a = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    if (ucp_context_query(x->ctx, &a) != UCS_OK) return false;
    return (a.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
}

size_t xport_max_inline_header(const xport *x) { return x->max_am_header > XPORT_PREFIX ? x->max_am_header - XPORT_PREFIX : 0; }

/* ---- authentication (xport_auth.c) ---- */

void xport_require_auth(xport *x, const cluster_key *key, enum xport_role role, double timeout_s)
{
    xauth_configure(&x->auth, key, role, timeout_s);
    if (key && !x->auth_ev) {
        x->auth_ev = event_new(x->base, -1, EV_PERSIST, on_auth_tick, x);
        struct timeval tv = {0, AUTH_TICK_US};
        if (x->auth_ev) event_add(x->auth_ev, &tv);
    }
}

enum xport_role xport_peer_role(const xport_peer *p) { return xauth_proven_role(&p->auth); }

const char *xport_role_name(enum xport_role r) { return xauth_role_name(r); }

/* ---- polling (xport_poll.c) ---- */

int xport_set_poll_us(xport *x, long us, st_err *err) { return xpoll_set_us(&x->poll, us, err); }

long xport_poll_us(const xport *x) { return xpoll_us(&x->poll); }

/* ---- sends (xport_send.c) ---- */

int xport_send(xport_peer *p, const frame_header *hdr, const void *payload, size_t payload_bytes,
               const xport_mem *mem, xport_send_cb cb, void *arg, st_err *err)
{
    if (!p) return st_errf(err, "xport: no peer (NULL)");
    if (st_hop_trace_on()) st_hop_mark("send", hdr->batch_id, st_now_ns());
    if (frame_validate(hdr, payload_bytes, err)) return st_err_prefix(err, "xport_send");
    if (hdr->batch_id) xpoll_note_ref(&p->x->poll, st_now_ns());
    size_t hl = 0;
    uint8_t *hb = frame_header_pack(hdr, &hl, err);
    if (!hb) return -1;
    int rc = xsend_frame(p, hb, hl, payload, payload_bytes, mem, cb, arg, err);
    free(hb);
    return rc;
}

int xport_send_raw(xport_peer *p, const void *hdr_bytes, size_t hdr_len, const void *payload, size_t payload_bytes,
                   xport_send_cb cb, void *arg, st_err *err)
{
    if (hdr_len > FRAME_MAX_HEADER) return st_errf(err, "xport: header too long");
    return xsend_frame(p, hdr_bytes, hdr_len, payload, payload_bytes, NULL, cb, arg, err);
}

/* ---- registered memory (xport_mem.c) ---- */

xport_mem *xport_mem_register(xport *x, void *ptr, size_t len, st_err *err) { return xm_register(x->ctx, ptr, len, err); }

xport_mem *xport_mem_alloc(xport *x, size_t len, st_err *err) { return xm_alloc(x->ctx, len, err); }

xport_mem *xport_mem_register_device(xport *x, void *ptr, size_t len, bool cuda, st_err *err)
{
    return xm_register_device(x->ctx, ptr, len, cuda, err);
}

void xport_mem_unregister(xport *x, xport_mem *m) { xm_unregister(x->ctx, m); }

void *xport_mem_ptr(const xport_mem *m) { return m->ptr; }
size_t xport_mem_len(const xport_mem *m) { return m->len; }

void xport_set_rx_sink(xport *x, const xport_rx_sink *sink)
{
    if (sink && sink->get && sink->put) x->sink = *sink;
    else memset(&x->sink, 0, sizeof x->sink);
}

/* ---- counters ---- */

void xport_get_stats(const xport *x, xport_stats *out)
{
    *out = x->stats;
    out->unauth_frames = x->auth.unauth_frames;
    out->auth_failures = x->auth.failures;
    out->poll_spins = x->poll.spins;
    out->poll_hits = x->poll.hits;
    out->poll_spin_ns = x->poll.spin_ns;
}
