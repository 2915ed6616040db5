/* xport_ucx.c — ib/transport.h over UCX ucp active messages.
 *
 * Why AM (not TAG/STREAM): one AM carries our small header and the payload
 * together, arrives with its reply endpoint (so we know the sender), and lets
 * the receiver choose the destination buffer for rendezvous data
 * (ucp_am_recv_data_nbx into a registered pool buffer) after it has decoded
 * and validated the header: nothing is allocated for a bad frame.
 *
 * Wire: AM id XPORT_AM_FRAME; AM header = 24-byte prefix (docs/protocol.md)
 * followed by the packed FrameHeader when it fits the worker's max AM header;
 * otherwise flag HDR_IN_DATA and the data is header || payload (copied).
 * AM data = payload. Sender sets UCP_AM_SEND_FLAG_REPLY so the receiver gets
 * the endpoint. Per-peer sequence numbers restore send order (a rendezvous
 * frame can complete after a later eager one).
 *
 * Everything user-visible (send completions, frames, connects, disconnects)
 * is queued from UCX callbacks and delivered by drain() after progress, on
 * the libevent loop.
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "ib/transport.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <sched.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <ucp/api/ucp.h>

#include "common/clock.h"
#include "common/hop_trace.h"
#include "common/log.h"
#include "common/log_limit.h"
#include "ib/poll_predict.h"

#define XPORT_AM_FRAME 17
#define XPORT_AM_AUTH 18            /* handshake messages (docs/protocol.md, "Handshake") */
#define XPORT_MAGIC 0x31465453u /* "STF1" little-endian */
#define XPORT_VERSION 1
#define XPORT_PREFIX 24
#define XPORT_FLAG_HDR_IN_DATA 1u
#define XPORT_POOL_MAX 8            /* registered receive buffers kept */
#define XPORT_POOL_MIN_BYTES (64u << 10)
#define XPORT_MAX_PENDING_RX 4096   /* out-of-order frames per peer */
#define XPORT_MAX_PEERS 1024
/* Payloads up to this many bytes go eagerly (UCP_AM_SEND_FLAG_EAGER) unless
 * UCX_RNDV_THRESH is set: UCX's automatic rendezvous threshold (8 KiB on TCP,
 * one token of a 2048-wide f32 activation) assumes a polling receiver; with
 * an event-driven one each extra rendezvous message (RTS, data, ATS) costs a
 * wake-up on both sides (8 KiB: ~250 us by rendezvous vs ~35 us eager). */
#define XPORT_EAGER_MAX (128u << 10)
/* on_event: progress / deliver rounds before it yields to the loop */
#define XPORT_EVENT_ROUNDS 64
/* Adaptive polling (docs/protocol.md, "Polling"). STRATA_XPORT_POLL_US: the
 * most one spin may last; unset: XPORT_POLL_DEFAULT_US. */
#define XPORT_POLL_MAX_US 10000
#define XPORT_POLL_DEFAULT_US 0 /* off: on the quiet test machine it did not win (docs/protocol.md) */
#define XPORT_SPARE_CHECK_NS 50000u /* a spin looks for a free CPU this often */
/* A window under 1/32 of its gap may take a busy CPU: it costs the compute
 * threads at most ~3% of one CPU; a longer one spins only on a free CPU. */
#define XPORT_SPIN_DUTY_DIV 32u
/* Handshake: one 72-byte message format (docs/protocol.md, "Handshake"). */
#define AUTH_MAGIC 0x31415453u      /* "STA1" little-endian */
#define AUTH_MSG_LEN 72             /* magic 4, type 1, role 1, zero 2, nonce 32, mac 32 */
#define AUTH_TIMEOUT_S 5.0
#define AUTH_TICK_US 200000         /* handshake deadline checks */
enum auth_type { AUTH_CHALLENGE = 1, AUTH_RESPONSE = 2, AUTH_CONFIRM = 3, AUTH_REFUSED = 4 };
/* Where a peer is in the handshake. AUTH_OFF: no key on this transport. */
enum auth_state { AUTH_OFF, AUTH_SERVER_START, AUTH_WAIT_RESPONSE, AUTH_WAIT_CHALLENGE, AUTH_WAIT_CONFIRM,
                  AUTH_FAILED, AUTH_DONE };

enum peer_state { PEER_OPEN, PEER_CLOSING, PEER_CLOSED };

struct xport_mem {
    ucp_mem_h memh;
    void *ptr;
    size_t len;
    bool owned;
    bool device;               /* xport_mem_register_device */
    ucs_memory_type_t mtype;
};

struct rbuf { /* registered receive buffer of the pool */
    void *ptr;
    size_t cap;
    ucp_mem_h memh;
    bool in_use;
};

enum rx_state { RX_WAITING, RX_READY, RX_FAILED };
enum rx_data { RXD_NONE, RXD_MALLOC, RXD_UCX, RXD_POOL, RXD_SINK };

struct rx { /* a received frame waiting for in-order delivery */
    struct rx *next;
    xport_peer *peer;
    uint64_t seq;
    enum rx_state state;
    frame_header *hdr; /* NULL with HDR_IN_DATA until complete */
    size_t hdr_in_data;  /* header bytes at the start of data */
    enum rx_data dkind;
    void *data;
    size_t len;
    struct rbuf *rb;
    xport_mem *sink; /* RXD_SINK: the region the sink lent */
    bool delivered;
};

struct xport_peer {
    xport *x;
    xport_peer *next;
    ucp_ep_h ep;
    char name[80];
    bool inbound;
    bool connect_reported;
    bool user_knows; /* on_connect reported, or the user created it: on_disconnect is due */
    bool fail;   /* error or close requested: close at next drain */
    enum peer_state state;
    char reason[160];
    int ops; /* in-flight UCX sends and receives, and undelivered send completions */
    uint64_t tx_seq, rx_next;
    struct rx *rx_head;
    int n_rx;
    void *user;
    /* handshake */
    enum auth_state auth;
    enum xport_role role;           /* proven by the peer */
    double auth_deadline;
    uint8_t ns[CLUSTER_NONCE_LEN], nc[CLUSTER_NONCE_LEN]; /* the server's and the client's nonce */
    uint8_t auth_in[AUTH_MSG_LEN];  /* a received handshake message, handled in drain */
    bool auth_in_ready;
    struct send_ctx *deferred_head, *deferred_tail; /* sends waiting for the handshake */
};

struct send_ctx {
    struct send_ctx *next;
    xport_peer *peer;
    xport_send_cb cb;
    void *arg;
    int status;
    uint8_t *amhdr; /* prefix (+ header) */
    uint8_t *copy;  /* header || payload when HDR_IN_DATA; the message of a handshake send */
    size_t bytes;
    /* the UCX send, kept for a send deferred until the handshake is done */
    unsigned am_id;
    size_t amhdr_len;
    const void *data;
    size_t dlen;
    uint32_t flags;
    const xport_mem *mem;
    bool internal;    /* a handshake message: no callback, not in the frame counters */
};

