/* rogue_peer.c — a data-plane peer for the security tests
 * (tests/cluster/security_test.py): it connects to a worker over the real
 * UCX transport, sends what it is told at once (before any handshake
 * message could arrive) and prints what comes back, one line each:
 *   connected
 *   ready ok=0|1 epoch=E stage=S error=TEXT      (a StageReady)
 *   tokens batch=B n=N                            (a TOKENS frame)
 *   disconnected: REASON
 *   done
 *
 *   rogue_peer HOST:PORT [--key FILE] [--role coordinator|stage] [--sign]
 *              [--wait S] [--epoch E] [--stage S] [--n-stages N] [--first F]
 *              [--last L] [--kv-blocks K] [--next-hop H:P] [--expect N] ACTION...
 * ACTION: assign:MODEL_PATH (a StageAssign with the flags' fields; --sign:
 * with the token of --key), garbage (a frame header of random bytes),
 * activations (one decode step of token 1 at epoch E for stage S), stats (a
 * StatsRequest; the StageStats security counters are printed as
 * "stats unauth_frames=N auth_failures=N refused_assigns=N loaded=0|1",
 * counted by --expect like a StageReady), offer:B:N (an ActivationOffer of
 * epoch E for boundary B->B+1 from a "cpu" stage, with an N-byte NCCL id of
 * bytes i*7+3 and nccl = N > 0; its ActivationAnswer is printed as
 * "answer boundary=B transport=T error=TEXT", counted by --expect).
 * Without --key the transport has no key; with one it does the handshake
 * as --role. Exits 0 after --wait seconds (default 3) or once N StageReady
 * came back (--expect N), 2 on bad usage.
 */
#include <event2/event.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ib/assign_token.h"
#include "ib/cluster_key.h"
#include "ib/transport.h"
#include "proto/stage.pb-c.h"

static struct {
    const char *actions[16];
    int n_actions;
    bool sign;
    uint64_t epoch;
    uint32_t stage, n_stages;
    int first, last, kv_blocks;
    const char *next_hop;
    cluster_key *key;
    struct event_base *base;
    bool sent;
    int expect, n_ready; /* --expect N: stop after N StageReady replies */
} g = {.epoch = 1, .n_stages = 1, .first = 0, .last = 5, .kv_blocks = 64, .next_hop = ""};

static void send_control(xport_peer *p, const Strata__V1__ControlMessage *m)
{
    size_t n = strata__v1__control_message__get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    strata__v1__control_message__pack(m, buf);
    frame_header h = STRATA__V1__FRAME_HEADER__INIT;
    h.kind = STRATA__V1__FRAME_KIND__FRAME_KIND_CONTROL;
    h.epoch = g.epoch;
    h.stage = g.stage;
    h.control.data = buf;
    h.control.len = n;
    st_err err;
    if (xport_send(p, &h, NULL, 0, NULL, NULL, NULL, &err)) printf("send failed: %s\n", err.msg);
    free(buf);
}

