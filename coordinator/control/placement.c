/* placement.c — stage memory, automatic placement and explicit-placement
 * checks for live mode (placement.h). */
#include "coordinator/control/placement.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "rpc/rpc_code.h"

const char *place_fmt_bytes(uint64_t b, char *buf, size_t cap) {
    if (b >= (1ull << 30))
        snprintf(buf, cap, "%.2f GiB", (double)b / (double)(1ull << 30));
    else if (b >= (1ull << 20))
        snprintf(buf, cap, "%.2f MiB", (double)b / (double)(1ull << 20));
    else if (b >= 1024)
        snprintf(buf, cap, "%.1f KiB", (double)b / 1024.0);
    else
        snprintf(buf, cap, "%llu bytes", (unsigned long long)b);
    return buf;
}

static uint64_t layer_cost(const place_model *m, int l) {
    return m->layer_bytes[l] + m->kv_bytes_per_layer;
}

uint64_t place_stage_bytes(const place_model *m, int first, int last, int n_layers) {
    uint64_t b = 0;
    for (int l = first; l <= last && l < m->n_layers; l++) b += layer_cost(m, l);
    if (first == 0) b += m->embd_bytes;
    if (last == n_layers - 1) {
        b += m->head_bytes;
        if (m->head_tied && first != 0) b += m->embd_bytes; /* the LM head is token_embd */
    }
    return b;
}

/* Activations of a stage at TP tp (and the logits on the last stage). */
static uint64_t stage_act(const place_model *m, bool last, int tp) {
    if (tp < 1) tp = 1;
    uint64_t b = (uint64_t)m->act_tokens * (m->act_token_rank * (uint64_t)tp + m->act_token_split);
    return last ? b + m->logits_bytes : b;
}

uint64_t place_stage_need(const place_model *m, int first, int last, int n_layers, int tp) {
    return place_stage_bytes(m, first, last, n_layers) + stage_act(m, last == n_layers - 1, tp);
}

uint64_t place_node_capacity(const place_node *n, int tp) {
    if (n->devices <= 0) return n->memory; /* CPU: the ranks share the host memory */
    if (tp < 1) tp = 1;
    return tp > n->devices ? 0 : (uint64_t)tp * n->memory;
}

place_node place_node_make(const char *name, const char *device_kind, uint32_t device_count,
                           uint64_t device_memory, uint64_t host_memory, uint32_t tp_limit, double util) {
    place_node n = {.name = name, .tp = place_node_tp(device_kind, device_count, tp_limit)};
    if (!device_kind || !strcmp(device_kind, "cpu") || device_count == 0) {
        n.memory = host_memory;
        return n;
    }
    if (!(util > 0 && util <= 1)) util = PLACE_GPU_UTIL_DEFAULT;
    n.devices = (int)device_count;
    n.memory = (uint64_t)((double)device_memory * util);
    return n;
}

