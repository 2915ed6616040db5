/* sampler.c — owns next-token sampling (see sampler.h for the pipeline,
 * the draw and the TP exactness rules): parameter checks, the penalty
 * history, per-rank candidate selection, and the merge that picks a token.
 * The full-row sampler_sample is the one-rank case of the TP path, with the
 * candidate cap grown until nothing is cut, so both share every formula. */
#include "model/sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TRUNC_NONE INT32_MAX /* exact_len: every position is exact */

/* ------------------------------------------------------------ params */

sampler_params sampler_default_params(void) {
    sampler_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.0f;
    p.seed = 0;
    p.n_top_logprobs = 0;
    return p;
}

sampler_params sampler_greedy_params(void) {
    sampler_params p = sampler_default_params();
    p.temperature = 0.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    return p;
}

int sampler_params_validate(const sampler_params *p, st_err *err) {
    if (!p) return st_errf(err, "sampler: no parameters");
    if (!isfinite(p->temperature) || p->temperature < 0.0f)
        return st_errf(err, "temperature must be a finite number >= 0, got %g", (double)p->temperature);
    if (p->temperature > 0.0f && p->temperature < 1e-4f)
        return st_errf(err, "temperature must be 0 (greedy) or >= 0.0001, got %g", (double)p->temperature);
    if (p->top_k < 0) return st_errf(err, "top_k must be >= 0 (0 = off), got %d", (int)p->top_k);
    if (!isfinite(p->top_p) || !(p->top_p > 0.0f && p->top_p <= 1.0f))
        return st_errf(err, "top_p must be in (0, 1], got %g", (double)p->top_p);
    if (!isfinite(p->min_p) || p->min_p < 0.0f || p->min_p > 1.0f)
        return st_errf(err, "min_p must be in [0, 1], got %g", (double)p->min_p);
    if (!isfinite(p->repeat_penalty) || p->repeat_penalty < 0.01f || p->repeat_penalty > 100.0f)
        return st_errf(err, "repeat_penalty must be in [0.01, 100] (1 = off), got %g",
                       (double)p->repeat_penalty);
    if (p->repeat_last_n < -1 || p->repeat_last_n > (1 << 20))
        return st_errf(err, "repeat_last_n must be -1 (all), 0 (off) or 1..%d, got %d", 1 << 20,
                       (int)p->repeat_last_n);
    if (!isfinite(p->presence_penalty) || p->presence_penalty < -2.0f || p->presence_penalty > 2.0f)
        return st_errf(err, "presence_penalty must be in [-2, 2], got %g", (double)p->presence_penalty);
    if (!isfinite(p->frequency_penalty) || p->frequency_penalty < -2.0f || p->frequency_penalty > 2.0f)
        return st_errf(err, "frequency_penalty must be in [-2, 2], got %g", (double)p->frequency_penalty);
    if (p->n_top_logprobs < 0 || p->n_top_logprobs > SAMPLER_MAX_TOP_LOGPROBS)
        return st_errf(err, "top_logprobs must be in [0, %d], got %d", SAMPLER_MAX_TOP_LOGPROBS,
                       (int)p->n_top_logprobs);
    if (p->n_bias < 0 || (p->n_bias > 0 && (!p->bias_ids || !p->bias_values)))
        return st_errf(err, "logit bias: %d entries without arrays", (int)p->n_bias);
    for (int32_t i = 0; i < p->n_bias; i++)
        if (p->bias_ids[i] < 0 || isnan(p->bias_values[i]) || p->bias_values[i] == INFINITY)
            return st_errf(err, "logit bias %d: token %d, bias %g (ids >= 0, biases finite or -inf)",
                           (int)i, (int)p->bias_ids[i], (double)p->bias_values[i]);
    return 0;
}

/* ------------------------------------------------------------ history */

static uint32_t hist_hash(int32_t id) { return (uint32_t)id * 2654435761u; }

static sampler_history_entry *hist_find(const sampler_history *h, int32_t id) {
    if (!h || !h->table) return NULL;
    uint32_t mask = h->cap - 1;
    for (uint32_t i = hist_hash(id) & mask;; i = (i + 1) & mask) {
        if (h->table[i].id == id) return &h->table[i];
        if (h->table[i].id < 0) return NULL;
    }
}

