/* act_link.c — the per-boundary activation transport, negotiated between
 * neighbouring stages (act_link.h, ib/act_transport.h, docs/protocol.md). */
#include "daemon/act_link.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "common/log.h"
#include "compute/registry.h"
#include "daemon/act_p2p.h"
#include "daemon/compute_thread.h"
#include "daemon/control_send.h"
#include "ib/act_transport.h"

static void hex(const uint8_t *b, size_t n, char *out)
{
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = d[b[i] >> 4];
        out[2 * i + 1] = d[b[i] & 15];
    }
    out[2 * n] = 0;
}

/* ": <hex>" of an NCCL id for the log, only under the test hook or at debug
 * level ("" otherwise): whoever holds the id can join the communicator's
 * bootstrap. */
static void id_text(const act_local *l, const uint8_t *id, size_t n, char out[2 * ACT_NCCL_ID_BYTES + 3])
{
    out[0] = 0;
    if (n > ACT_NCCL_ID_BYTES || !(l->test_nccl || st_log_enabled(ST_LOG_DEBUG))) return;
    out[0] = ':';
    out[1] = ' ';
    hex(id, n, out + 2);
}

/* The machine id (one node = one id), else the host name. */
static void read_machine_id(char *out, size_t cap)
{
    out[0] = 0;
    FILE *f = fopen("/etc/machine-id", "r");
    if (f) {
        if (fgets(out, (int)cap, f)) out[strcspn(out, "\r\n")] = 0;
        fclose(f);
    }
    if (!out[0] && gethostname(out, cap) != 0) snprintf(out, cap, "unknown");
    out[cap - 1] = 0;
}

void act_link_init(act_local *l, xport *x, int override, wcounters *counters)
{
    memset(l, 0, sizeof *l);
    l->override = override;
    l->counters = counters;
    read_machine_id(l->machine_id, sizeof l->machine_id);
    l->ucx_cuda = xport_memory_cuda(x);
    const char *hook = getenv("STRATA_TEST_ACT_TRANSPORT");
    l->test_nccl = hook && !strcmp(hook, "nccl");
    /* The test hook stands the (fake) module's host memory in for device
     * memory, registered with UCX as host memory, so the ucx-cuda path runs
     * on a UCX without CUDA (tests/cluster/act_transport_test.py ucx-cuda). */
    l->test_host_dev = hook && !strcmp(hook, "ucx-cuda-host");
    ST_INFO("worker: activations: --activation-transport %s; UCX CUDA memory %s (%s); NCCL between GPU stages when "
            "the CUDA module has it%s%s",
            act_override_name((enum act_override)l->override), l->ucx_cuda ? "yes" : "no",
            l->ucx_cuda ? "GPU stages hand UCX their device buffers" : "GPU stages stage through pinned host buffers",
            l->test_nccl ? "; test hook STRATA_TEST_ACT_TRANSPORT=nccl: this side claims a GPU with NCCL" : "",
            l->test_host_dev ? "; test hook STRATA_TEST_ACT_TRANSPORT=ucx-cuda-host: host memory stands in for "
                                   "device buffers" : "");
}

static bool stage_gpu(const wstage *st) { return !strcmp(st->cur.backend, "cuda"); }

/* The CUDA module's NCCL point-to-point, when this stage runs on it. */
static const backend_p2p_ops *stage_p2p(const wstage *st)
{
    if (!stage_gpu(st)) return NULL;
    st_err err;
    const backend_module *m = backend_registry_get("cuda", &err);
    return m && m->p2p && m->p2p->id_bytes == ACT_NCCL_ID_BYTES ? m->p2p : NULL;
}

/* The PCI bus id of the stage's first GPU ("" when none). */
static void stage_gpu_bus(const wstage *st, char *out, size_t cap)
{
    out[0] = 0;
    if (!stage_gpu(st)) return;
    st_err err;
    const backend_module *m = backend_registry_get("cuda", &err);
    backend_device_info di;
    if (m && m->device_info(st->cur.n_devices ? st->cur.devices[0] : 0, &di, &err) == 0)
        snprintf(out, cap, "%s", di.pci_bus_id);
}

/* Whether this stage can hand UCX device buffers: its UCX takes CUDA memory
 * (or the test hook stands host memory in) and its module allocates them. */
static bool stage_ucx_cuda(const wstage *st)
{
    if (!stage_gpu(st) || !(st->act->ucx_cuda || st->act->test_host_dev)) return false;
    st_err err;
    const backend_module *m = backend_registry_get("cuda", &err);
    return m && m->dev_alloc && m->dev_free;
}