struct xport {
    struct event_base *base;
    xport_callbacks cb;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_listener_h listener;
    struct event *ev;
    int port;
    size_t max_am_header;
    size_t eager_max; /* force eager sends up to this payload size (0: UCX decides) */
    xport_peer *peers;
    int n_peers;
    struct send_ctx *done_head, *done_tail;
    struct rbuf pool[XPORT_POOL_MAX];
    xport_rx_sink sink; /* xport_set_rx_sink (get NULL: none) */
    xport_stats stats;
    bool destroying;
    /* authentication (xport_require_auth) */
    const cluster_key *key;
    enum xport_role role;
    double auth_timeout_s;
    struct event *auth_ev;
    st_log_limit unauth_lim, authfail_lim; /* the warnings an outsider can cause: one a second */
    bool in_event; /* on_event is running: kick() only notes the work */
    bool issued;   /* a UCX operation was started since the last progress */
    uint64_t woke_ns; /* when on_event began (STRATA_HOP_TRACE only) */
    /* Adaptive polling (docs/protocol.md, "Polling"; ib/poll_predict.h) */
    uint64_t poll_ns;  /* the most one spin lasts (STRATA_XPORT_POLL_US; 0: never spin) */
    poll_predict pred;
    int tfd;           /* timerfd of the next spin */
    struct event *poll_ev;
    uint64_t ev_t0;    /* when on_event or the spin began */
    uint64_t plan_ref; /* pred.ref_ns of the current plan */
    uint64_t plan_at, plan_end; /* the plan's start (timer) and end; end 0: none, or spent */
    bool plan_timer;   /* plan_at is on the timerfd (else it runs at once: no lateness sample) */
    bool plan_spare;   /* the window is long for its gap: spin only while a CPU is free */
    uint64_t spin_from; /* while spinning, after one empty progress: a frame now is caught exactly */
    bool data_in;       /* a data frame arrived since the spin began */
    int loadavg_fd;     /* /proc/loadavg: runnable threads, for cpu_spare (-1: unknown, always spare) */
    int n_cpus;         /* CPUs this process may run on */
    bool resume;        /* the spin was cut by a control frame: it goes on after its delivery */
};

static bool auth_step(xport *x, xport_peer *p);
static void fail_deferred(xport_peer *p);

/* ---- small helpers ---- */

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_le16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint16_t get_le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint64_t get_le64(const uint8_t *p) { return (uint64_t)get_le32(p) | (uint64_t)get_le32(p + 4) << 32; }

/* New work for the loop (a UCX operation started, a completion or failure
 * queued): inside on_event it is picked up before the worker is armed again;
 * elsewhere on_event is scheduled. */
static void kick(xport *x)
{
    x->issued = true;
    if (x->in_event) return;
    if (x->ev && !x->destroying) event_active(x->ev, EV_READ, 0);
}

/* ---- adaptive polling (docs/protocol.md, "Polling"; ib/poll_predict.h) ----
 * Sleeping in epoll until the next data frame costs the wake-up of an idle
 * CPU after the frame came (on a VM 100+ us) and the cold caches after it.
 * So the loop spins on ucp_worker_progress over a window around the frame's
 * expected arrival, woken by a timer just before it: the wake-up happens
 * before the frame comes. A frame that misses the window is taken by the
 * usual epoll wake-up. Control frames (batch id 0) neither teach nor move
 * the plan. */

static void on_event(evutil_socket_t fd, short what, void *arg);

static void timer_set(xport *x, uint64_t at_ns) /* 0: disarm */
{
    struct itimerspec its = {.it_value = {.tv_sec = (time_t)(at_ns / 1000000000u),
                                          .tv_nsec = (long)(at_ns % 1000000000u)}};
    if (x->tfd >= 0) timerfd_settime(x->tfd, TFD_TIMER_ABSTIME, &its, NULL);
}

/* Whether a CPU is free for a spin: fewer runnable threads on the machine
 * (the 4th field of /proc/loadavg, this one included) than the CPUs this
 * process may use. A spin on a busy machine takes the CPU that the sender
 * of the awaited frame, or a compute thread, needs: on the 2-CPU test
 * machine a PP 2 cluster of a tiny model (gaps of a few hundred us, as
 * long as the window) decoded at half the speed or less when it spun
 * regardless. */
static bool cpu_spare(xport *x)
{
    if (x->loadavg_fd < 0) return true;
    char buf[128];
    ssize_t n = pread(x->loadavg_fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return true;
    buf[n] = 0;
    const char *slash = strchr(buf, '/');
    if (!slash) return true;
    const char *p = slash;
    while (p > buf && p[-1] >= '0' && p[-1] <= '9') p--;
    long running = strtol(p, NULL, 10);
    return running - 1 < x->n_cpus; /* others runnable: fewer than the CPUs */
}

/* A data frame arrived (on_am, inside progress). */
static void poll_note_arrival(xport *x)
{
    uint64_t now = st_now_ns();
    pp_note_arrival(&x->pred, now, x->spin_from && x->spin_from < now, x->ev_t0);
    x->data_in = true;
}

/* Spins on the worker until progress finds work, the plan's end or poll_ns.
 * Returns whether it found work; a data frame among it is a hit. */
static bool poll_spin(xport *x, uint64_t now, uint64_t end)
{
    if (end > now + x->poll_ns) end = now + x->poll_ns;
    struct timespec c0, c1; /* the spin's CPU time: its cost (wall time would count preemptions) */
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    bool hit = false;
    x->ev_t0 = x->woke_ns = now;
    x->spin_from = 0;
    uint64_t check = now; /* the next look for a free CPU */
    while (now < end) {
        if (ucp_worker_progress(x->worker)) {
            hit = true;
            break;
        }
        now = st_now_ns();
        if (!x->spin_from) x->spin_from = now; /* one empty progress: a frame from now on is caught */
        if (x->plan_spare && now >= check) {
            if (!cpu_spare(x)) break; /* others want the CPUs: sleep instead */
            check = now + XPORT_SPARE_CHECK_NS;
        }
    }
    x->spin_from = 0;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    x->stats.poll_spin_ns += (uint64_t)((c1.tv_sec - c0.tv_sec) * 1000000000ll + (c1.tv_nsec - c0.tv_nsec));
    if (hit && x->data_in) x->stats.poll_hits++;
    return hit;
}

/* The loop has nothing left to do and sleeps: plan the spin for the next
 * data frame (the timer) or run it now (poll_ev, after the loop's other
 * pending events). */
static void poll_plan(xport *x)
{
    if (x->plan_timer && x->plan_ref != x->pred.ref_ns) { /* a newer gap: the old plan is void */
        timer_set(x, 0);
        x->plan_timer = false;
    }
    if (x->destroying || !x->poll_ev) return;
    uint64_t start, end;
    if (!pp_plan(&x->pred, x->poll_ns, &start, &end)) return;
    uint64_t now = st_now_ns();
    x->plan_ref = x->pred.ref_ns;
    x->plan_at = start;
    x->plan_end = end;
    x->plan_spare = (end - start) * XPORT_SPIN_DUTY_DIV > x->pred.gap_ns;
    if (now >= end) return; /* late already: the usual wake-up takes it */
    x->plan_timer = start > now;
    if (x->plan_timer)
        timer_set(x, start);
    else
        event_active(x->poll_ev, EV_READ, 0);
}

static void on_poll_timer(evutil_socket_t fd, short what, void *arg)
{
    xport *x = arg;
    uint64_t v;
    ssize_t n = read(x->tfd, &v, sizeof v); /* reset readiness (EAGAIN when run at once) */
    (void)n;
    uint64_t now = st_now_ns();
    bool timer = x->plan_timer, resumed = x->resume;
    x->plan_timer = x->resume = false;
    if (x->plan_ref != x->pred.ref_ns || !x->plan_end || !x->poll_ns || x->destroying)
        return; /* a newer gap, spent, or polling turned off meanwhile */
    if (timer) pp_note_late(&x->pred, x->plan_at, now, x->poll_ns); /* the next plan's lead */
    if (!resumed) x->stats.poll_spins++;
    uint64_t end = x->plan_end;
    x->plan_end = 0; /* spent */
    x->data_in = false;
    if (poll_spin(x, now, end)) {
        if (!x->data_in) x->plan_end = end; /* a control frame: deliver it, then spin on */
        on_event(-1, 0, x);
        if (x->plan_end && x->plan_ref == x->pred.ref_ns && !x->destroying) {
            x->resume = true;
            event_active(x->poll_ev, EV_READ, 0);
        }
        return;
    }
    if (ucp_worker_arm(x->worker) == UCS_ERR_BUSY) on_event(-1, 0, x);
}

static void peer_fail(xport_peer *p, const char *reason)
{
    if (!p->fail) {
        p->fail = true;
        snprintf(p->reason, sizeof p->reason, "%s", reason);
    }
    kick(p->x);
}

static xport_peer *find_peer(xport *x, ucp_ep_h ep)
{
    for (xport_peer *p = x->peers; p; p = p->next)
        if (p->ep == ep) return p;
    return NULL;
}

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

/* ---- receive buffer pool ---- */

static int rbuf_map(xport *x, struct rbuf *b, size_t cap)
{
    void *ptr = NULL;
    if (posix_memalign(&ptr, 4096, cap)) return -1;
    ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                               .address = ptr,
                               .length = cap};
    if (ucp_mem_map(x->ctx, &mp, &b->memh) != UCS_OK) {
        free(ptr);
        return -1;
    }
    b->ptr = ptr;
    b->cap = cap;
    b->in_use = false;
    return 0;
}

