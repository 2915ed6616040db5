/* control_service.c — the live control plane (control_service.h): gRPC
 * handlers of strata.v1.Control, the serving engine that forwards to the
 * cluster of the serving epoch, placement changes (start, switch, release),
 * start-up (restore or auto place) and the periodic tick (failure detection,
 * retiring old clusters). */
#include "coordinator/control/control_service.h"

#include <event2/event.h>
#include <inttypes.h>
#include <protobuf-c/protobuf-c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/sha256.h"
#include "common/utf8.h"
#include "coordinator/serve/cluster.h"
#include "coordinator/control/placement.h"
#include "coordinator/control/state_file.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "proto/control.pb-c.h"
#include "rpc/grpc_loop.h"
#include "rpc/grpc_server.h"

#define SVC "/strata.v1.Control/"
#define RETIRE_AFTER_S 1.0   /* an old cluster lives on this long after StageRelease */
#define SWITCH_POLL_US 2000  /* waiting for the old epoch's in-flight batches */
#define RETRY_START_S 2.0
#define RECOVERY_TIMEOUT_S 60.0 /* default ctl_opts.recovery_timeout_s */

/* A node whose stage was lost: left out of recovery placements while it
 * holds the same lease (registering again gives it a new one). */
typedef struct lost_node {
    char name[REG_NAME_MAX];
    uint64_t lease;
} lost_node;

/* One placement epoch being loaded or served: its cluster and its config. */
typedef struct run {
    ctl_service *s;
    placement pl;
    coord_config cfg;        /* shallow copy of the live config; stages below */
    coord_stage_cfg *stages;
    cluster *cl;
    uint64_t node_reg[PLACE_NODE_MAX]; /* each stage's node's registrations when assigned */
    bool ready, failed;
    char fail_msg[ST_ERR_MSG_MAX];
    double retire_at;
    struct run *next;        /* the retired list */
} run;

/* A request through the engine: which cluster holds it now. */
typedef struct lreq {
    struct lreq *prev, *next;
    ctl_service *s;
    uint64_t id;             /* the id the HTTP layer / Generate knows */
    run *r;
    uint64_t cid;            /* the id in r->cl */
    coord_sink sink;
    void *ctx;
    char request_id[48];     /* coord_request.request_id (the logs' req=), for recovery's log lines */
} lreq;

/* An open Generate stream. */
/* Generate's max_tokens when the request leaves it 0 (the OpenAI API's default). */
#define GEN_DEFAULT_MAX_TOKENS 16

typedef struct gen_stream {
    struct gen_stream *prev, *next;
    ctl_service *s;
    rpc_call *call;
    coord_request req;
    int32_t *prompt;         /* req.prompt's token ids */
    uint64_t id;
    uint32_t n_prompt, n_gen;
    utf8_stream utf8;        /* the chunks' text: whole characters, U+FFFD for invalid bytes */
} gen_stream;

struct ctl_service {
    struct event_base *base;
    ctl_opts o;
    char model_file[256];    /* the model's file name: workers resolve it */
    char model_sha[65];
    place_model pm;
    registry reg;
    placement saved;         /* restored from the state file, not yet serving */
    uint64_t last_epoch;
    run *cur, *pend, *from;  /* serving, loading, being switched away from */
    run *retired;
    lreq *reqs;
    uint64_t next_id;
    gen_stream *streams;
    rpc_server *srv;
    rpc_loop *loop;
    struct event *tick_ev, *switch_ev;
    double t0, retry_at;
    /* Recovery (docs/recovery.md): `lost` is the serving run that lost a
     * stage; it holds its requests until a new placement serves them. */
    run *lost;
    double lost_at;
    bool recovery_expired;   /* recovery_timeout passed: the held requests failed */
    bool recovery_stuck_logged;
    char lost_msg[ST_ERR_MSG_MAX];
    lost_node excl[PLACE_NODE_MAX];
    int n_excl;
    uint64_t recoveries, seqs_resumed, tokens_recomputed;
};

/* ---------------------------------------------------------------- model */

static int model_info(ctl_service *s, st_err *err) {
    const coord_config *cfg = s->o.cfg;
    gguf_file *gf = gguf_open(cfg->model, err);
    if (!gf) return -1;
    llama_config mc;
    if (llama_config_from_gguf(gf, &mc, err) != 0) {
        gguf_close(gf);
        return -1;
    }
    if (mc.n_layer > PLACE_MAX_STAGES) {
        gguf_close(gf);
        return st_errf(err, "%s: %d layers (at most %d)", cfg->model, mc.n_layer, PLACE_MAX_STAGES);
    }
    place_model *m = &s->pm;
    memset(m, 0, sizeof *m);
    m->n_layers = mc.n_layer;
    uint64_t embd = 0;
    for (int64_t i = 0; i < gguf_n_tensors(gf); i++) {
        const gguf_tensor *t = gguf_tensor_at(gf, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.data);
        int l;
        if (sscanf(name, "blk.%d.", &l) == 1 && l >= 0 && l < mc.n_layer)
            m->layer_bytes[l] += t->nbytes;
        else if (!strcmp(name, "token_embd.weight"))
            embd = t->nbytes;
        else if (!strncmp(name, "output", 6))
            m->head_bytes += t->nbytes;
    }
    m->embd_bytes = embd;
    if (mc.tied_output) m->head_bytes += embd;
    m->kv_bytes_per_layer = (uint64_t)cfg->kv_blocks * (uint64_t)cfg->kv_block_size * 2u *
                            (uint64_t)mc.n_head_kv * (uint64_t)mc.head_dim * sizeof(float);
    gguf_close(gf);
    const char *b = strrchr(cfg->model, '/');
    snprintf(s->model_file, sizeof s->model_file, "%s", b ? b + 1 : cfg->model);
    return st_file_sha256(cfg->model, s->model_sha, err);
}

/* ---------------------------------------------------------------- state */

static void save_state(ctl_service *s) {
    st_err err = {{0}};
    const placement *p = s->cur ? &s->cur->pl : &s->saved;
    if (state_save(s->o.state_path, p, s->last_epoch, s->model_sha, &s->reg, &err) != 0)
        ST_ERROR("control: cannot save the state: %s", err.msg);
}

/* ---------------------------------------------------------------- nodes */

static uint64_t node_memory(const reg_node *n) {
    if (!strcmp(n->device_kind, "cpu")) return n->host_memory;
    return (uint64_t)n->device_count * n->device_memory;
}

static int node_tp(const reg_node *n) {
    return !strcmp(n->device_kind, "cpu") ? 1 : (int)n->device_count;
}

static int cmp_node(const void *a, const void *b) {
    return strcmp(((const place_node *)a)->name, ((const place_node *)b)->name);
}

/* The usable nodes (not draining, registered or ready), sorted by name;
 * `except` is left out. */
static int usable_nodes(ctl_service *s, place_node *out, const char *except) {
    int k = 0;
    for (int i = 0; i < s->reg.n && k < PLACE_NODE_MAX; i++) {
        const reg_node *n = &s->reg.nodes[i];
        if (!registry_usable(n) || (except && !strcmp(n->name, except))) continue;
        out[k++] = (place_node){n->name, node_memory(n), node_tp(n)};
    }
    qsort(out, (size_t)k, sizeof *out, cmp_node);
    return k;
}

/* ---------------------------------------------------------------- runs */

