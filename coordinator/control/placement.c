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
    if (last == n_layers - 1) b += m->head_bytes;
    return b;
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
    all += m->embd_bytes + m->head_bytes;
    /* Nodes with room for a layer, in name order (callers pass them sorted). */
    int use[PLACE_STAGE_MAX], k = 0; /* more nodes than layers: the first L that fit */
    for (int i = 0; i < n && k < L; i++)
        if (nodes[i].memory >= max_layer) use[k++] = i;
    uint64_t total = 0, biggest = 0;
    for (int i = 0; i < n; i++) {
        total += nodes[i].memory;
        if (nodes[i].memory > biggest) biggest = nodes[i].memory;
    }
    char b1[32], b2[32], b3[32];
    if (k == 0)
        return fail(code, RPC_RESOURCE_EXHAUSTED, err,
                    "no node can hold one layer: a layer needs %s (weights + KV cache), the largest "
                    "node has %s (short by %s)",
                    place_fmt_bytes(max_layer, b1, sizeof b1), place_fmt_bytes(biggest, b2, sizeof b2),
                    place_fmt_bytes(max_layer - biggest, b3, sizeof b3));
    for (int tries = 0; tries < 2; tries++) {
        /* memory left for layers after the embedding (first) and the head (last) */
        double left[PLACE_STAGE_MAX];
        int maxl[PLACE_STAGE_MAX], cnt[PLACE_STAGE_MAX];
        double sum = 0;
        int room = 0;
        for (int s = 0; s < k; s++) {
            double mem = (double)nodes[use[s]].memory;
            if (s == 0) mem -= (double)m->embd_bytes;
            if (s == k - 1) mem -= (double)m->head_bytes;
            left[s] = mem > 0 ? mem : 0;
            maxl[s] = (int)(left[s] / (double)max_layer);
            if (maxl[s] > L) maxl[s] = L;
            sum += left[s];
            room += maxl[s];
        }
        uint64_t have = 0;
        for (int s = 0; s < k; s++) have += nodes[use[s]].memory;
        if (room < L || sum <= 0) {
            if (tries == 0 && k > 1) { /* a node too small for its position: retry without the smallest */
                int small = 0;
                for (int s = 1; s < k; s++)
                    if (nodes[use[s]].memory < nodes[use[small]].memory) small = s;
                if (maxl[small] < 1) {
                    for (int s = small; s < k - 1; s++) use[s] = use[s + 1];
                    k--;
                    continue;
                }
            }
            return fail(code, RPC_RESOURCE_EXHAUSTED, err,
                        "the model does not fit: it needs %s (weights + KV cache), the %d usable "
                        "node(s) have %s (short by %s)",
                        place_fmt_bytes(all, b1, sizeof b1), k, place_fmt_bytes(have, b2, sizeof b2),
                        place_fmt_bytes(all > have ? all - have : max_layer, b3, sizeof b3));
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
            uint64_t need = place_stage_bytes(m, out->st[s].first, out->st[s].last, L);
            if (need > nodes[use[s]].memory)
                return fail(code, RPC_RESOURCE_EXHAUSTED, err,
                            "the model does not fit: stage %d on %s needs %s, the node has %s "
                            "(short by %s)",
                            s, nodes[use[s]].name, place_fmt_bytes(need, b1, sizeof b1),
                            place_fmt_bytes(nodes[use[s]].memory, b2, sizeof b2),
                            place_fmt_bytes(need - nodes[use[s]].memory, b3, sizeof b3));
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
        uint64_t need = place_stage_bytes(m, st->first, st->last, L);
        if (need > nodes[ni].memory) {
            char b1[32], b2[32], b3[32];
            return fail(code, RPC_RESOURCE_EXHAUSTED, err,
                        "stage %d: layers %d-%d need %s on %s, which has %s (short by %s)", s, st->first,
                        st->last, place_fmt_bytes(need, b1, sizeof b1), st->node,
                        place_fmt_bytes(nodes[ni].memory, b2, sizeof b2),
                        place_fmt_bytes(need - nodes[ni].memory, b3, sizeof b3));
        }
        p.st[s] = *st;
        if (p.st[s].tp <= 0) p.st[s].tp = nodes[ni].tp > 0 ? nodes[ni].tp : 1;
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