static void rbuf_unmap(xport *x, struct rbuf *b)
{
    if (!b->ptr) return;
    ucp_mem_unmap(x->ctx, b->memh);
    free(b->ptr);
    memset(b, 0, sizeof *b);
}

/* A free pool buffer of at least len bytes (growing or replacing one), or
 * NULL when every slot is busy. */
static struct rbuf *rbuf_get(xport *x, size_t len)
{
    struct rbuf *best = NULL, *empty = NULL, *small = NULL;
    for (int i = 0; i < XPORT_POOL_MAX; i++) {
        struct rbuf *b = &x->pool[i];
        if (!b->ptr) {
            if (!empty) empty = b;
        } else if (!b->in_use) {
            if (b->cap >= len) {
                if (!best || b->cap < best->cap) best = b;
            } else if (!small) {
                small = b;
            }
        }
    }
    if (!best) {
        struct rbuf *slot = empty ? empty : small;
        if (!slot) return NULL;
        rbuf_unmap(x, slot);
        size_t cap = XPORT_POOL_MIN_BYTES;
        while (cap < len) cap *= 2;
        if (rbuf_map(x, slot, cap)) return NULL;
        best = slot;
    }
    best->in_use = true;
    return best;
}

static void rx_free(xport *x, struct rx *r)
{
    frame_header_free(r->hdr);
    switch (r->dkind) {
    case RXD_MALLOC: free(r->data); break;
    case RXD_UCX: ucp_am_data_release(x->worker, r->data); break;
    case RXD_POOL: r->rb->in_use = false; break;
    case RXD_SINK: x->sink.put(r->sink, r->delivered, x->sink.arg); break;
    case RXD_NONE: break;
    }
    free(r);
}

/* ---- UCX callbacks (progress context: only record and queue) ---- */

static void send_done(xport *x, struct send_ctx *c, int status)
{
    c->status = status;
    c->next = NULL;
    if (x->done_tail)
        x->done_tail->next = c;
    else
        x->done_head = c;
    x->done_tail = c;
}

static void on_send_cb(void *request, ucs_status_t status, void *user_data)
{
    struct send_ctx *c = user_data;
    if (status != UCS_OK) ST_DEBUG("xport: send to %s: %s", c->peer->name, ucs_status_string(status));
    send_done(c->peer->x, c, status == UCS_OK ? 0 : -1);
    ucp_request_free(request);
}

static void on_recv_cb(void *request, ucs_status_t status, size_t length, void *user_data)
{
    struct rx *r = user_data;
    r->peer->ops--;
    if (status == UCS_OK && length == r->len) {
        r->state = RX_READY;
    } else {
        r->state = RX_FAILED;
        ST_DEBUG("xport: receive from %s: %s", r->peer->name, ucs_status_string(status));
    }
    ucp_request_free(request);
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    xport_peer *p = arg;
    char why[120];
    snprintf(why, sizeof why, "peer error: %s", ucs_status_string(status));
    peer_fail(p, why);
}

static ucs_status_t bad_frame(xport_peer *p, bool rndv, const char *why)
{
    ST_WARN("xport: malformed frame from %s: %s; disconnecting it", p->name, why);
    p->x->stats.bad_frames++;
    char reason[160];
    snprintf(reason, sizeof reason, "malformed frame: %.140s", why);
    peer_fail(p, reason);
    return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
}

static void rx_insert(xport_peer *p, struct rx *r)
{
    struct rx **pp = &p->rx_head;
    while (*pp && (*pp)->seq < r->seq) pp = &(*pp)->next;
    r->next = *pp;
    *pp = r;
    p->n_rx++;
}

static bool authenticating(const xport_peer *p) { return p->auth != AUTH_OFF && p->auth != AUTH_DONE; }

/* A frame from a peer that has not authenticated: dropped unread, counted. */
static ucs_status_t unauth_frame(xport_peer *p, bool rndv)
{
    xport *x = p->x;
    x->stats.unauth_frames++;
    unsigned long quiet;
    if (st_log_limit_allow(&x->unauth_lim, st_now_s(), &quiet))
        ST_WARN("xport: dropped a frame from %s: it has not authenticated (%llu dropped so far, %lu such "
                "lines left out)", p->name, (unsigned long long)x->stats.unauth_frames, quiet);
    return rndv ? UCS_ERR_REJECTED : UCS_OK;
}

/* The handshake with p failed: counted and logged (rate-limited). */
static void auth_fail_note(xport_peer *p, const char *why)
{
    xport *x = p->x;
    p->auth = AUTH_FAILED;
    x->stats.auth_failures++;
    unsigned long quiet;
    if (st_log_limit_allow(&x->authfail_lim, st_now_s(), &quiet))
        ST_WARN("xport: %s: authentication failed: %s (%lu such lines left out)", p->name, why, quiet);
}

/* ... and disconnected. */
static void auth_fail(xport_peer *p, const char *why)
{
    if (p->auth == AUTH_FAILED) return;
    auth_fail_note(p, why);
    char reason[160];
    snprintf(reason, sizeof reason, "authentication failed: %.130s", why);
    peer_fail(p, reason);
}