static void run_free(run *r) {
    if (!r) return;
    cluster_destroy(r->cl);
    free(r->stages);
    free(r);
}

static void retire(ctl_service *s, run *r, double after_s) {
    r->retire_at = st_now_s() + after_s;
    r->next = s->retired;
    s->retired = r;
}

static void run_on_ready(void *ud);
static void run_on_fatal(void *ud, const char *msg);
static void run_on_lost(void *ud, int stage, const char *msg);
static bool in_placement(const run *r, const char *node);

/* Starts loading placement pl (its epoch set) as a new cluster. */
static run *start_run(ctl_service *s, const placement *pl, st_err *err) {
    run *r = calloc(1, sizeof *r);
    if (r) r->stages = calloc((size_t)pl->n_stages, sizeof *r->stages);
    if (!r || !r->stages) {
        run_free(r);
        return st_errf(err, "out of memory"), NULL;
    }
    r->s = s;
    r->pl = *pl;
    place_range ranges[PLACE_NODE_MAX];
    for (int i = 0; i < pl->n_stages; i++) {
        const place_stage *ps = &pl->st[i];
        reg_node *n = registry_find(&s->reg, ps->node);
        coord_stage_cfg *cs = &r->stages[i];
        snprintf(cs->name, sizeof cs->name, "%s", ps->node);
        cs->tp = ps->tp > 0 ? ps->tp : 1;
        if (!n || coord_parse_hostport(n->data_address, cs->host, sizeof cs->host, &cs->port, 0, err) != 0) {
            if (!n) st_errf(err, "node %s is not registered", ps->node);
            run_free(r);
            return NULL;
        }
        r->node_reg[i] = n->registrations;
        ranges[i].first = ps->first;
        ranges[i].last = ps->last + 1;
    }
    r->cfg = *s->o.cfg;
    r->cfg.model = s->model_file; /* the workers resolve the file name */
    r->cfg.stages = r->stages;
    r->cfg.n_stages = pl->n_stages;
    r->cfg.n_partition = 0;
    if (r->cfg.max_inflight && r->cfg.max_inflight < pl->n_stages) r->cfg.max_inflight = 0;
    cluster_opts co = {.cfg = &r->cfg,
                       .ranges = ranges,
                       .n_ctx = s->o.n_ctx,
                       .vocab = s->o.vocab,
                       .ready_timeout_s = s->o.ready_timeout_s,
                       .on_fatal = run_on_fatal,
                       .on_ready = run_on_ready,
                       .ud = r,
                       .epoch = pl->epoch,
                       .keep_loaded = true,
                       .on_lost = run_on_lost};
    r->cl = cluster_create(s->base, &co, err);
    if (!r->cl) {
        run_free(r);
        return NULL;
    }
    char line[1024] = "";
    size_t off = 0;
    for (int i = 0; i < pl->n_stages && off < sizeof line - 80; i++)
        off += (size_t)snprintf(line + off, sizeof line - off, "%s%s:%d-%d", i ? "," : "", pl->st[i].node,
                                pl->st[i].first, pl->st[i].last);
    ST_INFO("control: loading placement epoch %" PRIu64 ": %s", pl->epoch, line);
    return r;
}

/* Every request whose cluster is `from` now lives in `to` under new_id. */
static void on_moved(void *ud, uint64_t old_id, uint64_t new_id) {
    ctl_service *s = ud;
    for (lreq *q = s->reqs; q; q = q->next)
        if (q->r == s->from && q->cid == old_id) {
            if (new_id) {
                q->r = s->cur;
                q->cid = new_id;
            }
            return;
        }
}

/* The ids of the requests run r holds (their request_id, the logs' req=,
 * else the engine's number), "cmpl-…01, cmpl-…02" (at most about cap bytes,
 * then "..."), into buf; their count. */
static int held_ids(const ctl_service *s, const run *r, char *buf, size_t cap) {
    size_t off = 0;
    int n = 0;
    buf[0] = 0;
    for (const lreq *q = s->reqs; q; q = q->next) {
        if (q->r != r) continue;
        if (off + 64 < cap && q->request_id[0])
            off += (size_t)snprintf(buf + off, cap - off, "%s%s", n ? ", " : "", q->request_id);
        else if (off + 64 < cap)
            off += (size_t)snprintf(buf + off, cap - off, "%s#%" PRIu64, n ? ", " : "", q->id);
        else if (off + 5 < cap && !strstr(buf, "..."))
            off += (size_t)snprintf(buf + off, cap - off, ", ...");
        n++;
    }
    if (!n) snprintf(buf, cap, "none");
    return n;
}

/* The old epoch has no batch in flight any more: move its sequences over. */
static void try_finish_switch(evutil_socket_t fd, short what, void *arg) {
    ctl_service *s = arg;
    run *from = s->from;
    if (!from) return;
    if (cluster_inflight(from->cl) > 0) {
        struct timeval tv = {0, SWITCH_POLL_US};
        evtimer_add(s->switch_ev, &tv);
        return;
    }
    bool recovery = from == s->lost;
    char ids[1024];
    int64_t tokens = 0;
    if (recovery) {
        held_ids(s, from, ids, sizeof ids);
        cluster_request_ids(from->cl, NULL, 0, &tokens);
    }
    int n = cluster_move_requests(from->cl, s->cur->cl, on_moved, s);
    if (recovery) {
        s->seqs_resumed += (uint64_t)n;
        s->tokens_recomputed += (uint64_t)tokens;
        ST_INFO("control: recovery: epoch %" PRIu64 " serves %.2f s after the loss in epoch %" PRIu64
                "; resumed %d request(s) [%s] by re-prefilling %" PRId64 " token(s)",
                s->cur->pl.epoch, st_now_s() - s->lost_at, from->pl.epoch, n, ids, tokens);
        s->lost = NULL;
        s->n_excl = 0;
    }
    cluster_release_workers(from->cl);
    ST_INFO("control: switched from epoch %" PRIu64 " to %" PRIu64 "; %d running sequence(s) moved "
            "(re-prefilled on the new stages)",
            from->pl.epoch, s->cur->pl.epoch, n);
    s->from = NULL;
    retire(s, from, RETIRE_AFTER_S);
}

static void run_on_ready(void *ud) {
    run *r = ud;
    ctl_service *s = r->s;
    r->ready = true;
    if (r != s->pend) return;
    s->pend = NULL;
    if (!s->cur) {
        s->cur = r;
        memset(&s->saved, 0, sizeof s->saved);
        ST_INFO("control: serving placement epoch %" PRIu64 " (%d stages)", r->pl.epoch, r->pl.n_stages);
        printf("strata-coordinator: serving placement epoch %" PRIu64 "\n", r->pl.epoch);
        fflush(stdout);
        save_state(s);
        return;
    }
    /* Atomic switch between steps: the old epoch launches nothing more; new
     * requests go to the new one; running sequences follow once the old
     * epoch's in-flight batches are back. */
    s->from = s->cur;
    cluster_pause(s->from->cl);
    s->cur = r;
    save_state(s);
    try_finish_switch(-1, 0, s);
}