/* What this worker's side of a boundary is and can do. */
static act_side own_side(const wstage *st)
{
    const act_local *l = st->act;
    act_side s = {.gpu = stage_gpu(st), .nccl = stage_p2p(st) != NULL, .ucx_cuda = stage_ucx_cuda(st)};
    if (l->test_nccl) s.gpu = s.nccl = true;
    return s;
}

/* Hands a link to the compute thread to close (after the jobs queued before). */
static void link_close(wstage *st, struct act_p2p **lp)
{
    act_p2p *p = *lp;
    *lp = NULL;
    if (!p) return;
    cjob *j = calloc(1, sizeof *j);
    if (!j) return; /* leaks the link rather than closing it under a running transfer */
    j->kind = CJOB_P2P_CLOSE;
    j->p2p = p;
    compute_submit(st->cq, j);
}

/* A new link whose join runs on the compute thread; NULL + why. */
static act_p2p *link_open(wstage *st, const backend_p2p_ops *ops, const uint8_t *id, int rank, char *why, size_t cap)
{
    act_p2p *p = act_p2p_new(ops, id, rank, rank == 0 ? st->cur.stage : st->cur.stage - 1);
    cjob *j = p ? calloc(1, sizeof *j) : NULL;
    if (!j) {
        free(p);
        snprintf(why, cap, "out of memory");
        return NULL;
    }
    j->kind = CJOB_P2P_OPEN;
    j->p2p = p; /* not owned: the link may be closed (and freed) before this job comes back */
    j->dev_gen = p->serial;
    compute_submit(st->cq, j);
    return p;
}

void act_link_reset(wstage *st)
{
    link_close(st, &st->p2p_in);
    link_close(st, &st->p2p_out);
    st->act_in = st->act_out = -1;
    st->has_act_id = false;
}

void act_link_next_lost(wstage *st)
{
    if (!st->shutting_down && st->cq) link_close(st, &st->p2p_out);
    st->act_out = -1;
    st->has_act_id = false;
}

void act_link_free(wstage *st)
{
    /* the compute thread is gone: close here */
    act_p2p *ls[2] = {st->p2p_in, st->p2p_out};
    st->p2p_in = st->p2p_out = NULL;
    for (int i = 0; i < 2; i++) {
        if (!ls[i]) continue;
        cjob j = {.kind = CJOB_P2P_CLOSE, .p2p = ls[i]};
        act_p2p_discard(&j);
    }
}

void act_link_job_done(wstage *st, cjob *j)
{
    if (j->kind == CJOB_P2P_OPEN) {
        /* only a link the stage still holds is looked at (a closed one is freed) */
        act_p2p *p = j->p2p == st->p2p_in ? st->p2p_in : j->p2p == st->p2p_out ? st->p2p_out : NULL;
        const bool current = p && p->serial == j->dev_gen;
        const unsigned k = current ? p->boundary : 0;
        if (current && j->status == 0) {
            p->ready = true;
            ST_INFO("worker: boundary %u->%u: nccl communicator up (rank %d)", k, k + 1, p->rank);
        } else if (current) {
            p->broken = true;
            ST_WARN("worker: boundary %u->%u: nccl communicator failed: %s; the activations stay on UCX", k, k + 1,
                    j->err.msg);
        }
    }
    free(j);
}

static void send_ctl(wstage *st, xport_peer *peer, ctl_msg *m)
{
    control_send(peer, m, st->cur.epoch, st->cur.stage, 0, "CONTROL reply");
}

