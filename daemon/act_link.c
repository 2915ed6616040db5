/* act_link.c — the per-boundary activation transport, negotiated between
 * neighbouring stages (act_link.h, ib/act_transport.h, docs/protocol.md). */
#include "daemon/act_link.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "common/log.h"
#include "daemon/assignment.h"
#include "ib/act_transport.h"

/* Whether this build carries activations between the device and the
 * transport without a host copy (device buffers to UCX as CUDA memory, or
 * NCCL send/recv). Not yet: every hand-off is host-staged (ucx-pinned on a
 * GPU stage), so a side never claims ucx_cuda or nccl on its own. */
#define ACT_DEVICE_HANDOFF 0

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
static void id_text(const worker *w, const uint8_t *id, size_t n, char out[2 * ACT_NCCL_ID_BYTES + 3])
{
    out[0] = 0;
    if (n > ACT_NCCL_ID_BYTES || !(w->act_test_nccl || st_log_enabled(ST_LOG_DEBUG))) return;
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

void act_link_init(worker *w)
{
    read_machine_id(w->machine_id, sizeof w->machine_id);
    w->ucx_cuda = xport_memory_cuda(w->x);
    const char *hook = getenv("STRATA_TEST_ACT_TRANSPORT");
    w->act_test_nccl = hook && !strcmp(hook, "nccl");
    ST_INFO("worker: activations: --activation-transport %s; UCX CUDA memory %s; device hand-off to UCX/NCCL %s%s",
            act_override_name((enum act_override)w->act_override), w->ucx_cuda ? "yes" : "no (host-staged)",
            ACT_DEVICE_HANDOFF ? "built" : "not built (GPU stages stage through pinned host buffers)",
            w->act_test_nccl ? "; test hook STRATA_TEST_ACT_TRANSPORT=nccl: this side claims a GPU with NCCL" : "");
}

static bool stage_gpu(const wstage *st) { return !strcmp(st->cur.backend, "cuda"); }

/* What this worker's side of a boundary is and can do. */
static act_side own_side(const wstage *st)
{
    const worker *w = st->front;
    act_side s = {.gpu = stage_gpu(st), .nccl = ACT_DEVICE_HANDOFF && stage_gpu(st),
                  .ucx_cuda = ACT_DEVICE_HANDOFF && stage_gpu(st) && w->ucx_cuda};
    if (w->act_test_nccl) s.gpu = s.nccl = true;
    return s;
}

static void send_ctl(wstage *st, xport_peer *peer, ctl_msg *m) { stage_send_control(st, peer, m, st->cur.epoch, 0); }

void act_link_offer(wstage *st)
{
    worker *w = st->front;
    act_side me = own_side(st);
    st->act_out = -1; /* UCX until the answer */
    uint8_t id[ACT_NCCL_ID_BYTES];
    Strata__V1__ActivationOffer o = STRATA__V1__ACTIVATION_OFFER__INIT;
    o.epoch = st->cur.epoch;
    o.boundary = st->cur.stage;
    o.backend = stage_gpu(st) ? "cuda" : "cpu";
    o.node_id = w->machine_id;
    o.nccl = me.nccl;
    o.ucx_cuda = me.ucx_cuda;
    o.override = (char *)act_override_name((enum act_override)w->act_override);
    if (me.nccl && w->act_override != ACT_OVERRIDE_UCX) {
        /* The NCCL unique id of this boundary's communicator (rank 0 = us).
         * Only the test hook gets here in this build: random bytes stand in
         * for ncclGetUniqueId. */
        if (getrandom(id, sizeof id, 0) != (ssize_t)sizeof id) {
            ST_WARN("worker: boundary %u->%u: no random bytes for the NCCL id; offering UCX only", st->cur.stage,
                    st->cur.stage + 1);
            o.nccl = false;
        } else {
            o.nccl_id.data = id;
            o.nccl_id.len = sizeof id;
            char h[2 * ACT_NCCL_ID_BYTES + 3];
            id_text(w, id, sizeof id, h);
            ST_INFO("worker: boundary %u->%u: nccl id sent to %s (%zu bytes)%s", st->cur.stage, st->cur.stage + 1,
                    xport_peer_name(st->next), sizeof id, h);
        }
    }
    ctl_msg m = STRATA__V1__CONTROL_MESSAGE__INIT;
    m.msg_case = STRATA__V1__CONTROL_MESSAGE__MSG_ACT_OFFER;
    m.act_offer = &o;
    send_ctl(st, st->next, &m);
}

/* Answers an offer: the transport and why, or the error that refused it. */
static void answer(worker *w, xport_peer *peer, const Strata__V1__ActivationOffer *o, wstage *st, const char *xport,
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
    /* no stage of that epoch: any stage's envelope will do (the worker always has one) */
    if (!st) st = w->stages;
    if (st) stage_send_control(st, peer, &m, o->epoch, 0);
}

static void refuse(worker *w, xport_peer *peer, const Strata__V1__ActivationOffer *o, wstage *st, const char *why)
{
    w->dropped_frames++;
    ST_WARN("worker: ActivationOffer from %s refused: %s; the activations stay on UCX", xport_peer_name(peer), why);
    answer(w, peer, o, st, "ucx", NULL, why);
}

/* Keeps an offer until its epoch's assignment (packed: the caller's copy dies). */
static void keep(worker *w, xport_peer *peer, const Strata__V1__ActivationOffer *o)
{
    size_t n = strata__v1__activation_offer__get_packed_size(o);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) return;
    strata__v1__activation_offer__pack(o, buf);
    if (w->n_act_pending == ACT_PENDING_MAX) {
        free(w->act_pending[0].buf);
        memmove(&w->act_pending[0], &w->act_pending[1], (ACT_PENDING_MAX - 1) * sizeof w->act_pending[0]);
        w->n_act_pending--;
    }
    w->act_pending[w->n_act_pending++] = (struct act_pending){.peer = peer, .epoch = o->epoch, .buf = buf, .len = n};
    ST_INFO("worker: boundary %u->%u: offer from %s for epoch %llu came before its assignment; answering when it comes",
            o->boundary, o->boundary + 1, xport_peer_name(peer), (unsigned long long)o->epoch);
}

