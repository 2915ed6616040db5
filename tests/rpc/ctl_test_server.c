/* ctl_test_server.c — a test fixture for the control API: a process that
 * serves strata.v1.Control with rpc/grpc_server + rpc/grpc_loop on a libevent
 * loop (the way the coordinator is meant to), backed by a tiny in-memory node
 * registry and placement, and answering with real protobuf-c messages.
 *
 * Usage: ctl_test_server [--listen ADDR] [--layers N] [--gen-delay-ms MS] [--node NAME]...
 * (--node pre-registers NAME: 1 cpu device of 16 GiB, 64 GiB host memory,
 * data address 127.0.0.1:7100+i, state registered.)
 * Prints "PORT <n>" on stdout once serving; SIGTERM / SIGINT stop it cleanly
 * (exit 0). Extra test methods (unary, any bytes): /strata.v1.Test/Slow echoes
 * the request after 300 ms (deadline tests); /strata.v1.Test/Echo echoes it at
 * once from the rpc thread (a direct handler, no loop); /strata.v1.Test/NoReply
 * finishes OK without a reply (the server must turn that into INTERNAL);
 * /strata.v1.Test/Block holds the loop for 600 ms (or the request's decimal
 * number of ms), then echoes;
 * /strata.v1.Test/Count answers the number of times its handler ran, as
 * decimal text (a call whose deadline passed while it was queued behind Block
 * must not run it: rpc/grpc_loop.h); /strata.v1.Test/Order (ordinary) and
 * /strata.v1.Test/Urgent (rpc_loop_add_urgent_method) answer "SEQ LEN": the
 * order in which their handlers ran, counted over both, and the request's
 * length (an urgent call queued behind ordinary ones runs first);
 * /strata.v1.Test/LoopStats (rpc thread) answers the bridge's counters
 * (rpc_loop_get_stats) as "CALLS JOB_MALLOCS BYTES_MALLOCS ARENA_MALLOCS".
 *
 * Generate streams max_tokens chunks (default 8), one every --gen-delay-ms:
 * chunk i carries token_ids [100+i] and text " t<i>"; the last one has
 * finish_reason "length", prompt_tokens = words in the prompt and
 * completion_tokens = max_tokens.
 */
#include <event2/event.h>
#include <inttypes.h>
#include <protobuf-c/protobuf-c.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "proto/control.pb-c.h"
#include "rpc/grpc_loop.h"
#include "rpc/grpc_server.h"

#define SVC "/strata.v1.Control/"
#define MAX_NODES 64

typedef struct node {
    char *name;
    uint64_t lease;
    Strata__V1__NodeState state;
    double last_hb;
    Strata__V1__Device *devices; /* n_devices, kind strings owned */
    size_t n_devices;
    uint64_t host_mem;
    uint32_t numa;
    char *data_address;
    uint32_t running, kv_used, kv_free;
    double busy;
    uint64_t bytes_sent;
} node;

typedef struct pending {           /* a stream or a slow reply in progress */
    struct fixture *fx;
    rpc_call *call;
    struct event *timer;
    uint32_t i, n, prompt_words;
    uint8_t *echo;                 /* Slow: the bytes to echo */
    size_t echo_len;
    struct pending *next;
} pending;

typedef struct fixture {
    struct event_base *base;
    node nodes[MAX_NODES];
    size_t n_nodes;
    uint64_t next_lease;
    uint32_t n_layers;
    uint64_t epoch;
    Strata__V1__Stage stages[MAX_NODES];
    char *stage_nodes[MAX_NODES];
    size_t n_stages;
    int gen_delay_ms;
    double t0;
    pending *active;
} fixture;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int pack_msg(const ProtobufCMessage *m, uint8_t **out, size_t *len) {
    *len = protobuf_c_message_get_packed_size(m);
    *out = malloc(*len ? *len : 1);
    if (!*out) return -1;
    protobuf_c_message_pack(m, *out);
    return 0;
}