void act_link_offer(wstage *st)
{
    const act_local *l = st->act;
    act_side me = own_side(st);
    link_close(st, &st->p2p_out); /* a new connection: a new communicator */
    st->act_out = -1; /* UCX until the answer */
    st->has_act_id = false;
    uint8_t *id = st->act_id;
    char bus[32];
    stage_gpu_bus(st, bus, sizeof bus);
    Strata__V1__ActivationOffer o = STRATA__V1__ACTIVATION_OFFER__INIT;
    o.epoch = st->cur.epoch;
    o.boundary = st->cur.stage;
    o.backend = stage_gpu(st) ? "cuda" : "cpu";
    o.node_id = (char *)l->machine_id;
    o.nccl = me.nccl;
    o.ucx_cuda = me.ucx_cuda;
    o.override = (char *)act_override_name((enum act_override)l->override);
    o.gpu = bus;
    if (me.nccl && l->override != ACT_OVERRIDE_UCX) {
        /* The NCCL unique id of this boundary's communicator (rank 0 = us),
         * from the module; under the test hook on a CPU stage random bytes
         * stand in for it. */
        const backend_p2p_ops *p2p = stage_p2p(st);
        st_err err = {{0}};
        int rc = p2p ? p2p->unique_id(id, &err)
                     : (getrandom(id, ACT_NCCL_ID_BYTES, 0) == ACT_NCCL_ID_BYTES ? 0 : st_errf(&err, "no random bytes"));
        if (rc) {
            ST_WARN("worker: boundary %u->%u: no NCCL id (%s); offering UCX only", st->cur.stage, st->cur.stage + 1,
                    err.msg);
            o.nccl = false;
        } else {
            st->has_act_id = true;
            o.nccl_id.data = id;
            o.nccl_id.len = ACT_NCCL_ID_BYTES;
            char h[2 * ACT_NCCL_ID_BYTES + 3];
            id_text(l, id, ACT_NCCL_ID_BYTES, h);
            ST_INFO("worker: boundary %u->%u: nccl id sent to %s (%d bytes)%s", st->cur.stage, st->cur.stage + 1,
                    xport_peer_name(st->next), ACT_NCCL_ID_BYTES, h);
        }
    }
    ctl_msg m = STRATA__V1__CONTROL_MESSAGE__INIT;
    m.msg_case = STRATA__V1__CONTROL_MESSAGE__MSG_ACT_OFFER;
    m.act_offer = &o;
    send_ctl(st, st->next, &m);
}

/* Answers an offer: the transport and why, or the error that refused it. */
static void answer(xport_peer *peer, const Strata__V1__ActivationOffer *o, const wstage *st, const char *xport,
                   const char *reason, const char *error)
{
    Strata__V1__ActivationAnswer a = STRATA__V1__ACTIVATION_ANSWER__INIT;
    a.epoch = o->epoch;
    a.boundary = o->boundary;
    a.transport = (char *)xport;
    a.reason = (char *)(reason ? reason : "");
    a.error = (char *)(error ? error : "");
    ctl_msg m = STRATA__V1__CONTROL_MESSAGE__INIT;
    m.msg_case = STRATA__V1__CONTROL_MESSAGE__MSG_ACT_ANSWER;
    m.act_answer = &a;
    if (st) control_send(peer, &m, o->epoch, st->cur.stage, 0, "CONTROL reply");
}

static void refuse(act_local *l, xport_peer *peer, const Strata__V1__ActivationOffer *o, const wstage *st,
                   const char *why)
{
    l->counters->dropped_frames++;
    ST_WARN("worker: ActivationOffer from %s refused: %s; the activations stay on UCX", xport_peer_name(peer), why);
    answer(peer, o, st, "ucx", NULL, why);
}

/* Keeps an offer until its epoch's assignment (packed: the caller's copy dies). */
static void keep(act_local *l, xport_peer *peer, const Strata__V1__ActivationOffer *o)
{
    size_t n = strata__v1__activation_offer__get_packed_size(o);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) return;
    strata__v1__activation_offer__pack(o, buf);
    if (l->n_pending == ACT_PENDING_MAX) {
        free(l->pending[0].buf);
        memmove(&l->pending[0], &l->pending[1], (ACT_PENDING_MAX - 1) * sizeof l->pending[0]);
        l->n_pending--;
    }
    l->pending[l->n_pending++] = (struct act_pending){.peer = peer, .epoch = o->epoch, .buf = buf, .len = n};
    ST_INFO("worker: boundary %u->%u: offer from %s for epoch %llu came before its assignment; answering when it comes",
            o->boundary, o->boundary + 1, xport_peer_name(peer), (unsigned long long)o->epoch);
}

void act_link_peer_gone(act_local *l, xport_peer *peer)
{
    int k = 0;
    for (int i = 0; i < l->n_pending; i++) {
        if (!peer || l->pending[i].peer == peer) free(l->pending[i].buf);
        else l->pending[k++] = l->pending[i];
    }
    l->n_pending = k;
}

void act_link_assigned(wstage *st)
{
    act_local *l = st->act;
    for (int i = 0; i < l->n_pending;) {
        struct act_pending p = l->pending[i];
        if (p.epoch != st->cur.epoch) {
            i++;
            continue;
        }
        memmove(&l->pending[i], &l->pending[i + 1], (size_t)(l->n_pending - i - 1) * sizeof p);
        l->n_pending--;
        Strata__V1__ActivationOffer *o = strata__v1__activation_offer__unpack(NULL, p.len, p.buf);
        free(p.buf);
        if (o) act_link_on_offer(l, st, false, st, p.peer, o);
        if (o) strata__v1__activation_offer__free_unpacked(o, NULL);
    }
}