static void act(xport_peer *p, const char *a)
{
    st_err err;
    if (!strncmp(a, "assign:", 7)) {
        Strata__V1__StageAssign s = STRATA__V1__STAGE_ASSIGN__INIT;
        s.epoch = g.epoch;
        s.stage = g.stage;
        s.n_stages = g.n_stages;
        s.model_path = (char *)a + 7;
        s.first_layer = g.first;
        s.last_layer = g.last;
        s.tp = 1;
        s.kv_blocks = g.kv_blocks;
        s.next_hop = (char *)g.next_hop;
        uint8_t tok[CLUSTER_MAC_LEN];
        if (g.sign && g.key && assign_token_make(g.key, &s, tok) == 0) {
            s.token.data = tok;
            s.token.len = sizeof tok;
        }
        Strata__V1__ControlMessage m = STRATA__V1__CONTROL_MESSAGE__INIT;
        m.msg_case = STRATA__V1__CONTROL_MESSAGE__MSG_ASSIGN;
        m.assign = &s;
        send_control(p, &m);
    } else if (!strcmp(a, "stats")) {
        Strata__V1__StatsRequest r = STRATA__V1__STATS_REQUEST__INIT;
        r.request_id = 42;
        Strata__V1__ControlMessage m = STRATA__V1__CONTROL_MESSAGE__INIT;
        m.msg_case = STRATA__V1__CONTROL_MESSAGE__MSG_STATS_REQUEST;
        m.stats_request = &r;
        send_control(p, &m);
    } else if (!strncmp(a, "offer:", 6)) {
        unsigned boundary = 0, n = 0;
        if (sscanf(a + 6, "%u:%u", &boundary, &n) != 2 || n > 4096) {
            printf("bad action %s\n", a);
            return;
        }
        uint8_t id[4096];
        for (unsigned i = 0; i < n; i++) id[i] = (uint8_t)(i * 7 + 3);
        Strata__V1__ActivationOffer o = STRATA__V1__ACTIVATION_OFFER__INIT;
        o.epoch = g.epoch;
        o.boundary = boundary;
        o.backend = "cpu";
        o.node_id = "rogue-node";
        o.nccl = n > 0;
        o.override = "auto";
        o.nccl_id.data = id;
        o.nccl_id.len = n;
        Strata__V1__ControlMessage m = STRATA__V1__CONTROL_MESSAGE__INIT;
        m.msg_case = STRATA__V1__CONTROL_MESSAGE__MSG_ACT_OFFER;
        m.act_offer = &o;
        send_control(p, &m);
    } else if (!strcmp(a, "garbage")) {
        uint8_t junk[64];
        for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)(i * 37 + 11);
        if (xport_send_raw(p, junk, sizeof junk, NULL, 0, NULL, NULL, &err)) printf("send failed: %s\n", err.msg);
    } else if (!strcmp(a, "activations")) {
        int32_t tok = 1, blk = 0;
        Strata__V1__SamplingParams sp = STRATA__V1__SAMPLING_PARAMS__INIT;
        sp.top_p = 1;
        sp.repeat_penalty = 1;
        Strata__V1__SeqRecord q = STRATA__V1__SEQ_RECORD__INIT, *qp = &q;
        q.seq_id = 9999;
        q.n_tokens = 1;
        q.block_table = &blk;
        q.n_block_table = 1;
        q.sampling = &sp;
        q.wants_logits = true;
        frame_header h = STRATA__V1__FRAME_HEADER__INIT;
        h.kind = STRATA__V1__FRAME_KIND__FRAME_KIND_ACTIVATIONS;
        h.batch_id = 777;
        h.epoch = g.epoch;
        h.stage = g.stage;
        h.seqs = &qp;
        h.n_seqs = 1;
        h.token_ids = &tok;
        h.n_token_ids = 1;
        if (xport_send(p, &h, NULL, 0, NULL, NULL, NULL, &err)) printf("send failed: %s\n", err.msg);
    } else {
        printf("unknown action %s\n", a);
    }
}

static void on_connect(xport_peer *p, bool inbound, void *ud)
{
    printf("connected\n");
    fflush(stdout);
    if (g.sent) return;
    g.sent = true;
    for (int i = 0; i < g.n_actions; i++) act(p, g.actions[i]);
}

static void on_disconnect(xport_peer *p, const char *reason, void *ud)
{
    printf("disconnected: %s\n", reason);
    fflush(stdout);
}

static void on_frame(xport_peer *p, const frame_header *h, const void *payload, size_t bytes, void *ud)
{
    if (h->kind == STRATA__V1__FRAME_KIND__FRAME_KIND_TOKENS) {
        printf("tokens batch=%llu n=%zu\n", (unsigned long long)h->batch_id, h->n_results);
    } else if (h->kind == STRATA__V1__FRAME_KIND__FRAME_KIND_CONTROL) {
        Strata__V1__ControlMessage *m = strata__v1__control_message__unpack(NULL, h->control.len, h->control.data);
        if (m && m->msg_case == STRATA__V1__CONTROL_MESSAGE__MSG_READY) {
            printf("ready ok=%d epoch=%llu stage=%u error=%s\n", m->ready->ok, (unsigned long long)m->ready->epoch,
                   m->ready->stage, m->ready->error ? m->ready->error : "");
            if (++g.n_ready == g.expect) event_base_loopbreak(g.base);
        } else if (m && m->msg_case == STRATA__V1__CONTROL_MESSAGE__MSG_STATS) {
            printf("stats unauth_frames=%llu auth_failures=%llu refused_assigns=%llu loaded=%d\n",
                   (unsigned long long)m->stats->unauth_frames, (unsigned long long)m->stats->auth_failures,
                   (unsigned long long)m->stats->refused_assigns, m->stats->loaded);
            if (++g.n_ready == g.expect) event_base_loopbreak(g.base);
        } else if (m && m->msg_case == STRATA__V1__CONTROL_MESSAGE__MSG_ACT_ANSWER) {
            printf("answer boundary=%u transport=%s error=%s\n", m->act_answer->boundary,
                   m->act_answer->transport ? m->act_answer->transport : "",
                   m->act_answer->error ? m->act_answer->error : "");
            if (++g.n_ready == g.expect) event_base_loopbreak(g.base);
        } else {
            printf("control %d\n", m ? (int)m->msg_case : -1);
        }
        if (m) strata__v1__control_message__free_unpacked(m, NULL);
    } else {
        printf("frame kind %d\n", (int)h->kind);
    }
    fflush(stdout);
}