static void reply(rpc_call *c, const ProtobufCMessage *m) {
    uint8_t *buf;
    size_t len;
    if (pack_msg(m, &buf, &len) != 0) {
        rpc_call_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    rpc_call_reply(c, buf, len);
    free(buf);
}

static node *find_node(fixture *fx, const char *name) {
    for (size_t i = 0; i < fx->n_nodes; i++)
        if (strcmp(fx->nodes[i].name, name) == 0) return &fx->nodes[i];
    return NULL;
}

static void node_clear(node *n) {
    for (size_t i = 0; i < n->n_devices; i++) free(n->devices[i].kind);
    free(n->devices);
    free(n->data_address);
    n->devices = NULL;
    n->n_devices = 0;
    n->data_address = NULL;
}

/* ------------------------------------------------------------------ unary handlers */

static void h_register(rpc_call *c, const rpc_request *req, void *ud) {
    fixture *fx = ud;
    const Strata__V1__RegisterRequest *r = (const void *)req->msg;
    if (!r->node[0]) {
        rpc_call_finish(c, RPC_INVALID_ARGUMENT, "Register: empty node name");
        return;
    }
    for (size_t i = 0; i < r->n_models; i++) {
        const char *h = r->models[i]->sha256;
        if (strlen(h) != 64 || strspn(h, "0123456789abcdef") != 64) {
            rpc_call_finishf(c, RPC_INVALID_ARGUMENT,
                             "Register: model %s: sha256 must be 64 lowercase hex digits",
                             r->models[i]->name);
            return;
        }
    }
    node *n = find_node(fx, r->node);
    if (!n) {
        if (fx->n_nodes == MAX_NODES) {
            rpc_call_finish(c, RPC_RESOURCE_EXHAUSTED, "Register: registry full");
            return;
        }
        n = &fx->nodes[fx->n_nodes++];
        memset(n, 0, sizeof *n);
        n->name = strdup(r->node);
    }
    node_clear(n);
    n->lease = ++fx->next_lease;
    n->state = STRATA__V1__NODE_STATE__NODE_STATE_REGISTERED;
    n->last_hb = now_s();
    n->devices = calloc(r->n_devices ? r->n_devices : 1, sizeof *n->devices);
    for (size_t i = 0; i < r->n_devices; i++) {
        strata__v1__device__init(&n->devices[i]);
        n->devices[i].kind = strdup(r->devices[i]->kind);
        n->devices[i].count = r->devices[i]->count;
        n->devices[i].memory_bytes = r->devices[i]->memory_bytes;
    }
    n->n_devices = r->n_devices;
    n->host_mem = r->host_memory_bytes;
    n->numa = r->numa_nodes;
    n->data_address = strdup(r->data_address);

    Strata__V1__RegisterReply out = STRATA__V1__REGISTER_REPLY__INIT;
    out.lease_id = n->lease;
    out.heartbeat_interval_ms = 1000;
    out.suspect_after_missed = 3;
    out.dead_after_ms = 5000;
    out.placement_epoch = fx->epoch;
    reply(c, &out.base);
}

static void h_heartbeat(rpc_call *c, const rpc_request *req, void *ud) {
    fixture *fx = ud;
    const Strata__V1__HeartbeatRequest *r = (const void *)req->msg;
    Strata__V1__HeartbeatReply out = STRATA__V1__HEARTBEAT_REPLY__INIT;
    node *n = find_node(fx, r->node);
    if (!n || n->lease != r->lease_id) {
        out.reregister = 1;
    } else {
        n->last_hb = now_s();
        if (n->state != STRATA__V1__NODE_STATE__NODE_STATE_DRAINING)
            n->state = STRATA__V1__NODE_STATE__NODE_STATE_READY;
        n->running = r->running_sequences;
        n->kv_used = r->kv_blocks_used;
        n->kv_free = r->kv_blocks_free;
        n->busy = r->busy_fraction;
        n->bytes_sent = r->bytes_sent;
    }
    out.placement_epoch = fx->epoch;
    reply(c, &out.base);
}

static void h_status(rpc_call *c, const rpc_request *req, void *ud) {
    fixture *fx = ud;
    Strata__V1__GetStatusReply out = STRATA__V1__GET_STATUS_REPLY__INIT;
    out.version = "strata-test";
    out.model = "stories260K.gguf";
    out.n_layers = fx->n_layers;
    out.placement_epoch = fx->epoch;
    out.n_stages = (uint32_t)fx->n_stages;
    out.nodes_total = (uint32_t)fx->n_nodes;
    for (size_t i = 0; i < fx->n_nodes; i++) {
        if (fx->nodes[i].state == STRATA__V1__NODE_STATE__NODE_STATE_READY) out.nodes_ready++;
        out.running_sequences += fx->nodes[i].running;
    }
    out.uptime_s = now_s() - fx->t0;
    out.serving = fx->n_stages > 0;
    reply(c, &out.base);
}

static void h_list_nodes(rpc_call *c, const rpc_request *req, void *ud) {
    fixture *fx = ud;
    Strata__V1__NodeInfo infos[MAX_NODES];
    Strata__V1__NodeInfo *ptrs[MAX_NODES];
    Strata__V1__Device *devp[MAX_NODES][8];
    double t = now_s();
    for (size_t i = 0; i < fx->n_nodes; i++) {
        node *n = &fx->nodes[i];
        Strata__V1__NodeInfo *o = &infos[i];
        strata__v1__node_info__init(o);
        o->name = n->name;
        o->state = n->state;
        o->heartbeat_age_s = t - n->last_hb;
        o->lease_id = n->lease;
        size_t nd = n->n_devices < 8 ? n->n_devices : 8;
        for (size_t d = 0; d < nd; d++) devp[i][d] = &n->devices[d];
        o->devices = devp[i];
        o->n_devices = nd;
        o->host_memory_bytes = n->host_mem;
        o->numa_nodes = n->numa;
        o->data_address = n->data_address;
        o->running_sequences = n->running;
        o->kv_blocks_used = n->kv_used;
        o->kv_blocks_free = n->kv_free;
        o->busy_fraction = n->busy;
        o->bytes_sent = n->bytes_sent;
        ptrs[i] = o;
    }
    Strata__V1__ListNodesReply out = STRATA__V1__LIST_NODES_REPLY__INIT;
    out.nodes = ptrs;
    out.n_nodes = fx->n_nodes;
    reply(c, &out.base);
}

static void reply_placement(fixture *fx, rpc_call *c, const Strata__V1__Stage *pend,
                            size_t n_pend) {
    Strata__V1__Stage *cur[MAX_NODES], *pp[MAX_NODES];
    Strata__V1__Stage pcopy[MAX_NODES];
    for (size_t i = 0; i < fx->n_stages; i++) cur[i] = &fx->stages[i];
    Strata__V1__Placement current = STRATA__V1__PLACEMENT__INIT, pending_pl = STRATA__V1__PLACEMENT__INIT;
    current.epoch = fx->epoch;
    current.n_layers = fx->n_layers;
    current.stages = cur;
    current.n_stages = fx->n_stages;
    Strata__V1__PlacementReply out = STRATA__V1__PLACEMENT_REPLY__INIT;
    out.current = &current;
    if (pend) {
        for (size_t i = 0; i < n_pend; i++) {
            pcopy[i] = pend[i];
            pp[i] = &pcopy[i];
        }
        pending_pl.epoch = fx->epoch + 1;
        pending_pl.n_layers = fx->n_layers;
        pending_pl.stages = pp;
        pending_pl.n_stages = n_pend;
        out.pending = &pending_pl;
    }
    reply(c, &out.base);
}

static void set_stages(fixture *fx, const Strata__V1__Stage *st, size_t n) {
    char *names[MAX_NODES];
    for (size_t i = 0; i < n; i++) names[i] = strdup(st[i].node);
    for (size_t i = 0; i < fx->n_stages; i++) free(fx->stage_nodes[i]);
    for (size_t i = 0; i < n; i++) {
        fx->stages[i] = st[i];
        fx->stage_nodes[i] = names[i];
        fx->stages[i].node = names[i];
    }
    fx->n_stages = n;
    fx->epoch++;
}

static void h_get_placement(rpc_call *c, const rpc_request *req, void *ud) {
    reply_placement(ud, c, NULL, 0);
}

static void h_set_placement(rpc_call *c, const rpc_request *req, void *ud) {
    fixture *fx = ud;
    const Strata__V1__SetPlacementRequest *r = (const void *)req->msg;
    if (r->n_stages == 0 || r->n_stages > MAX_NODES) {
        rpc_call_finishf(c, RPC_INVALID_ARGUMENT, "SetPlacement: %zu stages (1..%d)",
                         r->n_stages, MAX_NODES);
        return;
    }
    uint32_t next = 0;
    Strata__V1__Stage st[MAX_NODES];
    for (size_t i = 0; i < r->n_stages; i++) {
        const Strata__V1__Stage *s = r->stages[i];
        if (!find_node(fx, s->node)) {
            rpc_call_finishf(c, RPC_NOT_FOUND, "SetPlacement: unknown node \"%s\"", s->node);
            return;
        }
        if (s->first_layer > s->last_layer || s->last_layer >= fx->n_layers) {
            rpc_call_finishf(c, RPC_INVALID_ARGUMENT,
                             "SetPlacement: stage %zu: bad layer range %u-%u (model has %u layers)",
                             i, s->first_layer, s->last_layer, fx->n_layers);
            return;
        }
        if (s->first_layer != next) {
            rpc_call_finishf(c, RPC_INVALID_ARGUMENT,
                             s->first_layer < next
                                 ? "SetPlacement: layer %u is covered twice"
                                 : "SetPlacement: layer %u is not covered",
                             s->first_layer < next ? s->first_layer : next);
            return;
        }
        next = s->last_layer + 1;
        st[i] = *s;
    }
    if (next != fx->n_layers) {
        rpc_call_finishf(c, RPC_INVALID_ARGUMENT, "SetPlacement: layers %u-%u are not covered",
                         next, fx->n_layers - 1);
        return;
    }
    set_stages(fx, st, r->n_stages);
    reply_placement(fx, c, NULL, 0);
}

static void h_auto_placement(rpc_call *c, const rpc_request *req, void *ud) {
    fixture *fx = ud;
    const Strata__V1__AutoPlacementRequest *r = (const void *)req->msg;
    node *use[MAX_NODES];
    size_t k = 0;
    for (size_t i = 0; i < fx->n_nodes; i++) {
        Strata__V1__NodeState s = fx->nodes[i].state;
        if (s == STRATA__V1__NODE_STATE__NODE_STATE_REGISTERED ||
            s == STRATA__V1__NODE_STATE__NODE_STATE_READY)
            use[k++] = &fx->nodes[i];
    }
    if (k > fx->n_layers) k = fx->n_layers;
    if (k == 0) {
        rpc_call_finish(c, RPC_FAILED_PRECONDITION, "AutoPlacement: no ready node");
        return;
    }
    Strata__V1__Stage st[MAX_NODES];
    uint32_t first = 0;
    for (size_t i = 0; i < k; i++) {
        uint32_t cnt = fx->n_layers / (uint32_t)k + (i < fx->n_layers % k ? 1 : 0);
        strata__v1__stage__init(&st[i]);
        st[i].node = use[i]->name;
        st[i].first_layer = first;
        st[i].last_layer = first + cnt - 1;
        st[i].tp = use[i]->n_devices ? use[i]->devices[0].count : 1;
        first += cnt;
    }
    if (r->dry_run) {
        reply_placement(fx, c, st, k);
        return;
    }
    set_stages(fx, st, k);
    reply_placement(fx, c, NULL, 0);
}

static void h_drain(rpc_call *c, const rpc_request *req, void *ud) {
    fixture *fx = ud;
    const Strata__V1__DrainRequest *r = (const void *)req->msg;
    node *n = find_node(fx, r->node);
    if (!n) {
        rpc_call_finishf(c, RPC_NOT_FOUND, "Drain: unknown node \"%s\"", r->node);
        return;
    }
    n->state = STRATA__V1__NODE_STATE__NODE_STATE_DRAINING;
    Strata__V1__DrainReply out = STRATA__V1__DRAIN_REPLY__INIT;
    out.node = n->name;
    out.state = n->state;
    out.placement_epoch = fx->epoch;
    reply(c, &out.base);
}

/* ------------------------------------------------------------------ streams, slow calls */

static void pending_free(fixture *fx, pending *p) {
    for (pending **pp = &fx->active; *pp; pp = &(*pp)->next) {
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    }
    event_free(p->timer);
    free(p->echo);
    free(p);
}

static void gen_tick(evutil_socket_t fd, short what, void *arg) {
    pending *p = arg;
    fixture *fx = p->fx;
    if (rpc_call_cancelled(p->call)) {
        rpc_call_finish(p->call, RPC_CANCELLED, "Generate: cancelled");
        pending_free(fx, p);
        return;
    }
    char text[32];
    uint32_t tok = 100 + p->i;
    snprintf(text, sizeof text, " t%u", p->i);
    Strata__V1__GenerateChunk ch = STRATA__V1__GENERATE_CHUNK__INIT;
    ch.token_ids = &tok;
    ch.n_token_ids = 1;
    ch.text = text;
    p->i++;
    bool last = p->i == p->n;
    if (last) {
        ch.finish_reason = "length";
        ch.prompt_tokens = p->prompt_words;
        ch.completion_tokens = p->n;
    }
    uint8_t *buf;
    size_t len;
    if (pack_msg(&ch.base, &buf, &len) != 0 || rpc_call_send(p->call, buf, len) != 0) {
        rpc_call_finish(p->call, RPC_CANCELLED, "Generate: stream closed");
        pending_free(fx, p);
        return;
    }
    free(buf);
    if (last) {
        rpc_call_finish(p->call, RPC_OK, NULL);
        pending_free(fx, p);
        return;
    }
    struct timeval tv = {0, fx->gen_delay_ms * 1000};
    evtimer_add(p->timer, &tv);
}

static void h_generate(rpc_call *c, const rpc_request *req, void *ud) {
    fixture *fx = ud;
    const Strata__V1__GenerateRequest *r = (const void *)req->msg;
    if (!r->prompt[0]) {
        rpc_call_finish(c, RPC_INVALID_ARGUMENT, "Generate: empty prompt");
        return;
    }
    pending *p = calloc(1, sizeof *p);
    p->fx = fx;
    p->call = c;
    p->n = r->max_tokens ? r->max_tokens : 8;
    for (const char *s = r->prompt; *s;) {
        while (*s == ' ') s++;
        if (!*s) break;
        p->prompt_words++;
        while (*s && *s != ' ') s++;
    }
    p->timer = evtimer_new(fx->base, gen_tick, p);
    p->next = fx->active;
    fx->active = p;
    struct timeval tv = {0, 0};
    evtimer_add(p->timer, &tv);
}

static void slow_done(evutil_socket_t fd, short what, void *arg) {
    pending *p = arg;
    rpc_call_reply(p->call, p->echo, p->echo_len);
    pending_free(p->fx, p);
}

static void h_slow(rpc_call *c, const rpc_request *req, void *ud) {
    fixture *fx = ud;
    pending *p = calloc(1, sizeof *p);
    p->fx = fx;
    p->call = c;
    p->echo = malloc(req->len ? req->len : 1);
    memcpy(p->echo, req->bytes, req->len);
    p->echo_len = req->len;
    p->timer = evtimer_new(fx->base, slow_done, p);
    p->next = fx->active;
    fx->active = p;
    struct timeval tv = {0, 300 * 1000};
    evtimer_add(p->timer, &tv);
}

static void h_block(rpc_call *c, const rpc_request *req, void *ud) {
    long ms = req->len > 0 && req->len < 6 ? 0 : 600; /* "1500": hold 1.5 s */
    for (size_t i = 0; ms != 600 && i < req->len; i++)
        ms = req->bytes[i] >= '0' && req->bytes[i] <= '9' ? ms * 10 + (req->bytes[i] - '0') : 600;
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000 * 1000};
    nanosleep(&ts, NULL); /* the whole loop waits: the calls behind it queue */
    rpc_call_reply(c, req->bytes, req->len);
}