void act_link_on_offer(act_local *l, wstage *st, bool future, const wstage *reply_stage, xport_peer *peer,
                       const Strata__V1__ActivationOffer *o)
{
    char why[256];
    if (!st && future) {
        keep(l, peer, o);
        return;
    }
    if (!st || st->state == W_FAILED) {
        snprintf(why, sizeof why, "unknown boundary %u->%u: no stage of epoch %llu here", o->boundary,
                 o->boundary + 1, (unsigned long long)o->epoch);
        refuse(l, peer, o, reply_stage, why);
        return;
    }
    if (st->cur.stage == 0 || o->boundary != st->cur.stage - 1) {
        snprintf(why, sizeof why, "unknown boundary %u->%u: this worker is stage %u of epoch %llu", o->boundary,
                 o->boundary + 1, st->cur.stage, (unsigned long long)o->epoch);
        refuse(l, peer, o, st, why);
        return;
    }
    if (o->nccl_id.len != 0 && o->nccl_id.len != ACT_NCCL_ID_BYTES) {
        snprintf(why, sizeof why, "boundary %u->%u: NCCL id of %zu bytes (want %d)", o->boundary, o->boundary + 1,
                 o->nccl_id.len, ACT_NCCL_ID_BYTES);
        refuse(l, peer, o, st, why);
        return;
    }
    if (o->nccl && o->nccl_id.len == 0) {
        snprintf(why, sizeof why, "boundary %u->%u: NCCL offered without its id", o->boundary, o->boundary + 1);
        refuse(l, peer, o, st, why);
        return;
    }
    const char *be = o->backend ? o->backend : "";
    enum act_override sender_ovr;
    if (strcmp(be, "cpu") && strcmp(be, "cuda")) {
        snprintf(why, sizeof why, "boundary %u->%u: backend '%.32s' is not cpu or cuda", o->boundary, o->boundary + 1,
                 be);
        refuse(l, peer, o, st, why);
        return;
    }
    if (act_override_parse(o->override && *o->override ? o->override : "auto", &sender_ovr)) {
        snprintf(why, sizeof why, "boundary %u->%u: --activation-transport '%.32s' is not auto, ucx or nccl",
                 o->boundary, o->boundary + 1, o->override);
        refuse(l, peer, o, st, why);
        return;
    }
    const unsigned k = o->boundary;
    if (o->nccl_id.len) {
        char h[2 * ACT_NCCL_ID_BYTES + 3];
        id_text(l, o->nccl_id.data, o->nccl_id.len, h);
        ST_INFO("worker: boundary %u->%u: nccl id received from %s (%zu bytes)%s", k, k + 1, xport_peer_name(peer),
                o->nccl_id.len, h);
    }
    /* The boundary's override: the sender's, unless it is auto. */
    enum act_override mine = (enum act_override)l->override;
    enum act_override ovr = sender_ovr != ACT_OVERRIDE_AUTO ? sender_ovr : mine;
    if (sender_ovr != ACT_OVERRIDE_AUTO && mine != ACT_OVERRIDE_AUTO && sender_ovr != mine)
        ST_WARN("worker: boundary %u->%u: --activation-transport is %s on stage %u and %s here; the sender's wins", k,
                k + 1, act_override_name(sender_ovr), k, act_override_name(mine));
    /* An offer of a device hand-off speaks for a GPU stage (the test hook
     * makes a CPU stage offer one). */
    act_boundary b = {.send = {.gpu = !strcmp(be, "cuda") || o->nccl || o->ucx_cuda, .nccl = o->nccl,
                               .ucx_cuda = o->ucx_cuda},
                      .recv = own_side(st),
                      .same_node = o->node_id && !strcmp(o->node_id, l->machine_id),
                      .override = ovr};
    char bus[32];
    stage_gpu_bus(st, bus, sizeof bus);
    b.same_gpu = b.same_node && bus[0] && o->gpu && !strcmp(o->gpu, bus);
    act_choice c = act_transport_choose(&b);
    ST_INFO("worker: boundary %u->%u: %s (%s)", k, k + 1, act_xport_name(c.xport), c.reason);
    if (c.override_refused) ST_WARN("worker: boundary %u->%u: %s", k, k + 1, c.reason);
    /* Set it up: NCCL joins the communicator on the compute thread (after
     * the load, when one is running); ucx-cuda receives into the stage's
     * device buffers (datapath_sink_get), made at the first batch. */
    link_close(st, &st->p2p_in); /* a new offer: the old communicator goes */
    enum act_xport got = c.xport;
    char reason[sizeof c.reason + 200];
    snprintf(reason, sizeof reason, "%s", c.reason);
    const backend_p2p_ops *p2p = stage_p2p(st);
    char cause[160] = "";
    if (c.xport == ACT_XPORT_NCCL && !stage_gpu(st))
        snprintf(cause, sizeof cause, "stage %u runs on the cpu backend", st->cur.stage);
    else if (c.xport == ACT_XPORT_NCCL && (!p2p || strcmp(be, "cuda")))
        snprintf(cause, sizeof cause, "%s", !p2p ? "the CUDA module has no NCCL point-to-point" : "the sender is not on a GPU");
    else if (c.xport == ACT_XPORT_NCCL && !(st->p2p_in = link_open(st, p2p, o->nccl_id.data, 1, cause, sizeof cause)))
        ; /* cause set */
    else if (c.xport == ACT_XPORT_UCX_CUDA && (!stage_ucx_cuda(st) || strcmp(be, "cuda")))
        snprintf(cause, sizeof cause, "%s",
                 !stage_ucx_cuda(st) ? "this stage cannot receive into device buffers" : "the sender is not on a GPU");
    if (cause[0]) {
        const bool here_gpu = stage_gpu(st), there_gpu = !strcmp(be, "cuda");
        got = here_gpu || there_gpu ? ACT_XPORT_UCX_PINNED : ACT_XPORT_UCX;
        ST_WARN("worker: boundary %u->%u: %s cannot start: %s; falling back to %s", k, k + 1, act_xport_name(c.xport),
                cause, act_xport_name(got));
        snprintf(reason, sizeof reason, "%s chosen (%s) but %s; falling back", act_xport_name(c.xport), c.reason,
                 cause);
    }
    st->act_in = (int)got;
    answer(peer, o, st, act_xport_name(got), reason, NULL);
}

