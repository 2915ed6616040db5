/* stage_link.c — the coordinator's connection to one stage's worker (stage_link.h). */
#include "coordinator/serve/stage_link.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "ib/assign_token.h"
#include "ib/frame.h"

int stage_link_send_control(stage_link *l, uint64_t epoch, const Strata__V1__ControlMessage *m) {
    size_t n = strata__v1__control_message__get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) return -1;
    strata__v1__control_message__pack(m, buf);
    frame_header h = STRATA__V1__FRAME_HEADER__INIT;
    h.kind = STRATA__V1__FRAME_KIND__FRAME_KIND_CONTROL;
    h.epoch = epoch;
    h.stage = (uint32_t)l->index;
    h.control.data = buf;
    h.control.len = n;
    st_err err = {{0}};
    int rc = l->peer ? xport_send(l->peer, &h, NULL, 0, NULL, NULL, NULL, &err) : -1;
    free(buf);
    if (rc) ST_WARN("cluster: CONTROL to stage %d (%s:%d) failed: %s", l->index, l->host, l->port,
                    err.msg[0] ? err.msg : "not connected");
    return rc;
}

int stage_link_assign(stage_link *l, const stage_assign_args *a) {
    Strata__V1__StageAssign m = STRATA__V1__STAGE_ASSIGN__INIT;
    char next[COORD_HOST_MAX + 16] = "";
    if (a->next) {
        if (strchr(a->next->host, ':'))
            snprintf(next, sizeof next, "[%s]:%d", a->next->host, a->next->port);
        else
            snprintf(next, sizeof next, "%s:%d", a->next->host, a->next->port);
    }
    m.epoch = a->epoch;
    m.keep_loaded = a->keep_loaded;
    m.adopt_epoch = a->adopt_epoch;
    m.stage = (uint32_t)l->index;
    m.n_stages = (uint32_t)a->n_stages;
    m.model_path = (char *)a->model_path;
    m.first_layer = l->range.first;
    m.last_layer = l->range.last;
    m.tp = l->tp;
    m.kv_blocks = a->kv_blocks;
    m.block_size = a->block_size;
    m.act_dtype = a->act_bf16 ? STRATA__V1__DTYPE__DTYPE_BF16 : STRATA__V1__DTYPE__DTYPE_F32;
    m.next_hop = next;
    /* A GPU stage runs rank r on GPU r of its node (the node's TP rule counts
     * from GPU 0: coordinator/control, ib/gpu_links.h). */
    int32_t devices[64];
    m.backend = l->backend;
    if (!strcmp(l->backend, "cuda")) {
        for (int r = 0; r < l->tp && r < 64; r++) devices[r] = r;
        m.devices = devices;
        m.n_devices = (size_t)(l->tp < 64 ? l->tp : 64);
    }
    uint8_t token[CLUSTER_MAC_LEN];
    if (a->key) {
        if (assign_token_make(a->key, &m, token)) {
            ST_ERROR("cluster: cannot sign the assignment of stage %d (libcrypto)", l->index);
            return -1;
        }
        m.token.data = token;
        m.token.len = sizeof token;
    }
    Strata__V1__ControlMessage c = STRATA__V1__CONTROL_MESSAGE__INIT;
    c.msg_case = STRATA__V1__CONTROL_MESSAGE__MSG_ASSIGN;
    c.assign = &m;
    ST_INFO("cluster: assigning stage %d (layers [%d, %d), TP %d, %s) to %s:%d, next hop %s", l->index,
            l->range.first, l->range.last, l->tp, l->backend[0] ? l->backend : "cpu", l->host, l->port,
            next[0] ? next : "(coordinator)");
    if (stage_link_send_control(l, a->epoch, &c) != 0) return -1;
    l->state = LINK_ASSIGNED;
    return 0;
}

void stage_link_release(stage_link *l, uint64_t epoch) {
    Strata__V1__StageRelease rel = STRATA__V1__STAGE_RELEASE__INIT;
    rel.epoch = epoch;
    Strata__V1__ControlMessage m = STRATA__V1__CONTROL_MESSAGE__INIT;
    m.msg_case = STRATA__V1__CONTROL_MESSAGE__MSG_RELEASE;
    m.release = &rel;
    if (l->peer) stage_link_send_control(l, epoch, &m);
}

void stage_link_request_stats(stage_link *l, uint64_t epoch, uint64_t request_id) {
    Strata__V1__StatsRequest q = STRATA__V1__STATS_REQUEST__INIT;
    q.request_id = request_id;
    q.forward_intervals = l->st.fwd != NULL;
    q.forward_since_ns = l->st.fwd_last_end;
    Strata__V1__ControlMessage m = STRATA__V1__CONTROL_MESSAGE__INIT;
    m.msg_case = STRATA__V1__CONTROL_MESSAGE__MSG_STATS_REQUEST;
    m.stats_request = &q;
    stage_link_send_control(l, epoch, &m);
}

void stage_link_close(stage_link *l) {
    if (l->peer) {
        xport_peer *p = l->peer;
        l->peer = NULL; /* its on_disconnect is then ignored */
        xport_peer_close(p);
    }
    l->state = LINK_LOST;
}

void stage_link_ready(stage_link *l, const Strata__V1__StageReady *r) {
    l->state = LINK_READY;
    l->drops = 0;
    l->kv_blocks = r->kv_blocks;
    l->load_seconds = r->load_seconds;
    ST_INFO("cluster: stage %d at %s:%d ready: %llu weight bytes, %d KV blocks, loaded in %.2f s", l->index,
            l->host, l->port, (unsigned long long)r->weight_bytes, r->kv_blocks, r->load_seconds);
}

json_t *stage_link_json(stage_link *l) {
    char addr[COORD_HOST_MAX + 16];
    snprintf(addr, sizeof addr, "%s:%d", l->host, l->port);
    json_t *o = json_pack("{s:i,s:s,s:i,s:i,s:i,s:b}", "stage", l->index, "address", addr, "first_layer",
                          l->range.first, "last_layer", l->range.last, "tp", l->tp, "ready",
                          l->state == LINK_READY);
    if (o) stage_stats_json(&l->st, o);
    return o;
}

void stage_link_report(const stage_link *l, const char *config_name, bool serving, double now,
                       coord_stage_stats *stage, coord_worker_stats *worker) {
    stage_stats_report(&l->st, stage);
    stage->load_seconds = l->state == LINK_READY ? l->load_seconds : 0;
    snprintf(stage->worker, sizeof stage->worker, "%s", l->st.worker_name);
    if (!worker) return;
    snprintf(worker->name, sizeof worker->name, "%s", l->st.worker_name[0] ? l->st.worker_name : config_name);
    worker->state = l->state == LINK_LOST    ? "lost"
                    : l->state == LINK_READY ? (serving ? "serving" : "ready")
                                             : "joining";
    worker->heartbeat_age_s = l->st.have_stats ? now - l->st.stats_at : -1.0;
}