static int hist_alloc_table(sampler_history *h, uint32_t cap, st_err *err) {
    sampler_history_entry *t = malloc((size_t)cap * sizeof *t);
    if (!t) return st_errf(err, "sampler history: out of memory");
    for (uint32_t i = 0; i < cap; i++) t[i].id = -1, t[i].total = 0, t[i].window = 0, t[i].prompt = 0;
    sampler_history_entry *old = h->table;
    uint32_t old_cap = h->cap;
    h->table = t;
    h->cap = cap;
    for (uint32_t i = 0; i < old_cap; i++) {
        if (old[i].id < 0) continue;
        uint32_t j = hist_hash(old[i].id) & (cap - 1);
        while (t[j].id >= 0) j = (j + 1) & (cap - 1);
        t[j] = old[i];
    }
    free(old);
    return 0;
}

int sampler_history_init(sampler_history *h, int32_t window, st_err *err) {
    if (!h) return st_errf(err, "sampler history: NULL");
    memset(h, 0, sizeof *h);
    if (window < -1 || window > (1 << 20))
        return st_errf(err, "sampler history: window must be -1, 0 or 1..%d, got %d", 1 << 20,
                       (int)window);
    h->window = window;
    if (window > 0) {
        h->ring = malloc((size_t)window * sizeof *h->ring);
        if (!h->ring) return st_errf(err, "sampler history: out of memory");
    }
    if (hist_alloc_table(h, 64, err) != 0) {
        free(h->ring);
        h->ring = NULL;
        return -1;
    }
    return 0;
}

void sampler_history_free(sampler_history *h) {
    if (!h) return;
    free(h->ring);
    free(h->table);
    memset(h, 0, sizeof *h);
}

void sampler_history_reset(sampler_history *h) {
    if (!h) return;
    for (uint32_t i = 0; i < h->cap; i++)
        h->table[i].id = -1, h->table[i].total = 0, h->table[i].window = 0, h->table[i].prompt = 0;
    h->n_used = 0;
    h->n_added = 0;
}

/* The entry of id, created when absent; NULL + err. */
static sampler_history_entry *hist_entry(sampler_history *h, int32_t id, st_err *err) {
    if (!h || !h->table) return st_errf(err, "sampler history: not initialised"), NULL;
    if (id < 0) return st_errf(err, "sampler history: negative token id %d", (int)id), NULL;
    sampler_history_entry *e = hist_find(h, id);
    if (!e) {
        if ((h->n_used + 1) * 2 > h->cap && hist_alloc_table(h, h->cap * 2, err) != 0) return NULL;
        uint32_t j = hist_hash(id) & (h->cap - 1);
        while (h->table[j].id >= 0) j = (j + 1) & (h->cap - 1);
        e = &h->table[j];
        e->id = id;
        e->total = 0;
        e->window = 0;
        e->prompt = 0;
        h->n_used++;
    }
    return e;
}

int sampler_history_add_prompt(sampler_history *h, int32_t id, st_err *err) {
    sampler_history_entry *e = hist_entry(h, id, err);
    if (!e) return -1;
    e->prompt++;
    return 0;
}

int sampler_history_rebuild_prompt(sampler_history *h, const int32_t *ids, size_t n,
                                   size_t n_prompt, st_err *err) {
    if (!h || !h->table) return st_errf(err, "sampler history: not initialised");
    if (n > 0 && !ids) return st_errf(err, "sampler history: NULL token list");
    if (n_prompt > n) return st_errf(err, "sampler history: %zu prompt tokens of %zu", n_prompt, n);
    sampler_history_reset(h);
    for (size_t i = 0; i < n; i++)
        if ((i < n_prompt ? sampler_history_add_prompt(h, ids[i], err)
                          : sampler_history_add(h, ids[i], err)) != 0)
            return -1;
    return 0;
}

int sampler_history_add(sampler_history *h, int32_t id, st_err *err) {
    sampler_history_entry *e = hist_entry(h, id, err);
    if (!e) return -1;
    e->total++;
    if (h->window == -1) {
        e->window = e->total;
    } else if (h->window > 0) {
        size_t slot = (size_t)(h->n_added % h->window);
        if (h->n_added >= h->window) {
            sampler_history_entry *old = hist_find(h, h->ring[slot]);
            if (old) old->window--;
        }
        h->ring[slot] = id;
        e->window++;
    }
    h->n_added++;
    return 0;
}