void act_link_on_answer(act_local *l, wstage *st, xport_peer *peer, const Strata__V1__ActivationAnswer *a)
{
    if (!st || st->next != peer || a->boundary != st->cur.stage) {
        l->counters->dropped_frames++;
        ST_WARN("worker: ActivationAnswer from %s for boundary %u->%u of epoch %llu: not a boundary this worker sends "
                "on; ignored",
                xport_peer_name(peer), a->boundary, a->boundary + 1, (unsigned long long)a->epoch);
        return;
    }
    const unsigned k = st->cur.stage;
    if (a->error && *a->error) {
        ST_WARN("worker: boundary %u->%u: stage %u refused the offer: %s; the activations stay on UCX", k, k + 1, k + 1,
                a->error);
        st->act_out = ACT_XPORT_UCX;
        return;
    }
    enum act_xport x;
    const backend_p2p_ops *p2p = stage_p2p(st);
    if (!act_xport_parse(a->transport, &x) && x == ACT_XPORT_NCCL && p2p && st->has_act_id) {
        char why[160] = "";
        link_close(st, &st->p2p_out);
        if ((st->p2p_out = link_open(st, p2p, st->act_id, 0, why, sizeof why))) {
            st->act_out = (int)x;
            ST_INFO("worker: boundary %u->%u: nccl (%s); joining the communicator as rank 0", k, k + 1,
                    a->reason ? a->reason : "");
        } else {
            ST_WARN("worker: boundary %u->%u: nccl cannot start here: %s; the activations stay on UCX", k, k + 1, why);
        }
        return;
    }
    if (!act_xport_parse(a->transport, &x) && x == ACT_XPORT_UCX_CUDA && stage_ucx_cuda(st)) {
        st->act_out = (int)x; /* the forwards write device buffers; UCX sends from them */
        ST_INFO("worker: boundary %u->%u: %s (%s)", k, k + 1, act_xport_name(x), a->reason ? a->reason : "");
        return;
    }
    if (act_xport_parse(a->transport, &x) || x == ACT_XPORT_NCCL || x == ACT_XPORT_UCX_CUDA) {
        /* A device hand-off this worker cannot carry: stay host-staged. */
        l->counters->dropped_frames++;
        ST_WARN("worker: boundary %u->%u: stage %u answered transport '%.32s', which this worker cannot carry; "
                "the activations stay on UCX",
                k, k + 1, k + 1, a->transport ? a->transport : "");
        st->act_out = ACT_XPORT_UCX;
        return;
    }
    st->act_out = (int)x;
    ST_INFO("worker: boundary %u->%u: %s (%s)", k, k + 1, act_xport_name(x), a->reason ? a->reason : "");
}
