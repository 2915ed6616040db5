/* test_rpc_client.c — rpc/grpc_client against rpc/grpc_server, over real
 * gRPC on loopback: starts tests/rpc/ctl_test_server (argv[1]) as a child
 * process and checks unary round trips with protobuf-c messages, a server
 * stream of N chunks in order, deadlines, UNIMPLEMENTED, INVALID_ARGUMENT for
 * garbage bytes, application errors, UNAVAILABLE, client-side cancellation,
 * concurrent streams, asynchronous unary calls on a completion queue of the
 * test's (rpc_client_start), and a clean server exit (status 0, so no ASan/LSan
 * report) with a stream still open.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <grpc/grpc.h>
#include <grpc/support/time.h>

#include "proto/control.pb-c.h"
#include "rpc/grpc_client.h"
#include "tests/testutil.h"

#define SVC "/strata.v1.Control/"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Starts the server; returns its pid and fills *port (from its "PORT n"). */
static pid_t start_server(const char *bin, int *port) {
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execl(bin, bin, "--gen-delay-ms", "2", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    char buf[64] = {0};
    size_t n = 0;
    double t_end = now_s() + 20.0;
    while (n < sizeof buf - 1 && !strchr(buf, '\n') && now_s() < t_end) {
        struct pollfd p = {fds[0], POLLIN, 0};
        if (poll(&p, 1, 200) <= 0) continue;
        ssize_t r = read(fds[0], buf + n, sizeof buf - 1 - n);
        if (r <= 0) break;
        n += (size_t)r;
    }
    close(fds[0]);
    if (sscanf(buf, "PORT %d", port) != 1) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        REQUIRE_MSG(0, "server did not print its port (got \"%s\")", buf);
    }
    return pid;
}