int sampler_history_rebuild(sampler_history *h, const int32_t *ids, size_t n, st_err *err) {
    if (!h || !h->table) return st_errf(err, "sampler history: not initialised");
    if (n > 0 && !ids) return st_errf(err, "sampler history: NULL token list");
    sampler_history_reset(h);
    for (size_t i = 0; i < n; i++)
        if (sampler_history_add(h, ids[i], err) != 0) return -1;
    return 0;
}

void sampler_history_count(const sampler_history *h, int32_t id, int32_t *total, int32_t *in_window) {
    const sampler_history_entry *e = id >= 0 ? hist_find(h, id) : NULL;
    if (total) *total = e ? e->total : 0;
    if (in_window) *in_window = e ? e->window : 0;
}

int sampler_apply_penalties(const sampler_params *p, const sampler_history *h, float *logits,
                            int32_t lo, int32_t hi, st_err *err) {
    if (sampler_params_validate(p, err) != 0) return -1;
    if (lo < 0 || hi < lo) return st_errf(err, "sampler: bad slice [%d, %d)", (int)lo, (int)hi);
    if (hi > lo && !logits) return st_errf(err, "sampler: NULL logits");
    for (int32_t i = 0; i < p->n_bias; i++)
        if (p->bias_ids[i] >= lo && p->bias_ids[i] < hi) logits[p->bias_ids[i] - lo] += p->bias_values[i];
    if (!h || !h->table || h->n_used == 0) return 0;
    int rep = p->repeat_penalty != 1.0f && p->repeat_last_n != 0;
    if (rep && h->window != p->repeat_last_n)
        return st_errf(err, "sampler: history window %d does not match repeat_last_n %d",
                       (int)h->window, (int)p->repeat_last_n);
    if (!rep && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f) return 0;
    for (uint32_t i = 0; i < h->cap; i++) {
        const sampler_history_entry *e = &h->table[i];
        if (e->id < lo || e->id >= hi || (e->total <= 0 && e->prompt <= 0)) continue; /* empty slots have id -1 */
        float l = logits[e->id - lo];
        if (rep && (e->window > 0 || e->prompt > 0))
            l = l > 0.0f ? l / p->repeat_penalty : l * p->repeat_penalty;
        if (e->total > 0) l -= p->presence_penalty + p->frequency_penalty * (float)e->total;
        logits[e->id - lo] = l;
    }
    return 0;
}

/* ------------------------------------------------------------ random */

static uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* (k + 0.5) / 2^23 with k the top 23 bits of the hash: exactly representable
 * as a float, in [2^-24, 1 - 2^-24], so -log(-log(u)) is finite. */
static float uniform_f(uint64_t seed, uint64_t step, int32_t id) {
    uint64_t x = mix64(mix64(mix64(seed) ^ step) ^ (uint64_t)(uint32_t)id);
    return ((float)(x >> 41) + 0.5f) * (1.0f / 8388608.0f);
}

double sampler_uniform(uint64_t seed, uint64_t step, int32_t id) { return uniform_f(seed, step, id); }

/* Gumbel-max score of one token; -inf logits never win. The noise is in
 * float (two logf per token: the whole-vocabulary draw is the hot loop). */
static double gumbel_score(const sampler_params *p, uint64_t step, int32_t id, float logit) {
    if (isinf(logit)) return -INFINITY;
    float g = -logf(-logf(uniform_f(p->seed, step, id)));
    return (double)logit / (double)p->temperature + (double)g;
}

/* ------------------------------------------------------------ ordering */

/* a comes before b: key descending, then id ascending. */
static int before(const sampler_cand *a, const sampler_cand *b, int by_raw) {
    float x = by_raw ? a->raw : a->logit, y = by_raw ? b->raw : b->logit;
    if (x != y) return x > y;
    return a->id < b->id;
}

static int cmp_logit(const void *a, const void *b) {
    const sampler_cand *x = a, *y = b;
    if (x->id == y->id) return 0;
    return before(x, y, 0) ? -1 : 1;
}
static int cmp_raw(const void *a, const void *b) {
    const sampler_cand *x = a, *y = b;
    if (x->id == y->id) return 0;
    return before(x, y, 1) ? -1 : 1;
}

/* Bounded heap keeping the first `cap` elements in order; heap[0] is the one
 * that comes last. */
typedef struct topk {
    sampler_cand *h;
    int32_t n, cap;
    int by_raw;
} topk;

