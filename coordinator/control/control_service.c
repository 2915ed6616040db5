/* control_service.c — the live control plane (control_service.h): gRPC
 * handlers of strata.v1.Control, the serving engine that forwards to the
 * cluster of the serving epoch, placement changes (start, switch, release),
 * start-up (restore or auto place) and the periodic tick (failure detection,
 * retiring old clusters). The parts live in the files control_internal.h
 * lists; this one holds the lifetime, the handler table, the serving engine
 * and the Register / Heartbeat / GetStatus / ListNodes handlers. */
#include "coordinator/control/control_service.h"

#include <inttypes.h>
#include <protobuf-c/protobuf-c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/sha256.h"
#include "common/version.h"
#include "coordinator/control/authz.h"
#include "coordinator/control/control_internal.h"
#include "coordinator/control/hb_inbox.h"
#include "coordinator/control/journal.h"
#include "coordinator/control/leader.h"
#include "coordinator/control/state_file.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "proto/control.pb-c.h"

#define SVC "/strata.v1.Control/"

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
    m->head_tied = mc.tied_output;
    m->kv_bytes_per_layer = (uint64_t)cfg->kv_blocks * (uint64_t)cfg->kv_block_size * 2u *
                            (uint64_t)mc.n_head_kv * (uint64_t)mc.head_dim * sizeof(float);
    /* The stage's micro-batch buffers (placement.h's memory model). */
    m->act_tokens = (uint32_t)cfg->max_batch_tokens;
    m->act_token_rank = 3u * (uint64_t)mc.n_embd * sizeof(float);
    m->act_token_split = (2u * (uint64_t)mc.n_head * mc.head_dim + 2u * (uint64_t)mc.n_head_kv * mc.head_dim +
                          2u * (uint64_t)mc.n_ff) * sizeof(float);
    m->logits_bytes = (uint64_t)cfg->max_seqs * ((uint64_t)mc.n_vocab + (uint64_t)mc.n_embd) * sizeof(float);
    gguf_close(gf);
    const char *b = strrchr(cfg->model, '/');
    snprintf(s->model_file, sizeof s->model_file, "%s", b ? b + 1 : cfg->model);
    return st_file_sha256(cfg->model, s->model_sha, err);
}

/* ---------------------------------------------------------------- state */

void ctl_save_state(ctl_service *s) {
    st_err err = {{0}};
    const placement *p = s->cur ? &s->cur->pl : &s->saved;
    if (s->ha) {
        ctl_etcd_save(s, p);
        return;
    }
    if (state_save(s->o.state_path, p, s->last_epoch, s->model_sha, &s->reg, &err) != 0)
        ST_ERROR("control: cannot save the state: %s", err.msg);
    else
        ctl_store_reset(s); /* the snapshot holds every node now */
}

/* ---------------------------------------------------------------- nodes */

static int cmp_node(const void *a, const void *b) {
    return strcmp(((const place_node *)a)->name, ((const place_node *)b)->name);
}

/* The usable nodes (not draining, registered or ready); control_internal.h. */
int ctl_usable_nodes(ctl_service *s, place_node **outp, const char *except) {
    int k = 0;
    *outp = NULL;
    if (s->reg.n == 0) return 0;
    place_node *out = malloc(sizeof *out * (size_t)s->reg.n);
    if (!out) return -1;
    *outp = out;
    for (int i = 0; i < s->reg.n; i++) {
        const reg_node *n = &s->reg.nodes[i];
        if (!registry_usable(n) || (except && !strcmp(n->name, except))) continue;
        /* memory and the TP rule: placement.h */
        out[k++] = place_node_make(n->name, n->device_kind, n->device_count, n->device_memory, n->host_memory,
                                   n->tp_limit, s->o.cfg->gpu_memory_utilization);
    }
    if (k == 0) { /* nothing to free for the caller */
        free(out);
        *outp = NULL;
        return 0;
    }
    qsort(out, (size_t)k, sizeof *out, cmp_node);
    return k;
}

/* The link matrix of a Register (Gpu.links, Gpu.nic_links, nics) checked
 * and copied: NULL when the worker sent none; -1 + err when it is malformed
 * (rows of the wrong length, an unknown class, "X" off the diagonal). */
