/* bench_xport.c — strata-bench-xport: one-hop latency and bandwidth of the
 * UCX data plane (ib/transport.h) between two processes.
 *
 *   strata-bench-xport [--gap-ms N] [--gap-bytes B] [--gap-only] [server ... | client ...]
 *   strata-bench-xport                   spawns a server on 127.0.0.1 and measures
 *   strata-bench-xport server [PORT]     serve (prints "PORT n")
 *   strata-bench-xport client HOST PORT  measure against a running server
 *
 * For each payload size 256 B .. 16 MiB (x4 steps; rows x cols f32 with
 * cols = min(size/4, 4096)):
 *   latency   = ping-pong round trip / 2 (the server answers with a frame of
 *               the same size from its own registered buffer), in us;
 *   bandwidth = a window of 8 frames in flight (the receiver pool size), the server acks each with a
 *               CONTROL frame; bytes / time, in MiB/s.
 * Then, with --gap-ms N (default 40; 0 skips it), a pipeline's case: one-way
 * latency after an idle gap at --gap-bytes (default 8192). The server holds
 * each ping N ms (a forward elsewhere in the pipeline), stamps
 * CLOCK_MONOTONIC into the reply and sends it; the client sleeps in its loop
 * meanwhile, as a stage does, and takes (arrival - stamp). Rounds alternate
 * the client's adaptive polling (ib/transport.h) on (STRATA_XPORT_POLL_US, or
 * its default) and off (0); medians of each, with the spins' CPU time.
 * Then the same case over plain TCP loopback without UCX (bench/tcp_floor.h),
 * the floor of this machine's kernel and CPUs.
 * Transports come from UCX's environment (UCX_TLS, UCX_NET_DEVICES). Compare
 * with: ucx_perftest -t ucp_am_lat / ucp_am_bw -s SIZE (see docs/protocol.md).
 */
#include <event2/event.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/tcp_floor.h"
#include "common/clock.h"
#include "ib/transport.h"

#define MAX_BYTES (16u << 20)
#define WINDOW 8

struct bench {
    struct event_base *base;
    xport *x;
    xport_mem *buf; /* registered send buffer, MAX_BYTES */
    xport_peer *peer;
    long got;       /* pongs / acks received */
    uint64_t stamp_ns; /* the last gap reply's send time (server's CLOCK_MONOTONIC) */
    uint64_t got_ns;   /* when it was delivered */
    long sent_done;
    int gone;
};

/* A 1-sequence ACTIVATIONS header for `bytes` of f32 payload. stage 0 = ping,
 * stage 1 = bandwidth (ack wanted). */
struct hdr {
    frame_header h;
    frame_seq s;
    frame_seq *sp;
    int32_t block;
    uint32_t shape[2];
};

static void make_hdr(struct hdr *m, size_t bytes, uint32_t stage, uint64_t batch)
{
    strata__v1__frame_header__init(&m->h);
    strata__v1__seq_record__init(&m->s);
    size_t n = bytes / 4, cols = n < 4096 ? n : 4096;
    m->block = 0;
    m->s.seq_id = 1;
    m->s.n_tokens = (int32_t)(n / cols);
    m->s.block_table = &m->block;
    m->s.n_block_table = 1;
    m->sp = &m->s;
    m->shape[0] = (uint32_t)(n / cols);
    m->shape[1] = (uint32_t)cols;
    m->h.kind = STRATA__V1__FRAME_KIND__FRAME_KIND_ACTIVATIONS;
    m->h.batch_id = batch;
    m->h.stage = stage;
    m->h.seqs = &m->sp;
    m->h.n_seqs = 1;
    m->h.dtype = STRATA__V1__DTYPE__DTYPE_F32;
    m->h.shape = m->shape;
    m->h.n_shape = 2;
}

static void on_sent(xport_peer *p, int status, void *arg)
{
    struct bench *b = arg;
    b->sent_done++;
    if (status) fprintf(stderr, "send failed\n");
}

/* ---- server ---- */