static void topk_push(topk *t, sampler_cand c) {
    if (t->cap <= 0) return;
    if (t->n < t->cap) {
        int32_t i = t->n++;
        t->h[i] = c;
        while (i > 0) {
            int32_t par = (i - 1) / 2;
            if (!before(&t->h[par], &t->h[i], t->by_raw)) break;
            sampler_cand tmp = t->h[par];
            t->h[par] = t->h[i];
            t->h[i] = tmp;
            i = par;
        }
        return;
    }
    if (!before(&c, &t->h[0], t->by_raw)) return;
    t->h[0] = c;
    int32_t i = 0;
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < t->n && before(&t->h[w], &t->h[l], t->by_raw)) w = l;
        if (r < t->n && before(&t->h[w], &t->h[r], t->by_raw)) w = r;
        if (w == i) break;
        sampler_cand tmp = t->h[w];
        t->h[w] = t->h[i];
        t->h[i] = tmp;
        i = w;
    }
}

static void topk_sort(topk *t) {
    if (t->n > 1) qsort(t->h, (size_t)t->n, sizeof *t->h, t->by_raw ? cmp_raw : cmp_logit);
}

/* ------------------------------------------------------------ local (one rank) */

static int pure_temperature(const sampler_params *p) {
    return p->temperature > 0.0f && p->top_k == 0 && p->top_p >= 1.0f && p->min_p <= 0.0f;
}

int32_t sampler_tp_max_cands(const sampler_params *p) {
    if (!p || p->temperature <= 0.0f) return 1;
    if (p->top_k > 0) return p->top_k;
    return SAMPLER_TP_CANDS;
}

int sampler_local_candidates(const sampler_params *p, const float *logits_slice, int32_t lo,
                             int32_t hi, const sampler_history *h, uint64_t step,
                             sampler_cand *cands_out, int32_t max_cands,
                             sampler_local_stats *stats, st_err *err) {
    if (sampler_params_validate(p, err) != 0) return -1;
    if (!stats) return st_errf(err, "sampler: NULL stats");
    if (lo < 0 || hi < lo) return st_errf(err, "sampler: bad vocabulary slice [%d, %d)", (int)lo, (int)hi);
    if (hi > lo && !logits_slice) return st_errf(err, "sampler: NULL logits");
    if (max_cands < 1 || !cands_out) return st_errf(err, "sampler: need room for at least one candidate");
    int32_t n = hi - lo;

    memset(stats, 0, sizeof *stats);
    stats->lo = lo;
    stats->hi = hi;
    stats->raw_max = -INFINITY;
    stats->pen_max = -INFINITY;

    /* Raw statistics (logprob normaliser) and the top raw logits. */
    int32_t n_top = p->n_top_logprobs < n ? p->n_top_logprobs : n;
    topk traw = {stats->top_raw, 0, n_top, 1};
    float rmax = -INFINITY;
    for (int32_t i = 0; i < n; i++) {
        float x = logits_slice[i];
        if (isnan(x) || x == INFINITY)
            return st_errf(err, "sampler: logit of token %d is %s", (int)(lo + i), isnan(x) ? "NaN" : "+inf");
        if (x > rmax) rmax = x;
    }
    if (rmax > -INFINITY) {
        double s = 0.0;
        for (int32_t i = 0; i < n; i++) s += (double)expf(logits_slice[i] - rmax);
        stats->raw_max = rmax;
        stats->raw_sum = s;
    }
    /* Ids increase along the loops below, so a value equal to the heap's
     * last element comes after it: skip without building a record. */
    for (int32_t i = 0; i < n && n_top > 0; i++) {
        if (traw.n == traw.cap && logits_slice[i] <= traw.h[0].raw) continue;
        sampler_cand c = {lo + i, logits_slice[i], logits_slice[i]};
        topk_push(&traw, c);
    }
    topk_sort(&traw);
    stats->n_top = traw.n;

    /* Penalized copy. */
    float *pen = NULL;
    if (n > 0) {
        pen = malloc((size_t)n * sizeof *pen);
        if (!pen) return st_errf(err, "sampler: out of memory (%d logits)", (int)n);
        memcpy(pen, logits_slice, (size_t)n * sizeof *pen);
        if (sampler_apply_penalties(p, h, pen, lo, hi, err) != 0) {
            free(pen);
            return -1;
        }
    }
    float pmax = -INFINITY;
    for (int32_t i = 0; i < n; i++) {
        if (isnan(pen[i]) || pen[i] == INFINITY) {
            free(pen);
            return st_errf(err, "sampler: penalized logit of token %d is not finite", (int)(lo + i));
        }
        if (pen[i] > pmax) pmax = pen[i];
    }
    stats->pen_max = pmax;
    double T = p->temperature;
    if (T > 0.0 && pmax > -INFINITY) {
        double s = 0.0;
        float inv_t = (float)(1.0 / T);
        for (int32_t i = 0; i < n; i++) s += (double)expf((pen[i] - pmax) * inv_t);
        stats->pen_sum = s;
    }

    if (pure_temperature(p)) {
        /* The Gumbel winner of the slice is all the merge needs. */
        double best = -INFINITY;
        for (int32_t i = 0; i < n; i++) {
            double sc = gumbel_score(p, step, lo + i, pen[i]);
            if (sc > best) { /* strict: lowest id wins ties */
                best = sc;
                stats->gumbel.id = lo + i;
                stats->gumbel.logit = pen[i];
                stats->gumbel.raw = logits_slice[i];
                stats->gumbel_valid = 1;
            }
        }
        stats->n_cands = 0;
        free(pen);
        return 0;
    }

    /* Greedy needs the slice's best, top-k its k best, top-p/min-p as many
     * as the caller has room for. */
    int32_t m = max_cands;
    if (p->temperature <= 0.0f) m = 1;
    else if (p->top_k > 0 && p->top_k < m) m = p->top_k;
    if (m > n) m = n;
    topk tc = {cands_out, 0, m, 0};
    for (int32_t i = 0; i < n; i++) {
        if (tc.n == tc.cap && pen[i] <= tc.h[0].logit) continue;
        sampler_cand c = {lo + i, pen[i], logits_slice[i]};
        topk_push(&tc, c);
    }
    topk_sort(&tc);
    stats->n_cands = tc.n;
    free(pen);
    return 0;
}

