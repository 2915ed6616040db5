/* test_worker.c — two real strata-worker processes serving stories260K as a
 * PP 2 x TP 2 pipeline on 127.0.0.1, driven by a fake coordinator: this test,
 * a protocol-level client on its own event loop (ib/transport.h) that speaks
 * the CONTROL protocol of proto/stage.proto (docs/protocol.md).
 *
 * argv[1] = the strata-worker binary. Checks, in order:
 *  1. a StageAssign with a bad model path gets StageReady{ok=false} naming it;
 *  2. StageAssign layers [0,3) / [3,5), TP 2 each -> StageReady{ok} with the
 *     model's shape and the KV blocks asked for;
 *  3. reference prompts 0 and 1 run concurrently as two sequences (separate
 *     micro-batches in flight): prefill, then 63 decode frames each; after 20
 *     tokens both pause while garbage arrives (random bytes over raw TCP to
 *     both data ports, an undecodable CONTROL, ACTIVATIONS with a wrong epoch
 *     to each stage, a block id beyond the KV cache), each garbage sender is
 *     disconnected, and then all 64 ids of each sequence equal the
 *     reference's completion_tokens, with the first token's logprobs;
 *  4. a forward that fails inside the stage (position beyond the KV cache)
 *     gets a CONTROL BatchError for its batch id; a chunk without
 *     wants_logits gets a CONTROL BatchDone;
 *  5. StatsRequest -> StageStats with exact forward / token / all-reduce counts;
 *  6. a new assignment (next epoch, bf16 activations) reloads both stages and
 *     prompt 0's first 16 greedy tokens still equal the reference;
 *  7. stage 1 stops (SIGTERM, exit 0): stage 0 keeps serving and answers
 *     BatchError for batches it cannot pass on;
 *  8. SIGTERM -> stage 0 exits with code 0 within 15 s.
 * Also: ACTIVATIONS before any assignment get their sender disconnected.
 * Every worker is killed at exit (atexit + PR_SET_PDEATHSIG); every wait is
 * bounded. UCX_TLS defaults to tcp, as in tests/ib.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ib/transport.h"
#include "proto/stage.pb-c.h"
#include "compute/registry.h"
#include "tests/testutil.h"

#define EPOCH 5
#define KV_BLOCKS 64
#define BLOCK_SIZE 16
#define N_GEN 64
#define PAUSE_AT 20

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- processes */

static pid_t pids[2];

static void kill_all(void)
{
    for (int i = 0; i < 2; i++)
        if (pids[i] > 0) {
            kill(pids[i], SIGKILL);
            waitpid(pids[i], NULL, 0);
            pids[i] = 0;
        }
}