void act_link_peer_gone(worker *w, xport_peer *peer)
{
    int k = 0;
    for (int i = 0; i < w->n_act_pending; i++) {
        if (!peer || w->act_pending[i].peer == peer) free(w->act_pending[i].buf);
        else w->act_pending[k++] = w->act_pending[i];
    }
    w->n_act_pending = k;
}

void act_link_assigned(wstage *st)
{
    worker *w = st->front;
    for (int i = 0; i < w->n_act_pending;) {
        struct act_pending p = w->act_pending[i];
        if (p.epoch != st->cur.epoch) {
            i++;
            continue;
        }
        memmove(&w->act_pending[i], &w->act_pending[i + 1], (size_t)(w->n_act_pending - i - 1) * sizeof p);
        w->n_act_pending--;
        Strata__V1__ActivationOffer *o = strata__v1__activation_offer__unpack(NULL, p.len, p.buf);
        free(p.buf);
        if (o) act_link_on_offer(w, p.peer, o);
        if (o) strata__v1__activation_offer__free_unpacked(o, NULL);
    }
}

/* Whether epoch is newer than every stage this worker holds (its assignment may still come). */
static bool future_epoch(const worker *w, uint64_t epoch)
{
    for (const wstage *x = w->stages; x; x = x->link)
        if (x->state != W_IDLE && x->cur.epoch >= epoch) return false;
    return epoch > w->max_epoch || w->max_epoch == 0;
}