static void on_timeout(evutil_socket_t fd, short what, void *arg) { event_base_loopbreak(g.base); }

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: rogue_peer HOST:PORT [options] ACTION...\n");
        return 2;
    }
    setenv("UCX_TLS", "tcp", 0);
    setenv("UCX_NET_DEVICES", "lo", 0); /* loopback only: another test may be adding a bridge */
    char host[256];
    const char *colon = strrchr(argv[1], ':');
    if (!colon || (size_t)(colon - argv[1]) >= sizeof host) return 2;
    snprintf(host, sizeof host, "%.*s", (int)(colon - argv[1]), argv[1]);
    int port = atoi(colon + 1);
    const char *key_file = NULL;
    enum xport_role role = XPORT_ROLE_COORDINATOR;
    double wait_s = 3;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--key") && v) key_file = argv[++i];
        else if (!strcmp(a, "--role") && v) role = !strcmp(argv[++i], "stage") ? XPORT_ROLE_STAGE : XPORT_ROLE_COORDINATOR;
        else if (!strcmp(a, "--sign")) g.sign = true;
        else if (!strcmp(a, "--expect") && v) g.expect = atoi(argv[++i]);
        else if (!strcmp(a, "--wait") && v) wait_s = atof(argv[++i]);
        else if (!strcmp(a, "--epoch") && v) g.epoch = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(a, "--stage") && v) g.stage = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(a, "--n-stages") && v) g.n_stages = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(a, "--first") && v) g.first = atoi(argv[++i]);
        else if (!strcmp(a, "--last") && v) g.last = atoi(argv[++i]);
        else if (!strcmp(a, "--kv-blocks") && v) g.kv_blocks = atoi(argv[++i]);
        else if (!strcmp(a, "--next-hop") && v) g.next_hop = argv[++i];
        else if (a[0] == '-') {
            fprintf(stderr, "rogue_peer: bad option %s\n", a);
            return 2;
        } else if (g.n_actions < 16) g.actions[g.n_actions++] = a;
    }
    st_err err;
    if (key_file && !(g.key = cluster_key_load(key_file, &err))) {
        fprintf(stderr, "rogue_peer: %s\n", err.msg);
        return 2;
    }
    g.base = event_base_new();
    xport_callbacks cb = {.on_connect = on_connect, .on_disconnect = on_disconnect, .on_frame = on_frame};
    xport *x = xport_create(g.base, NULL, 0, &cb, &err);
    if (!x) {
        fprintf(stderr, "rogue_peer: %s\n", err.msg);
        return 1;
    }
    if (g.key) xport_require_auth(x, g.key, role, 0);
    if (!xport_connect(x, host, port, &err)) {
        printf("connect failed: %s\n", err.msg);
    }
    struct event *t = evtimer_new(g.base, on_timeout, NULL);
    struct timeval tv = {(time_t)wait_s, (suseconds_t)((wait_s - (double)(time_t)wait_s) * 1e6)};
    evtimer_add(t, &tv);
    event_base_dispatch(g.base);
    xport_stats xs;
    xport_get_stats(x, &xs);
    event_free(t);
    xport_destroy(x);
    event_base_free(g.base);
    cluster_key_free(g.key);
    printf("done auth_failures=%llu\n", (unsigned long long)xs.auth_failures);
    return 0;
}