/* A stage of a ready run was lost (its cluster holds the requests). */
static void run_on_lost(void *ud, int stage, const char *msg) {
    run *r = ud;
    ctl_service *s = r->s;
    if (r != s->cur && r != s->from) return; /* retired: nothing depends on it */
    const char *node = stage >= 0 && stage < r->pl.n_stages ? r->pl.st[stage].node : "?";
    const reg_node *rn = registry_find(&s->reg, node);
    if (s->n_excl < PLACE_NODE_MAX) {
        snprintf(s->excl[s->n_excl].name, sizeof s->excl[s->n_excl].name, "%s", node);
        s->excl[s->n_excl].lease = rn ? rn->lease : 0;
        s->n_excl++;
    }
    char ids[1024];
    int n = held_ids(s, r, ids, sizeof ids);
    if (r != s->cur) {
        ST_WARN("control: recovery: epoch %" PRIu64 " (being switched away from) lost stage %d on %s: %s; "
                "its %d request(s) [%s] move to epoch %" PRIu64,
                r->pl.epoch, stage, node, msg, n, ids, s->cur->pl.epoch);
        return;
    }
    if (!s->lost) {
        s->lost = r;
        s->lost_at = st_now_s();
        s->recovery_expired = false;
        s->recovery_stuck_logged = false;
        s->recoveries++;
        s->retry_at = 0;
    }
    snprintf(s->lost_msg, sizeof s->lost_msg, "%s", msg);
    ST_ERROR("control: recovery: epoch %" PRIu64 " lost stage %d on node %s: %s; holding %d request(s) [%s] "
             "for up to %.0f s while it is re-placed",
             r->pl.epoch, stage, node, msg, n, ids, s->o.recovery_timeout_s);
    event_active(s->tick_ev, 0, 0);
}

static bool excluded(ctl_service *s, const char *name) {
    for (int i = 0; i < s->n_excl; i++) {
        if (strcmp(s->excl[i].name, name)) continue;
        const reg_node *n = registry_find(&s->reg, name);
        if (n && n->lease == s->excl[i].lease) return true;
    }
    return false;
}

static int change_placement(ctl_service *s, placement *pl, int *code, st_err *err);

/* Recovery, from the tick: the held requests fail after recovery_timeout;
 * meanwhile (and after) an automatic placement over the usable nodes, less
 * the lost ones, is loaded as soon as there is one. */
static void recovery_tick(ctl_service *s, double t) {
    char ids[1024];
    if (!s->recovery_expired && t - s->lost_at >= s->o.recovery_timeout_s) {
        s->recovery_expired = true;
        int n = held_ids(s, s->lost, ids, sizeof ids);
        char msg[ST_ERR_MSG_MAX + 128];
        snprintf(msg, sizeof msg, "the cluster could not recover within %.0f s (recovery_timeout) from: %s",
                 s->o.recovery_timeout_s, s->lost_msg);
        ST_ERROR("control: recovery: no placement serves %.0f s after the loss; failing %d request(s) [%s]; "
                 "new requests get 503 until one does",
                 s->o.recovery_timeout_s, n, ids);
        cluster_fail_requests(s->lost->cl, msg);
    }
    if (s->pend || s->from || t < s->retry_at) return;
    place_node all[PLACE_NODE_MAX], nodes[PLACE_NODE_MAX];
    int n_all = usable_nodes(s, all, NULL), n = 0;
    for (int i = 0; i < n_all; i++)
        if (!excluded(s, all[i].name)) nodes[n++] = all[i];
    placement pl;
    int code = 0;
    st_err err = {{0}};
    if (n == 0) st_errf(&err, "no usable node is left");
    if (n == 0 || place_auto(&s->pm, nodes, n, &pl, &code, &err) != 0) {
        if (!s->recovery_stuck_logged)
            ST_ERROR("control: recovery: cannot re-place yet (%s); waiting for capacity%s", err.msg,
                     s->recovery_expired ? "" : " (requests are held until recovery_timeout)");
        s->recovery_stuck_logged = true;
        return;
    }
    if (change_placement(s, &pl, &code, &err) != 0) {
        ST_ERROR("control: recovery: %s", err.msg);
        s->retry_at = t + RETRY_START_S;
        return;
    }
    held_ids(s, s->lost, ids, sizeof ids);
    ST_INFO("control: recovery: re-placing over %d node(s) as epoch %" PRIu64 "; requests [%s] resume when it serves",
            n, pl.epoch, ids);
}

static void run_on_fatal(void *ud, const char *msg) {
    run *r = ud;
    r->failed = true;
    snprintf(r->fail_msg, sizeof r->fail_msg, "%s", msg);
    event_active(r->s->tick_ev, 0, 0); /* dropped from the tick, outside the cluster's callback */
}

/* A change to pl (epoch assigned here). */
static int change_placement(ctl_service *s, placement *pl, int *code, st_err *err) {
    if (s->pend || s->from) {
        *code = RPC_FAILED_PRECONDITION;
        return st_errf(err, "placement epoch %" PRIu64 " is still %s; try again when it serves",
                       s->pend ? s->pend->pl.epoch : s->cur->pl.epoch, s->pend ? "loading" : "switching");
    }
    pl->epoch = s->last_epoch + 1;
    run *r = start_run(s, pl, err);
    if (!r) {
        *code = RPC_INTERNAL;
        return -1;
    }
    s->last_epoch = pl->epoch;
    s->pend = r;
    save_state(s);
    return 0;
}

/* ---------------------------------------------------------------- the tick */

static void tick(evutil_socket_t fd, short what, void *arg) {
    ctl_service *s = arg;
    double t = st_now_s();
    registry_tick(&s->reg, t);
    if (s->pend && s->pend->failed) {
        ST_ERROR("control: placement epoch %" PRIu64 " failed to load: %s%s", s->pend->pl.epoch,
                 s->pend->fail_msg,
                 s->lost ? "; recovery tries again" : s->cur ? "; the current placement keeps serving" : "; retrying");
        retire(s, s->pend, 0);
        s->pend = NULL;
        s->retry_at = t + RETRY_START_S;
    }
    if (s->lost) recovery_tick(s, t);
    for (run **pp = &s->retired; *pp;) {
        run *r = *pp;
        if (t >= r->retire_at) {
            *pp = r->next;
            run_free(r);
        } else {
            pp = &r->next;
        }
    }
    if (!s->cur && !s->pend && t >= s->retry_at) {
        st_err err = {{0}};
        int code = 0;
        if (s->saved.epoch) {
            bool all = true;
            for (int i = 0; i < s->saved.n_stages && all; i++) {
                reg_node *n = registry_find(&s->reg, s->saved.st[i].node);
                all = n && registry_usable(n);
            }
            if (all) {
                s->pend = start_run(s, &s->saved, &err);
                if (!s->pend) {
                    ST_ERROR("control: cannot restore placement epoch %" PRIu64 ": %s", s->saved.epoch, err.msg);
                    s->retry_at = t + RETRY_START_S;
                }
            }
        } else {
            place_node nodes[PLACE_NODE_MAX];
            int n = usable_nodes(s, nodes, NULL);
            if (n >= s->o.min_workers) {
                placement pl;
                if (place_auto(&s->pm, nodes, n, &pl, &code, &err) != 0 ||
                    change_placement(s, &pl, &code, &err) != 0) {
                    ST_ERROR("control: automatic placement: %s", err.msg);
                    s->retry_at = t + RETRY_START_S;
                }
            }
        }
    }
    if (!event_pending(s->tick_ev, EV_TIMEOUT, NULL)) {
        uint32_t ms = s->reg.heartbeat_ms / 4;
        if (ms < 10) ms = 10;
        if (ms > 250) ms = 250;
        struct timeval tv = {0, (int)ms * 1000};
        evtimer_add(s->tick_ev, &tv);
    }
}