/* ------------------------------------------------------------ merge (every rank) */

/* Steps 4-6 on the sorted candidates c[0..n): positions [0, exact_len) are
 * the true global order; p_i = exp((l_i - zmax)/T) / zsum. */
static int32_t filter_and_draw(const sampler_params *p, const sampler_cand *c, int32_t n,
                               int32_t exact_len, double zmax, double zsum, uint64_t step,
                               int32_t *truncated) {
    double T = p->temperature;
    int32_t n_keep = n;
    /* exact: the kept prefix is the true one (see the rules in sampler.h). */
    int exact = exact_len == TRUNC_NONE;
    if (p->top_p < 1.0f) {
        double cum = 0.0;
        for (int32_t i = 0; i < n; i++) {
            cum += exp(((double)c[i].logit - zmax) / T) / zsum;
            if (cum >= (double)p->top_p) {
                n_keep = i + 1;
                exact = n_keep <= exact_len;
                break;
            }
        }
    }
    if (p->min_p > 0.0f) {
        double thr = log((double)p->min_p);
        int32_t j = 1; /* the first candidate always passes: its ratio is 1 */
        while (j < n_keep && ((double)c[j].logit - (double)c[0].logit) / T >= thr) j++;
        if (j < n_keep) exact = j < exact_len; /* candidate j is known and fails */
        n_keep = j;
    }
    if (!exact) *truncated = 1;
    int32_t best = 0;
    double best_sc = -INFINITY;
    for (int32_t i = 0; i < n_keep; i++) {
        double sc = gumbel_score(p, step, c[i].id, c[i].logit);
        if (sc > best_sc || (sc == best_sc && c[i].id < c[best].id)) {
            best_sc = sc;
            best = i;
        }
    }
    return best;
}

static int check_stats(const sampler_local_stats *s, int n_ranks, int32_t max_cands, st_err *err) {
    int32_t expect_lo = 0;
    for (int r = 0; r < n_ranks; r++) {
        if (s[r].lo != expect_lo || s[r].hi < s[r].lo)
            return st_errf(err, "sampler merge: rank %d slice [%d, %d) does not continue at %d", r,
                           (int)s[r].lo, (int)s[r].hi, (int)expect_lo);
        if (s[r].n_cands < 0 || s[r].n_cands > max_cands || s[r].n_cands > s[r].hi - s[r].lo)
            return st_errf(err, "sampler merge: rank %d sent %d candidates (max %d)", r,
                           (int)s[r].n_cands, (int)max_cands);
        if (s[r].n_top < 0 || s[r].n_top > SAMPLER_MAX_TOP_LOGPROBS)
            return st_errf(err, "sampler merge: rank %d sent %d top logprobs", r, (int)s[r].n_top);
        expect_lo = s[r].hi;
    }
    if (expect_lo < 1) return st_errf(err, "sampler merge: empty vocabulary");
    return 0;
}