/* A handshake message: kept for drain (no sends from UCX's callbacks). */
static ucs_status_t on_auth_am(void *arg, const void *header, size_t header_length, void *data, size_t length,
                               const ucp_am_recv_param_t *param)
{
    xport *x = arg;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) return UCS_ERR_REJECTED;
    xport_peer *p = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? find_peer(x, param->reply_ep) : NULL;
    if (!p || p->state != PEER_OPEN || p->fail) return UCS_OK;
    if (header_length != 0 || length != AUTH_MSG_LEN || get_le32(data) != AUTH_MAGIC) {
        auth_fail(p, "malformed handshake message");
        return UCS_OK;
    }
    if (p->auth_in_ready || p->auth == AUTH_DONE) {
        auth_fail(p, "handshake message out of turn");
        return UCS_OK;
    }
    memcpy(p->auth_in, data, AUTH_MSG_LEN);
    p->auth_in_ready = true;
    kick(x);
    return UCS_OK;
}

static ucs_status_t on_am(void *arg, const void *header, size_t header_length, void *data, size_t length,
                          const ucp_am_recv_param_t *param)
{
    xport *x = arg;
    bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    xport_peer *p = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? find_peer(x, param->reply_ep) : NULL;
    if (!p) {
        ST_WARN("xport: frame from an unknown endpoint dropped");
        return rndv ? UCS_ERR_REJECTED : UCS_OK;
    }
    if (p->state != PEER_OPEN || p->fail) return rndv ? UCS_ERR_CANCELED : UCS_OK;
    if (authenticating(p) || p->auth == AUTH_FAILED) return unauth_frame(p, rndv);

    const uint8_t *h = header;
    if (header_length < XPORT_PREFIX || get_le32(h) != XPORT_MAGIC) return bad_frame(p, rndv, "bad prefix");
    if (get_le16(h + 4) != XPORT_VERSION) return bad_frame(p, rndv, "unsupported version");
    uint16_t flags = get_le16(h + 6);
    uint32_t hdr_len = get_le32(h + 8);
    uint64_t seq = get_le64(h + 16);
    if ((flags & ~XPORT_FLAG_HDR_IN_DATA) || get_le32(h + 12) != 0) return bad_frame(p, rndv, "bad prefix flags");
    if (seq < p->rx_next || seq - p->rx_next >= XPORT_MAX_PENDING_RX) return bad_frame(p, rndv, "bad sequence number");
    for (struct rx *q = p->rx_head; q; q = q->next)
        if (q->seq == seq) return bad_frame(p, rndv, "duplicate sequence number");

    frame_header *fh = NULL;
    size_t hdr_in_data = 0;
    st_err err;
    if (flags & XPORT_FLAG_HDR_IN_DATA) {
        if (header_length != XPORT_PREFIX || hdr_len > length || hdr_len > FRAME_MAX_HEADER ||
            length - hdr_len > FRAME_MAX_PAYLOAD)
            return bad_frame(p, rndv, "bad header-in-data length");
        hdr_in_data = hdr_len;
    } else {
        if (header_length != XPORT_PREFIX + (size_t)hdr_len) return bad_frame(p, rndv, "header length mismatch");
        fh = frame_header_unpack(h + XPORT_PREFIX, hdr_len, &err);
        if (!fh) return bad_frame(p, rndv, err.msg);
        if (frame_validate(fh, length, &err)) {
            frame_header_free(fh);
            return bad_frame(p, rndv, err.msg);
        }
    }

    if (fh && fh->batch_id) poll_note_arrival(x);
    if (fh && st_hop_trace_on()) { /* common/hop_trace.h */
        st_hop_mark("wake", fh->batch_id, x->woke_ns);
        st_hop_mark("recv", fh->batch_id, st_now_ns());
    }
    struct rx *r = calloc(1, sizeof *r);
    if (!r) {
        frame_header_free(fh);
        return bad_frame(p, rndv, "out of memory");
    }
    r->peer = p;
    r->seq = seq;
    r->hdr = fh;
    r->hdr_in_data = hdr_in_data;
    r->len = length;
    r->state = RX_READY;
    ucs_status_t ret = UCS_OK;
    if (length == 0) {
        r->dkind = RXD_NONE;
    } else if (rndv) {
        xport_mem *sm = fh && x->sink.get ? x->sink.get(p, fh, length, x->sink.arg) : NULL;
        if (sm && sm->len < length) {
            x->sink.put(sm, false, x->sink.arg);
            sm = NULL;
        }
        struct rbuf *b = sm ? NULL : rbuf_get(x, length);
        ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                                  .cb.recv_am = on_recv_cb,
                                  .user_data = r};
        if (sm) { /* straight into the sink's region (device memory: no host staging) */
            r->dkind = RXD_SINK;
            r->sink = sm;
            r->data = sm->ptr;
            rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
            rp.memh = sm->memh;
            rp.memory_type = sm->mtype;
        } else if (b) {
            r->dkind = RXD_POOL;
            r->rb = b;
            r->data = b->ptr;
            rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
            rp.memh = b->memh;
        } else {
            r->dkind = RXD_MALLOC;
            r->data = malloc(length);
            if (!r->data) {
                rx_free(x, r);
                return bad_frame(p, rndv, "out of memory");
            }
        }
        x->stats.rndv_recv++;
        r->state = RX_WAITING;
        ucs_status_ptr_t sp = ucp_am_recv_data_nbx(x->worker, data, r->data, length, &rp);
        if (sp == NULL) {
            r->state = RX_READY;
        } else if (UCS_PTR_IS_ERR(sp)) {
            ST_WARN("xport: receive from %s failed: %s", p->name, ucs_status_string(UCS_PTR_STATUS(sp)));
            rx_free(x, r);
            peer_fail(p, "receive failed");
            return UCS_OK; /* descriptor is owned by UCX now */
        } else {
            p->ops++;
        }
    } else if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) {
        r->dkind = RXD_UCX; /* keep UCX's descriptor, release after delivery */
        r->data = data;
        ret = UCS_INPROGRESS;
    } else {
        r->dkind = RXD_MALLOC;
        r->data = malloc(length);
        if (!r->data) {
            rx_free(x, r);
            return bad_frame(p, rndv, "out of memory");
        }
        memcpy(r->data, data, length);
    }
    rx_insert(p, r);
    return ret;
}

static xport_peer *peer_new(xport *x, bool inbound, const char *name)
{
    xport_peer *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->x = x;
    p->inbound = inbound;
    p->user_knows = !inbound;
    p->state = PEER_OPEN;
    if (x->key) {
        p->auth = inbound ? AUTH_SERVER_START : AUTH_WAIT_CHALLENGE;
        p->auth_deadline = st_now_s() + x->auth_timeout_s;
    }
    snprintf(p->name, sizeof p->name, "%s", name);
    return p;
}

static void peer_link(xport *x, xport_peer *p)
{
    p->next = x->peers;
    x->peers = p;
    x->n_peers++;
}

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
    xport_peer *p = peer_new(x, true, name);
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
    peer_link(x, p);
    kick(x);
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