/* ---------------------------------------------------------------- the engine */

static void lreq_unlink(ctl_service *s, lreq *q) {
    if (q->prev)
        q->prev->next = q->next;
    else if (s->reqs == q)
        s->reqs = q->next;
    if (q->next) q->next->prev = q->prev;
    q->prev = q->next = NULL;
}

static void lr_on_prompt(void *ctx, const int32_t *ids, int n) {
    lreq *q = ctx;
    q->sink.on_prompt(q->ctx, ids, n);
}
static void lr_on_token(void *ctx, int32_t id, const char *piece, size_t len, const coord_logprobs *lp) {
    lreq *q = ctx;
    q->sink.on_token(q->ctx, id, piece, len, lp);
}
static void lr_on_finish(void *ctx, enum coord_finish reason, const char *message) {
    lreq *q = ctx;
    coord_sink sink = q->sink;
    void *uctx = q->ctx;
    lreq_unlink(q->s, q);
    free(q);
    sink.on_finish(uctx, reason, message);
}
static const coord_sink lr_sink = {lr_on_prompt, lr_on_token, lr_on_finish};

static int eng_submit(void *impl, const coord_request *req, const coord_sink *sink, void *ctx,
                      uint64_t *id_out, st_err *err) {
    ctl_service *s = impl;
    /* While recovering (docs/recovery.md), new requests are held with the others. */
    bool hold = s->lost && s->lost == s->cur && !s->recovery_expired;
    if (!hold && (!s->cur || !cluster_is_ready(s->cur->cl))) {
        int ready = 0;
        for (int i = 0; i < s->reg.n; i++) ready += registry_usable(&s->reg.nodes[i]);
        return st_errf(err, "no placement is serving yet (%d usable node(s) registered%s)", ready,
                       s->pend ? ", a placement is loading" : ""),
               COORD_EUNAVAIL;
    }
    lreq *q = calloc(1, sizeof *q);
    if (!q) return st_errf(err, "out of memory"), COORD_EINTERNAL;
    q->s = s;
    q->sink = *sink;
    q->ctx = ctx;
    snprintf(q->request_id, sizeof q->request_id, "%s", req->request_id);
    q->r = s->cur;
    coord_engine e = cluster_engine(s->cur->cl);
    int rc = e.ops->submit(e.impl, req, &lr_sink, q, &q->cid, err);
    if (rc != COORD_OK) {
        free(q);
        return rc;
    }
    q->id = ++s->next_id;
    q->next = s->reqs;
    if (s->reqs) s->reqs->prev = q;
    s->reqs = q;
    *id_out = q->id;
    return COORD_OK;
}

static void eng_cancel(void *impl, uint64_t id) {
    ctl_service *s = impl;
    for (lreq *q = s->reqs; q; q = q->next)
        if (q->id == id) {
            coord_engine e = cluster_engine(q->r->cl);
            lreq_unlink(s, q);
            e.ops->cancel(e.impl, q->cid);
            free(q);
            return;
        }
}

static int eng_health(void *impl, st_err *err) {
    ctl_service *s = impl;
    if (!s->cur) return st_errf(err, "no placement is serving yet%s", s->pend ? " (loading)" : "");
    if (s->lost && s->lost == s->cur)
        return st_errf(err, "recovering from: %s (%s)", s->lost_msg,
                       s->recovery_expired ? "no capacity; waiting for a usable node"
                       : s->pend          ? "a new placement is loading"
                                          : "waiting for capacity");
    coord_engine e = cluster_engine(s->cur->cl);
    return e.ops->health(e.impl, err);
}

static char *eng_stages_json(void *impl) {
    ctl_service *s = impl;
    if (!s->cur) return strdup("{\"ready\":false,\"stages\":[]}");
    coord_engine e = cluster_engine(s->cur->cl);
    return e.ops->stages_json ? e.ops->stages_json(e.impl) : NULL;
}

static void eng_stats(void *impl, coord_engine_stats *out) {
    ctl_service *s = impl;
    memset(out, 0, sizeof *out);
    if (s->cur) {
        coord_engine e = cluster_engine(s->cur->cl);
        if (e.ops->stats) e.ops->stats(e.impl, out);
    }
    /* Workers: the registry's view (state names of registry.h), "serving"
     * for a ready node that holds a stage of the serving placement. */
    static const char *const live_states[] = {"registered", "ready", "serving", "suspect", "dead", "draining", NULL};
    out->worker_states = live_states;
    out->recoveries = s->recoveries;
    out->sequences_resumed = s->seqs_resumed;
    out->tokens_recomputed = s->tokens_recomputed;
    bool serving = s->cur && cluster_is_ready(s->cur->cl);
    double t = st_now_s();
    out->n_workers = 0;
    for (int i = 0; i < s->reg.n && out->n_workers < COORD_STATS_MAX_STAGES; i++) {
        const reg_node *n = &s->reg.nodes[i];
        coord_worker_stats *w = &out->workers[out->n_workers++];
        snprintf(w->name, sizeof w->name, "%s", n->name);
        w->state = n->state == REG_READY && serving && in_placement(s->cur, n->name) ? "serving"
                   : n->state ? registry_state_name(n->state)
                              : NULL; /* known from the state file only: no state is 1 */
        w->heartbeat_age_s = n->state ? t - n->last_seen : -1.0;
    }
}

static const coord_engine_ops ctl_ops = {eng_submit, eng_cancel, eng_health, eng_stages_json, eng_stats};

coord_engine ctl_engine(ctl_service *s) {
    coord_engine e = {&ctl_ops, s};
    return e;
}

const registry *ctl_registry(const ctl_service *s) { return &s->reg; }

/* ---------------------------------------------------------------- gRPC helpers */

static void reply(rpc_call *c, const ProtobufCMessage *m) {
    size_t len = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        rpc_call_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    protobuf_c_message_pack(m, buf);
    rpc_call_reply(c, buf, len);
    free(buf);
}

static bool is_hex64(const char *h) {
    return h && strlen(h) == 64 && strspn(h, "0123456789abcdef") == 64;
}

/* ---------------------------------------------------------------- Register / Heartbeat */