int sampler_merge_pick(const sampler_params *p, const sampler_cand *all_cands, int32_t max_cands,
                       const sampler_local_stats *all_stats, int n_ranks, uint64_t step,
                       sampler_token_info *out, st_err *err) {
    if (sampler_params_validate(p, err) != 0) return -1;
    if (n_ranks < 1 || !all_stats || !out || max_cands < 1 || !all_cands)
        return st_errf(err, "sampler merge: bad arguments");
    if (check_stats(all_stats, n_ranks, max_cands, err) != 0) return -1;
    memset(out, 0, sizeof *out);
    int32_t n_vocab = all_stats[n_ranks - 1].hi;

    /* Raw normaliser: log sum exp over the whole vocabulary. */
    double gmax = -INFINITY;
    for (int r = 0; r < n_ranks; r++)
        if (all_stats[r].raw_sum > 0.0 && all_stats[r].raw_max > gmax) gmax = all_stats[r].raw_max;
    if (gmax == -INFINITY) return st_errf(err, "sampler: every logit is -inf");
    double S = 0.0;
    for (int r = 0; r < n_ranks; r++)
        if (all_stats[r].raw_sum > 0.0) S += all_stats[r].raw_sum * exp(all_stats[r].raw_max - gmax);
    double log_z = gmax + log(S);

    /* Top logprobs. */
    int32_t n_top = p->n_top_logprobs < n_vocab ? p->n_top_logprobs : n_vocab;
    if (n_top > 0) {
        sampler_cand buf[SAMPLER_MAX_TOP_LOGPROBS];
        topk t = {buf, 0, n_top, 1};
        for (int r = 0; r < n_ranks; r++)
            for (int32_t i = 0; i < all_stats[r].n_top; i++) topk_push(&t, all_stats[r].top_raw[i]);
        topk_sort(&t);
        out->n_top = t.n;
        for (int32_t i = 0; i < t.n; i++) {
            out->top_ids[i] = buf[i].id;
            out->top_logprobs[i] = (float)((double)buf[i].raw - log_z);
        }
    }

    sampler_cand chosen = {-1, -INFINITY, -INFINITY};
    double T = p->temperature;
    if (pure_temperature(p)) {
        double best = -INFINITY;
        int found = 0;
        for (int r = 0; r < n_ranks; r++) {
            if (!all_stats[r].gumbel_valid) continue;
            const sampler_cand *g = &all_stats[r].gumbel;
            double sc = gumbel_score(p, step, g->id, g->logit);
            if (!found || sc > best || (sc == best && g->id < chosen.id)) {
                best = sc;
                chosen = *g;
                found = 1;
            }
        }
        if (!found) return st_errf(err, "sampler: every penalized logit is -inf");
    } else {
        /* Union of the ranks' candidates, sorted. */
        int32_t n_all = 0;
        for (int r = 0; r < n_ranks; r++) n_all += all_stats[r].n_cands;
        if (n_all < 1) return st_errf(err, "sampler merge: no candidates");
        sampler_cand *u = malloc((size_t)n_all * sizeof *u);
        if (!u) return st_errf(err, "sampler merge: out of memory");
        int32_t k = 0;
        for (int r = 0; r < n_ranks; r++)
            for (int32_t i = 0; i < all_stats[r].n_cands; i++) {
                sampler_cand c = all_cands[(size_t)r * (size_t)max_cands + (size_t)i];
                if (c.id < all_stats[r].lo || c.id >= all_stats[r].hi || isnan(c.logit) || isnan(c.raw)) {
                    free(u);
                    return st_errf(err, "sampler merge: rank %d sent a bad candidate (id %d)", r, (int)c.id);
                }
                u[k++] = c;
            }
        qsort(u, (size_t)n_all, sizeof *u, cmp_logit);

        /* Positions [0, exact_len) of u are the true global order: up to and
         * including the last candidate of the first rank that sent less than
         * its whole slice. */
        int32_t exact_len = TRUNC_NONE;
        for (int r = 0; r < n_ranks; r++) {
            const sampler_local_stats *s = &all_stats[r];
            if (s->n_cands == s->hi - s->lo) continue;
            if (s->n_cands == 0) {
                exact_len = 0;
                continue;
            }
            sampler_cand last = all_cands[(size_t)r * (size_t)max_cands + (size_t)(s->n_cands - 1)];
            for (int32_t i = 0; i < n_all; i++)
                if (u[i].id == last.id) {
                    if (i + 1 < exact_len) exact_len = i + 1;
                    break;
                }
        }

        int32_t pick;
        if (T <= 0.0) {
            pick = 0;
            if (exact_len < 1) out->truncated = 1;
        } else if (p->top_k > 0) {
            int32_t nk = p->top_k < n_all ? p->top_k : n_all;
            if ((p->top_k > n_all && exact_len != TRUNC_NONE) || nk > exact_len) out->truncated = 1;
            if (u[0].logit == -INFINITY) {
                free(u);
                return st_errf(err, "sampler: every penalized logit is -inf");
            }
            double zmax = u[0].logit, zsum = 0.0;
            for (int32_t i = 0; i < nk; i++) zsum += exp(((double)u[i].logit - zmax) / T);
            pick = filter_and_draw(p, u, nk, TRUNC_NONE, zmax, zsum, step, &out->truncated);
        } else {
            double zmax = -INFINITY, zsum = 0.0;
            for (int r = 0; r < n_ranks; r++)
                if (all_stats[r].pen_sum > 0.0 && all_stats[r].pen_max > zmax) zmax = all_stats[r].pen_max;
            for (int r = 0; r < n_ranks; r++)
                if (all_stats[r].pen_sum > 0.0)
                    zsum += all_stats[r].pen_sum * exp((all_stats[r].pen_max - zmax) / T);
            if (!(zsum > 0.0)) {
                free(u);
                return st_errf(err, "sampler: every penalized logit is -inf");
            }
            pick = filter_and_draw(p, u, n_all, exact_len, zmax, zsum, step, &out->truncated);
        }
        chosen = u[pick];
        free(u);
    }
    if (chosen.logit == -INFINITY && T > 0.0) return st_errf(err, "sampler: every penalized logit is -inf");
    out->id = chosen.id;
    out->logprob = (float)((double)chosen.raw - log_z);
    return 0;
}