static void h_count(rpc_call *c, const rpc_request *req, void *ud) {
    static int runs;
    char buf[16];
    int n = snprintf(buf, sizeof buf, "%d", ++runs);
    rpc_call_reply(c, buf, (size_t)n);
}

static void h_sequence(rpc_call *c, const rpc_request *req, void *ud) {
    static int seq;
    char buf[32];
    int n = snprintf(buf, sizeof buf, "%d %zu", ++seq, req->len);
    rpc_call_reply(c, buf, (size_t)n);
}

/* Direct handlers: run on the rpc thread (rpc_server_add_method), answer at once. */
static void h_echo(rpc_call *c, const rpc_request *req, void *ud) {
    rpc_call_reply(c, req->bytes, req->len);
}

/* "CALLS JOB_MALLOCS BYTES_MALLOCS ARENA_MALLOCS" of the loop bridge. */
static void h_loop_stats(rpc_call *c, const rpc_request *req, void *ud) {
    rpc_loop_stats st;
    rpc_loop_get_stats(ud, &st);
    char buf[128];
    int n = snprintf(buf, sizeof buf, "%" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64, st.calls, st.job_mallocs,
                     st.bytes_mallocs, st.arena_mallocs);
    rpc_call_reply(c, buf, (size_t)n);
}