static void h_register(rpc_call *c, const rpc_request *req, void *ud) {
    ctl_service *s = ud;
    const Strata__V1__RegisterRequest *r = (const void *)req->msg;
    const Strata__V1__ModelFile *mine = NULL;
    for (size_t i = 0; i < r->n_models; i++) {
        if (!is_hex64(r->models[i]->sha256)) {
            rpc_call_finishf(c, RPC_INVALID_ARGUMENT, "Register: model %s: sha256 must be 64 lowercase hex digits",
                             r->models[i]->name);
            return;
        }
        if (!strcmp(r->models[i]->name, s->model_file)) mine = r->models[i];
    }
    if (!r->node[0]) {
        rpc_call_finish(c, RPC_INVALID_ARGUMENT, "Register: empty node name");
        return;
    }
    if (!mine) {
        rpc_call_finishf(c, RPC_FAILED_PRECONDITION,
                         "Register: node %s does not have the cluster's model %s (it lists %zu model file(s))",
                         r->node, s->model_file, r->n_models);
        return;
    }
    if (strcmp(mine->sha256, s->model_sha)) {
        rpc_call_finishf(c, RPC_FAILED_PRECONDITION,
                         "Register: node %s: model %s has sha256 %.16s..., the cluster's is %.16s... "
                         "(a different file)",
                         r->node, mine->name, mine->sha256, s->model_sha);
        return;
    }
    reg_info in = {.name = r->node,
                   .device_kind = r->n_devices ? r->devices[0]->kind : "cpu",
                   .device_count = r->n_devices ? r->devices[0]->count : 1,
                   .device_memory = r->n_devices ? r->devices[0]->memory_bytes : r->host_memory_bytes,
                   .host_memory = r->host_memory_bytes,
                   .numa_nodes = r->numa_nodes,
                   .data_address = r->data_address};
    st_err err = {{0}};
    uint64_t lease = 0;
    bool known = registry_find(&s->reg, r->node) != NULL;
    if (registry_register(&s->reg, &in, st_now_s(), &lease, &err) != 0) {
        rpc_call_finish(c, RPC_INVALID_ARGUMENT, err.msg);
        return;
    }
    if (!known) save_state(s);
    Strata__V1__RegisterReply out = STRATA__V1__REGISTER_REPLY__INIT;
    out.lease_id = lease;
    out.heartbeat_interval_ms = s->reg.heartbeat_ms;
    out.suspect_after_missed = s->reg.suspect_after_missed;
    out.dead_after_ms = s->reg.dead_after_ms;
    out.placement_epoch = s->cur ? s->cur->pl.epoch : 0;
    reply(c, &out.base);
    event_active(s->tick_ev, 0, 0);
}

static void h_heartbeat(rpc_call *c, const rpc_request *req, void *ud) {
    ctl_service *s = ud;
    const Strata__V1__HeartbeatRequest *r = (const void *)req->msg;
    reg_load l = {r->running_sequences, r->kv_blocks_used, r->kv_blocks_free, r->busy_fraction, r->bytes_sent};
    Strata__V1__HeartbeatReply out = STRATA__V1__HEARTBEAT_REPLY__INIT;
    out.reregister = registry_heartbeat(&s->reg, r->node, r->lease_id, &l, st_now_s()) != 0;
    out.placement_epoch = s->cur ? s->cur->pl.epoch : 0;
    reply(c, &out.base);
}

/* ---------------------------------------------------------------- status / nodes */

static void h_status(rpc_call *c, const rpc_request *req, void *ud) {
    ctl_service *s = ud;
    Strata__V1__GetStatusReply out = STRATA__V1__GET_STATUS_REPLY__INIT;
    out.version = "strata-coordinator 0.1 (live)";
    out.model = s->model_file;
    out.n_layers = (uint32_t)s->pm.n_layers;
    out.placement_epoch = s->cur ? s->cur->pl.epoch : 0;
    out.n_stages = s->cur ? (uint32_t)s->cur->pl.n_stages : 0;
    out.nodes_total = (uint32_t)s->reg.n;
    for (int i = 0; i < s->reg.n; i++) {
        out.nodes_ready += s->reg.nodes[i].state == REG_READY;
        out.running_sequences += s->reg.nodes[i].running_sequences;
    }
    int running = 0;
    for (lreq *q = s->reqs; q; q = q->next) running++;
    out.running_sequences = (uint32_t)running;
    out.uptime_s = st_now_s() - s->t0;
    out.serving = s->cur && cluster_is_ready(s->cur->cl);
    reply(c, &out.base);
}