/* Delivers everything queued. Returns true when it called anything. */
static bool drain(xport *x)
{
    bool did = false;
    /* send completions */
    while (x->done_head) {
        struct send_ctx *c = x->done_head;
        x->done_head = c->next;
        if (!x->done_head) x->done_tail = NULL;
        xport_peer *p = c->peer;
        p->ops--;
        if (!c->internal) {
            if (c->status == 0) {
                x->stats.frames_sent++;
                x->stats.bytes_sent += c->bytes;
            }
            if (c->cb) c->cb(p, c->status, c->arg);
        }
        free(c->amhdr);
        free(c->copy);
        free(c);
        did = true;
    }
    /* connects and frames */
    for (xport_peer *p = x->peers; p; p = p->next) {
        if (p->state != PEER_OPEN || p->fail) continue;
        if ((authenticating(p) || p->auth_in_ready) && auth_step(x, p)) did = true;
        if (authenticating(p) || p->auth == AUTH_FAILED || p->fail) continue;
        if (!p->connect_reported) {
            p->connect_reported = true;
            p->user_knows = true;
            did = true;
            if (x->cb.on_connect) x->cb.on_connect(p, p->inbound, x->cb.ud);
        }
        while (p->state == PEER_OPEN && !p->fail && p->rx_head && p->rx_head->seq == p->rx_next &&
               p->rx_head->state != RX_WAITING) {
            struct rx *r = p->rx_head;
            p->rx_head = r->next;
            p->n_rx--;
            p->rx_next++;
            did = true;
            if (r->state == RX_FAILED) {
                rx_free(x, r);
                peer_fail(p, "payload receive failed");
                break;
            }
            const uint8_t *payload = r->data;
            size_t bytes = r->len;
            if (!r->hdr) {
                st_err err;
                r->hdr = frame_header_unpack(r->data, r->hdr_in_data, &err);
                payload += r->hdr_in_data;
                bytes -= r->hdr_in_data;
                if (!r->hdr || frame_validate(r->hdr, bytes, &err)) {
                    bad_frame(p, false, err.msg);
                    rx_free(x, r);
                    break;
                }
            }
            x->stats.frames_recv++;
            x->stats.bytes_recv += bytes;
            if (st_hop_trace_on()) st_hop_mark("deliver", r->hdr->batch_id, st_now_ns());
            if (r->hdr->batch_id) pp_note_ref(&x->pred, st_now_ns());
            r->delivered = x->cb.on_frame != NULL;
            if (x->cb.on_frame) x->cb.on_frame(p, r->hdr, bytes ? payload : NULL, bytes, x->cb.ud);
            rx_free(x, r);
        }
    }
    /* closes */
    for (xport_peer *p = x->peers; p; p = p->next) {
        if (p->fail && p->deferred_head) {
            fail_deferred(p);
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
        while (p->rx_head) {
            struct rx *r = p->rx_head;
            p->rx_head = r->next;
            rx_free(x, r);
        }
        if (p->user_knows && x->cb.on_disconnect) x->cb.on_disconnect(p, p->reason, x->cb.ud);
        free(p);
        did = true;
    }
    return did;
}

/* The worker's fd is readable, or kick(). Progress and deliver in rounds
 * until nothing happens, then arm the worker (UCX: after progress returned 0;
 * BUSY = more events). Each frame is delivered right after the progress call
 * that completed it, before the next progress or the arm (a receiver starts
 * its work one round sooner), and work started by the callbacks (a send
 * from on_frame) is progressed in the same call rather than in another pass
 * of the loop: each pass costs an epoll_wait, and on a loopback hop the
 * woken peer often waits for this thread's CPU. Progress is skipped when
 * the previous round neither progressed nor started a UCX operation. After
 * XPORT_EVENT_ROUNDS busy rounds it yields to the loop (kick). */
static void on_event(evutil_socket_t fd, short what, void *arg)
{
    xport *x = arg;
    x->ev_t0 = x->woke_ns = st_now_ns();
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
        poll_plan(x);
        return;
    }
    x->in_event = false;
    kick(x);
}

/* ---- public API ---- */

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
    x->tfd = -1;
    x->loadavg_fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    cpu_set_t cs;
    x->n_cpus = sched_getaffinity(0, sizeof cs, &cs) == 0 ? CPU_COUNT(&cs) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (x->n_cpus < 1) x->n_cpus = 1;
    x->unauth_lim = (st_log_limit)ST_LOG_LIMIT_INIT(1.0);
    x->authfail_lim = (st_log_limit)ST_LOG_LIMIT_INIT(1.0);

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
    x->poll_ns = (uint64_t)XPORT_POLL_DEFAULT_US * 1000u;
    const char *poll = getenv("STRATA_XPORT_POLL_US");
    if (poll && *poll) {
        char *end;
        errno = 0;
        long us = strtol(poll, &end, 10);
        if (errno || *end || us < 0 || us > XPORT_POLL_MAX_US) {
            st_errf(err, "STRATA_XPORT_POLL_US=%.40s: want a whole number of microseconds in [0, %d]", poll,
                    XPORT_POLL_MAX_US);
            goto fail;
        }
        x->poll_ns = (uint64_t)us * 1000u;
    }
    ucp_am_handler_param_t ap = {.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                                               UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG,
                                 .id = XPORT_AM_FRAME,
                                 .flags = UCP_AM_FLAG_WHOLE_MSG | UCP_AM_FLAG_PERSISTENT_DATA,
                                 .cb = on_am,
                                 .arg = x};
    st = ucp_worker_set_am_recv_handler(x->worker, &ap);
    if (st == UCS_OK) {
        ucp_am_handler_param_t aa = ap;
        aa.id = XPORT_AM_AUTH;
        aa.flags = UCP_AM_FLAG_WHOLE_MSG;
        aa.cb = on_auth_am;
        st = ucp_worker_set_am_recv_handler(x->worker, &aa);
    }
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
    /* The spin's timer: a timerfd, not a libevent timer (those round epoll's
     * timeout up to whole milliseconds). */
    x->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (x->tfd < 0) {
        st_errf(err, "xport: timerfd_create: %s", strerror(errno));
        goto fail;
    }
    x->poll_ev = event_new(base, x->tfd, EV_READ | EV_PERSIST, on_poll_timer, x);
    if (!x->poll_ev || event_add(x->poll_ev, NULL)) {
        st_errf(err, "xport: cannot add the poll timer to the loop");
        goto fail;
    }
    if (listen_host) {
        struct sockaddr_storage ss;
        socklen_t sl;
        if (resolve(listen_host, listen_port, &ss, &sl, true, err)) goto fail;
        ucp_listener_params_t lp = {.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR |
                                                  UCP_LISTENER_PARAM_FIELD_CONN_HANDLER,
                                    .sockaddr = {.addr = (const struct sockaddr *)&ss, .addrlen = sl},
                                    .conn_handler = {.cb = on_conn_request, .arg = x}};
        st = ucp_listener_create(x->worker, &lp, &x->listener);
        if (st != UCS_OK) {
            st_errf(err, "xport: listen on %s:%d: %s", listen_host, listen_port, ucs_status_string(st));
            goto fail;
        }
        ucp_listener_attr_t la = {.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR};
        st = ucp_listener_query(x->listener, &la);
        if (st != UCS_OK) {
            st_errf(err, "xport: ucp_listener_query: %s", ucs_status_string(st));
            goto fail;
        }
        if (la.sockaddr.ss_family == AF_INET)
            x->port = ntohs(((struct sockaddr_in *)&la.sockaddr)->sin_port);
        else if (la.sockaddr.ss_family == AF_INET6)
            x->port = ntohs(((struct sockaddr_in6 *)&la.sockaddr)->sin6_port);
    }
    kick(x); /* arm the worker from the loop */
    return x;