static int links_from_register(const Strata__V1__RegisterRequest *r, reg_links **out, st_err *err) {
    *out = NULL;
    const Strata__V1__Device *d = r->n_devices ? r->devices[0] : NULL;
    size_t n = d ? d->n_gpus : 0, any = r->n_nics;
    for (size_t i = 0; i < n; i++) any += d->gpus[i]->n_links + d->gpus[i]->n_nic_links;
    if (!any) return 0;
    if (n == 0) return st_errf(err, "NICs in the link matrix without GPUs");
    if (n > REG_GPU_MAX) return st_errf(err, "a link matrix of %zu GPUs (at most %d)", n, REG_GPU_MAX);
    if (r->n_nics > REG_NIC_MAX) return st_errf(err, "%zu NICs in the link matrix (at most %d)", r->n_nics, REG_NIC_MAX);
    reg_links *l = calloc(1, sizeof *l);
    if (!l) return st_errf(err, "out of memory");
    l->n_nic = (int)r->n_nics;
    for (size_t k = 0; k < r->n_nics; k++) {
        size_t len = strlen(r->nics[k]);
        if (len == 0 || len >= sizeof l->nic[k]) {
            free(l);
            return st_errf(err, "NIC %zu: name empty or longer than %zu bytes", k, sizeof l->nic[k] - 1);
        }
        memcpy(l->nic[k], r->nics[k], len + 1);
    }
    for (size_t i = 0; i < n; i++) {
        const Strata__V1__Gpu *g = d->gpus[i];
        if (g->n_links != n || g->n_nic_links != r->n_nics) {
            free(l);
            return st_errf(err, "GPU %zu: %zu links and %zu NIC links, want %zu and %zu (one per GPU and NIC)", i,
                           g->n_links, g->n_nic_links, n, r->n_nics);
        }
        for (size_t j = 0; j < n + r->n_nics; j++) {
            const char *cell = j < n ? g->links[j] : g->nic_links[j - n];
            bool ok = reg_link_valid(cell) && ((j == i) == !strcmp(cell, "X"));
            if (!ok) {
                free(l);
                return st_errf(err, "GPU %zu: link to %s %zu is '%.16s' (want X on the diagonal only, NV<n>, PIX, "
                                    "PXB, PHB, NODE or SYS)",
                               i, j < n ? "GPU" : "NIC", j < n ? j : j - n, cell);
            }
            snprintf(j < n ? l->gg[i][j] : l->gn[i][j - n], REG_LINK_CELL, "%s", cell);
        }
    }
    *out = l;
    return 0;
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
static const coord_sink lr_sink = {lr_on_prompt, lr_on_token, lr_on_finish, NULL};

int ctl_eng_submit(void *impl, const coord_request *req, const coord_sink *sink, void *ctx,
                      uint64_t *id_out, st_err *err) {
    ctl_service *s = impl;
    char standby[600], http[256];
    if (ctl_standby(s, standby, sizeof standby, http, sizeof http))
        return st_errf(err, "%s", standby), COORD_EUNAVAIL;
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

void ctl_eng_cancel(void *impl, uint64_t id) {
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
    char standby[600], http[256];
    if (ctl_standby(s, standby, sizeof standby, http, sizeof http)) return st_errf(err, "%s", standby);
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
    ctl_heartbeats_apply(s);
    memset(out, 0, sizeof *out);
    if (s->cur) {
        coord_engine e = cluster_engine(s->cur->cl);
        if (e.ops->stats) e.ops->stats(e.impl, out);
        coord_engine_stats_release(out); /* the registry's view replaces the cluster's */
    }
    /* Workers: the registry's view (state names of registry.h), "serving"
     * for a ready node that holds a stage of the serving placement. */
    static const char *const live_states[] = {"registered", "ready", "serving", "suspect", "dead", "draining", NULL};
    out->worker_states = live_states;
    out->recoveries = s->recoveries;
    out->sequences_resumed = s->seqs_resumed;
    out->tokens_recomputed = s->tokens_recomputed;
    cluster_recovery_times(out); /* also with no placement serving */
    if (s->ha) {
        leader_write_stats ws;
        leader_stats(s->ha, &ws);
        out->etcd_txns_refused = ws.refused_batches;
        out->etcd_changes_dropped = ws.dropped_changes;
        out->etcd_queued = ws.queued;
        out->etcd_unwritten_s = ws.unwritten_s;
    }
    bool serving = s->cur && cluster_is_ready(s->cur->cl);
    double t = st_now_s();
    out->n_workers = 0;
    out->workers = calloc((size_t)(s->reg.n ? s->reg.n : 1), sizeof *out->workers);
    for (int i = 0; out->workers && i < s->reg.n; i++) {
        const reg_node *n = &s->reg.nodes[i];
        coord_worker_stats *w = &out->workers[out->n_workers++];
        snprintf(w->name, sizeof w->name, "%s", n->name);
        w->state = n->state == REG_READY && serving && ctl_in_placement(s->cur, n->name) ? "serving"
                   : n->state ? registry_state_name(n->state)
                              : NULL; /* known from the state file only: no state is 1 */
        w->heartbeat_age_s = n->state ? t - n->last_seen : -1.0;
    }
}

/* engine_api.h: not the leader (--etcd standby), with its HTTP URL. */
static bool eng_standby(void *impl, char *leader_http, size_t cap) {
    char msg[600];
    return ctl_standby(impl, msg, sizeof msg, leader_http, cap);
}

static const coord_engine_ops ctl_ops = {ctl_eng_submit, ctl_eng_cancel, eng_health, eng_stages_json, eng_stats,
                                         eng_standby};

coord_engine ctl_engine(ctl_service *s) {
    coord_engine e = {&ctl_ops, s};
    return e;
}

const registry *ctl_registry(const ctl_service *s) { return &s->reg; }

/* ---------------------------------------------------------------- gRPC helpers */

void ctl_reply(rpc_call *c, const ProtobufCMessage *m) {
    size_t len = protobuf_c_message_get_packed_size(m);
    /* small replies (Heartbeat, Register) are packed on the stack: the
     * heartbeat path allocates nothing of ours (rpc_call_send copies) */
    uint8_t small[256];
    uint8_t *buf = len <= sizeof small ? small : malloc(len);
    if (!buf) {
        rpc_call_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    protobuf_c_message_pack(m, buf);
    rpc_call_reply(c, buf, len);
    if (buf != small) free(buf);
}

static bool is_hex64(const char *h) {
    return h && strlen(h) == 64 && strspn(h, "0123456789abcdef") == 64;
}

/* ---------------------------------------------------------------- Register / Heartbeat */

static void h_register(rpc_call *c, const rpc_request *req, void *ud) {
    ctl_service *s = ud;
    const Strata__V1__RegisterRequest *r = (const void *)req->msg;
    if (!ctl_authorize(s->tls, c, CTL_ROLE_NODE, r->node)) return;
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
        /* The cluster's hash stays in the coordinator's log: a caller learns
         * only that its own file differs (issue 14). */
        ST_WARN("control: Register of %s refused: its %s has sha256 %.16s..., the cluster's is %.16s...", r->node,
                mine->name, mine->sha256, s->model_sha);
        rpc_call_finishf(c, RPC_FAILED_PRECONDITION,
                         "Register: node %s: model %s has sha256 %.16s..., which is a different file from the "
                         "cluster's model",
                         r->node, mine->name, mine->sha256);
        return;
    }
    reg_gpu gpus[REG_GPU_MAX];
    int n_gpus = 0;
    if (r->n_devices && r->devices[0]->n_gpus > REG_GPU_MAX) /* display detail only: placement uses the count */
        ST_WARN("control: %s lists %zu GPUs; the registry keeps the details (name, memory, PCI bus id) of the first "
                "%d (REG_GPU_MAX), placement uses all %u",
                r->node, r->devices[0]->n_gpus, REG_GPU_MAX, r->devices[0]->count);
    for (size_t i = 0; r->n_devices && i < r->devices[0]->n_gpus && n_gpus < REG_GPU_MAX; i++, n_gpus++) {
        const Strata__V1__Gpu *g = r->devices[0]->gpus[i];
        memset(&gpus[n_gpus], 0, sizeof gpus[n_gpus]);
        snprintf(gpus[n_gpus].name, sizeof gpus[n_gpus].name, "%s", g->name);
        gpus[n_gpus].memory = g->memory_bytes;
        snprintf(gpus[n_gpus].pci_bus_id, sizeof gpus[n_gpus].pci_bus_id, "%s", g->pci_bus_id);
        gpus[n_gpus].numa = g->numa_node;
    }
    reg_links *links = NULL;
    st_err lerr = {{0}};
    if (links_from_register(r, &links, &lerr) != 0) {
        rpc_call_finishf(c, RPC_INVALID_ARGUMENT, "Register: node %s: %s", r->node, lerr.msg);
        return;
    }
    reg_info in = {.name = r->node,
                   .links = links,
                   .tp_limit = r->tp_limit,
                   .link_summary = r->link_summary,
                   .n_gpus = n_gpus,
                   .gpus = gpus,
                   .device_kind = r->n_devices ? r->devices[0]->kind : "cpu",
                   .device_count = r->n_devices ? r->devices[0]->count : 1,
                   .device_memory = r->n_devices ? r->devices[0]->memory_bytes : r->host_memory_bytes,
                   .host_memory = r->host_memory_bytes,
                   .numa_nodes = r->numa_nodes,
                   .data_address = r->data_address};
    st_err err = {{0}};
    uint64_t lease = 0;
    const reg_node *was = registry_find(&s->reg, r->node);
    bool known = was && !strcmp(was->data_address, r->data_address);
    int reg_rc = registry_register(&s->reg, &in, st_now_s(), &lease, &err);
    free(links); /* copied by the registry */
    if (reg_rc != 0) {
        rpc_call_finish(c, RPC_INVALID_ARGUMENT, err.msg);
        return;
    }
    if (!known) ctl_store_node(s, registry_find(&s->reg, r->node)); /* O(1): one journal record */
    Strata__V1__RegisterReply out = STRATA__V1__REGISTER_REPLY__INIT;
    out.lease_id = lease;
    out.heartbeat_interval_ms = s->reg.heartbeat_ms;
    out.suspect_after_missed = s->reg.suspect_after_missed;
    out.dead_after_ms = s->reg.dead_after_ms;
    out.placement_epoch = s->cur ? s->cur->pl.epoch : 0;
    ctl_reply(c, &out.base);
    event_active(s->tick_ev, 0, 0);
}

/* On the loop's thread (--etcd: a standby must refuse it, h_guarded). */
static void h_heartbeat(rpc_call *c, const rpc_request *req, void *ud) {
    ctl_service *s = ud;
    const Strata__V1__HeartbeatRequest *r = (const void *)req->msg;
    if (!ctl_authorize(s->tls, c, CTL_ROLE_NODE, r->node)) return;
    reg_load l = {r->running_sequences, r->kv_blocks_used, r->kv_blocks_free, r->busy_fraction, r->bytes_sent};
    Strata__V1__HeartbeatReply out = STRATA__V1__HEARTBEAT_REPLY__INIT;
    out.reregister = registry_heartbeat(&s->reg, r->node, r->lease_id, &l, st_now_s()) != 0;
    out.placement_epoch = s->cur ? s->cur->pl.epoch : 0;
    ctl_reply(c, &out.base);
}

/* On the rpc thread (hb_inbox.h: why, and who owns what): the lease check
 * under the registry's lock, the heartbeat queued for the loop, the reply at
 * once. Touches no other state of the service. */
static void h_heartbeat_rpc(rpc_call *c, const rpc_request *req, void *ud) {
    ctl_service *s = ud;
    const Strata__V1__HeartbeatRequest *r = (const void *)req->msg;
    if (!ctl_authorize(s->tls, c, CTL_ROLE_NODE, r->node)) return;
    Strata__V1__HeartbeatReply out = STRATA__V1__HEARTBEAT_REPLY__INIT;
    out.reregister = !registry_lease_is(&s->reg, r->node, r->lease_id);
    if (!out.reregister) {
        reg_load l = {r->running_sequences, r->kv_blocks_used, r->kv_blocks_free, r->busy_fraction, r->bytes_sent};
        if (hb_inbox_put(s->hb, r->node, r->lease_id, &l, st_now_s()) != 0) {
            rpc_call_finish(c, RPC_RESOURCE_EXHAUSTED, "Heartbeat: out of memory");
            return;
        }
    }
    out.placement_epoch = atomic_load(&s->hb_epoch);
    ctl_reply(c, &out.base);
}

void ctl_heartbeats_apply(ctl_service *s) {
    atomic_store(&s->hb_epoch, s->cur ? s->cur->pl.epoch : 0);
    if (s->hb) hb_inbox_apply(s->hb, &s->reg);
}

/* ---------------------------------------------------------------- the open-file limit */

void ctl_check_fd_room(ctl_service *s) {
    if (!s->fd_limit) return;
    uint64_t live = 0;
    for (int i = 0; i < s->reg.n; i++) live += s->reg.nodes[i].lease != 0;
    uint64_t room = s->fd_limit > 64 ? s->fd_limit - 64 : 0;
    int level = live >= room ? 2 : live * 10 >= room * 9 ? 1 : 0;
    if (level > s->fd_alarm && level == 2)
        ST_ERROR("control: %" PRIu64 " live nodes, one connection each, are within 64 descriptors of the "
                 "open-file limit %" PRIu64 ": workers past it cannot connect (EMFILE); raise the hard limit "
                 "(LimitNOFILE=, ulimit -Hn) and restart the coordinator",
                 live, s->fd_limit);
    else if (level > s->fd_alarm)
        ST_WARN("control: %" PRIu64 " live nodes: close to the open-file limit %" PRIu64
                " (one connection each; about %" PRIu64 " fit); raise LimitNOFILE= for a bigger fleet",
                live, s->fd_limit, room);
    else if (level < s->fd_alarm && level == 0)
        ST_INFO("control: %" PRIu64 " live nodes, below 90%% of the open-file limit %" PRIu64 " again", live,
                s->fd_limit);
    if (level > s->fd_alarm || level == 0) s->fd_alarm = level;
}

/* ---------------------------------------------------------------- status / nodes */

static void h_status(rpc_call *c, const rpc_request *req, void *ud) {
    ctl_service *s = ud;
    Strata__V1__GetStatusReply out = STRATA__V1__GET_STATUS_REPLY__INIT;
    char version[128]; /* common/version.h: the same words as --version and GET /version */
    snprintf(version, sizeof version, "strata-coordinator %s (commit %s, %s build; live)", st_version(),
             st_git_commit(), st_build_type());
    out.version = version;
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
    Strata__V1__RecoveryStatus rec = STRATA__V1__RECOVERY_STATUS__INIT;
    char ids[8];
    if (s->lost) {
        rec.state = s->recovery_expired ? "expired" : s->pend ? "loading" : "placing";
        rec.lost_node = s->lost_name;
        rec.lost_stage = s->lost_stage >= 0 ? (uint32_t)s->lost_stage : 0;
        rec.lost_epoch = s->lost->pl.epoch;
        rec.since_s = st_now_s() - s->lost_at;
        rec.held_sequences = (uint32_t)ctl_held_ids(s, s->lost, ids, sizeof ids);
        rec.reason = s->lost_msg;
        rec.loading_epoch = s->pend ? s->pend->pl.epoch : 0;
        rec.timeout_s = s->o.recovery_timeout_s;
        out.recovery = &rec;
    }
    Strata__V1__EtcdWrites ew = STRATA__V1__ETCD_WRITES__INIT;
    leader_write_stats ws;
    if (s->ha) { /* issue 30: a write etcd refuses or that stalls is seen here */
        leader_stats(s->ha, &ws);
        ew.queued = ws.queued;
        ew.unwritten_s = ws.unwritten_s;
        ew.txns_refused = ws.refused_batches;
        ew.changes_dropped = ws.dropped_changes;
        ew.last_refusal = ws.last_refusal;
        ew.last_refusal_age_s = ws.last_refusal_age_s;
        out.etcd_writes = &ew;
    }
    ctl_reply(c, &out.base);
}

static void h_list_nodes(rpc_call *c, const rpc_request *req, void *ud) {
    ctl_service *s = ud;
    int n = s->reg.n;
    Strata__V1__NodeInfo *infos = calloc((size_t)(n ? n : 1), sizeof *infos);
    Strata__V1__NodeInfo **ptrs = calloc((size_t)(n ? n : 1), sizeof *ptrs);
    Strata__V1__Device *devs = calloc((size_t)(n ? n : 1), sizeof *devs);
    Strata__V1__Device **devp = calloc((size_t)(n ? n : 1), sizeof *devp);
    size_t n_gpu = 1;
    for (int i = 0; i < n; i++) n_gpu += (size_t)s->reg.nodes[i].n_gpus;
    Strata__V1__Gpu *gpus = calloc(n_gpu, sizeof *gpus);
    Strata__V1__Gpu **gpup = calloc(n_gpu, sizeof *gpup);
    /* the link matrices' cell pointers, only for the nodes that sent one */
    size_t n_cell = 1;
    for (int i = 0; i < n; i++)
        if (s->reg.nodes[i].links) n_cell += REG_NIC_MAX + (size_t)s->reg.nodes[i].n_gpus * (REG_GPU_MAX + REG_NIC_MAX);
    char **cells = calloc(n_cell, sizeof *cells);
    size_t gk = 0, ck = 0;
    if (!infos || !ptrs || !devs || !devp || !gpus || !gpup || !cells) {
        free(infos), free(ptrs), free(devs), free(devp), free(gpus), free(gpup), free(cells);
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
        devs[i].gpus = &gpup[gk];
        devs[i].n_gpus = (size_t)rn->n_gpus;
        for (int g = 0; g < rn->n_gpus; g++, gk++) {
            strata__v1__gpu__init(&gpus[gk]);
            gpus[gk].name = rn->gpus[g].name;
            gpus[gk].memory_bytes = rn->gpus[g].memory;
            gpus[gk].pci_bus_id = rn->gpus[g].pci_bus_id;
            gpus[gk].numa_node = rn->gpus[g].numa;
            if (rn->links) {
                gpus[gk].links = &cells[ck];
                for (int j = 0; j < rn->n_gpus; j++) cells[ck++] = rn->links->gg[g][j];
                gpus[gk].n_links = (size_t)rn->n_gpus;
                gpus[gk].nic_links = &cells[ck];
                for (int k = 0; k < rn->links->n_nic; k++) cells[ck++] = rn->links->gn[g][k];
                gpus[gk].n_nic_links = (size_t)rn->links->n_nic;
            }
            gpup[gk] = &gpus[gk];
        }
        if (rn->links) {
            o->nics = &cells[ck];
            for (int k = 0; k < rn->links->n_nic; k++) cells[ck++] = rn->links->nic[k];
            o->n_nics = (size_t)rn->links->n_nic;
        }
        o->tp_limit = rn->tp_limit;
        o->link_summary = rn->link_summary;
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
    ctl_reply(c, &out.base);
    free(infos), free(ptrs), free(devs), free(devp), free(gpus), free(gpup), free(cells);
}

/* ---------------------------------------------------------------- authorization */

/* Every call: its handler, behind the standby check (--etcd: only the
 * leader serves; UNAVAILABLE names it) and, for an operator call, the role
 * check. */
struct ctl_guard {
    ctl_service *s;
    rpc_handler_fn fn;
    bool operator_only;
};

static void h_guarded(rpc_call *c, const rpc_request *req, void *ud) {
    struct ctl_guard *g = ud;
    char msg[600], http[256];
    ctl_heartbeats_apply(g->s); /* every handler sees the nodes as of now */
    if (ctl_standby(g->s, msg, sizeof msg, http, sizeof http)) {
        rpc_call_finish(c, RPC_UNAVAILABLE, msg);
        return;
    }
    if (!g->operator_only || ctl_authorize(g->s->tls, c, CTL_ROLE_OPERATOR, NULL)) g->fn(c, req, g->s);
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
    struct rlimit rl; /* after the coordinator raised it (main.c) */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) s->fd_limit = rl.rlim_cur;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    registry_init(&s->reg, o->heartbeat_ms, o->suspect_missed, o->dead_after_ms,
                  (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32));
    if (model_info(s, err) != 0) goto fail;
    int lrc = o->ha ? 1 : state_load(o->state_path, &s->saved, &s->last_epoch, s->model_sha, &s->reg, err);
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
    if (!o->ha && ctl_store_open(s, err) != 0) goto fail; /* --etcd: the state is in etcd (etcd_store.c) */
    s->tick_ev = event_new(base, -1, 0, ctl_tick, s);
    s->switch_ev = evtimer_new(base, ctl_try_finish_switch, s);
    if (!s->tick_ev || !s->switch_ev) {
        st_errf(err, "control: cannot create events");
        goto fail;
    }
    if (o->ha && ctl_etcd_open(s, err) != 0) goto fail;
    rpc_tls tls = {o->grpc_ca, o->grpc_cert, o->grpc_key};
    int tls_given = rpc_tls_given(&tls, "--grpc-", err);
    if (tls_given < 0) goto fail;
    s->tls = tls_given == 1;
    if (!(s->srv = rpc_server_create(o->grpc_listen, s->tls ? &tls : NULL, err)) ||
        !(s->loop = rpc_loop_create(base, err)))
        goto fail;
    /* Register, Heartbeat and Leave check the node name themselves (authz.h); every
     * other call is an operator's, checked by h_operator before its handler.
     * Heartbeat is answered on the rpc thread (h_heartbeat_rpc, hb_inbox.h),
     * so a burst of Registers (a fleet's cold start) or a big ListNodes on
     * the loop never delays a live node's heartbeat into a false suspect.
     * With --etcd it runs on the loop behind the standby check, as an urgent
     * method (rpc/grpc_loop.h: before every queued ordinary call).
     * Every other handler runs on the loop's thread, which alone writes the
     * registry, after applying the queued heartbeats (h_guarded). */
    static const struct {
        const char *name;
        rpc_kind kind;
        rpc_handler_fn fn;
        bool operator_only;
        const ProtobufCMessageDescriptor *req;
    } methods[] = {
        {SVC "Register", RPC_KIND_UNARY, h_register, false, &strata__v1__register_request__descriptor},
        {SVC "Heartbeat", RPC_KIND_UNARY, h_heartbeat, false, &strata__v1__heartbeat_request__descriptor},
        {SVC "Leave", RPC_KIND_UNARY, ctl_h_leave, false, &strata__v1__leave_request__descriptor},
        {SVC "GetStatus", RPC_KIND_UNARY, h_status, true, &strata__v1__get_status_request__descriptor},
        {SVC "ListNodes", RPC_KIND_UNARY, h_list_nodes, true, &strata__v1__list_nodes_request__descriptor},
        {SVC "GetPlacement", RPC_KIND_UNARY, ctl_h_get_placement, true, &strata__v1__get_placement_request__descriptor},
        {SVC "SetPlacement", RPC_KIND_UNARY, ctl_h_set_placement, true, &strata__v1__set_placement_request__descriptor},
        {SVC "AutoPlacement", RPC_KIND_UNARY, ctl_h_auto_placement, true,
         &strata__v1__auto_placement_request__descriptor},
        {SVC "Drain", RPC_KIND_UNARY, ctl_h_drain, true, &strata__v1__drain_request__descriptor},
        {SVC "Undrain", RPC_KIND_UNARY, ctl_h_undrain, true, &strata__v1__drain_request__descriptor},
        {SVC "RemoveNode", RPC_KIND_UNARY, ctl_h_remove_node, true, &strata__v1__remove_node_request__descriptor},
        {SVC "Generate", RPC_KIND_SERVER_STREAM, ctl_h_generate, true, &strata__v1__generate_request__descriptor},
    };
    size_t n_methods = sizeof methods / sizeof methods[0];
    if (!(s->guards = calloc(n_methods, sizeof *s->guards))) {
        st_errf(err, "control: out of memory");
        goto fail;
    }
    if (!(s->hb = hb_inbox_new())) {
        st_errf(err, "control: out of memory");
        goto fail;
    }
    for (size_t i = 0; i < n_methods; i++) {
        s->guards[i] = (struct ctl_guard){s, methods[i].fn, methods[i].operator_only};
        rpc_method m = {methods[i].name, methods[i].kind, h_guarded, &s->guards[i], methods[i].req};
        bool urgent = methods[i].fn == h_heartbeat;
        if (urgent && !o->ha) {
            m.handler = h_heartbeat_rpc;
            m.ud = s;
            if (rpc_server_add_method(s->srv, &m, err) != 0) goto fail;
            continue;
        }
        if ((urgent ? rpc_loop_add_urgent_method : rpc_loop_add_method)(s->loop, s->srv, &m, err) != 0) goto fail;
    }
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
    ctl_etcd_close(s); /* resign first: a standby takes over while we stop */
    if (s->loop) rpc_loop_close(s->loop);
    ctl_generate_close_all(s);
    rpc_server_destroy(s->srv);
    rpc_loop_destroy(s->loop);
    hb_inbox_free(s->hb); /* after the rpc thread: it fills the inbox */
    while (s->reqs) {
        lreq *q = s->reqs;
        lreq_unlink(s, q);
        free(q);
    }
    ctl_run_free(s->cur);
    ctl_run_free(s->pend);
    ctl_run_free(s->from);
    while (s->retired) {
        run *r = s->retired;
        s->retired = r->next;
        ctl_run_free(r);
    }
    if (s->tick_ev) event_free(s->tick_ev);
    if (s->switch_ev) event_free(s->switch_ev);
    if (s->jr) {
        st_err jerr = {{0}};
        if (journal_sync(s->jr, &jerr) != 0) ST_ERROR("control: %s", jerr.msg);
        journal_close(s->jr);
    }
    registry_free(&s->reg);
    free(s->guards);
    free(s);
}