static void h_list_nodes(rpc_call *c, const rpc_request *req, void *ud) {
    ctl_service *s = ud;
    int n = s->reg.n;
    Strata__V1__NodeInfo *infos = calloc((size_t)(n ? n : 1), sizeof *infos);
    Strata__V1__NodeInfo **ptrs = calloc((size_t)(n ? n : 1), sizeof *ptrs);
    Strata__V1__Device *devs = calloc((size_t)(n ? n : 1), sizeof *devs);
    Strata__V1__Device **devp = calloc((size_t)(n ? n : 1), sizeof *devp);
    if (!infos || !ptrs || !devs || !devp) {
        free(infos), free(ptrs), free(devs), free(devp);
        rpc_call_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    double t = st_now_s();
    for (int i = 0; i < n; i++) {
        reg_node *rn = &s->reg.nodes[i];
        Strata__V1__NodeInfo *o = &infos[i];
        strata__v1__node_info__init(o);
        o->name = rn->name;
        o->state = rn->state ? (Strata__V1__NodeState)rn->state : STRATA__V1__NODE_STATE__NODE_STATE_UNSPECIFIED;
        o->heartbeat_age_s = rn->state ? t - rn->last_seen : 0;
        o->lease_id = rn->lease;
        strata__v1__device__init(&devs[i]);
        devs[i].kind = rn->device_kind;
        devs[i].count = rn->device_count;
        devs[i].memory_bytes = rn->device_memory;
        devp[i] = &devs[i];
        o->devices = &devp[i];
        o->n_devices = rn->state ? 1 : 0;
        o->host_memory_bytes = rn->host_memory;
        o->numa_nodes = rn->numa_nodes;
        o->data_address = rn->data_address;
        o->running_sequences = rn->running_sequences;
        o->kv_blocks_used = rn->kv_blocks_used;
        o->kv_blocks_free = rn->kv_blocks_free;
        o->busy_fraction = rn->busy_fraction;
        o->bytes_sent = rn->bytes_sent;
        o->missed_heartbeats = registry_missed(&s->reg, rn, t);
        ptrs[i] = o;
    }
    Strata__V1__ListNodesReply out = STRATA__V1__LIST_NODES_REPLY__INIT;
    out.nodes = ptrs;
    out.n_nodes = (size_t)n;
    reply(c, &out.base);
    free(infos), free(ptrs), free(devs), free(devp);
}

/* ---------------------------------------------------------------- placement */

typedef struct pl_msg {
    Strata__V1__Placement p;
    Strata__V1__Stage st[PLACE_NODE_MAX];
    Strata__V1__Stage *sp[PLACE_NODE_MAX];
} pl_msg;

static void fill_placement(pl_msg *m, const placement *pl) {
    strata__v1__placement__init(&m->p);
    m->p.epoch = pl->epoch;
    m->p.n_layers = (uint32_t)pl->n_layers;
    for (int i = 0; i < pl->n_stages; i++) {
        strata__v1__stage__init(&m->st[i]);
        m->st[i].node = (char *)pl->st[i].node;
        m->st[i].first_layer = (uint32_t)pl->st[i].first;
        m->st[i].last_layer = (uint32_t)pl->st[i].last;
        m->st[i].tp = (uint32_t)pl->st[i].tp;
        m->sp[i] = &m->st[i];
    }
    m->p.stages = m->sp;
    m->p.n_stages = (size_t)pl->n_stages;
}

/* current, and pending = the loading placement or `dry` (a dry run). */
static void reply_placement(ctl_service *s, rpc_call *c, const placement *dry, bool unchanged) {
    pl_msg *two = calloc(2, sizeof *two);
    if (!two) {
        rpc_call_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    pl_msg *cur = &two[0], *pend = &two[1];
    Strata__V1__NodeLoad loads[PLACE_NODE_MAX], *lp[PLACE_NODE_MAX];
    Strata__V1__PlacementReply out = STRATA__V1__PLACEMENT_REPLY__INIT;
    placement none = {0};
    none.n_layers = s->pm.n_layers;
    fill_placement(cur, s->cur ? &s->cur->pl : &none);
    out.current = &cur->p;
    out.unchanged = unchanged;
    const placement *pp = dry ? dry : s->pend ? &s->pend->pl : NULL;
    if (pp) {
        fill_placement(pend, pp);
        out.pending = &pend->p;
        if (!dry && s->pend) {
            for (int i = 0; i < pp->n_stages; i++) {
                strata__v1__node_load__init(&loads[i]);
                loads[i].node = (char *)pp->st[i].node;
                loads[i].bytes_total = place_stage_bytes(&s->pm, pp->st[i].first, pp->st[i].last, pp->n_layers);
                loads[i].bytes_loaded = cluster_stage_ready(s->pend->cl, i) ? loads[i].bytes_total : 0;
                lp[i] = &loads[i];
            }
            out.loading = lp;
            out.n_loading = (size_t)pp->n_stages;
        }
    }
    reply(c, &out.base);
    free(two);
}

static void h_get_placement(rpc_call *c, const rpc_request *req, void *ud) { reply_placement(ud, c, NULL, false); }

/* pl has the current placement's stages (node, layers, TP), no change is in
 * progress, and no node of it registered again since the current epoch was
 * assigned: then a change would only reload the same stages. A node that
 * registered again (restarted, or back from dead: registry.h's
 * registrations) holds none of the current epoch's stages, so the same
 * stages are a change: a new epoch loads them onto it (issue 12: a
 * restarted worker re-placed with the old split was refused as unchanged). */
static bool same_as_current(ctl_service *s, const placement *pl) {
    if (!s->cur || s->pend || s->from) return false;
    const placement *c = &s->cur->pl;
    if (c->n_stages != pl->n_stages || c->n_layers != pl->n_layers) return false;
    for (int i = 0; i < pl->n_stages; i++)
        if (strcmp(c->st[i].node, pl->st[i].node) || c->st[i].first != pl->st[i].first ||
            c->st[i].last != pl->st[i].last || c->st[i].tp != pl->st[i].tp)
            return false;
    for (int i = 0; i < c->n_stages; i++) {
        const reg_node *n = registry_find(&s->reg, c->st[i].node);
        if (n && n->registrations != s->cur->node_reg[i]) {
            ST_INFO("control: %s registered again since placement epoch %" PRIu64 " was assigned (stage %d): "
                    "the same stages are a change (a new epoch loads them)",
                    n->name, c->epoch, i);
            return false;
        }
    }
    return true;
}

/* The placement asked for is the current one: answer it, unchanged. */
static void reply_unchanged(ctl_service *s, rpc_call *c, const char *what) {
    ST_INFO("control: %s: the placement is unchanged (epoch %" PRIu64 "); nothing to reload", what,
            s->cur->pl.epoch);
    reply_placement(s, c, NULL, true);
}

/* Why a registered node is not usable: "is draining", "is dead"... Names
 * the state; "is not registered" for nodes known from the state file only. */
static const char *unusable_why(const reg_node *n) {
    switch (n->state) {
    case REG_DRAINING: return "is draining (stratactl undrain brings it back)";
    case REG_SUSPECT: return "is suspect (missing heartbeats)";
    case REG_DEAD: return "is dead (no heartbeat; its lease was revoked)";
    default: return "is not registered (known from the state file only)";
    }
}

static void h_set_placement(rpc_call *c, const rpc_request *req, void *ud) {
    ctl_service *s = ud;
    const Strata__V1__SetPlacementRequest *r = (const void *)req->msg;
    if (r->n_stages == 0 || r->n_stages > PLACE_NODE_MAX) {
        rpc_call_finishf(c, RPC_INVALID_ARGUMENT, "SetPlacement: %zu stages (want 1..%d)", r->n_stages,
                         PLACE_NODE_MAX);
        return;
    }
    place_stage st[PLACE_NODE_MAX];
    for (size_t i = 0; i < r->n_stages; i++) {
        if (strlen(r->stages[i]->node) >= sizeof st[i].node) {
            rpc_call_finishf(c, RPC_INVALID_ARGUMENT, "SetPlacement: stage %zu: node name too long", i);
            return;
        }
        snprintf(st[i].node, sizeof st[i].node, "%s", r->stages[i]->node);
        st[i].first = r->stages[i]->first_layer > 100000 ? 100000 : (int)r->stages[i]->first_layer;
        st[i].last = r->stages[i]->last_layer > 100000 ? 100000 : (int)r->stages[i]->last_layer;
        st[i].tp = r->stages[i]->tp > 64 ? 64 : (int)r->stages[i]->tp;
        const reg_node *rn = registry_find(&s->reg, st[i].node);
        if (rn && !registry_usable(rn)) {
            rpc_call_finishf(c, RPC_FAILED_PRECONDITION, "SetPlacement: node \"%s\" (stage %zu) %s", rn->name, i,
                             unusable_why(rn));
            return;
        }
    }
    place_node nodes[PLACE_NODE_MAX];
    int n = usable_nodes(s, nodes, NULL);
    placement pl;
    int code = RPC_INVALID_ARGUMENT;
    st_err err = {{0}};
    if (place_check_explicit(&s->pm, nodes, n, st, (int)r->n_stages, &pl, &code, &err) != 0) {
        rpc_call_finishf(c, code, "SetPlacement: %s", err.msg);
        return;
    }
    if (same_as_current(s, &pl)) {
        reply_unchanged(s, c, "SetPlacement");
        return;
    }
    if (change_placement(s, &pl, &code, &err) != 0) {
        rpc_call_finishf(c, code, "SetPlacement: %s", err.msg);
        return;
    }
    reply_placement(s, c, NULL, false);
}

static void h_auto_placement(rpc_call *c, const rpc_request *req, void *ud) {
    ctl_service *s = ud;
    const Strata__V1__AutoPlacementRequest *r = (const void *)req->msg;
    place_node nodes[PLACE_NODE_MAX];
    int n = usable_nodes(s, nodes, NULL);
    placement pl;
    int code = RPC_INTERNAL;
    st_err err = {{0}};
    if (place_auto(&s->pm, nodes, n, &pl, &code, &err) != 0) {
        rpc_call_finishf(c, code, "AutoPlacement: %s", err.msg);
        return;
    }
    if (same_as_current(s, &pl)) { /* a dry run too: no pending change to show */
        reply_unchanged(s, c, r->dry_run ? "AutoPlacement (dry run)" : "AutoPlacement");
        return;
    }
    if (r->dry_run) {
        pl.epoch = s->last_epoch + 1;
        reply_placement(s, c, &pl, false);
        return;
    }
    if (change_placement(s, &pl, &code, &err) != 0) {
        rpc_call_finishf(c, code, "AutoPlacement: %s", err.msg);
        return;
    }
    reply_placement(s, c, NULL, false);
}

static bool in_placement(const run *r, const char *node) {
    if (!r) return false;
    for (int i = 0; i < r->pl.n_stages; i++)
        if (!strcmp(r->pl.st[i].node, node)) return true;
    return false;
}

static int cmp_reg_name(const void *a, const void *b) {
    return strcmp((*(const reg_node *const *)a)->name, (*(const reg_node *const *)b)->name);
}

/* The other nodes' states, grouped, names sorted: "node-b, node-c are
 * draining; node-d is dead" (or "no other node is registered"), into buf. */
static const char *others_why(const ctl_service *s, const char *except, char *buf, size_t cap) {
    static const int order[] = {REG_DRAINING, REG_SUSPECT, REG_DEAD, 0};
    const reg_node *by_name[PLACE_NODE_MAX];
    int nn = 0;
    for (int i = 0; i < s->reg.n && nn < PLACE_NODE_MAX; i++) by_name[nn++] = &s->reg.nodes[i];
    qsort(by_name, (size_t)nn, sizeof *by_name, cmp_reg_name);
    size_t off = 0;
    buf[0] = 0;
    for (size_t k = 0; k < sizeof order / sizeof *order; k++) {
        int cnt = 0;
        size_t start = off;
        for (int i = 0; i < nn && off < cap; i++) {
            const reg_node *o = by_name[i];
            if (o->state != order[k] || !strcmp(o->name, except)) continue;
            off += (size_t)snprintf(buf + off, cap - off, "%s%s", cnt ? ", " : start ? "; " : "", o->name);
            cnt++;
        }
        if (cnt && off < cap)
            off += (size_t)snprintf(buf + off, cap - off, " %s %s", cnt > 1 ? "are" : "is",
                                    order[k] ? registry_state_name(order[k]) : "not registered");
    }
    if (off >= cap) off = cap - 1;
    if (!off) snprintf(buf, cap, "no other node is registered");
    return buf;
}

static void h_drain(rpc_call *c, const rpc_request *req, void *ud) {
    ctl_service *s = ud;
    const Strata__V1__DrainRequest *r = (const void *)req->msg;
    reg_node *n = registry_find(&s->reg, r->node);
    if (!n || !n->state) {
        rpc_call_finishf(c, RPC_NOT_FOUND, "Drain: unknown node \"%s\"", r->node);
        return;
    }
    if (s->pend || s->from) {
        rpc_call_finish(c, RPC_FAILED_PRECONDITION, "Drain: a placement change is in progress; try again when it serves");
        return;
    }
    uint64_t epoch = s->cur ? s->cur->pl.epoch : 0;
    if (in_placement(s->cur, n->name)) {
        place_node nodes[PLACE_NODE_MAX];
        int k = usable_nodes(s, nodes, n->name);
        placement pl;
        int code = RPC_INTERNAL;
        st_err err = {{0}};
        if (k == 0) {
            rpc_call_finishf(c, RPC_FAILED_PRECONDITION,
                             "Drain: cannot move %s's stages away: no other usable node would be left (%s)",
                             n->name, others_why(s, n->name, err.msg, sizeof err.msg));
            return;
        }
        if (place_auto(&s->pm, nodes, k, &pl, &code, &err) != 0 || change_placement(s, &pl, &code, &err) != 0) {
            rpc_call_finishf(c, code, "Drain: cannot move %s's stages away: %s", n->name, err.msg);
            return;
        }
        epoch = pl.epoch;
    }
    if (n->state != REG_DEAD) n->state = REG_DRAINING;
    ST_INFO("control: draining %s (placement epoch %" PRIu64 ")", n->name, epoch);
    Strata__V1__DrainReply out = STRATA__V1__DRAIN_REPLY__INIT;
    out.node = n->name;
    out.state = (Strata__V1__NodeState)n->state;
    out.placement_epoch = epoch;
    reply(c, &out.base);
}

static void h_undrain(rpc_call *c, const rpc_request *req, void *ud) {
    ctl_service *s = ud;
    const Strata__V1__DrainRequest *r = (const void *)req->msg;
    st_err err = {{0}};
    if (registry_undrain(&s->reg, r->node, &err) != 0) {
        reg_node *n = registry_find(&s->reg, r->node);
        rpc_call_finishf(c, n && n->state ? RPC_FAILED_PRECONDITION : RPC_NOT_FOUND, "Undrain: %s", err.msg);
        return;
    }
    reg_node *n = registry_find(&s->reg, r->node);
    uint64_t epoch = s->cur ? s->cur->pl.epoch : 0;
    ST_INFO("control: undrained %s: ready for the next placement change (placement epoch %" PRIu64
            " unchanged)", n->name, epoch);
    Strata__V1__DrainReply out = STRATA__V1__DRAIN_REPLY__INIT;
    out.node = n->name;
    out.state = (Strata__V1__NodeState)n->state;
    out.placement_epoch = epoch;
    reply(c, &out.base);
    event_active(s->tick_ev, 0, 0); /* with no placement yet, the tick may place now */
}

/* ---------------------------------------------------------------- Generate */

static void stream_free(ctl_service *s, gen_stream *g) {
    if (g->prev)
        g->prev->next = g->next;
    else if (s->streams == g)
        s->streams = g->next;
    if (g->next) g->next->prev = g->prev;
    free(g->prompt);
    free(g);
}

static int send_chunk(gen_stream *g, const int32_t *ids, size_t n_ids, const char *text, size_t len,
                      const char *finish) {
    Strata__V1__GenerateChunk ch = STRATA__V1__GENERATE_CHUNK__INIT;
    uint32_t id = ids && n_ids ? (uint32_t)ids[0] : 0;
    ch.token_ids = n_ids ? &id : NULL;
    ch.n_token_ids = n_ids;
    char *t = malloc(len + 1);
    if (!t) return -1;
    memcpy(t, text, len); /* valid UTF-8 (g->utf8), as protobuf strings must be */
    t[len] = 0;
    ch.text = t;
    if (finish) {
        ch.finish_reason = (char *)finish;
        ch.prompt_tokens = g->n_prompt;
        ch.completion_tokens = g->n_gen;
    }
    size_t plen = strata__v1__generate_chunk__get_packed_size(&ch);
    uint8_t *buf = malloc(plen ? plen : 1);
    int rc = -1;
    if (buf) {
        strata__v1__generate_chunk__pack(&ch, buf);
        rc = rpc_call_send(g->call, buf, plen);
    }
    free(buf);
    free(t);
    return rc;
}

static void g_on_prompt(void *ctx, const int32_t *ids, int n) {
    gen_stream *g = ctx;
    g->n_prompt = (uint32_t)n;
}

static void g_on_token(void *ctx, int32_t id, const char *piece, size_t len, const coord_logprobs *lp) {
    gen_stream *g = ctx;
    ctl_service *s = g->s;
    g->n_gen++;
    /* The same text as the HTTP API and strata-run give (common/utf8.h). */
    char small[256], *text = small;
    size_t cap = UTF8_STREAM_MAX_OUT(len), n = 0;
    if (cap > sizeof small) text = malloc(cap);
    if (text) n = utf8_stream_push(&g->utf8, piece, len, text);
    int rc = rpc_call_cancelled(g->call) ? -1 : send_chunk(g, &id, 1, text ? text : "", n, NULL);
    if (text != small) free(text);
    if (rc != 0) {
        eng_cancel(s, g->id);
        rpc_call_finish(g->call, RPC_CANCELLED, "Generate: cancelled");
        stream_free(s, g);
    }
}

static void g_on_finish(void *ctx, enum coord_finish reason, const char *message) {
    gen_stream *g = ctx;
    ctl_service *s = g->s;
    if (reason == COORD_FINISH_ERROR) {
        rpc_call_finishf(g->call, RPC_UNAVAILABLE, "Generate: %s", message ? message : "failed");
    } else {
        char rest[UTF8_STREAM_MAX_OUT(0)]; /* an unfinished character: U+FFFD */
        size_t n = utf8_stream_flush(&g->utf8, rest);
        send_chunk(g, NULL, 0, rest, n, reason == COORD_FINISH_STOP ? "stop" : "length");
        rpc_call_finish(g->call, RPC_OK, NULL);
    }
    stream_free(s, g);
}

static const coord_sink gen_sink = {g_on_prompt, g_on_token, g_on_finish};

static void h_generate(rpc_call *c, const rpc_request *req, void *ud) {
    ctl_service *s = ud;
    const Strata__V1__GenerateRequest *r = (const void *)req->msg;
    if (!r->prompt[0]) {
        rpc_call_finish(c, RPC_INVALID_ARGUMENT, "Generate: empty prompt");
        return;
    }
    if (r->temperature < 0 || r->temperature > 2) {
        rpc_call_finishf(c, RPC_INVALID_ARGUMENT, "Generate: temperature %g not in [0, 2]", r->temperature);
        return;
    }
    gen_stream *g = calloc(1, sizeof *g);
    if (!g) {
        rpc_call_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    size_t n_ids = 0;
    st_err terr = {{0}};
    if (tok_encode(s->o.vocab, r->prompt, strlen(r->prompt), true, false, &g->prompt, &n_ids, &terr) != 0 ||
        n_ids == 0) {
        rpc_call_finishf(c, RPC_INVALID_ARGUMENT, "Generate: %s", n_ids ? terr.msg : "the prompt has no tokens");
        free(g->prompt);
        free(g);
        return;
    }
    g->s = s;
    g->call = c;
    g->req.prompt = g->prompt;
    g->req.n_prompt = (int)n_ids;
    g->req.max_tokens = r->max_tokens ? (int)(r->max_tokens > 100000 ? 100000 : r->max_tokens) : GEN_DEFAULT_MAX_TOKENS;
    g->req.sampling = sampler_default_params();
    g->req.sampling.temperature = r->temperature;
    g->req.sampling.top_k = 0;
    g->req.sampling.top_p = 1.0f;
    g->req.sampling.min_p = 0.0f;
    g->req.sampling.repeat_penalty = 1.0f;
    g->req.sampling.seed = r->seed;
    g->req.has_seed = r->seed != 0;
    g->next = s->streams;
    if (s->streams) s->streams->prev = g;
    s->streams = g;
    st_err err = {{0}};
    int rc = eng_submit(s, &g->req, &gen_sink, g, &g->id, &err);
    if (rc != COORD_OK) {
        int code = rc == COORD_EUNAVAIL ? RPC_UNAVAILABLE
                   : rc == COORD_EBUSY  ? RPC_RESOURCE_EXHAUSTED
                   : rc == COORD_EINTERNAL ? RPC_INTERNAL
                                           : RPC_INVALID_ARGUMENT;
        rpc_call_finishf(c, code, "Generate: %s", err.msg);
        stream_free(s, g);
    }
}

/* ---------------------------------------------------------------- lifetime */

ctl_service *ctl_create(struct event_base *base, const ctl_opts *o, st_err *err) {
    ctl_service *s = calloc(1, sizeof *s);
    if (!s) return st_errf(err, "control: out of memory"), NULL;
    s->base = base;
    s->o = *o;
    if (!s->o.min_workers) s->o.min_workers = 1;
    if (!(s->o.ready_timeout_s > 0)) s->o.ready_timeout_s = 120;
    if (!(s->o.recovery_timeout_s > 0)) s->o.recovery_timeout_s = RECOVERY_TIMEOUT_S;
    s->t0 = st_now_s();
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    registry_init(&s->reg, o->heartbeat_ms, o->suspect_missed, o->dead_after_ms,
                  (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32));
    if (model_info(s, err) != 0) goto fail;
    int lrc = state_load(o->state_path, &s->saved, &s->last_epoch, s->model_sha, &s->reg, err);
    if (lrc < 0) goto fail;
    if (lrc == 0) {
        if (s->saved.epoch && s->saved.n_layers != s->pm.n_layers) {
            st_errf(err, "state %s: placement for %d layers, the model has %d", o->state_path, s->saved.n_layers,
                    s->pm.n_layers);
            goto fail;
        }
        ST_INFO("control: restored state %s: placement epoch %" PRIu64 " (%d stages), %d known node(s)",
                o->state_path, s->saved.epoch, s->saved.n_stages, s->reg.n);
    }
    s->tick_ev = event_new(base, -1, 0, tick, s);
    s->switch_ev = evtimer_new(base, try_finish_switch, s);
    if (!s->tick_ev || !s->switch_ev) {
        st_errf(err, "control: cannot create events");
        goto fail;
    }
    if (!(s->srv = rpc_server_create(o->grpc_listen, err)) || !(s->loop = rpc_loop_create(base, err)))
        goto fail;
    const rpc_method methods[] = {
        {SVC "Register", RPC_KIND_UNARY, h_register, s, &strata__v1__register_request__descriptor},
        {SVC "Heartbeat", RPC_KIND_UNARY, h_heartbeat, s, &strata__v1__heartbeat_request__descriptor},
        {SVC "GetStatus", RPC_KIND_UNARY, h_status, s, &strata__v1__get_status_request__descriptor},
        {SVC "ListNodes", RPC_KIND_UNARY, h_list_nodes, s, &strata__v1__list_nodes_request__descriptor},
        {SVC "GetPlacement", RPC_KIND_UNARY, h_get_placement, s, &strata__v1__get_placement_request__descriptor},
        {SVC "SetPlacement", RPC_KIND_UNARY, h_set_placement, s, &strata__v1__set_placement_request__descriptor},
        {SVC "AutoPlacement", RPC_KIND_UNARY, h_auto_placement, s, &strata__v1__auto_placement_request__descriptor},
        {SVC "Drain", RPC_KIND_UNARY, h_drain, s, &strata__v1__drain_request__descriptor},
        {SVC "Undrain", RPC_KIND_UNARY, h_undrain, s, &strata__v1__drain_request__descriptor},
        {SVC "Generate", RPC_KIND_SERVER_STREAM, h_generate, s, &strata__v1__generate_request__descriptor},
    };
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (rpc_loop_add_method(s->loop, s->srv, &methods[i], err) != 0) goto fail;
    if (rpc_server_start(s->srv, err) != 0) goto fail;
    event_active(s->tick_ev, 0, 0);
    return s;
fail:
    ctl_destroy(s);
    return NULL;
}

int ctl_grpc_port(const ctl_service *s) { return rpc_server_port(s->srv); }

void ctl_destroy(ctl_service *s) {
    if (!s) return;
    if (s->loop) rpc_loop_close(s->loop);
    while (s->streams) {
        gen_stream *g = s->streams;
        eng_cancel(s, g->id);
        rpc_call_finish(g->call, RPC_UNAVAILABLE, "server stopping");
        stream_free(s, g);
    }
    rpc_server_destroy(s->srv);
    rpc_loop_destroy(s->loop);
    while (s->reqs) {
        lreq *q = s->reqs;
        lreq_unlink(s, q);
        free(q);
    }
    run_free(s->cur);
    run_free(s->pend);
    run_free(s->from);
    while (s->retired) {
        run *r = s->retired;
        s->retired = r->next;
        run_free(r);
    }
    if (s->tick_ev) event_free(s->tick_ev);
    if (s->switch_ev) event_free(s->switch_ev);
    registry_free(&s->reg);
    free(s);
}