fail:
    xport_destroy(x);
    return NULL;
}

int xport_port(const xport *x) { return x->port; }

bool xport_memory_cuda(const xport *x)
{
    ucp_context_attr_t a = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    if (ucp_context_query(x->ctx, &a) != UCS_OK) return false;
    return (a.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
}

int xport_set_poll_us(xport *x, long us, st_err *err)
{
    if (us < 0 || us > XPORT_POLL_MAX_US)
        return st_errf(err, "xport: idle poll of %ld us: want [0, %d]", us, XPORT_POLL_MAX_US);
    x->poll_ns = (uint64_t)us * 1000u;
    if (!x->poll_ns && x->plan_timer) {
        timer_set(x, 0);
        x->plan_timer = false;
    }
    return 0;
}

long xport_poll_us(const xport *x) { return (long)(x->poll_ns / 1000u); }

size_t xport_max_inline_header(const xport *x) { return x->max_am_header > XPORT_PREFIX ? x->max_am_header - XPORT_PREFIX : 0; }

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
    xport_peer *p = peer_new(x, false, name);
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
    peer_link(x, p);
    kick(x);
    return p;
}

void xport_peer_close(xport_peer *p)
{
    if (p) peer_fail(p, "closed locally");
}
const char *xport_peer_name(const xport_peer *p) { return p->name; }
void xport_peer_set_user(xport_peer *p, void *user) { p->user = user; }
void *xport_peer_user(const xport_peer *p) { return p->user; }

/* Starts the UCX send of c (am_id, amhdr, data, flags, mem filled). 0, or
 * -1 + err (c untouched: the caller frees it). */
static int issue_send(xport_peer *p, struct send_ctx *c, st_err *err)
{
    xport *x = p->x;
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                                              UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = c->flags,
                              .cb.send = on_send_cb,
                              .user_data = c};
    if (c->mem && c->dlen) {
        rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        rp.memh = c->mem->memh;
        if (c->mem->device) {
            rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
            rp.memory_type = c->mem->mtype;
        }
    }
    ucs_status_ptr_t sp = ucp_am_send_nbx(p->ep, c->am_id, c->amhdr_len ? c->amhdr : NULL, c->amhdr_len,
                                          c->dlen ? c->data : NULL, c->dlen, &rp);
    if (UCS_PTR_IS_ERR(sp))
        return st_errf(err, "xport: send to %s: %s", p->name, ucs_status_string(UCS_PTR_STATUS(sp)));
    if (sp == NULL) send_done(x, c, 0); /* completed at once: report from the loop */
    kick(x);
    return 0;
}

/* The sends queued during the handshake go out (it succeeded) or fail. */
static void flush_deferred(xport_peer *p)
{
    while (p->deferred_head) {
        struct send_ctx *c = p->deferred_head;
        p->deferred_head = c->next;
        if (!p->deferred_head) p->deferred_tail = NULL;
        st_err err;
        if (issue_send(p, c, &err)) {
            ST_WARN("%s", err.msg);
            send_done(p->x, c, -1);
            peer_fail(p, "send failed");
        }
    }
}

static void fail_deferred(xport_peer *p)
{
    while (p->deferred_head) {
        struct send_ctx *c = p->deferred_head;
        p->deferred_head = c->next;
        send_done(p->x, c, -1);
    }
    p->deferred_tail = NULL;
}

static int send_common(xport_peer *p, const uint8_t *hb, size_t hl, const void *payload, size_t bytes,
                       const xport_mem *mem, xport_send_cb cb, void *arg, st_err *err)
{
    if (!p) return st_errf(err, "xport: no peer (NULL)");
    xport *x = p->x;
    if (p->state != PEER_OPEN || p->fail) return st_errf(err, "xport: peer %s is disconnected", p->name);
    if (bytes && !payload) return st_errf(err, "xport: payload of %zu bytes is NULL", bytes);
    if (mem && bytes &&
        ((const uint8_t *)payload < (const uint8_t *)mem->ptr ||
         (const uint8_t *)payload + bytes > (const uint8_t *)mem->ptr + mem->len))
        return st_errf(err, "xport: payload is outside its registered region");
    struct send_ctx *c = calloc(1, sizeof *c);
    if (!c) return st_errf(err, "xport: out of memory");
    c->peer = p;
    c->cb = cb;
    c->arg = arg;
    c->bytes = bytes;
    bool inline_hdr = XPORT_PREFIX + hl <= x->max_am_header;
    const bool device = mem && bytes && mem->device;
    if (device && !inline_hdr) { /* the header cannot be copied in front of device memory */
        free(c);
        return st_errf(err, "xport: a header of %zu bytes with a device payload does not fit the AM header", hl);
    }
    c->amhdr = malloc(XPORT_PREFIX + (inline_hdr ? hl : 0));
    if (!c->amhdr) goto oom;
    put_le32(c->amhdr, XPORT_MAGIC);
    put_le16(c->amhdr + 4, XPORT_VERSION);
    put_le16(c->amhdr + 6, inline_hdr ? 0 : XPORT_FLAG_HDR_IN_DATA);
    put_le32(c->amhdr + 8, (uint32_t)hl);
    put_le32(c->amhdr + 12, 0);
    put_le64(c->amhdr + 16, p->tx_seq);
    const void *data = payload;
    size_t dlen = bytes;
    if (inline_hdr) {
        if (hl) memcpy(c->amhdr + XPORT_PREFIX, hb, hl);
    } else {
        c->copy = malloc(hl + bytes);
        if (!c->copy) goto oom;
        memcpy(c->copy, hb, hl);
        if (bytes) memcpy(c->copy + hl, payload, bytes);
        data = c->copy;
        dlen = hl + bytes;
        mem = NULL;
    }
    c->am_id = XPORT_AM_FRAME;
    c->amhdr_len = XPORT_PREFIX + (inline_hdr ? hl : 0);
    c->data = data;
    c->dlen = dlen;
    c->flags = UCP_AM_SEND_FLAG_REPLY;
    if (device) c->flags |= UCP_AM_SEND_FLAG_RNDV; /* the receiver picks the (device) destination */
    else if (dlen && dlen <= x->eager_max) c->flags |= UCP_AM_SEND_FLAG_EAGER;
    c->mem = mem;
    if (authenticating(p)) { /* goes out once the peer proved the key (flush_deferred) */
        c->next = NULL;
        if (p->deferred_tail)
            p->deferred_tail->next = c;
        else
            p->deferred_head = c;
        p->deferred_tail = c;
    } else if (issue_send(p, c, err)) {
        free(c->amhdr);
        free(c->copy);
        free(c);
        return -1;
    }
    p->tx_seq++;
    p->ops++;
    return 0;
oom:
    free(c->amhdr);
    free(c);
    return st_errf(err, "xport: out of memory");
}

/* ---- handshake (docs/protocol.md, "Handshake") ---- */