static pid_t spawn_worker(const char *exe, const char *name, int *port)
{
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execl(exe, exe, "--listen", "127.0.0.1:0", "--name", name, "--threads", "2", "--model-dir",
              test_shared_path("models"), (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    char buf[256] = {0};
    size_t got = 0;
    double t0 = now_s();
    while (got < sizeof buf - 1 && !strchr(buf, '\n') && now_s() - t0 < 30) {
        ssize_t n = read(fds[0], buf + got, sizeof buf - 1 - got);
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fds[0]);
    *port = 0;
    const char *p = strstr(buf, "listening on ");
    if (p) {
        const char *c = strrchr(p, ':');
        if (c) *port = atoi(c + 1);
    }
    REQUIRE_MSG(*port > 0, "worker %s did not report its port (got '%s')", name, buf);
    return pid;
}

/* Waits up to timeout_s for pid; returns its wait status or -1 on timeout. */
static int wait_exit(pid_t pid, double timeout_s)
{
    double t0 = now_s();
    while (now_s() - t0 < timeout_s) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return st;
        usleep(20000);
    }
    return -1;
}

/* ---------------------------------------------------------------- reference */

typedef struct ref_prompt {
    int32_t prompt[64];
    int n_prompt;
    int32_t completion[N_GEN];
    int32_t top_id[2];   /* first generated token: top-2 ids and logprobs */
    float top_lp[2];
} ref_prompt;

static void load_ref(ref_prompt *r, int n)
{
    json_error_t je;
    json_t *root = json_load_file(test_shared_path("reference/stories260K-greedy.json"), 0, &je);
    REQUIRE_MSG(root && json_is_array(root), "reference json: %s", je.text);
    for (int i = 0; i < n; i++) {
        json_t *e = json_array_get(root, (size_t)i);
        json_t *pt = json_object_get(e, "prompt_tokens"), *ct = json_object_get(e, "completion_tokens");
        json_t *top = json_array_get(json_object_get(e, "top3_logprobs_first4"), 0);
        REQUIRE(json_is_array(pt) && json_is_array(ct) && json_array_size(ct) == N_GEN && json_is_array(top));
        REQUIRE(json_array_size(pt) <= 64);
        r[i].n_prompt = (int)json_array_size(pt);
        for (int k = 0; k < r[i].n_prompt; k++) r[i].prompt[k] = (int32_t)json_integer_value(json_array_get(pt, (size_t)k));
        for (int k = 0; k < N_GEN; k++) r[i].completion[k] = (int32_t)json_integer_value(json_array_get(ct, (size_t)k));
        for (int k = 0; k < 2; k++) {
            json_t *pair = json_array_get(top, (size_t)k);
            r[i].top_id[k] = (int32_t)json_integer_value(json_array_get(pair, 0));
            r[i].top_lp[k] = (float)json_real_value(json_array_get(pair, 1));
        }
    }
    json_decref(root);
}

/* ---------------------------------------------------------------- fake coordinator */

struct conn {
    xport_peer *p;
    int port;
    bool up, down;
    int n_ready;
    bool ready_ok;
    char ready_error[512];
    int ready_kv_blocks, ready_n_embd, ready_n_vocab, ready_n_layer;
    uint64_t ready_weight_bytes;
    int n_stats;
    Strata__V1__StageStats *stats; /* last one (owned) */
    int n_batch_error;
    uint64_t batch_error_id;
    char batch_error_msg[512];
    int n_batch_done;
    uint64_t batch_done_id;
};

struct seq {
    uint64_t id;
    const ref_prompt *ref;
    int32_t got[N_GEN];
    float lp0;
    int n_top0;
    int32_t top0[4];
    int n_got;
    int32_t blocks[16];
    int n_blocks;
    bool inflight, paused;
    int stop_at; /* 0 = N_GEN */
};

static struct {
    struct event_base *base;
    xport *x;
    struct conn w[2];        /* stage 0, stage 1 */
    struct conn rogue;       /* garbage senders (one at a time) */
    struct seq seqs[2];
    int32_t free_blocks[KV_BLOCKS];
    int n_free;
    uint64_t next_batch;
    uint64_t epoch;          /* of the frames send_step sends */
    int n_tokens_frames;     /* TOKENS frames received */
    int unknown_results;
} g;

static struct conn *conn_of(xport_peer *p) { return xport_peer_user(p); }

static void on_connect(xport_peer *p, bool inbound, void *ud)
{
    struct conn *c = conn_of(p);
    if (c) c->up = true;
}

static void on_disconnect(xport_peer *p, const char *reason, void *ud)
{
    struct conn *c = conn_of(p);
    if (c) {
        c->down = true;
        c->p = NULL;
    }
}

static void send_step(struct seq *s);

static void on_frame(xport_peer *p, const frame_header *h, const void *payload, size_t bytes, void *ud)
{
    struct conn *c = conn_of(p);
    if (!c) return;
    if (h->kind == STRATA__V1__FRAME_KIND__FRAME_KIND_TOKENS) {
        g.n_tokens_frames++;
        CHECK_EQ_INT(h->epoch, g.epoch);
        CHECK_EQ_INT(h->stage, 1);
        for (size_t i = 0; i < h->n_results; i++) {
            const frame_result *r = h->results[i];
            struct seq *s = NULL;
            for (int k = 0; k < 2; k++)
                if (g.seqs[k].id == r->seq_id) s = &g.seqs[k];
            if (!s || s->n_got >= N_GEN) {
                g.unknown_results++;
                continue;
            }
            if (s->n_got == 0) {
                s->lp0 = r->logprob;
                s->n_top0 = (int)r->n_top;
                for (size_t t = 0; t < r->n_top && t < 4; t++) s->top0[t] = r->top[t]->token;
            }
            s->got[s->n_got++] = r->token;
            s->inflight = false;
            if (s->n_got < (s->stop_at ? s->stop_at : N_GEN) && !(s->n_got == PAUSE_AT && s->paused)) send_step(s);
        }
        return;
    }
    if (h->kind != STRATA__V1__FRAME_KIND__FRAME_KIND_CONTROL) {
        CHECK_MSG(0, "unexpected frame kind %d from a worker", (int)h->kind);
        return;
    }
    Strata__V1__ControlMessage *m = strata__v1__control_message__unpack(NULL, h->control.len, h->control.data);
    REQUIRE(m);
    switch (m->msg_case) {
    case STRATA__V1__CONTROL_MESSAGE__MSG_READY: {
        const Strata__V1__StageReady *r = m->ready;
        c->n_ready++;
        c->ready_ok = r->ok;
        snprintf(c->ready_error, sizeof c->ready_error, "%s", r->error);
        c->ready_kv_blocks = r->kv_blocks;
        c->ready_n_embd = r->n_embd;
        c->ready_n_vocab = r->n_vocab;
        c->ready_n_layer = r->n_layer;
        c->ready_weight_bytes = r->weight_bytes;
        break;
    }
    case STRATA__V1__CONTROL_MESSAGE__MSG_STATS:
        c->n_stats++;
        if (c->stats) strata__v1__stage_stats__free_unpacked(c->stats, NULL);
        c->stats = m->stats;
        m->stats = NULL; /* keep it */
        m->msg_case = STRATA__V1__CONTROL_MESSAGE__MSG__NOT_SET;
        break;
    case STRATA__V1__CONTROL_MESSAGE__MSG_BATCH_ERROR:
        c->n_batch_error++;
        c->batch_error_id = m->batch_error->batch_id;
        snprintf(c->batch_error_msg, sizeof c->batch_error_msg, "%s", m->batch_error->error);
        break;
    case STRATA__V1__CONTROL_MESSAGE__MSG_BATCH_DONE:
        c->n_batch_done++;
        c->batch_done_id = m->batch_done->batch_id;
        break;
    default: CHECK_MSG(0, "unexpected CONTROL %d", (int)m->msg_case); break;
    }
    strata__v1__control_message__free_unpacked(m, NULL);
}

static void tick(evutil_socket_t fd, short what, void *arg) {}

/* Runs the loop until done() or timeout; returns done(). */
static bool pump(double timeout_s, bool (*done)(void *), void *arg)
{
    double t0 = now_s();
    while (!done(arg)) {
        if (now_s() - t0 > timeout_s) return false;
        event_base_loop(g.base, EVLOOP_ONCE);
    }
    return true;
}

static bool ready_count_is(void *arg)
{
    int want = *(int *)arg;
    return g.w[0].n_ready >= want && g.w[1].n_ready >= want;
}
static bool a_ready_is(void *arg) { return g.w[0].n_ready >= *(int *)arg; }
static bool rogue_down(void *arg) { return g.rogue.down; }
static bool seqs_at(void *arg)
{
    int n = *(int *)arg;
    return g.seqs[0].n_got >= n && g.seqs[1].n_got >= n;
}
static bool seq0_at(void *arg) { return g.seqs[0].n_got >= *(int *)arg; }
static bool a_batch_error(void *arg) { return g.w[0].n_batch_error >= 1; }
static bool b_batch_done(void *arg) { return g.w[1].n_batch_done >= 1; }
static bool stats_in(void *arg) { return g.w[0].n_stats >= 1 && g.w[1].n_stats >= 1; }

static void send_control(xport_peer *p, const Strata__V1__ControlMessage *m)
{
    size_t n = strata__v1__control_message__get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    strata__v1__control_message__pack(m, buf);
    frame_header h = STRATA__V1__FRAME_HEADER__INIT;
    h.kind = STRATA__V1__FRAME_KIND__FRAME_KIND_CONTROL;
    h.control.data = buf;
    h.control.len = n;
    st_err err;
    CHECK_MSG(xport_send(p, &h, NULL, 0, NULL, NULL, NULL, &err) == 0, "%s", err.msg);
    free(buf);
}

static void send_assign_ex(struct conn *c, uint64_t epoch, uint32_t stage, const char *model, int first,
                           int last, const char *next_hop, int act_dtype)
{
    Strata__V1__StageAssign a = STRATA__V1__STAGE_ASSIGN__INIT;
    a.epoch = epoch;
    a.stage = stage;
    a.n_stages = 2;
    a.model_path = (char *)model;
    a.first_layer = first;
    a.last_layer = last;
    a.tp = 2;
    a.kv_blocks = KV_BLOCKS;
    a.block_size = BLOCK_SIZE;
    a.act_dtype = act_dtype;
    a.next_hop = (char *)next_hop;
    Strata__V1__ControlMessage m = STRATA__V1__CONTROL_MESSAGE__INIT;
    m.msg_case = STRATA__V1__CONTROL_MESSAGE__MSG_ASSIGN;
    m.assign = &a;
    send_control(c->p, &m);
}

/* Stage 0 of 2 at TP 1 on a backend, with a device list. */
static void send_assign_backend(struct conn *c, const char *model, const char *backend, int32_t *devices,
                                size_t n_devices)
{
    Strata__V1__StageAssign a = STRATA__V1__STAGE_ASSIGN__INIT;
    a.epoch = EPOCH;
    a.n_stages = 2;
    a.model_path = (char *)model;
    a.first_layer = 0;
    a.last_layer = 3;
    a.tp = (int32_t)(n_devices ? n_devices : 1);
    a.kv_blocks = KV_BLOCKS;
    a.block_size = BLOCK_SIZE;
    a.next_hop = "127.0.0.1:1";
    a.backend = (char *)backend;
    a.devices = devices;
    a.n_devices = n_devices;
    Strata__V1__ControlMessage m = STRATA__V1__CONTROL_MESSAGE__INIT;
    m.msg_case = STRATA__V1__CONTROL_MESSAGE__MSG_ASSIGN;
    m.assign = &a;
    send_control(c->p, &m);
}

static void send_assign(struct conn *c, uint32_t stage, const char *model, int first, int last,
                        const char *next_hop)
{
    send_assign_ex(c, EPOCH, stage, model, first, last, next_hop, STRATA__V1__DTYPE__DTYPE_F32);
}

/* One ACTIVATIONS frame for stage 0 (token ids, no payload). */
static int send_tokens_frame(xport_peer *p, uint64_t epoch, uint64_t batch, uint64_t seq_id, int32_t pos,
                             const int32_t *tokens, int n, const int32_t *blocks, int n_blocks, uint64_t step,
                             bool wants_logits)
{
    frame_sampling sp = STRATA__V1__SAMPLING_PARAMS__INIT;
    sp.temperature = 0; /* greedy */
    sp.top_p = 1;
    sp.repeat_penalty = 1;
    sp.n_top_logprobs = 2;
    frame_seq s = STRATA__V1__SEQ_RECORD__INIT;
    s.seq_id = seq_id;
    s.pos = pos;
    s.n_tokens = n;
    s.block_table = (int32_t *)blocks;
    s.n_block_table = (size_t)n_blocks;
    s.sampling = &sp;
    s.wants_logits = wants_logits;
    s.step = step;
    frame_seq *sv[1] = {&s};
    frame_header h = STRATA__V1__FRAME_HEADER__INIT;
    h.kind = STRATA__V1__FRAME_KIND__FRAME_KIND_ACTIVATIONS;
    h.batch_id = batch;
    h.epoch = epoch;
    h.stage = 0;
    h.seqs = sv;
    h.n_seqs = 1;
    h.token_ids = (int32_t *)tokens;
    h.n_token_ids = (size_t)n;
    st_err err;
    int rc = xport_send(p, &h, NULL, 0, NULL, NULL, NULL, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    return rc;
}

/* Prefill (n_got == 0) or decode of the last sampled token. */
static void send_step(struct seq *s)
{
    const int32_t *toks;
    int n, pos;
    if (s->n_got == 0) {
        toks = s->ref->prompt;
        n = s->ref->n_prompt;
        pos = 0;
    } else {
        toks = &s->got[s->n_got - 1];
        n = 1;
        pos = s->ref->n_prompt + s->n_got - 1;
    }
    while (s->n_blocks * BLOCK_SIZE < pos + n) {
        REQUIRE(g.n_free > 0 && s->n_blocks < 16);
        s->blocks[s->n_blocks++] = g.free_blocks[--g.n_free];
    }
    s->inflight = true;
    send_tokens_frame(g.w[0].p, g.epoch, ++g.next_batch, s->id, pos, toks, n, s->blocks, s->n_blocks,
                      (uint64_t)s->n_got, true);
}

/* Random bytes over a plain TCP connection to a worker's data port. */
static void raw_garbage(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
        uint8_t buf[4096];
        uint64_t st = 0x1234567ull + (uint64_t)port;
        for (size_t i = 0; i < sizeof buf; i++) {
            st = st * 6364136223846793005ull + 1442695040888963407ull;
            buf[i] = (uint8_t)(st >> 56);
        }
        ssize_t w = write(fd, buf, sizeof buf);
        CHECK(w > 0);
    } else {
        CHECK_MSG(0, "raw connect to %d: %s", port, strerror(errno));
    }
    close(fd);
}

/* A fresh rogue connection to worker i; pumps until it is usable. */
static xport_peer *rogue_connect(int i)
{
    memset(&g.rogue, 0, sizeof g.rogue);
    st_err err;
    g.rogue.p = xport_connect(g.x, "127.0.0.1", g.w[i].port, &err);
    REQUIRE_MSG(g.rogue.p, "%s", err.msg);
    xport_peer_set_user(g.rogue.p, &g.rogue);
    return g.rogue.p;
}

static void expect_rogue_dropped(const char *what)
{
    CHECK_MSG(pump(20, rogue_down, NULL), "the worker did not disconnect the sender of %s", what);
}

static void garbage_phase(void)
{
    raw_garbage(g.w[0].port);
    raw_garbage(g.w[1].port);

    /* CONTROL whose bytes are not a Control message (field 1 = StageAssign
     * with a length running past the end). */
    xport_peer *r = rogue_connect(0);
    static const uint8_t junk[] = {0x0a, 0x7f, 0x08, 0x01, 0x12, 0x33, 0xff, 0xff};
    frame_header h = STRATA__V1__FRAME_HEADER__INIT;
    h.kind = STRATA__V1__FRAME_KIND__FRAME_KIND_CONTROL;
    h.control.data = (uint8_t *)junk;
    h.control.len = sizeof junk;
    st_err err;
    CHECK(xport_send(r, &h, NULL, 0, NULL, NULL, NULL, &err) == 0);
    expect_rogue_dropped("an undecodable StageAssign");

    /* ACTIVATIONS with a wrong epoch, to stage 0 ... */
    int32_t tok[1] = {5}, blk[1] = {0};
    r = rogue_connect(0);
    send_tokens_frame(r, EPOCH + 1, 9001, 77, 0, tok, 1, blk, 1, 0, true);
    expect_rogue_dropped("a wrong-epoch ACTIVATIONS (stage 0)");

    /* ... and to stage 1 (f32 payload of the right shape) */
    r = rogue_connect(1);
    {
        static float hid[64];
        frame_seq s = STRATA__V1__SEQ_RECORD__INIT;
        s.seq_id = 77;
        s.n_tokens = 1;
        s.block_table = blk;
        s.n_block_table = 1;
        s.wants_logits = true;
        frame_seq *sv[1] = {&s};
        uint32_t shape[2] = {1, 64};
        frame_header a = STRATA__V1__FRAME_HEADER__INIT;
        a.kind = STRATA__V1__FRAME_KIND__FRAME_KIND_ACTIVATIONS;
        a.batch_id = 9002;
        a.epoch = EPOCH - 1;
        a.stage = 1;
        a.seqs = sv;
        a.n_seqs = 1;
        a.dtype = STRATA__V1__DTYPE__DTYPE_F32;
        a.shape = shape;
        a.n_shape = 2;
        CHECK(xport_send(r, &a, hid, sizeof hid, NULL, NULL, NULL, &err) == 0);
    }
    expect_rogue_dropped("a wrong-epoch ACTIVATIONS (stage 1)");

    /* a block id beyond the KV cache */
    r = rogue_connect(0);
    blk[0] = KV_BLOCKS;
    send_tokens_frame(r, EPOCH, 9003, 77, 0, tok, 1, blk, 1, 0, true);
    expect_rogue_dropped("a block id >= kv_blocks");
}

int main(int argc, char **argv)
{
    REQUIRE_MSG(argc == 2, "usage: test_worker STRATA_WORKER_BINARY");
    setenv("UCX_TLS", "tcp", 0);
    setenv("UCX_NET_DEVICES", "lo", 0); /* loopback only: another test may be adding a bridge */
    signal(SIGPIPE, SIG_IGN);
    atexit(kill_all);
    alarm(170); /* a hard bound for the whole test */
    const char *model = "stories260K.gguf"; /* under the workers' --model-dir */
    ref_prompt ref[2];
    load_ref(ref, 2);
    double t_start = now_s();
    g.epoch = EPOCH;

    pids[0] = spawn_worker(argv[1], "w0", &g.w[0].port);
    pids[1] = spawn_worker(argv[1], "w1", &g.w[1].port);

    g.base = event_base_new();
    struct event *tk = event_new(g.base, -1, EV_PERSIST, tick, NULL);
    struct timeval tv = {0, 20000};
    event_add(tk, &tv);
    xport_callbacks cb = {.on_connect = on_connect, .on_disconnect = on_disconnect, .on_frame = on_frame};
    st_err err;
    g.x = xport_create(g.base, NULL, 0, &cb, &err);
    REQUIRE_MSG(g.x, "%s", err.msg);
    for (int i = 0; i < 2; i++) {
        g.w[i].p = xport_connect(g.x, "127.0.0.1", g.w[i].port, &err);
        REQUIRE_MSG(g.w[i].p, "%s", err.msg);
        xport_peer_set_user(g.w[i].p, &g.w[i]);
    }

    /* 1. bad model path */
    send_assign(&g.w[0], 0, "/nonexistent/strata/model.gguf", 0, 3, "127.0.0.1:1");
    int one = 1;
    REQUIRE_MSG(pump(30, a_ready_is, &one), "no StageReady for a bad model path");
    CHECK(!g.w[0].ready_ok);
    CHECK_MSG(strstr(g.w[0].ready_error, "/nonexistent/strata/model.gguf") != NULL, "error: '%s'", g.w[0].ready_error);

    /* 1b. the backend of the assignment: an unknown one and a CPU device list
     * are refused; "cuda" without a GPU is the stage's clean error. */
    {
        int32_t devs[2] = {0, 1};
        int k = 2;
        send_assign_backend(&g.w[0], model, "tpu", NULL, 0);
        REQUIRE_MSG(pump(30, a_ready_is, &k), "no StageReady for backend tpu");
        CHECK(!g.w[0].ready_ok);
        CHECK_MSG(strstr(g.w[0].ready_error, "backend 'tpu' is not cpu or cuda") != NULL, "error: '%s'", g.w[0].ready_error);
        k++;
        send_assign_backend(&g.w[0], model, "cpu", devs, 2);
        REQUIRE_MSG(pump(30, a_ready_is, &k), "no StageReady for a cpu device list");
        CHECK(!g.w[0].ready_ok);
        CHECK_MSG(strstr(g.w[0].ready_error, "backend cpu takes no device list") != NULL, "error: '%s'", g.w[0].ready_error);
        st_err re;
        const backend_module *cuda = backend_registry_get("cuda", &re);
        if (!cuda || cuda->device_count() == 0) {
            k++;
            send_assign_backend(&g.w[0], model, "cuda", devs, 1);
            REQUIRE_MSG(pump(30, a_ready_is, &k), "no StageReady for backend cuda");
            CHECK(!g.w[0].ready_ok);
            CHECK_MSG(strstr(g.w[0].ready_error, "backend cuda: no CUDA device") != NULL, "error: '%s'", g.w[0].ready_error);
        }
        g.w[0].n_ready = 1; /* the count step 2 waits from (as after step 1) */
    }

    /* ACTIVATIONS before any assignment (w1 is idle) */
    {
        int32_t t1[1] = {5}, b1[1] = {0};
        xport_peer *r = rogue_connect(1);
        send_tokens_frame(r, EPOCH, 8999, 77, 0, t1, 1, b1, 1, 0, true);
        expect_rogue_dropped("ACTIVATIONS before an assignment");
    }

    /* 2. the real assignment */
    char next[64];
    snprintf(next, sizeof next, "127.0.0.1:%d", g.w[1].port);
    send_assign(&g.w[1], 1, model, 3, 5, "");
    send_assign(&g.w[0], 0, model, 0, 3, next);
    int two = 2;
    g.w[1].n_ready = 1; /* align the counters: w0 already answered once */
    REQUIRE_MSG(pump(60, ready_count_is, &two), "StageReady timed out");
    for (int i = 0; i < 2; i++) {
        CHECK_MSG(g.w[i].ready_ok, "stage %d: %s", i, g.w[i].ready_error);
        CHECK_EQ_INT(g.w[i].ready_kv_blocks, KV_BLOCKS);
        CHECK_EQ_INT(g.w[i].ready_n_embd, 64);
        CHECK_EQ_INT(g.w[i].ready_n_vocab, 512);
        CHECK_EQ_INT(g.w[i].ready_n_layer, 5);
        CHECK(g.w[i].ready_weight_bytes > 0);
    }
    REQUIRE(g.w[0].ready_ok && g.w[1].ready_ok);
    double t_ready = now_s();

    /* 3. two sequences, concurrently; pause at PAUSE_AT for the garbage */
    for (int b = 0; b < KV_BLOCKS; b++) g.free_blocks[g.n_free++] = b; /* popped from the top: 63, 62, ... */
    for (int i = 0; i < 2; i++) {
        g.seqs[i].id = 1000 + (uint64_t)i;
        g.seqs[i].ref = &ref[i];
        g.seqs[i].paused = true;
        send_step(&g.seqs[i]);
    }
    int pause_at = PAUSE_AT;
    REQUIRE_MSG(pump(60, seqs_at, &pause_at), "decode stalled before token %d (got %d, %d)", PAUSE_AT,
                g.seqs[0].n_got, g.seqs[1].n_got);
    garbage_phase();
    CHECK(g.w[0].p && g.w[1].p && !g.w[0].down && !g.w[1].down);
    for (int i = 0; i < 2; i++) {
        g.seqs[i].paused = false;
        send_step(&g.seqs[i]);
    }
    int all = N_GEN;
    REQUIRE_MSG(pump(90, seqs_at, &all), "decode stalled (got %d, %d)", g.seqs[0].n_got, g.seqs[1].n_got);
    double t_done = now_s();
    for (int i = 0; i < 2; i++) {
        struct seq *s = &g.seqs[i];
        CHECK_EQ_INT(s->n_got, N_GEN);
        int first_bad = -1;
        for (int k = 0; k < s->n_got; k++)
            if (s->got[k] != ref[i].completion[k]) {
                first_bad = k;
                break;
            }
        CHECK_MSG(first_bad < 0, "prompt %d: token %d is %d, reference %d", i, first_bad,
                  first_bad >= 0 ? s->got[first_bad] : 0, first_bad >= 0 ? ref[i].completion[first_bad] : 0);
        CHECK_NEAR(s->lp0, ref[i].top_lp[0], 2e-3);
        CHECK_EQ_INT(s->n_top0, 2);
        CHECK_EQ_INT(s->top0[0], ref[i].top_id[0]);
        CHECK_EQ_INT(s->top0[1], ref[i].top_id[1]);
    }
    CHECK_EQ_INT(g.unknown_results, 0);
    CHECK_EQ_INT(g.n_tokens_frames, 2 * N_GEN);

    /* 4. BatchError (position beyond the KV cache) and BatchDone (no logits) */
    int32_t tok[3] = {1, 403, 407}, blk[1] = {0};
    send_tokens_frame(g.w[0].p, EPOCH, 7001, 3000, KV_BLOCKS * BLOCK_SIZE, tok, 1, blk, 1, 0, true);
    CHECK_MSG(pump(20, a_batch_error, NULL), "no BatchError");
    CHECK_EQ_INT(g.w[0].batch_error_id, 7001);
    CHECK_MSG(strstr(g.w[0].batch_error_msg, "KV") != NULL, "BatchError message: '%s'", g.w[0].batch_error_msg);
    send_tokens_frame(g.w[0].p, EPOCH, 7002, 3001, 0, tok, 3, blk, 1, 0, false);
    CHECK_MSG(pump(20, b_batch_done, NULL), "no BatchDone");
    CHECK_EQ_INT(g.w[1].batch_done_id, 7002);
    CHECK_EQ_INT(g.w[1].n_batch_error, 0);

    /* 5. stats */
    Strata__V1__StatsRequest sr = STRATA__V1__STATS_REQUEST__INIT;
    Strata__V1__ControlMessage m = STRATA__V1__CONTROL_MESSAGE__INIT;
    m.msg_case = STRATA__V1__CONTROL_MESSAGE__MSG_STATS_REQUEST;
    m.stats_request = &sr;
    sr.request_id = 42;
    send_control(g.w[0].p, &m);
    send_control(g.w[1].p, &m);
    CHECK_MSG(pump(20, stats_in, NULL), "no StageStats");
    const uint64_t fwd = 2 * N_GEN + 1; /* + the BatchDone chunk; the failed one is not counted */
    const uint64_t toks = (uint64_t)(ref[0].n_prompt + ref[1].n_prompt + 2 * (N_GEN - 1) + 3);
    for (int i = 0; i < 2 && g.w[0].stats && g.w[1].stats; i++) {
        const Strata__V1__StageStats *s = g.w[i].stats;
        CHECK_EQ_INT(s->request_id, 42);
        CHECK_EQ_INT(s->epoch, EPOCH);
        CHECK_EQ_INT(s->stage, (unsigned)i);
        CHECK(s->loaded);
        CHECK_EQ_INT(s->forwards, fwd);
        CHECK_EQ_INT(s->tokens, toks);
        CHECK(s->busy_seconds > 0 && s->busy_seconds < s->uptime_seconds);
        CHECK_EQ_INT(s->n_ranks, 2);
        /* stage 0: embedding (1) + 3 layers x 2; stage 1: 2 layers x 2, one all-gather per sampled batch */
        for (size_t r = 0; r < s->n_ranks; r++) {
            CHECK_EQ_INT(s->ranks[r]->all_reduce_calls, fwd * (i == 0 ? 7 : 4));
            CHECK_EQ_INT(s->ranks[r]->all_gather_calls, i == 0 ? 0 : 2 * N_GEN);
        }
        CHECK_EQ_INT(s->queue_depth, 0);
        CHECK(s->frames_recv >= fwd);
        printf("stage %d: %llu forwards, %llu tokens, busy %.3f s of %.3f s uptime, dropped %llu, batch errors %llu\n",
               i, (unsigned long long)s->forwards, (unsigned long long)s->tokens, s->busy_seconds,
               s->uptime_seconds, (unsigned long long)s->dropped_frames, (unsigned long long)s->batch_errors);
    }
    if (g.w[0].stats) {
        CHECK_EQ_INT(g.w[0].stats->dropped_frames, 3); /* junk CONTROL, wrong epoch, bad block id */
        CHECK_EQ_INT(g.w[0].stats->fenced_frames, 0);  /* its wrong epoch is a newer one */
        CHECK_EQ_INT(g.w[0].stats->batch_errors, 1);
    }
    if (g.w[1].stats) {
        CHECK_EQ_INT(g.w[1].stats->dropped_frames, 2); /* before assignment, wrong epoch */
        CHECK_EQ_INT(g.w[1].stats->fenced_frames, 1);  /* its wrong epoch is an older one */
    }
    printf("load %.2f s; 2 x %d tokens in %.2f s (%.1f tok/s aggregate, PP 2 x TP 2, with the garbage pause)\n",
           t_ready - t_start, N_GEN, t_done - t_ready, 2 * N_GEN / (t_done - t_ready));

    /* 6. a new assignment (epoch +1, bf16 activations) reloads both stages;
     * greedy decode of prompt 0 still follows the reference for 16 tokens */
    {
        for (int i = 0; i < 2; i++) g.w[i].n_ready = 0;
        send_assign_ex(&g.w[1], EPOCH + 1, 1, model, 3, 5, "", STRATA__V1__DTYPE__DTYPE_BF16);
        send_assign_ex(&g.w[0], EPOCH + 1, 0, model, 0, 3, next, STRATA__V1__DTYPE__DTYPE_BF16);
        CHECK_MSG(pump(60, ready_count_is, &one), "StageReady (bf16) timed out");
        CHECK(g.w[0].ready_ok && g.w[1].ready_ok);
        g.epoch = EPOCH + 1;
        memset(&g.seqs[0], 0, sizeof g.seqs[0]);
        g.n_free = 0;
        for (int b = 0; b < KV_BLOCKS; b++) g.free_blocks[g.n_free++] = b;
        g.seqs[0].id = 2000;
        g.seqs[0].ref = &ref[0];
        g.seqs[0].stop_at = 16;
        send_step(&g.seqs[0]);
        int n16 = 16;
        CHECK_MSG(pump(30, seq0_at, &n16), "bf16 decode stalled at %d", g.seqs[0].n_got);
        for (int k = 0; k < 16; k++) CHECK_EQ_INT(g.seqs[0].got[k], ref[0].completion[k]);
    }

    /* 7. next hop lost: stage 1 stops; stage 0 keeps serving and answers
     * BatchError for what it cannot send on (probe every 0.5 s) */
    {
        kill(pids[1], SIGTERM);
        int st = wait_exit(pids[1], 15);
        CHECK_MSG(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "worker 1: status 0x%x", st);
        if (st != -1) pids[1] = 0;
        g.w[0].n_batch_error = 0;
        double t0 = now_s();
        uint64_t probe = 8100;
        while (g.w[0].n_batch_error == 0 && now_s() - t0 < 20) {
            send_tokens_frame(g.w[0].p, EPOCH + 1, ++probe, 4000, 0, tok, 1, blk, 1, 0, true);
            double t1 = now_s();
            while (g.w[0].n_batch_error == 0 && now_s() - t1 < 0.5) event_base_loop(g.base, EVLOOP_ONCE);
        }
        CHECK_MSG(g.w[0].n_batch_error > 0, "no BatchError after the next hop died");
        CHECK(g.w[0].batch_error_id > 8100 && g.w[0].batch_error_id <= probe);
        printf("next hop lost: BatchError '%s' after %.2f s\n", g.w[0].batch_error_msg, now_s() - t0);
        CHECK(g.w[0].p != NULL);
    }

    /* 8. SIGTERM -> exit 0 */
    xport_destroy(g.x);
    event_free(tk);
    event_base_free(g.base);
    for (int i = 0; i < 2; i++) {
        if (g.w[i].stats) strata__v1__stage_stats__free_unpacked(g.w[i].stats, NULL);
        if (!pids[i]) continue;
        double t0 = now_s();
        kill(pids[i], SIGTERM);
        int st = wait_exit(pids[i], 15);
        CHECK_MSG(st != -1, "worker %d did not exit within 15 s of SIGTERM", i);
        if (st != -1) {
            pids[i] = 0;
            CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "worker %d: status 0x%x", i, st);
            printf("worker %d exited %d, %.2f s after SIGTERM\n", i, WIFEXITED(st) ? WEXITSTATUS(st) : -1,
                   now_s() - t0);
        }
    }
    return test_summary();
}