void act_link_on_offer(worker *w, xport_peer *peer, const Strata__V1__ActivationOffer *o)
{
    char why[256];
    wstage *st = stage_by_epoch(w, o->epoch);
    if (!st && future_epoch(w, o->epoch)) {
        keep(w, peer, o);
        return;
    }
    if (!st || st->state == W_FAILED) {
        snprintf(why, sizeof why, "unknown boundary %u->%u: no stage of epoch %llu here", o->boundary,
                 o->boundary + 1, (unsigned long long)o->epoch);
        refuse(w, peer, o, NULL, why);
        return;
    }
    if (st->cur.stage == 0 || o->boundary != st->cur.stage - 1) {
        snprintf(why, sizeof why, "unknown boundary %u->%u: this worker is stage %u of epoch %llu", o->boundary,
                 o->boundary + 1, st->cur.stage, (unsigned long long)o->epoch);
        refuse(w, peer, o, st, why);
        return;
    }
    if (o->nccl_id.len != 0 && o->nccl_id.len != ACT_NCCL_ID_BYTES) {
        snprintf(why, sizeof why, "boundary %u->%u: NCCL id of %zu bytes (want %d)", o->boundary, o->boundary + 1,
                 o->nccl_id.len, ACT_NCCL_ID_BYTES);
        refuse(w, peer, o, st, why);
        return;
    }
    if (o->nccl && o->nccl_id.len == 0) {
        snprintf(why, sizeof why, "boundary %u->%u: NCCL offered without its id", o->boundary, o->boundary + 1);
        refuse(w, peer, o, st, why);
        return;
    }
    const char *be = o->backend ? o->backend : "";
    enum act_override sender_ovr;
    if (strcmp(be, "cpu") && strcmp(be, "cuda")) {
        snprintf(why, sizeof why, "boundary %u->%u: backend '%.32s' is not cpu or cuda", o->boundary, o->boundary + 1,
                 be);
        refuse(w, peer, o, st, why);
        return;
    }
    if (act_override_parse(o->override && *o->override ? o->override : "auto", &sender_ovr)) {
        snprintf(why, sizeof why, "boundary %u->%u: --activation-transport '%.32s' is not auto, ucx or nccl",
                 o->boundary, o->boundary + 1, o->override);
        refuse(w, peer, o, st, why);
        return;
    }
    const unsigned k = o->boundary;
    if (o->nccl_id.len) {
        char h[2 * ACT_NCCL_ID_BYTES + 3];
        id_text(w, o->nccl_id.data, o->nccl_id.len, h);
        ST_INFO("worker: boundary %u->%u: nccl id received from %s (%zu bytes)%s", k, k + 1, xport_peer_name(peer),
                o->nccl_id.len, h);
        memcpy(st->nccl_id_in, o->nccl_id.data, ACT_NCCL_ID_BYTES);
        st->has_nccl_id_in = true;
    }
    /* The boundary's override: the sender's, unless it is auto. */
    enum act_override mine = (enum act_override)w->act_override;
    enum act_override ovr = sender_ovr != ACT_OVERRIDE_AUTO ? sender_ovr : mine;
    if (sender_ovr != ACT_OVERRIDE_AUTO && mine != ACT_OVERRIDE_AUTO && sender_ovr != mine)
        ST_WARN("worker: boundary %u->%u: --activation-transport is %s on stage %u and %s here; the sender's wins", k,
                k + 1, act_override_name(sender_ovr), k, act_override_name(mine));
    /* An offer of a device hand-off speaks for a GPU stage (the test hook
     * makes a CPU stage offer one). */
    act_boundary b = {.send = {.gpu = !strcmp(be, "cuda") || o->nccl || o->ucx_cuda, .nccl = o->nccl,
                               .ucx_cuda = o->ucx_cuda},
                      .recv = own_side(st),
                      .same_node = o->node_id && !strcmp(o->node_id, w->machine_id),
                      .override = ovr};
    act_choice c = act_transport_choose(&b);
    ST_INFO("worker: boundary %u->%u: %s (%s)", k, k + 1, act_xport_name(c.xport), c.reason);
    if (c.override_refused) ST_WARN("worker: boundary %u->%u: %s", k, k + 1, c.reason);
    /* Set it up. The device hand-offs are not carried by this build's data
     * path: fall back to the host-staged transport and say why. */
    enum act_xport got = c.xport;
    char reason[sizeof c.reason + 200];
    snprintf(reason, sizeof reason, "%s", c.reason);
    if (c.xport == ACT_XPORT_NCCL || c.xport == ACT_XPORT_UCX_CUDA) {
        const bool here_gpu = stage_gpu(st), there_gpu = !strcmp(be, "cuda");
        got = here_gpu || there_gpu ? ACT_XPORT_UCX_PINNED : ACT_XPORT_UCX;
        char cause[160];
        if (!here_gpu)
            snprintf(cause, sizeof cause, "stage %u runs on the cpu backend", st->cur.stage);
        else
            snprintf(cause, sizeof cause, "this build carries activations host-staged only");
        ST_WARN("worker: boundary %u->%u: %s cannot start: %s; falling back to %s", k, k + 1, act_xport_name(c.xport),
                cause, act_xport_name(got));
        snprintf(reason, sizeof reason, "%s chosen (%s) but %s; falling back", act_xport_name(c.xport), c.reason,
                 cause);
    }
    st->act_in = (int)got;
    answer(w, peer, o, st, act_xport_name(got), reason, NULL);
}

void act_link_on_answer(worker *w, xport_peer *peer, const Strata__V1__ActivationAnswer *a)
{
    wstage *st = stage_by_epoch(w, a->epoch);
    if (!st || st->next != peer || a->boundary != st->cur.stage) {
        w->dropped_frames++;
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
    if (act_xport_parse(a->transport, &x) || x == ACT_XPORT_NCCL || x == ACT_XPORT_UCX_CUDA) {
        /* A device hand-off this build does not carry: stay host-staged. */
        w->dropped_frames++;
        ST_WARN("worker: boundary %u->%u: stage %u answered transport '%.32s', which this worker cannot carry; "
                "the activations stay on UCX",
                k, k + 1, k + 1, a->transport ? a->transport : "");
        st->act_out = ACT_XPORT_UCX;
        return;
    }
    st->act_out = (int)x;
    ST_INFO("worker: boundary %u->%u: %s (%s)", k, k + 1, act_xport_name(x), a->reason ? a->reason : "");
}