static void auth_send(xport_peer *p, enum auth_type type, const uint8_t *nonce, const uint8_t *mac)
{
    struct send_ctx *c = calloc(1, sizeof *c);
    uint8_t *m = calloc(1, AUTH_MSG_LEN);
    if (!c || !m) {
        free(c);
        free(m);
        auth_fail(p, "out of memory");
        return;
    }
    put_le32(m, AUTH_MAGIC);
    m[4] = (uint8_t)type;
    m[5] = (uint8_t)p->x->role;
    if (nonce) memcpy(m + 8, nonce, CLUSTER_NONCE_LEN);
    if (mac) memcpy(m + 8 + CLUSTER_NONCE_LEN, mac, CLUSTER_MAC_LEN);
    c->peer = p;
    c->internal = true;
    c->copy = m;
    c->am_id = XPORT_AM_AUTH;
    c->data = m;
    c->dlen = AUTH_MSG_LEN;
    c->flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    st_err err;
    if (issue_send(p, c, &err)) {
        free(m);
        free(c);
        auth_fail(p, err.msg);
        return;
    }
    p->ops++;
}

/* Runs p's handshake one step: the server's challenge, then the message
 * received (p->auth_in). Returns true when it did something. */
static bool auth_step(xport *x, xport_peer *p)
{
    bool did = false;
    if (p->auth == AUTH_SERVER_START) {
        did = true;
        if (cluster_random(p->ns, CLUSTER_NONCE_LEN)) {
            auth_fail(p, "no random bytes (RAND_bytes)");
            return true;
        }
        p->auth = AUTH_WAIT_RESPONSE;
        auth_send(p, AUTH_CHALLENGE, p->ns, NULL);
    }
    if (!p->auth_in_ready || p->fail) return did;
    p->auth_in_ready = false;
    const uint8_t *m = p->auth_in;
    uint8_t type = m[4], role = m[5];
    const uint8_t *nonce = m + 8, *mac = m + 8 + CLUSTER_NONCE_LEN;
    uint8_t mine[CLUSTER_MAC_LEN];
    if (p->auth == AUTH_OFF) {
        if (!p->inbound && type == AUTH_CHALLENGE) {
            x->stats.auth_failures++;
            unsigned long quiet;
            if (st_log_limit_allow(&x->authfail_lim, st_now_s(), &quiet))
                ST_ERROR("xport: %s requires data-plane authentication, and this process has no cluster key "
                         "(cluster_key_file / --cluster-key-file; docs/security.md)", p->name);
            peer_fail(p, "the peer requires the cluster key and none is configured");
        }
        return true; /* anything else from a peer when we have no key: ignored */
    }
    if (role != XPORT_ROLE_COORDINATOR && role != XPORT_ROLE_STAGE) {
        auth_fail(p, "handshake with an unknown role");
        return true;
    }
    int idx;
    switch (p->auth) {
    case AUTH_WAIT_CHALLENGE:
        if (type != AUTH_CHALLENGE) break;
        memcpy(p->ns, nonce, CLUSTER_NONCE_LEN);
        if (cluster_random(p->nc, CLUSTER_NONCE_LEN)) {
            auth_fail(p, "no random bytes (RAND_bytes)");
            return true;
        }
        p->role = (enum xport_role)role;
        if (cluster_handshake_proof(x->key, 0, 'C', (uint8_t)x->role, role, p->ns, p->nc, mine)) {
            auth_fail(p, "HMAC failed (libcrypto)");
            return true;
        }
        p->auth = AUTH_WAIT_CONFIRM;
        auth_send(p, AUTH_RESPONSE, p->nc, mine);
        return true;
    case AUTH_WAIT_RESPONSE:
        if (type != AUTH_RESPONSE) break;
        memcpy(p->nc, nonce, CLUSTER_NONCE_LEN);
        idx = cluster_handshake_verify(x->key, 'C', role, (uint8_t)x->role, p->ns, p->nc, mac);
        if (idx < 0) { /* tell it (its operator sees why); disconnected when it leaves, or at on_auth_tick */
            auth_fail_note(p, "its proof does not match the cluster key (a different key, or none)");
            p->auth_deadline = st_now_s() + 1.0;
            auth_send(p, AUTH_REFUSED, NULL, NULL);
            return true;
        }
        p->role = (enum xport_role)role;
        if (cluster_handshake_proof(x->key, idx, 'S', role, (uint8_t)x->role, p->ns, p->nc, mine)) {
            auth_fail(p, "HMAC failed (libcrypto)");
            return true;
        }
        auth_send(p, AUTH_CONFIRM, NULL, mine);
        if (p->fail) return true;
        p->auth = AUTH_DONE;
        ST_DEBUG("xport: %s authenticated as %s", p->name, xport_role_name(p->role));
        flush_deferred(p);
        return true;
    case AUTH_WAIT_CONFIRM:
        if (type == AUTH_REFUSED) {
            auth_fail(p, "the peer refused our proof: the cluster keys differ");
            return true;
        }
        if (type != AUTH_CONFIRM) break;
        if (cluster_handshake_verify(x->key, 'S', (uint8_t)x->role, (uint8_t)p->role, p->ns, p->nc, mac) < 0) {
            auth_fail(p, "the peer did not prove the cluster key");
            return true;
        }
        p->auth = AUTH_DONE;
        ST_DEBUG("xport: %s authenticated as %s", p->name, xport_role_name(p->role));
        flush_deferred(p);
        return true;
    default: break;
    }
    auth_fail(p, "handshake message out of turn");
    return true;
}

/* Handshake deadlines. */
static void on_auth_tick(evutil_socket_t fd, short what, void *arg)
{
    xport *x = arg;
    double now = st_now_s();
    for (xport_peer *p = x->peers; p; p = p->next) {
        if (p->state != PEER_OPEN || p->fail || now < p->auth_deadline) continue;
        if (p->auth == AUTH_FAILED)
            peer_fail(p, "authentication failed");
        else if (authenticating(p))
            auth_fail(p, p->inbound ? "no proof of the cluster key in time"
                                    : "no handshake from the listener in time (has it the cluster key?)");
    }
}

void xport_require_auth(xport *x, const cluster_key *key, enum xport_role role, double timeout_s)
{
    x->key = key;
    x->role = key ? role : XPORT_ROLE_NONE;
    x->auth_timeout_s = timeout_s > 0 ? timeout_s : AUTH_TIMEOUT_S;
    if (key && !x->auth_ev) {
        x->auth_ev = event_new(x->base, -1, EV_PERSIST, on_auth_tick, x);
        struct timeval tv = {0, AUTH_TICK_US};
        if (x->auth_ev) event_add(x->auth_ev, &tv);
    }
}

enum xport_role xport_peer_role(const xport_peer *p) { return p->auth == AUTH_DONE ? p->role : XPORT_ROLE_NONE; }

const char *xport_role_name(enum xport_role r)
{
    return r == XPORT_ROLE_COORDINATOR ? "coordinator" : r == XPORT_ROLE_STAGE ? "stage" : "unauthenticated";
}