/* ------------------------------------------------------------ full row */

/* How many top candidates top-p / min-p need on this row: a histogram of
 * the tempered log-probabilities in 0.25-nat buckets (as llama.cpp's top-p
 * bucket sort), through the bucket where the mass crosses top_p plus the
 * next one; for min-p, the count that passes plus one. Only a first guess:
 * the caller still grows it if the merge reports a cut. */
static int estimate_cands(const sampler_params *p, const float *logits, int32_t n,
                          const sampler_history *h, int32_t *m_out, st_err *err) {
    enum { NB = 160 };
    const double width = 0.25;
    float *pen = malloc((size_t)n * sizeof *pen);
    if (!pen) return st_errf(err, "sampler: out of memory (%d logits)", (int)n);
    memcpy(pen, logits, (size_t)n * sizeof *pen);
    if (sampler_apply_penalties(p, h, pen, 0, n, err) != 0) {
        free(pen);
        return -1;
    }
    float pmax = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        if (pen[i] > pmax) pmax = pen[i];
    double mass[NB + 1] = {0}, T = p->temperature, thr = p->min_p > 0.0f ? log((double)p->min_p) : 0.0;
    int32_t cnt[NB + 1] = {0}, n_minp = 0;
    for (int32_t i = 0; i < n; i++) {
        double x = ((double)pen[i] - (double)pmax) / T; /* <= 0, or -inf/NaN when masked */
        if (!(x > -(double)NB * width)) {
            cnt[NB]++;
            if (x > -INFINITY) mass[NB] += exp(x);
        } else {
            int b = (int)(-x / width);
            if (b >= NB) b = NB - 1;
            cnt[b]++;
            mass[b] += exp(x);
        }
        n_minp += x >= thr;
    }
    free(pen);
    int64_t m = n;
    if (p->top_p < 1.0f) {
        double z = 0.0, cum = 0.0;
        int64_t count = 0;
        for (int b = 0; b <= NB; b++) z += mass[b];
        for (int b = 0; b <= NB; b++) {
            cum += mass[b];
            count += cnt[b];
            if (cum >= (double)p->top_p * z) {
                if (b < NB) count += cnt[b + 1];
                m = count;
                break;
            }
        }
    }
    if (p->min_p > 0.0f && (int64_t)n_minp + 1 < m) m = n_minp + 1;
    m += 8;
    *m_out = (int32_t)(m > n ? n : (m < 1 ? 1 : m));
    return 0;
}

