/* node_rpc.c — the nodes' calls of strata.v1.Control (node_rpc.h):
 * Register, Heartbeat (on the loop, or answered on the rpc thread and
 * applied by the loop: hb_inbox.h) and ListNodes. */
#include "coordinator/control/node_rpc.h"

#include <event2/event.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "coordinator/control/authz.h"
#include "coordinator/control/reply.h"
#include "proto/control.pb-c.h"

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

static bool is_hex64(const char *h) {
    return h && strlen(h) == 64 && strspn(h, "0123456789abcdef") == 64;
}

/* ---------------------------------------------------------------- Register / Heartbeat */

void node_rpc_register(rpc_call *c, const rpc_request *req, void *ud) {
    node_rpc *s = ud;
    const Strata__V1__RegisterRequest *r = (const void *)req->msg;
    if (!ctl_authorize(s->tls, c, CTL_ROLE_NODE, r->node)) return;
    const Strata__V1__ModelFile *mine = NULL;
    for (size_t i = 0; i < r->n_models; i++) {
        if (!is_hex64(r->models[i]->sha256)) {
            rpc_call_finishf(c, RPC_INVALID_ARGUMENT, "Register: model %s: sha256 must be 64 lowercase hex digits",
                             r->models[i]->name);
            return;
        }
        if (!strcmp(r->models[i]->name, s->model->file)) mine = r->models[i];
    }
    if (!r->node[0]) {
        rpc_call_finish(c, RPC_INVALID_ARGUMENT, "Register: empty node name");
        return;
    }
    if (!mine) {
        rpc_call_finishf(c, RPC_FAILED_PRECONDITION,
                         "Register: node %s does not have the cluster's model %s (it lists %zu model file(s))",
                         r->node, s->model->file, r->n_models);
        return;
    }
    if (strcmp(mine->sha256, s->model->sha)) {
        /* The cluster's hash stays in the coordinator's log: a caller learns
         * only that its own file differs (issue 14). */
        ST_WARN("control: Register of %s refused: its %s has sha256 %.16s..., the cluster's is %.16s...", r->node,
                mine->name, mine->sha256, s->model->sha);
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
    const reg_node *was = registry_find(s->reg, r->node);
    bool known = was && !strcmp(was->data_address, r->data_address);
    int reg_rc = registry_register(s->reg, &in, st_now_s(), &lease, &err);
    free(links); /* copied by the registry */
    if (reg_rc != 0) {
        rpc_call_finish(c, RPC_INVALID_ARGUMENT, err.msg);
        return;
    }
    if (!known) node_store_node(s->store, registry_find(s->reg, r->node)); /* O(1): one journal record */
    Strata__V1__RegisterReply out = STRATA__V1__REGISTER_REPLY__INIT;
    out.lease_id = lease;
    out.heartbeat_interval_ms = s->reg->heartbeat_ms;
    out.suspect_after_missed = s->reg->suspect_after_missed;
    out.dead_after_ms = s->reg->dead_after_ms;
    out.placement_epoch = s->ep->cur ? s->ep->cur->pl.epoch : 0;
    ctl_reply(c, &out.base);
    event_active(s->ep->o.tick, 0, 0);
}

void node_rpc_heartbeat(rpc_call *c, const rpc_request *req, void *ud) {
    node_rpc *s = ud;
    const Strata__V1__HeartbeatRequest *r = (const void *)req->msg;
    if (!ctl_authorize(s->tls, c, CTL_ROLE_NODE, r->node)) return;
    reg_load l = {r->running_sequences, r->kv_blocks_used, r->kv_blocks_free, r->busy_fraction, r->bytes_sent};
    Strata__V1__HeartbeatReply out = STRATA__V1__HEARTBEAT_REPLY__INIT;
    out.reregister = registry_heartbeat(s->reg, r->node, r->lease_id, &l, st_now_s()) != 0;
    out.placement_epoch = s->ep->cur ? s->ep->cur->pl.epoch : 0;
    ctl_reply(c, &out.base);
}

void node_rpc_heartbeat_now(rpc_call *c, const rpc_request *req, void *ud) {
    node_rpc *s = ud;
    const Strata__V1__HeartbeatRequest *r = (const void *)req->msg;
    if (!ctl_authorize(s->tls, c, CTL_ROLE_NODE, r->node)) return;
    Strata__V1__HeartbeatReply out = STRATA__V1__HEARTBEAT_REPLY__INIT;
    out.reregister = !registry_lease_is(s->reg, r->node, r->lease_id);
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

void node_rpc_apply(node_rpc *s) {
    atomic_store(&s->hb_epoch, s->ep->cur ? s->ep->cur->pl.epoch : 0);
    if (s->hb) hb_inbox_apply(s->hb, s->reg);
}

/* ---------------------------------------------------------------- ListNodes */

void node_rpc_list(rpc_call *c, const rpc_request *req, void *ud) {
    node_rpc *s = ud;
    int n = s->reg->n;
    Strata__V1__NodeInfo *infos = calloc((size_t)(n ? n : 1), sizeof *infos);
    Strata__V1__NodeInfo **ptrs = calloc((size_t)(n ? n : 1), sizeof *ptrs);
    Strata__V1__Device *devs = calloc((size_t)(n ? n : 1), sizeof *devs);
    Strata__V1__Device **devp = calloc((size_t)(n ? n : 1), sizeof *devp);
    size_t n_gpu = 1;
    for (int i = 0; i < n; i++) n_gpu += (size_t)s->reg->nodes[i].n_gpus;
    Strata__V1__Gpu *gpus = calloc(n_gpu, sizeof *gpus);
    Strata__V1__Gpu **gpup = calloc(n_gpu, sizeof *gpup);
    /* the link matrices' cell pointers, only for the nodes that sent one */
    size_t n_cell = 1;
    for (int i = 0; i < n; i++)
        if (s->reg->nodes[i].links) n_cell += REG_NIC_MAX + (size_t)s->reg->nodes[i].n_gpus * (REG_GPU_MAX + REG_NIC_MAX);
    char **cells = calloc(n_cell, sizeof *cells);
    size_t gk = 0, ck = 0;
    if (!infos || !ptrs || !devs || !devp || !gpus || !gpup || !cells) {
        free(infos), free(ptrs), free(devs), free(devp), free(gpus), free(gpup), free(cells);
        rpc_call_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    double t = st_now_s();
    for (int i = 0; i < n; i++) {
        reg_node *rn = &s->reg->nodes[i];
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
        o->missed_heartbeats = registry_missed(s->reg, rn, t);
        ptrs[i] = o;
    }
    Strata__V1__ListNodesReply out = STRATA__V1__LIST_NODES_REPLY__INIT;
    out.nodes = ptrs;
    out.n_nodes = (size_t)n;
    ctl_reply(c, &out.base);
    free(infos), free(ptrs), free(devs), free(devp), free(gpus), free(gpup), free(cells);
}