struct held { /* a gap ping the server answers later */
    struct bench *b;
    xport_peer *p;
    struct hdr m;
    size_t bytes;
};

static void srv_reply_held(evutil_socket_t fd, short what, void *arg)
{
    struct held *hd = arg;
    st_err err;
    uint64_t now = st_now_ns();
    memcpy(xport_mem_ptr(hd->b->buf), &now, sizeof now);
    if (xport_send(hd->p, &hd->m.h, xport_mem_ptr(hd->b->buf), hd->bytes, hd->b->buf, on_sent, hd->b, &err))
        fprintf(stderr, "server: %s\n", err.msg);
    free(hd);
}

static void srv_frame(xport_peer *p, const frame_header *h, const void *payload, size_t bytes, void *ud)
{
    struct bench *b = ud;
    st_err err;
    if (h->stage == 2 && bytes >= 8 && h->n_seqs == 1) { /* gap ping: pos = the hold in ms */
        struct held *hd = calloc(1, sizeof *hd);
        if (!hd) return;
        hd->b = b;
        hd->p = p;
        hd->bytes = bytes;
        make_hdr(&hd->m, bytes, 2, h->batch_id);
        int ms = (int)h->seqs[0]->pos;
        struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
        event_base_once(b->base, -1, EV_TIMEOUT, srv_reply_held, hd, &tv);
    } else if (h->stage == 0) { /* ping: pong the same size from our registered buffer */
        if (xport_send(p, h, xport_mem_ptr(b->buf), bytes, b->buf, on_sent, b, &err))
            fprintf(stderr, "server: %s\n", err.msg);
    } else { /* bandwidth: ack */
        frame_header a;
        strata__v1__frame_header__init(&a);
        a.kind = STRATA__V1__FRAME_KIND__FRAME_KIND_CONTROL;
        a.batch_id = h->batch_id;
        if (xport_send(p, &a, NULL, 0, NULL, on_sent, b, &err)) fprintf(stderr, "server: %s\n", err.msg);
    }
}

static int run_server(int port)
{
    struct bench b = {0};
    b.base = event_base_new();
    xport_callbacks cb = {.on_frame = srv_frame, .ud = &b};
    st_err err;
    b.x = xport_create(b.base, "0.0.0.0", port, &cb, &err);
    if (!b.x) {
        fprintf(stderr, "server: %s\n", err.msg);
        return 1;
    }
    b.buf = xport_mem_alloc(b.x, MAX_BYTES, &err);
    if (!b.buf) return 1;
    memset(xport_mem_ptr(b.buf), 0x5a, MAX_BYTES);
    printf("PORT %d\n", xport_port(b.x));
    fflush(stdout);
    if (getenv("STRATA_BENCH_POLL")) /* busy-poll like ucx_perftest instead of sleeping in epoll */
        for (;;) event_base_loop(b.base, EVLOOP_NONBLOCK);
    event_base_dispatch(b.base);
    return 0;
}

/* ---- client ---- */