/* SIGTERM, then waits up to 20 s; returns the exit status (-1: had to kill). */
static int stop_server(pid_t pid) {
    kill(pid, SIGTERM);
    double t_end = now_s() + 20.0;
    int st = 0;
    while (now_s() < t_end) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        usleep(20000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

/* Packs m, calls method, unpacks the reply with desc (NULL on any error). */
static ProtobufCMessage *call(rpc_client *c, const char *method, const ProtobufCMessage *m,
                              const ProtobufCMessageDescriptor *desc, rpc_status *st) {
    size_t len = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(len ? len : 1);
    protobuf_c_message_pack(m, buf);
    uint8_t *rep = NULL;
    size_t rlen = 0;
    int rc = rpc_client_unary(c, method, buf, len, 5.0, &rep, &rlen, st);
    free(buf);
    if (rc != 0) return NULL;
    ProtobufCMessage *out = protobuf_c_message_unpack(desc, NULL, rlen, rep);
    free(rep);
    return out;
}

static uint64_t do_register(rpc_client *c, const char *name, uint32_t gpus) {
    Strata__V1__Device dev = STRATA__V1__DEVICE__INIT;
    dev.kind = "cuda";
    dev.count = gpus;
    dev.memory_bytes = 80ull << 30;
    Strata__V1__Device *devs[] = {&dev};
    Strata__V1__ModelFile mf = STRATA__V1__MODEL_FILE__INIT;
    mf.name = "stories260K.gguf";
    mf.size_bytes = 1185376;
    mf.sha256 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    Strata__V1__ModelFile *mfs[] = {&mf};
    Strata__V1__RegisterRequest r = STRATA__V1__REGISTER_REQUEST__INIT;
    r.node = (char *)name;
    r.devices = devs;
    r.n_devices = 1;
    r.host_memory_bytes = 512ull << 30;
    r.numa_nodes = 2;
    r.data_address = "127.0.0.1:7100";
    r.models = mfs;
    r.n_models = 1;
    rpc_status st;
    Strata__V1__RegisterReply *rep = (void *)call(
        c, SVC "Register", &r.base, &strata__v1__register_reply__descriptor, &st);
    CHECK_MSG(rep != NULL, "Register %s: %s %s", name, rpc_code_name(st.code), st.msg);
    if (!rep) return 0;
    CHECK_EQ_INT(st.code, RPC_OK);
    CHECK_EQ_INT(rep->heartbeat_interval_ms, 1000);
    CHECK_EQ_INT(rep->suspect_after_missed, 3);
    uint64_t lease = rep->lease_id;
    protobuf_c_message_free_unpacked(&rep->base, NULL);
    return lease;
}

/* ---- streaming helpers ---- */

typedef struct gen_ctx {
    int n, bad_order, stop_after, finished_ok;
    unsigned prompt_tokens, completion_tokens;
    char text[4096];
} gen_ctx;

static int on_chunk(const uint8_t *msg, size_t len, void *ud) {
    gen_ctx *g = ud;
    Strata__V1__GenerateChunk *ch = strata__v1__generate_chunk__unpack(NULL, len, msg);
    if (!ch) {
        g->bad_order++;
        return 1;
    }
    if (ch->n_token_ids != 1 || ch->token_ids[0] != 100u + (unsigned)g->n) g->bad_order++;
    char want[32];
    snprintf(want, sizeof want, " t%d", g->n);
    if (strcmp(ch->text, want) != 0) g->bad_order++;
    if (strlen(g->text) + strlen(ch->text) < sizeof g->text) strcat(g->text, ch->text);
    if (ch->finish_reason[0]) {
        g->finished_ok = strcmp(ch->finish_reason, "length") == 0;
        g->prompt_tokens = ch->prompt_tokens;
        g->completion_tokens = ch->completion_tokens;
    }
    strata__v1__generate_chunk__free_unpacked(ch, NULL);
    g->n++;
    return g->stop_after && g->n >= g->stop_after;
}

static int generate(rpc_client *c, const char *prompt, unsigned max_tokens, double timeout,
                    gen_ctx *g, rpc_status *st) {
    Strata__V1__GenerateRequest r = STRATA__V1__GENERATE_REQUEST__INIT;
    r.prompt = (char *)prompt;
    r.max_tokens = max_tokens;
    size_t len = strata__v1__generate_request__get_packed_size(&r);
    uint8_t buf[256];
    strata__v1__generate_request__pack(&r, buf);
    return rpc_client_stream(c, SVC "Generate", buf, len, timeout, on_chunk, g, st);
}

typedef struct thr_arg {
    rpc_client *c;
    unsigned n;
    gen_ctx g;
    rpc_status st;
    int rc;
} thr_arg;

static void *gen_thread(void *p) {
    thr_arg *a = p;
    a->rc = generate(a->c, "hello there", a->n, 30.0, &a->g, &a->st);
    return NULL;
}

/* Waits for one tag on cq (20 s at most); NULL on a timeout. */
static void *next_tag(grpc_completion_queue *cq) {
    grpc_event ev = grpc_completion_queue_next(
        cq, gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_seconds(20, GPR_TIMESPAN)), NULL);
    return ev.type == GRPC_OP_COMPLETE ? ev.tag : NULL;
}

static void async_calls(const char *addr) {
    st_err err;
    grpc_init();
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    enum { K = 3 };
    rpc_client *cl[K];
    rpc_async *a[K];
    int tags[K];
    char names[K][32];
    for (int i = 0; i < K; i++) {
        REQUIRE((cl[i] = rpc_client_create_own(addr, NULL, &err)) != NULL);
        snprintf(names[i], sizeof names[i], "async-%d", i);
        Strata__V1__Device dev = STRATA__V1__DEVICE__INIT, *devs[] = {&dev};
        dev.kind = "cpu";
        dev.count = 4;
        dev.memory_bytes = 1ull << 30;
        Strata__V1__RegisterRequest r = STRATA__V1__REGISTER_REQUEST__INIT;
        r.node = names[i];
        r.devices = devs;
        r.n_devices = 1;
        r.data_address = "127.0.0.1:7100";
        uint8_t buf[256];
        size_t len = strata__v1__register_request__pack(&r, buf);
        rpc_status st;
        tags[i] = i;
        a[i] = rpc_client_start(cl[i], cq, SVC "Register", buf, len, 10.0, &tags[i], &st);
        CHECK_MSG(a[i] != NULL, "start: %s", st.msg);
    }
    uint64_t lease[K] = {0};
    for (int n = 0; n < K; n++) { /* in any order */
        int *tag = next_tag(cq);
        REQUIRE(tag != NULL && *tag >= 0 && *tag < K && a[*tag]);
        uint8_t *rep;
        size_t rlen;
        rpc_status st;
        CHECK_EQ_INT(rpc_async_finish(a[*tag], &rep, &rlen, &st), 0);
        a[*tag] = NULL;
        Strata__V1__RegisterReply *rr = strata__v1__register_reply__unpack(NULL, rlen, rep);
        CHECK(rr != NULL && rr->lease_id != 0 && rr->heartbeat_interval_ms == 1000);
        if (rr) {
            lease[*tag] = rr->lease_id;
            strata__v1__register_reply__free_unpacked(rr, NULL);
        }
        free(rep);
    }
    CHECK(lease[0] != lease[1] && lease[1] != lease[2] && lease[0] != lease[2]);
    /* heartbeats: the right lease, and a wrong one (reregister) */
    for (int i = 0; i < K; i++) {
        Strata__V1__HeartbeatRequest hb = STRATA__V1__HEARTBEAT_REQUEST__INIT;
        hb.node = names[i];
        hb.lease_id = i == 2 ? lease[i] + 1 : lease[i];
        uint8_t buf[128];
        size_t len = strata__v1__heartbeat_request__pack(&hb, buf);
        rpc_status st;
        a[i] = rpc_client_start(cl[i], cq, SVC "Heartbeat", buf, len, 10.0, &tags[i], &st);
        CHECK(a[i] != NULL);
    }
    for (int n = 0; n < K; n++) {
        int *tag = next_tag(cq);
        REQUIRE(tag != NULL && a[*tag]);
        uint8_t *rep;
        size_t rlen;
        rpc_status st;
        CHECK_EQ_INT(rpc_async_finish(a[*tag], &rep, &rlen, &st), 0);
        a[*tag] = NULL;
        Strata__V1__HeartbeatReply *hr = strata__v1__heartbeat_reply__unpack(NULL, rlen, rep);
        REQUIRE(hr != NULL);
        CHECK_EQ_INT(hr->reregister, *tag == 2);
        strata__v1__heartbeat_reply__free_unpacked(hr, NULL);
        free(rep);
    }
    /* an unknown method: UNIMPLEMENTED through the queue; a bad name: refused at start */
    rpc_status st;
    int t_unk = 7;
    rpc_async *u = rpc_client_start(cl[0], cq, SVC "NoSuchMethod", "", 0, 10.0, &t_unk, &st);
    REQUIRE(u != NULL);
    CHECK(next_tag(cq) == &t_unk);
    uint8_t *rep;
    size_t rlen;
    CHECK_EQ_INT(rpc_async_finish(u, &rep, &rlen, &st), -1);
    CHECK_EQ_INT(st.code, RPC_UNIMPLEMENTED);
    CHECK(rep == NULL);
    CHECK(rpc_client_start(cl[0], cq, "NoSlash", "", 0, 10.0, &t_unk, &st) == NULL);
    CHECK_EQ_INT(st.code, RPC_INVALID_ARGUMENT);
    /* nothing listens on port 1: UNAVAILABLE through the queue */
    rpc_client *dead = rpc_client_create_own("127.0.0.1:1", NULL, &err);
    REQUIRE(dead != NULL);
    int t_dead = 8;
    rpc_async *d = rpc_client_start(dead, cq, SVC "GetStatus", "", 0, 5.0, &t_dead, &st);
    REQUIRE(d != NULL);
    CHECK(next_tag(cq) == &t_dead);
    CHECK_EQ_INT(rpc_async_finish(d, &rep, &rlen, &st), -1);
    CHECK_EQ_INT(st.code, RPC_UNAVAILABLE);
    rpc_client_destroy(dead);
    for (int i = 0; i < K; i++) rpc_client_destroy(cl[i]);
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type != GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cq);
    grpc_shutdown();
}