static int fail(int *code, int c, st_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(int *code, int c, st_err *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char msg[ST_ERR_MSG_MAX];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (code) *code = c;
    return st_errf(err, "%s", msg);
}

int place_auto(const place_model *m, const place_node *nodes, int n, placement *out, int *code,
               st_err *err) {
    memset(out, 0, sizeof *out);
    const int L = m->n_layers;
    if (n < 1) return fail(code, RPC_FAILED_PRECONDITION, err, "no usable node (none registered and heartbeating)");
    if (L < 1 || L > PLACE_MAX_STAGES) return fail(code, RPC_INTERNAL, err, "model has %d layers", L);
    uint64_t max_layer = 0, all = 0;
    for (int l = 0; l < L; l++) {
        if (layer_cost(m, l) > max_layer) max_layer = layer_cost(m, l);
        all += layer_cost(m, l);
    }
    all += m->embd_bytes + m->head_bytes + (m->head_tied && L > 1 ? m->embd_bytes : 0);
    /* Each node's capacity at its TP, less its activations: what is left for
     * layers (weights + KV). Nodes with room for a layer, in name order
     * (callers pass them sorted). */
    uint64_t room_of[PLACE_STAGE_MAX];
    int use[PLACE_STAGE_MAX], k = 0; /* more nodes than layers: the first L that fit */
    uint64_t biggest = 0, act_biggest = 0;
    for (int i = 0; i < n && k < L; i++) {
        uint64_t cap = place_node_capacity(&nodes[i], nodes[i].tp), act = stage_act(m, false, nodes[i].tp);
        if (cap > biggest) biggest = cap, act_biggest = act;
        if (cap >= act && cap - act >= max_layer) {
            room_of[k] = cap;
            use[k++] = i;
        }
    }
    char b1[32], b2[32], b3[32];
    if (k == 0) {
        uint64_t need = max_layer + act_biggest;
        return fail(code, RPC_RESOURCE_EXHAUSTED, err,
                    "no node can hold one layer: a layer needs %s (weights + KV cache) plus %s of "
                    "activations, the largest node offers %s (short by %s)",
                    place_fmt_bytes(max_layer, b1, sizeof b1), place_fmt_bytes(act_biggest, b3, sizeof b3),
                    place_fmt_bytes(biggest, b2, sizeof b2),
                    place_fmt_bytes(need > biggest ? need - biggest : 0, b3, sizeof b3));
    }
    for (int tries = 0; tries < 2; tries++) {
        /* memory left for layers after the activations, the embedding (first)
         * and the head (last) */
        double left[PLACE_STAGE_MAX];
        int maxl[PLACE_STAGE_MAX], cnt[PLACE_STAGE_MAX];
        double sum = 0;
        int room = 0;
        for (int s = 0; s < k; s++) {
            const bool last = s == k - 1;
            double mem = (double)room_of[s] - (double)stage_act(m, last, nodes[use[s]].tp);
            if (s == 0) mem -= (double)m->embd_bytes;
            if (last) mem -= (double)m->head_bytes + (m->head_tied && k > 1 ? (double)m->embd_bytes : 0);
            left[s] = mem > 0 ? mem : 0;
            maxl[s] = (int)(left[s] / (double)max_layer);
            if (maxl[s] > L) maxl[s] = L;
            sum += left[s];
            room += maxl[s];
        }
        uint64_t have = 0;
        for (int s = 0; s < k; s++) have += room_of[s];
        if (room < L || sum <= 0) {
            if (tries == 0 && k > 1) { /* a node too small for its position: retry without the smallest */
                int small = 0;
                for (int s = 1; s < k; s++)
                    if (room_of[s] < room_of[small]) small = s;
                if (maxl[small] < 1) {
                    for (int s = small; s < k - 1; s++) use[s] = use[s + 1], room_of[s] = room_of[s + 1];
                    k--;
                    continue;
                }
            }
            uint64_t need = all;
            for (int s = 0; s < k; s++) need += stage_act(m, s == k - 1, nodes[use[s]].tp);
            return fail(code, RPC_RESOURCE_EXHAUSTED, err,
                        "the model does not fit: it needs %s (weights + KV cache + activations), the %d "
                        "usable node(s) offer %s (short by %s)",
                        place_fmt_bytes(need, b1, sizeof b1), k, place_fmt_bytes(have, b2, sizeof b2),
                        place_fmt_bytes(need > have ? need - have : max_layer, b3, sizeof b3));
        }
        int given = 0;
        for (int s = 0; s < k; s++) {
            cnt[s] = (int)((double)L * left[s] / sum);
            if (cnt[s] < 1) cnt[s] = 1;
            if (cnt[s] > maxl[s]) cnt[s] = maxl[s];
            given += cnt[s];
        }
        /* too many (the at-least-one rule): take from the last stages first */
        for (int s = k - 1; given > L && s >= 0; s--)
            while (given > L && cnt[s] > 1) cnt[s]--, given--;
        /* the remainder: one each to the earlier stages (vLLM) */
        while (given < L) {
            int progress = 0;
            for (int s = 0; s < k && given < L; s++)
                if (cnt[s] < maxl[s]) cnt[s]++, given++, progress = 1;
            if (!progress) break;
        }
        if (given != L) continue;
        int first = 0;
        for (int s = 0; s < k; s++) {
            place_stage *st = &out->st[s];
            snprintf(st->node, sizeof st->node, "%s", nodes[use[s]].name);
            st->first = first;
            st->last = first + cnt[s] - 1;
            st->tp = nodes[use[s]].tp > 0 ? nodes[use[s]].tp : 1;
            first += cnt[s];
        }
        out->n_stages = k;
        out->n_layers = L;
        /* final check: each stage within its node (the exact per-layer sizes) */
        for (int s = 0; s < k; s++) {
            uint64_t need = place_stage_need(m, out->st[s].first, out->st[s].last, L, out->st[s].tp);
            if (need > room_of[s])
                return fail(code, RPC_RESOURCE_EXHAUSTED, err,
                            "the model does not fit: stage %d on %s needs %s, the node offers %s "
                            "(short by %s)",
                            s, nodes[use[s]].name, place_fmt_bytes(need, b1, sizeof b1),
                            place_fmt_bytes(room_of[s], b2, sizeof b2),
                            place_fmt_bytes(need - room_of[s], b3, sizeof b3));
        }
        return 0;
    }
    return fail(code, RPC_RESOURCE_EXHAUSTED, err, "the model does not fit on the usable nodes");
}

int place_check_explicit(const place_model *m, const place_node *nodes, int n, const place_stage *stages,
                         int n_stages, placement *out, int *code, st_err *err) {
    const int L = m->n_layers;
    if (n_stages < 1 || n_stages > PLACE_STAGE_MAX)
        return fail(code, RPC_INVALID_ARGUMENT, err, "%d stages (want 1..%d)", n_stages, PLACE_STAGE_MAX);
    placement p;
    memset(&p, 0, sizeof p);
    int next = 0;
    for (int s = 0; s < n_stages; s++) {
        const place_stage *st = &stages[s];
        if (!st->node[0]) return fail(code, RPC_INVALID_ARGUMENT, err, "stage %d has no node name", s);
        int ni = -1;
        for (int i = 0; i < n; i++)
            if (!strcmp(nodes[i].name, st->node)) ni = i;
        if (ni < 0)
            return fail(code, RPC_NOT_FOUND, err, "unknown node \"%s\" (stage %d; not registered, or not usable)",
                        st->node, s);
        for (int t = 0; t < s; t++)
            if (!strcmp(stages[t].node, st->node))
                return fail(code, RPC_INVALID_ARGUMENT, err, "node \"%s\" appears in stages %d and %d",
                            st->node, t, s);
        if (st->first < 0 || st->last < st->first)
            return fail(code, RPC_INVALID_ARGUMENT, err, "stage %d (%s): bad layer range %d-%d", s,
                        st->node, st->first, st->last);
        if (st->last >= L)
            return fail(code, RPC_INVALID_ARGUMENT, err,
                        "stage %d (%s): layer %d does not exist (the model has layers 0-%d)", s,
                        st->node, st->last, L - 1);
        if (st->first < next)
            return fail(code, RPC_INVALID_ARGUMENT, err, "layer %d is covered twice (stages %d and %d overlap)",
                        st->first, s - 1, s);
        if (st->first > next)
            return fail(code, RPC_INVALID_ARGUMENT, err, "layers %d-%d are not covered (before stage %d)", next,
                        st->first - 1, s);
        next = st->last + 1;
        const int tp = st->tp > 0 ? st->tp : nodes[ni].tp > 0 ? nodes[ni].tp : 1;
        if (nodes[ni].devices > 0 && tp > nodes[ni].devices)
            return fail(code, RPC_INVALID_ARGUMENT, err, "stage %d: TP %d on %s, which has %d GPU(s)", s, tp,
                        st->node, nodes[ni].devices);
        uint64_t need = place_stage_need(m, st->first, st->last, L, tp), cap = place_node_capacity(&nodes[ni], tp);
        if (need > cap) {
            char b1[32], b2[32], b3[32], b4[32];
            return fail(code, RPC_RESOURCE_EXHAUSTED, err,
                        "stage %d: layers %d-%d at TP %d need %s (weights + KV cache + %s of activations) "
                        "on %s, which offers %s (short by %s)",
                        s, st->first, st->last, tp, place_fmt_bytes(need, b1, sizeof b1),
                        place_fmt_bytes(need - place_stage_bytes(m, st->first, st->last, L), b4, sizeof b4),
                        st->node, place_fmt_bytes(cap, b2, sizeof b2), place_fmt_bytes(need - cap, b3, sizeof b3));
        }
        p.st[s] = *st;
        if (p.st[s].tp <= 0) p.st[s].tp = tp;
        else if (nodes[ni].tp > 0 && p.st[s].tp > nodes[ni].tp)
            /* The operator asked for more than the node's link rule allows
             * (ib/gpu_links.h: NVLink, at most 2 over PCIe): honoured. */
            ST_WARN("placement: stage %d on %s: TP %d is above the %d its GPU links allow (operator override; "
                    "all-reduces cross PCIe)", s, st->node, p.st[s].tp, nodes[ni].tp);
    }
    if (next != L)
        return fail(code, RPC_INVALID_ARGUMENT, err, "layers %d-%d are not covered (after the last stage)",
                    next, L - 1);
    p.n_stages = n_stages;
    p.n_layers = L;
    *out = p;
    return 0;
}

int place_node_tp(const char *device_kind, uint32_t device_count, uint32_t tp_limit) {
    if (!device_kind || !strcmp(device_kind, "cpu")) return 1;
    uint32_t limit = tp_limit ? tp_limit : 2;
    uint32_t tp = device_count < limit ? device_count : limit;
    return tp ? (int)tp : 1;
}