static void cli_frame(xport_peer *p, const frame_header *h, const void *payload, size_t bytes, void *ud)
{
    struct bench *b = ud;
    if (h->stage == 2 && bytes >= 8) {
        b->got_ns = st_now_ns();
        memcpy(&b->stamp_ns, payload, sizeof b->stamp_ns);
    }
    b->got++;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The pipeline's case (see the top): rounds alternate polling on and off. */
static int gap_rounds(struct bench *b, int gap_ms, size_t bytes)
{
    enum { ROUNDS = 40, WARM = 4 };
    long on_us = xport_poll_us(b->x); /* STRATA_XPORT_POLL_US, or the default */
    double lat[2][ROUNDS], caught[ROUNDS];
    int n[2] = {0, 0}, n_caught = 0;
    xport_stats st0, st1;
    uint64_t spin_ns[2] = {0, 0}, spins[2] = {0, 0}, hits[2] = {0, 0};
    st_err err;
    for (int r = 0; r < 2 * (ROUNDS + WARM); r++) {
        int off = (r / 2) % 2; /* on, on, off, off, ...: each keeps its learnt gap */
        if (xport_set_poll_us(b->x, off ? 0 : on_us, &err)) return -1;
        struct hdr m;
        make_hdr(&m, bytes, 2, 1000000 + (uint64_t)r);
        m.s.pos = gap_ms;
        long want = b->got + 1;
        xport_get_stats(b->x, &st0);
        if (xport_send(b->peer, &m.h, xport_mem_ptr(b->buf), bytes, b->buf, on_sent, b, &err)) return -1;
        double t0 = st_now_s();
        while (b->got < want && !b->gone && st_now_s() - t0 < 30) event_base_loop(b->base, EVLOOP_ONCE);
        if (b->got < want) return -1;
        xport_get_stats(b->x, &st1);
        if (r / 2 >= WARM && n[off] < ROUNDS) {
            lat[off][n[off]++] = (double)(b->got_ns - b->stamp_ns) / 1e3;
            if (st1.poll_hits > st0.poll_hits) caught[n_caught++] = lat[off][n[off] - 1];
            spin_ns[off] += st1.poll_spin_ns - st0.poll_spin_ns;
            spins[off] += st1.poll_spins - st0.poll_spins;
            hits[off] += st1.poll_hits - st0.poll_hits;
        }
    }
    qsort(caught, (size_t)n_caught, sizeof caught[0], cmp_d);
    for (int k = 0; k < 2; k++) {
        qsort(lat[k], (size_t)n[k], sizeof lat[k][0], cmp_d);
        printf("# gap %d ms, %zu B, polling %s (STRATA_XPORT_POLL_US=%ld): one-way median %.1f us, p90 %.1f us;"
               " %llu spins, %llu hits in %d replies (caught ones: median %.1f us), %.1f us of spin CPU per reply\n",
               gap_ms, bytes, k ? "off" : "on", k ? 0L : on_us, lat[k][n[k] / 2], lat[k][n[k] * 9 / 10],
               (unsigned long long)spins[k], (unsigned long long)hits[k], n[k],
               !k && n_caught ? caught[n_caught / 2] : 0.0, n[k] ? spin_ns[k] / 1e3 / n[k] : 0.0);
    }
    return 0;
}

static void cli_disc(xport_peer *p, const char *reason, void *ud)
{
    fprintf(stderr, "client: server gone: %s\n", reason);
    ((struct bench *)ud)->gone = 1;
}

static int wait_for(struct bench *b, long *ctr, long want, double timeout)
{
    double t0 = st_now_s();
    while (*ctr < want && !b->gone) {
        event_base_loop(b->base, EVLOOP_NONBLOCK);
        if (st_now_s() - t0 > timeout) return -1;
    }
    return b->gone ? -1 : 0;
}

static int gap_ms = 40, gap_only = 0;
static size_t gap_bytes = 8192;

static int run_client(const char *host, int port)
{
    struct bench b = {0};
    b.base = event_base_new();
    xport_callbacks cb = {.on_frame = cli_frame, .on_disconnect = cli_disc, .ud = &b};
    st_err err;
    b.x = xport_create(b.base, NULL, 0, &cb, &err);
    if (!b.x) {
        fprintf(stderr, "client: %s\n", err.msg);
        return 1;
    }
    b.buf = xport_mem_alloc(b.x, MAX_BYTES, &err);
    if (!b.buf) return 1;
    memset(xport_mem_ptr(b.buf), 0xa5, MAX_BYTES);
    b.peer = xport_connect(b.x, host, port, &err);
    if (!b.peer) {
        fprintf(stderr, "client: %s\n", err.msg);
        return 1;
    }
    const char *tls = getenv("UCX_TLS");
    printf("# strata-bench-xport: UCX_TLS=%s, one hop %s:%d\n", tls ? tls : "(default)", host, port);
    printf("# %10s %12s %14s\n", "bytes", "lat_us", "bw_MiB_s");
    for (size_t bytes = 256; bytes <= MAX_BYTES && !gap_only; bytes *= 4) {
        struct hdr m;
        int iters = bytes <= 65536 ? 2000 : bytes <= (1u << 20) ? 300 : 40;
        int warm = iters / 10 + 2;
        double t0 = 0;
        for (int i = 0; i < warm + iters; i++) {
            if (i == warm) t0 = st_now_s();
            make_hdr(&m, bytes, 0, (uint64_t)i);
            long want = b.got + 1;
            if (xport_send(b.peer, &m.h, xport_mem_ptr(b.buf), bytes, b.buf, on_sent, &b, &err) ||
                wait_for(&b, &b.got, want, 30)) {
                fprintf(stderr, "client: ping %zu failed: %s\n", bytes, err.msg);
                return 1;
            }
        }
        double lat = (st_now_s() - t0) / iters / 2 * 1e6;
        /* bandwidth: WINDOW frames in flight */
        int n = iters * 2;
        long base_got = b.got;
        int sent = 0;
        double t1 = st_now_s();
        while (b.got - base_got < n) {
            while (sent < n && sent - (b.got - base_got) < WINDOW) {
                make_hdr(&m, bytes, 1, (uint64_t)sent);
                if (xport_send(b.peer, &m.h, xport_mem_ptr(b.buf), bytes, b.buf, on_sent, &b, &err)) {
                    fprintf(stderr, "client: %s\n", err.msg);
                    return 1;
                }
                sent++;
            }
            event_base_loop(b.base, EVLOOP_NONBLOCK);
            if (b.gone || st_now_s() - t1 > 60) return 1;
        }
        double bw = (double)bytes * n / (st_now_s() - t1) / 1048576.0;
        printf("  %10zu %12.2f %14.1f\n", bytes, lat, bw);
        fflush(stdout);
    }
    if (gap_ms > 0 && gap_rounds(&b, gap_ms, gap_bytes)) {
        fprintf(stderr, "client: the gap rounds failed\n");
        return 1;
    }
    double floor_us[2];
    if (gap_ms > 0 && tcp_floor(gap_ms, gap_bytes, 40, floor_us))
        fprintf(stderr, "client: the plain TCP rounds failed\n");
    xport_mem_unregister(b.x, b.buf);
    xport_destroy(b.x);
    event_base_free(b.base);
    return 0;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    while (argc >= 3 && strncmp(argv[1], "--", 2) == 0) { /* options first */
        if (strcmp(argv[1], "--gap-ms") == 0) gap_ms = atoi(argv[2]);
        else if (strcmp(argv[1], "--gap-bytes") == 0) gap_bytes = (size_t)atol(argv[2]);
        else break;
        argv += 2;
        argc -= 2;
    }
    if (argc >= 2 && strcmp(argv[1], "--gap-only") == 0) {
        gap_only = 1;
        argv++;
        argc--;
    }
    if (gap_ms < 0 || gap_ms > 10000 || gap_bytes < 8 || gap_bytes > MAX_BYTES) {
        fprintf(stderr, "--gap-ms wants 0..10000, --gap-bytes 8..%u\n", MAX_BYTES);
        return 2;
    }
    if (argc >= 2 && strcmp(argv[1], "server") == 0) return run_server(argc >= 3 ? atoi(argv[2]) : 0);
    if (argc >= 4 && strcmp(argv[1], "client") == 0) return run_client(argv[2], atoi(argv[3]));
    if (argc != 1) {
        fprintf(stderr, "usage: %s [--gap-ms N] [--gap-bytes B] [--gap-only] [server [PORT] | client HOST PORT]\n",
                argv[0]);
        return 2;
    }
    int fds[2];
    if (pipe(fds)) return 1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        execl("/proc/self/exe", argv[0], "server", "0", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    char buf[64] = {0};
    ssize_t r = read(fds[0], buf, sizeof buf - 1);
    close(fds[0]);
    int port = 0;
    if (r <= 0 || sscanf(buf, "PORT %d", &port) != 1) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        fprintf(stderr, "server did not start\n");
        return 1;
    }
    int rc = run_client("127.0.0.1", port);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    return rc;
}