static void h_no_reply(rpc_call *c, const rpc_request *req, void *ud) {
    rpc_call_finish(c, RPC_OK, NULL); /* a bug the server turns into INTERNAL */
}

/* ------------------------------------------------------------------ main */

static void seed_node(fixture *fx, const char *name) {
    if (fx->n_nodes == MAX_NODES || find_node(fx, name)) return;
    node *n = &fx->nodes[fx->n_nodes];
    memset(n, 0, sizeof *n);
    n->name = strdup(name);
    n->lease = ++fx->next_lease;
    n->state = STRATA__V1__NODE_STATE__NODE_STATE_REGISTERED;
    n->last_hb = now_s();
    n->devices = calloc(1, sizeof *n->devices);
    strata__v1__device__init(&n->devices[0]);
    n->devices[0].kind = strdup("cpu");
    n->devices[0].count = 1;
    n->devices[0].memory_bytes = 16ull << 30;
    n->n_devices = 1;
    n->host_mem = 64ull << 30;
    n->numa = 1;
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%zu", 7100 + fx->n_nodes);
    n->data_address = strdup(addr);
    fx->n_nodes++;
}

static void on_signal(evutil_socket_t sig, short what, void *arg) {
    event_base_loopbreak(arg);
}

int main(int argc, char **argv) {
    const char *listen = "127.0.0.1:0";
    fixture fx;
    memset(&fx, 0, sizeof fx);
    fx.n_layers = 5;
    fx.gen_delay_ms = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--listen") && i + 1 < argc) listen = argv[++i];
        else if (!strcmp(argv[i], "--layers") && i + 1 < argc) fx.n_layers = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--gen-delay-ms") && i + 1 < argc) fx.gen_delay_ms = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--node") && i + 1 < argc) seed_node(&fx, argv[++i]);
        else {
            fprintf(stderr, "usage: ctl_test_server [--listen ADDR] [--layers N] [--gen-delay-ms MS] [--node NAME]...\n");
            for (size_t k = 0; k < fx.n_nodes; k++) {
                node_clear(&fx.nodes[k]);
                free(fx.nodes[k].name);
            }
            return 2;
        }
    }
    st_log_set_tag("ctl-test");
    signal(SIGPIPE, SIG_IGN);
    fx.t0 = now_s();
    fx.base = event_base_new();
    st_err err;
    rpc_server *srv = rpc_server_create(listen, NULL, &err);
    if (!srv) {
        fprintf(stderr, "ctl_test_server: %s\n", err.msg);
        event_base_free(fx.base);
        return 1;
    }
    rpc_loop *lp = rpc_loop_create(fx.base, &err);
    const rpc_method methods[] = {
        {SVC "Register", RPC_KIND_UNARY, h_register, &fx, &strata__v1__register_request__descriptor},
        {SVC "Heartbeat", RPC_KIND_UNARY, h_heartbeat, &fx, &strata__v1__heartbeat_request__descriptor},
        {SVC "GetStatus", RPC_KIND_UNARY, h_status, &fx, &strata__v1__get_status_request__descriptor},
        {SVC "ListNodes", RPC_KIND_UNARY, h_list_nodes, &fx, &strata__v1__list_nodes_request__descriptor},
        {SVC "GetPlacement", RPC_KIND_UNARY, h_get_placement, &fx, &strata__v1__get_placement_request__descriptor},
        {SVC "SetPlacement", RPC_KIND_UNARY, h_set_placement, &fx, &strata__v1__set_placement_request__descriptor},
        {SVC "AutoPlacement", RPC_KIND_UNARY, h_auto_placement, &fx, &strata__v1__auto_placement_request__descriptor},
        {SVC "Drain", RPC_KIND_UNARY, h_drain, &fx, &strata__v1__drain_request__descriptor},
        {SVC "Generate", RPC_KIND_SERVER_STREAM, h_generate, &fx, &strata__v1__generate_request__descriptor},
        {"/strata.v1.Test/Slow", RPC_KIND_UNARY, h_slow, &fx, NULL},
        {"/strata.v1.Test/Block", RPC_KIND_UNARY, h_block, &fx, NULL},
        {"/strata.v1.Test/Count", RPC_KIND_UNARY, h_count, &fx, NULL},
    };
    int rc = 0;
    if (!lp) rc = 1;
    for (size_t i = 0; rc == 0 && i < sizeof methods / sizeof methods[0]; i++)
        if (rpc_loop_add_method(lp, srv, &methods[i], &err) != 0) rc = 1;
    const rpc_method order = {"/strata.v1.Test/Order", RPC_KIND_UNARY, h_sequence, NULL, NULL};
    const rpc_method urgent = {"/strata.v1.Test/Urgent", RPC_KIND_UNARY, h_sequence, NULL, NULL};
    if (rc == 0 && (rpc_loop_add_method(lp, srv, &order, &err) != 0 ||
                    rpc_loop_add_urgent_method(lp, srv, &urgent, &err) != 0))
        rc = 1;
    const rpc_method direct[] = {
        {"/strata.v1.Test/Echo", RPC_KIND_UNARY, h_echo, NULL, NULL},
        {"/strata.v1.Test/NoReply", RPC_KIND_UNARY, h_no_reply, NULL, NULL},
        {"/strata.v1.Test/LoopStats", RPC_KIND_UNARY, h_loop_stats, lp, NULL},
    };
    for (size_t i = 0; rc == 0 && i < 3; i++)
        if (rpc_server_add_method(srv, &direct[i], &err) != 0) rc = 1;
    if (rc == 0 && rpc_server_start(srv, &err) != 0) rc = 1;
    if (rc != 0) {
        fprintf(stderr, "ctl_test_server: %s\n", err.msg);
    } else {
        printf("PORT %d\n", rpc_server_port(srv));
        fflush(stdout);
        struct event *sterm = evsignal_new(fx.base, SIGTERM, on_signal, fx.base);
        struct event *sint = evsignal_new(fx.base, SIGINT, on_signal, fx.base);
        event_add(sterm, NULL);
        event_add(sint, NULL);
        event_base_dispatch(fx.base);
        event_free(sterm);
        event_free(sint);
    }
    /* Shutdown order of grpc_loop.h. */
    if (lp) rpc_loop_close(lp);
    while (fx.active) {
        rpc_call_finish(fx.active->call, RPC_UNAVAILABLE, "server stopping");
        pending_free(&fx, fx.active);
    }
    rpc_server_destroy(srv);
    rpc_loop_destroy(lp);
    for (size_t i = 0; i < fx.n_nodes; i++) {
        node_clear(&fx.nodes[i]);
        free(fx.nodes[i].name);
    }
    for (size_t i = 0; i < fx.n_stages; i++) free(fx.stage_nodes[i]);
    event_base_free(fx.base);
    return rc;
}