int main(int argc, char **argv) {
    REQUIRE_MSG(argc == 2, "usage: test_rpc_client PATH/ctl_test_server");
    signal(SIGPIPE, SIG_IGN);
    int port = 0;
    pid_t pid = start_server(argv[1], &port);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    st_err err;
    rpc_client *c = rpc_client_create(addr, NULL, &err);
    REQUIRE(c != NULL);

    /* 1. Unary round trips with real messages. */
    uint64_t la = do_register(c, "node-a", 2);
    uint64_t lb = do_register(c, "node-b", 1);
    CHECK(la != 0 && lb != 0 && la != lb);

    Strata__V1__HeartbeatRequest hb = STRATA__V1__HEARTBEAT_REQUEST__INIT;
    hb.node = "node-a";
    hb.lease_id = la;
    hb.running_sequences = 3;
    hb.kv_blocks_used = 40;
    hb.kv_blocks_free = 88;
    hb.busy_fraction = 0.25;
    hb.bytes_sent = 123456789;
    rpc_status st;
    Strata__V1__HeartbeatReply *hr = (void *)call(c, SVC "Heartbeat", &hb.base,
                                                  &strata__v1__heartbeat_reply__descriptor, &st);
    REQUIRE(hr != NULL);
    CHECK_EQ_INT(hr->reregister, 0);
    protobuf_c_message_free_unpacked(&hr->base, NULL);
    hb.lease_id = la + 1000; /* a lease the server never gave */
    hr = (void *)call(c, SVC "Heartbeat", &hb.base, &strata__v1__heartbeat_reply__descriptor, &st);
    REQUIRE(hr != NULL);
    CHECK_EQ_INT(hr->reregister, 1);
    protobuf_c_message_free_unpacked(&hr->base, NULL);

    Strata__V1__ListNodesRequest lr = STRATA__V1__LIST_NODES_REQUEST__INIT;
    Strata__V1__ListNodesReply *nodes = (void *)call(
        c, SVC "ListNodes", &lr.base, &strata__v1__list_nodes_reply__descriptor, &st);
    REQUIRE(nodes != NULL);
    CHECK_EQ_INT(nodes->n_nodes, 2);
    if (nodes->n_nodes == 2) {
        Strata__V1__NodeInfo *a = nodes->nodes[0], *b = nodes->nodes[1];
        CHECK_EQ_STR(a->name, "node-a");
        CHECK_EQ_INT(a->state, STRATA__V1__NODE_STATE__NODE_STATE_READY);
        CHECK_EQ_INT(a->running_sequences, 3);
        CHECK_EQ_INT(a->kv_blocks_free, 88);
        CHECK_EQ_INT(a->bytes_sent, 123456789);
        CHECK_NEAR(a->busy_fraction, 0.25, 1e-12);
        CHECK(a->heartbeat_age_s >= 0 && a->heartbeat_age_s < 5);
        CHECK_EQ_INT(a->n_devices, 1);
        if (a->n_devices == 1) {
            CHECK_EQ_STR(a->devices[0]->kind, "cuda");
            CHECK_EQ_INT(a->devices[0]->count, 2);
            CHECK_EQ_INT(a->devices[0]->memory_bytes, 80ll << 30);
        }
        CHECK_EQ_STR(a->data_address, "127.0.0.1:7100");
        CHECK_EQ_STR(b->name, "node-b");
        CHECK_EQ_INT(b->state, STRATA__V1__NODE_STATE__NODE_STATE_REGISTERED);
        CHECK_EQ_INT(b->numa_nodes, 2);
    }
    protobuf_c_message_free_unpacked(&nodes->base, NULL);

    /* Placement: auto over 5 layers and 2 nodes = 0-2, 3-4; then errors. */
    Strata__V1__AutoPlacementRequest ar = STRATA__V1__AUTO_PLACEMENT_REQUEST__INIT;
    Strata__V1__PlacementReply *pr = (void *)call(
        c, SVC "AutoPlacement", &ar.base, &strata__v1__placement_reply__descriptor, &st);
    REQUIRE(pr != NULL && pr->current != NULL);
    CHECK_EQ_INT(pr->current->epoch, 1);
    CHECK_EQ_INT(pr->current->n_stages, 2);
    if (pr->current->n_stages == 2) {
        CHECK_EQ_STR(pr->current->stages[0]->node, "node-a");
        CHECK_EQ_INT(pr->current->stages[0]->last_layer, 2);
        CHECK_EQ_INT(pr->current->stages[0]->tp, 2);
        CHECK_EQ_INT(pr->current->stages[1]->first_layer, 3);
        CHECK_EQ_INT(pr->current->stages[1]->last_layer, 4);
    }
    protobuf_c_message_free_unpacked(&pr->base, NULL);

    Strata__V1__Stage s0 = STRATA__V1__STAGE__INIT, s1 = STRATA__V1__STAGE__INIT;
    s0.node = "node-a";
    s0.first_layer = 0;
    s0.last_layer = 2;
    s1.node = "node-z";
    s1.first_layer = 3;
    s1.last_layer = 4;
    Strata__V1__Stage *ss[] = {&s0, &s1};
    Strata__V1__SetPlacementRequest sp = STRATA__V1__SET_PLACEMENT_REQUEST__INIT;
    sp.stages = ss;
    sp.n_stages = 2;
    pr = (void *)call(c, SVC "SetPlacement", &sp.base, &strata__v1__placement_reply__descriptor, &st);
    CHECK(pr == NULL);
    CHECK_EQ_INT(st.code, RPC_NOT_FOUND);
    CHECK_MSG(strstr(st.msg, "node-z") != NULL, "msg: %s", st.msg);
    s1.node = "node-b";
    s1.first_layer = 2; /* overlaps stage 0 */
    pr = (void *)call(c, SVC "SetPlacement", &sp.base, &strata__v1__placement_reply__descriptor, &st);
    CHECK(pr == NULL);
    CHECK_EQ_INT(st.code, RPC_INVALID_ARGUMENT);
    CHECK_MSG(strstr(st.msg, "layer 2 is covered twice") != NULL, "msg: %s", st.msg);
    s1.first_layer = 3;
    pr = (void *)call(c, SVC "SetPlacement", &sp.base, &strata__v1__placement_reply__descriptor, &st);
    REQUIRE_MSG(pr != NULL, "SetPlacement: %s", st.msg);
    CHECK_EQ_INT(pr->current->epoch, 2);
    protobuf_c_message_free_unpacked(&pr->base, NULL);

    /* 2. A server stream of N chunks, in order. */
    gen_ctx g;
    memset(&g, 0, sizeof g);
    int rc = generate(c, "once upon a", 20, 10.0, &g, &st);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(st.code, RPC_OK);
    CHECK_EQ_INT(g.n, 20);
    CHECK_EQ_INT(g.bad_order, 0);
    CHECK_EQ_INT(g.finished_ok, 1);
    CHECK_EQ_INT(g.prompt_tokens, 3);
    CHECK_EQ_INT(g.completion_tokens, 20);
    CHECK(strncmp(g.text, " t0 t1 t2 t3", 12) == 0);
    memset(&g, 0, sizeof g);
    rc = generate(c, "", 4, 10.0, &g, &st);
    CHECK_EQ_INT(rc, -1);
    CHECK_EQ_INT(st.code, RPC_INVALID_ARGUMENT);
    CHECK_EQ_INT(g.n, 0);

    /* Client-side cancel after 3 chunks. */
    memset(&g, 0, sizeof g);
    g.stop_after = 3;
    rc = generate(c, "x", 1000, 10.0, &g, &st);
    CHECK_EQ_INT(rc, -1);
    CHECK_EQ_INT(st.code, RPC_CANCELLED);
    CHECK_EQ_INT(g.n, 3);

    /* Four concurrent streams on one client. */
    thr_arg ta[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        memset(&ta[i], 0, sizeof ta[i]);
        ta[i].c = c;
        ta[i].n = 30 + (unsigned)i;
        pthread_create(&th[i], NULL, gen_thread, &ta[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(ta[i].rc, 0);
        CHECK_EQ_INT(ta[i].g.n, 30 + i);
        CHECK_EQ_INT(ta[i].g.bad_order, 0);
        CHECK_EQ_INT(ta[i].g.finished_ok, 1);
    }

    /* 3. Deadlines: the handler answers after 300 ms. */
    uint8_t *rep = NULL;
    size_t rlen = 0;
    double t0 = now_s();
    rc = rpc_client_unary(c, "/strata.v1.Test/Slow", "abc", 3, 0.1, &rep, &rlen, &st);
    double dt = now_s() - t0;
    CHECK_EQ_INT(rc, -1);
    CHECK_EQ_INT(st.code, RPC_DEADLINE_EXCEEDED);
    CHECK(rep == NULL);
    CHECK_MSG(dt >= 0.09 && dt < 1.0, "deadline took %.3f s", dt);
    printf("deadline 100 ms -> DEADLINE_EXCEEDED after %.1f ms\n", dt * 1e3);
    rc = rpc_client_unary(c, "/strata.v1.Test/Slow", "abc", 3, 5.0, &rep, &rlen, &st);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(rlen, 3);
    CHECK(rep && memcmp(rep, "abc", 3) == 0);
    free(rep);
    rep = NULL;
    /* Streaming deadline: 1000 chunks at 2 ms cannot finish in 150 ms. */
    memset(&g, 0, sizeof g);
    rc = generate(c, "x", 1000, 0.15, &g, &st);
    CHECK_EQ_INT(rc, -1);
    CHECK_EQ_INT(st.code, RPC_DEADLINE_EXCEEDED);
    CHECK(g.n > 0 && g.n < 1000);
    CHECK_EQ_INT(g.bad_order, 0);

    /* Direct (rpc-thread) handlers: a 1 MiB echo; OK without a reply -> INTERNAL. */
    size_t big = 1u << 20;
    uint8_t *blob = malloc(big);
    for (size_t i = 0; i < big; i++) blob[i] = (uint8_t)(i * 131u + 7u);
    rc = rpc_client_unary(c, "/strata.v1.Test/Echo", blob, big, 5.0, &rep, &rlen, &st);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(rlen, big);
    CHECK(rep && memcmp(rep, blob, big) == 0);
    free(rep);
    rep = NULL;
    rc = rpc_client_unary(c, "/strata.v1.Test/Echo", "", 0, 5.0, &rep, &rlen, &st);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(rlen, 0);
    CHECK(rep != NULL);
    free(rep);
    rep = NULL;
    free(blob);
    rc = rpc_client_unary(c, "/strata.v1.Test/NoReply", "", 0, 5.0, &rep, &rlen, &st);
    CHECK_EQ_INT(rc, -1);
    CHECK_EQ_INT(st.code, RPC_INTERNAL);
    CHECK_MSG(strstr(st.msg, "without a reply") != NULL, "msg: %s", st.msg);

    /* 4. Unknown method. */
    rc = rpc_client_unary(c, SVC "Nope", "", 0, 5.0, &rep, &rlen, &st);
    CHECK_EQ_INT(rc, -1);
    CHECK_EQ_INT(st.code, RPC_UNIMPLEMENTED);
    CHECK_MSG(strstr(st.msg, "/strata.v1.Control/Nope") != NULL, "msg: %s", st.msg);

    /* 5. Garbage request bytes: never a crash, INVALID_ARGUMENT with a message. */
    const uint8_t junk1[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    const uint8_t junk2[] = {0x0a, 0x7f, 'n', 'o'};       /* field 1, length 127, 2 bytes */
    const uint8_t junk3[] = {0x12, 0x03, 0x0a, 0x80, 0x80}; /* truncated nested varint */
    const uint8_t *junks[] = {junk1, junk2, junk3};
    size_t jlen[] = {sizeof junk1, sizeof junk2, sizeof junk3};
    for (int i = 0; i < 3; i++) {
        rc = rpc_client_unary(c, SVC "Register", junks[i], jlen[i], 5.0, &rep, &rlen, &st);
        CHECK_EQ_INT(rc, -1);
        CHECK_EQ_INT(st.code, RPC_INVALID_ARGUMENT);
        CHECK_MSG(strstr(st.msg, "malformed strata.v1.RegisterRequest") != NULL, "msg: %s",
                  st.msg);
    }
    /* The server still works afterwards. */
    CHECK(do_register(c, "node-c", 1) != 0);

    /* 6. Unavailable: nothing listens on port 1. */
    rpc_client *dead = rpc_client_create("127.0.0.1:1", NULL, &err);
    REQUIRE(dead != NULL);
    t0 = now_s();
    rc = rpc_client_unary(dead, SVC "GetStatus", "", 0, 5.0, &rep, &rlen, &st);
    CHECK_EQ_INT(rc, -1);
    CHECK_EQ_INT(st.code, RPC_UNAVAILABLE);
    CHECK_MSG(now_s() - t0 < 4.0, "UNAVAILABLE took %.2f s", now_s() - t0);
    rpc_client_destroy(dead);

    /* 6b. Asynchronous unary calls on one completion queue of ours
     * (rpc_client_start, as bench/fleet_sim.c drives thousands): three
     * clients with a connection each register and heartbeat; an unknown
     * method, a bad method name and an unreachable server. */
    async_calls(addr);

    /* 7. Stop the server while a stream is open: the client gets an error
     * status, the server exits 0 (clean under ASan/LSan). */
    thr_arg lt;
    memset(&lt, 0, sizeof lt);
    lt.c = c;
    lt.n = 100000;
    pthread_create(&th[0], NULL, gen_thread, &lt);
    while (__atomic_load_n(&lt.g.n, __ATOMIC_RELAXED) < 5) usleep(2000);
    int code = stop_server(pid);
    pthread_join(th[0], NULL);
    CHECK_EQ_INT(code, 0);
    CHECK_EQ_INT(lt.rc, -1);
    CHECK_MSG(lt.st.code == RPC_UNAVAILABLE || lt.st.code == RPC_CANCELLED, "%s: %s",
              rpc_code_name(lt.st.code), lt.st.msg);
    CHECK(lt.g.n >= 5 && lt.g.bad_order == 0);

    rpc_client_destroy(c);
    return test_summary();
}