int xport_send(xport_peer *p, const frame_header *hdr, const void *payload, size_t payload_bytes,
               const xport_mem *mem, xport_send_cb cb, void *arg, st_err *err)
{
    if (!p) return st_errf(err, "xport: no peer (NULL)");
    if (st_hop_trace_on()) st_hop_mark("send", hdr->batch_id, st_now_ns());
    if (frame_validate(hdr, payload_bytes, err)) return st_err_prefix(err, "xport_send");
    if (hdr->batch_id) pp_note_ref(&p->x->pred, st_now_ns());
    size_t hl = 0;
    uint8_t *hb = frame_header_pack(hdr, &hl, err);
    if (!hb) return -1;
    int rc = send_common(p, hb, hl, payload, payload_bytes, mem, cb, arg, err);
    free(hb);
    return rc;
}

int xport_send_raw(xport_peer *p, const void *hdr_bytes, size_t hdr_len, const void *payload, size_t payload_bytes,
                   xport_send_cb cb, void *arg, st_err *err)
{
    if (hdr_len > FRAME_MAX_HEADER) return st_errf(err, "xport: header too long");
    return send_common(p, hdr_bytes, hdr_len, payload, payload_bytes, NULL, cb, arg, err);
}

static xport_mem *mem_map_type(xport *x, void *ptr, size_t len, bool owned, bool device, ucs_memory_type_t mtype,
                               st_err *err)
{
    xport_mem *m = calloc(1, sizeof *m);
    if (!m) {
        st_errf(err, "xport: out of memory");
        return NULL;
    }
    ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                               .address = ptr,
                               .length = len};
    if (device) {
        mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
        mp.memory_type = mtype;
    }
    ucs_status_t st = ucp_mem_map(x->ctx, &mp, &m->memh);
    if (st != UCS_OK) {
        free(m);
        st_errf(err, "xport: ucp_mem_map %zu bytes: %s", len, ucs_status_string(st));
        return NULL;
    }
    m->ptr = ptr;
    m->len = len;
    m->owned = owned;
    m->device = device;
    m->mtype = device ? mtype : UCS_MEMORY_TYPE_HOST;
    return m;
}

static xport_mem *mem_map(xport *x, void *ptr, size_t len, bool owned, st_err *err)
{
    return mem_map_type(x, ptr, len, owned, false, UCS_MEMORY_TYPE_HOST, err);
}

xport_mem *xport_mem_register_device(xport *x, void *ptr, size_t len, bool cuda, st_err *err)
{
    if (!ptr || !len) {
        st_errf(err, "xport: cannot register an empty region");
        return NULL;
    }
    return mem_map_type(x, ptr, len, false, true, cuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST, err);
}

void xport_set_rx_sink(xport *x, const xport_rx_sink *sink)
{
    if (sink && sink->get && sink->put) x->sink = *sink;
    else memset(&x->sink, 0, sizeof x->sink);
}

xport_mem *xport_mem_register(xport *x, void *ptr, size_t len, st_err *err)
{
    if (!ptr || !len) {
        st_errf(err, "xport: cannot register an empty region");
        return NULL;
    }
    return mem_map(x, ptr, len, false, err);
}

xport_mem *xport_mem_alloc(xport *x, size_t len, st_err *err)
{
    void *ptr = NULL;
    if (!len || posix_memalign(&ptr, 4096, len)) {
        st_errf(err, "xport: cannot allocate %zu bytes", len);
        return NULL;
    }
    xport_mem *m = mem_map(x, ptr, len, true, err);
    if (!m) free(ptr);
    return m;
}

void *xport_mem_ptr(const xport_mem *m) { return m->ptr; }
size_t xport_mem_len(const xport_mem *m) { return m->len; }

void xport_mem_unregister(xport *x, xport_mem *m)
{
    if (!m) return;
    ucp_mem_unmap(x->ctx, m->memh);
    if (m->owned) free(m->ptr);
    free(m);
}

void xport_get_stats(const xport *x, xport_stats *out) { *out = x->stats; }

/* Runs the send callbacks of the completed sends and frees them. */
static void destroy_run_done(xport *x)
{
    while (x->done_head) {
        struct send_ctx *c = x->done_head;
        x->done_head = c->next;
        c->peer->ops--;
        if (c->cb) c->cb(c->peer, c->status, c->arg);
        free(c->amhdr);
        free(c->copy);
        free(c);
    }
    x->done_tail = NULL;
}

/* Teardown order. UCX may call back from its own thread until the worker is
 * destroyed: in UCX 1.13 a TCP connection the listener accepted but whose
 * request data had not been read yet keeps a pointer to the listener, and
 * delivers it (ucp_cm_server_conn_request_cb) even after
 * ucp_listener_destroy freed it; only ucp_worker_destroy (closing the
 * connection manager, with UCX's async thread blocked) removes those.
 * So: refuse new requests first (destroying: on_conn_request rejects them
 * with ucp_listener_reject), close the peers, then destroy the listener and
 * the worker back to back, and free what a callback could still name (the
 * peers, their pending receives, the loop event) only after the worker. */
void xport_destroy(xport *x)
{
    if (!x) return;
    x->destroying = true;
    if (x->worker) {
        for (xport_peer *p = x->peers; p; p = p->next) {
            if (!p->fail) snprintf(p->reason, sizeof p->reason, "transport destroyed");
            p->fail = true;
            fail_deferred(p);
            peer_start_close(x, p);
        }
        /* Let closes and cancelled operations complete (bounded), running
         * the send callbacks as they complete. */
        double t0 = st_now_s();
        for (;;) {
            while (ucp_worker_progress(x->worker)) {
            }
            destroy_run_done(x);
            bool busy = false;
            for (xport_peer *p = x->peers; p; p = p->next)
                if (p->state != PEER_CLOSED || p->ops > 0) busy = true;
            if (!busy || st_now_s() - t0 > 5.0) break;
        }
        for (xport_peer *p = x->peers; p; p = p->next) {
            if (p->state != PEER_CLOSED || p->ops > 0) ST_WARN("xport: %s did not close cleanly", p->name);
            /* A waiting receive may still be written by UCX: kept until the
             * worker is gone. The others are released now (UCX-owned data
             * needs the worker). */
            struct rx *keep = NULL;
            while (p->rx_head) {
                struct rx *r = p->rx_head;
                p->rx_head = r->next;
                if (r->state != RX_WAITING) {
                    rx_free(x, r);
                } else {
                    r->next = keep;
                    keep = r;
                }
            }
            p->rx_head = keep;
        }
        if (x->listener) ucp_listener_destroy(x->listener);
        ucp_worker_destroy(x->worker);
        /* No UCX callback from here on. Sends the worker cancelled while
         * closing report -1. */
        destroy_run_done(x);
        while (x->peers) {
            xport_peer *p = x->peers;
            x->peers = p->next;
            while (p->rx_head) {
                struct rx *r = p->rx_head;
                p->rx_head = r->next;
                if (r->dkind == RXD_UCX) r->dkind = RXD_NONE; /* went with the worker */
                rx_free(x, r);
            }
            free(p);
        }
    }
    if (x->ev) event_free(x->ev);
    if (x->poll_ev) event_free(x->poll_ev);
    if (x->tfd >= 0) close(x->tfd);
    if (x->loadavg_fd >= 0) close(x->loadavg_fd);
    if (x->auth_ev) event_free(x->auth_ev);
    for (int i = 0; i < XPORT_POOL_MAX; i++) rbuf_unmap(x, &x->pool[i]);
    if (x->ctx) ucp_cleanup(x->ctx);
    free(x);
}