int sampler_sample(const sampler_params *p, const float *logits, int32_t n_vocab,
                   const sampler_history *h, uint64_t step, sampler_token_info *out, st_err *err) {
    if (sampler_params_validate(p, err) != 0) return -1;
    if (n_vocab < 1) return st_errf(err, "sampler: n_vocab must be >= 1, got %d", (int)n_vocab);
    if (!logits || !out) return st_errf(err, "sampler: NULL logits or result");
    /* One rank owning the whole row. When top-p/min-p cut at the candidate
     * cap, grow the cap (x8) until they do not: the row path is exact. */
    int32_t m = sampler_tp_max_cands(p);
    if (p->temperature > 0.0f && p->top_k == 0 && !pure_temperature(p)) {
        if (estimate_cands(p, logits, n_vocab, h, &m, err) != 0) return -1;
    }
    if (m > n_vocab) m = n_vocab;
    for (;;) {
        sampler_cand *c = malloc((size_t)m * sizeof *c);
        if (!c) return st_errf(err, "sampler: out of memory");
        sampler_local_stats st;
        int rc = sampler_local_candidates(p, logits, 0, n_vocab, h, step, c, m, &st, err);
        if (rc == 0) rc = sampler_merge_pick(p, c, m, &st, 1, step, out, err);
        free(c);
        if (rc != 0) return -1;
        if (!out->truncated || m >= n_vocab) break;
        m = m > n_vocab / 8 ? n_vocab : m * 8;
    }
    out->truncated = 0;
    return 0;
}

/* ------------------------------------------------------------ blobs */

size_t sampler_tp_blob_bytes(int32_t max_cands) {
    if (max_cands < 1) max_cands = 1;
    size_t b = sizeof(sampler_local_stats) + (size_t)max_cands * sizeof(sampler_cand);
    return (b + 7) & ~(size_t)7;
}

int sampler_tp_local_blob(const sampler_params *p, const float *logits_slice, int32_t lo,
                          int32_t hi, const sampler_history *h, uint64_t step, int32_t max_cands,
                          void *blob, st_err *err) {
    if (!blob || max_cands < 1) return st_errf(err, "sampler: bad blob arguments");
    memset(blob, 0, sampler_tp_blob_bytes(max_cands));
    sampler_local_stats st;
    sampler_cand *c = (sampler_cand *)((char *)blob + sizeof st);
    if (sampler_local_candidates(p, logits_slice, lo, hi, h, step, c, max_cands, &st, err) != 0) return -1;
    memcpy(blob, &st, sizeof st);
    return 0;
}

int sampler_tp_merge_blobs(const sampler_params *p, const void *blobs, int n_ranks,
                           int32_t max_cands, uint64_t step, sampler_token_info *out, st_err *err) {
    if (!blobs || n_ranks < 1 || max_cands < 1) return st_errf(err, "sampler merge: bad blob arguments");
    size_t bb = sampler_tp_blob_bytes(max_cands);
    sampler_local_stats *st = malloc((size_t)n_ranks * sizeof *st);
    sampler_cand *c = malloc((size_t)n_ranks * (size_t)max_cands * sizeof *c);
    if (!st || !c) {
        free(st);
        free(c);
        return st_errf(err, "sampler merge: out of memory");
    }
    for (int r = 0; r < n_ranks; r++) {
        const char *b = (const char *)blobs + (size_t)r * bb;
        memcpy(&st[r], b, sizeof *st);
        memcpy(&c[(size_t)r * (size_t)max_cands], b + sizeof *st, (size_t)max_cands * sizeof *c);
    }
    int rc = sampler_merge_pick(p, c, max_cands, st, n_ranks, step, out, err);
    free(st);
    free(c);
    return rc;
}
