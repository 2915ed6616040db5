/* sched.c — queue, sequence states, KV block tables and micro-batch formation.
 * See sched.h for the policy. */
#include "coordinator/serve/sched.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct seq {
    uint64_t id;
    void *user;
    enum sched_state state;
    int32_t *tokens;     /* prompt, then generated ids */
    int n_prompt, n_tokens, cap;
    int n_computed;      /* positions whose KV the stages hold */
    int max_new, n_gen;
    int32_t *blocks;     /* block table: blocks[i] holds positions [i*bs, (i+1)*bs) */
    int32_t n_blocks, cap_blocks;
    bm_hash *hashes;     /* chain hashes of the first n_hashes full blocks of tokens */
    int n_hashes, cap_hashes;
    int n_published;     /* blocks [0, n_published) published (or mapped from the cache) */
    bool in_flight, cancelled;
    bool preempted;      /* waiting again after a preemption */
    struct seq *prev, *next;
} seq;

typedef struct seq_list {
    seq *head, *tail;
    int n;
} seq_list;

/* One in-flight micro-batch slot with its own buffers. */
typedef struct slot {
    bool used;
    sched_batch batch;
    sched_slice *slices;
    seq **owners;        /* owners[i] is the sequence of slices[i] */
    int cap_slices;
    int32_t *tokens, *blocks;
    int cap_tokens, cap_blocks;
} slot;

struct sched {
    sched_config cfg;
    block_manager *kv;
    int32_t bs, watermark;   /* block size; blocks kept free at admission (1% of the pool) */
    seq_list waiting, running;
    int n_waiting_preempted; /* of waiting */
    slot *slots;
    int n_inflight;
    uint64_t next_seq_id, next_batch_id;
    sched_event *events;
    int cap_events;
    uint64_t batches_launched, tokens_launched, prefill_tokens;
    uint64_t preemptions, prefix_query_tokens, prefix_hit_tokens;
    int32_t *verify_owners; /* sched_verify's scratch: n_blocks counts */
};

#ifndef NDEBUG
/* Debug and Asan builds: the invariant check after every step (sched.h). */
static void debug_verify(const sched *s, const char *where) {
    char msg[256];
    if (sched_verify(s, msg, sizeof msg) != 0) {
        fprintf(stderr, "sched: KV block invariant broken after %s: %s\n", where, msg);
        abort();
    }
}
#define DEBUG_VERIFY(s, where) debug_verify((s), (where))
#else
#define DEBUG_VERIFY(s, where) ((void)0)
#endif

static void list_push(seq_list *l, seq *q) {
    q->prev = l->tail;
    q->next = NULL;
    if (l->tail)
        l->tail->next = q;
    else
        l->head = q;
    l->tail = q;
    l->n++;
}

static void list_push_front(seq_list *l, seq *q) {
    q->prev = NULL;
    q->next = l->head;
    if (l->head)
        l->head->prev = q;
    else
        l->tail = q;
    l->head = q;
    l->n++;
}

static void list_remove(seq_list *l, seq *q) {
    if (q->prev)
        q->prev->next = q->next;
    else
        l->head = q->next;
    if (q->next)
        q->next->prev = q->prev;
    else
        l->tail = q->prev;
    q->prev = q->next = NULL;
    l->n--;
}

sched *sched_create(const sched_config *cfg, block_manager *kv, st_err *err) {
    sched_config c = *cfg;
    if (!kv) return (void)st_errf(err, "sched: no KV allocator"), NULL;
    if (c.n_stages < 1) return (void)st_errf(err, "sched: n_stages %d < 1", c.n_stages), NULL;
    if (c.max_inflight == 0) c.max_inflight = c.n_stages;
    if (c.max_inflight < c.n_stages || c.max_inflight > 4096)
        return (void)st_errf(err, "sched: max_inflight %d outside [n_stages=%d, 4096]",
                             c.max_inflight, c.n_stages),
               NULL;
    if (c.headroom_blocks < 0 || c.headroom_blocks > 1024)
        return (void)st_errf(err, "sched: headroom_blocks %d outside [0, 1024]", c.headroom_blocks),
               NULL;
    if (c.max_queue < 1 || c.max_seqs < 1 || c.prefill_chunk < 1 || c.max_batch_tokens < 1 ||
        c.n_ctx < 2)
        return (void)st_errf(err,
                             "sched: max_queue, max_seqs, prefill_chunk, max_batch_tokens must "
                             "be >= 1 and n_ctx >= 2 (got %d, %d, %d, %d, %d)",
                             c.max_queue, c.max_seqs, c.prefill_chunk, c.max_batch_tokens,
                             c.n_ctx),
               NULL;
    sched *s = calloc(1, sizeof *s);
    if (!s) return (void)st_errf(err, "sched: out of memory"), NULL;
    s->cfg = c;
    s->kv = kv;
    s->bs = bm_block_size(kv);
    s->watermark = bm_n_blocks(kv) / 100; /* vLLM: int(0.01 * num_blocks) */
    s->slots = calloc((size_t)c.max_inflight, sizeof *s->slots);
    s->verify_owners = calloc((size_t)bm_n_blocks(kv), sizeof *s->verify_owners);
    if (!s->slots || !s->verify_owners) {
        free(s->slots);
        free(s->verify_owners);
        free(s);
        return (void)st_errf(err, "sched: out of memory"), NULL;
    }
    s->next_seq_id = 1;
    s->next_batch_id = 1;
    return s;
}

/* Gives q's blocks back, last first (so its tail is evicted before its
 * prefix, as vLLM does). */
static void release_blocks(sched *s, seq *q) {
    for (int32_t i = q->n_blocks; i-- > 0;) bm_release(s->kv, q->blocks[i]);
    q->n_blocks = 0;
    q->n_published = 0;
}

static void seq_free(sched *s, seq *q) {
    release_blocks(s, q);
    free(q->blocks);
    free(q->hashes);
    free(q->tokens);
    free(q);
}

static void waiting_remove(sched *s, seq *q) {
    list_remove(&s->waiting, q);
    if (q->preempted) s->n_waiting_preempted--;
    q->preempted = false;
}

/* Removes a running sequence and frees its blocks and reservation. */
static void running_drop(sched *s, seq *q) {
    list_remove(&s->running, q);
    seq_free(s, q);
}

void sched_destroy(sched *s) {
    if (!s) return;
    while (s->waiting.head) {
        seq *q = s->waiting.head;
        waiting_remove(s, q);
        seq_free(s, q);
    }
    while (s->running.head) running_drop(s, s->running.head);
    for (int i = 0; i < s->cfg.max_inflight; i++) {
        slot *sl = &s->slots[i];
        free(sl->slices);
        free(sl->owners);
        free(sl->tokens);
        free(sl->blocks);
    }
    free(s->slots);
    free(s->events);
    free(s->verify_owners);
    free(s);
}

int sched_add(sched *s, const int32_t *prompt, int n_prompt, int max_new, void *user,
              uint64_t *id_out, st_err *err) {
    if (n_prompt < 1) return st_errf(err, "the prompt has no tokens"), SCHED_EINVAL;
    if (max_new < 1) return st_errf(err, "max_tokens must be >= 1 (got %d)", max_new), SCHED_EINVAL;
    if ((int64_t)n_prompt + max_new > s->cfg.n_ctx)
        return st_errf(err,
                       "this model's maximum context length is %d tokens; the prompt has %d and "
                       "max_tokens is %d",
                       s->cfg.n_ctx, n_prompt, max_new),
               SCHED_EINVAL;
    int32_t need = bm_blocks_for(s->kv, (int64_t)n_prompt + max_new);
    if (need > bm_n_blocks(s->kv))
        return st_errf(err, "the request needs %d KV blocks but the cluster has %d",
                       (int)need, (int)bm_n_blocks(s->kv)),
               SCHED_EINVAL;
    int n_new_waiting = s->waiting.n - s->n_waiting_preempted;
    if (n_new_waiting >= s->cfg.max_queue)
        return st_errf(err, "the request queue is full (%d waiting)", n_new_waiting), SCHED_EFULL;
    seq *q = calloc(1, sizeof *q);
    int cap = n_prompt + max_new;
    if (q) q->tokens = malloc(sizeof(int32_t) * (size_t)cap);
    if (!q || !q->tokens) {
        free(q);
        return st_errf(err, "sched: out of memory"), SCHED_EINVAL;
    }
    memcpy(q->tokens, prompt, sizeof(int32_t) * (size_t)n_prompt);
    q->id = s->next_seq_id++;
    q->user = user;
    q->state = SCHED_WAITING;
    q->n_prompt = q->n_tokens = n_prompt;
    q->cap = cap;
    q->max_new = max_new;
    list_push(&s->waiting, q);
    if (id_out) *id_out = q->id;
    return 0;
}

static int grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return 0;
    int n = *cap ? *cap : 16;
    while (n < need) n *= 2;
    void *np = realloc(*p, elem * (size_t)n);
    if (!np) return -1;
    *p = np;
    *cap = n;
    return 0;
}

/* q's chain hashes up to n full blocks of its tokens (computed once). */
static int ensure_hashes(sched *s, seq *q, int n) {
    if (n <= q->n_hashes) return 0;
    if (grow((void **)&q->hashes, &q->cap_hashes, n, sizeof *q->hashes) != 0) return -1;
    for (int i = q->n_hashes; i < n; i++) {
        if (bm_chain_hash(s->kv, i ? &q->hashes[i - 1] : NULL, q->tokens + (size_t)i * (size_t)s->bs,
                          &q->hashes[i]) != 0)
            return -1;
        q->n_hashes = i + 1;
    }
    return 0;
}

/* The running list stays in arrival order (sequence ids), so a resumed
 * sequence keeps its place: the newest arrivals are preempted first, never
 * the same old sequence again and again (vLLM's FCFS priority). */
static void running_insert(sched *s, seq *q) {
    seq *after = s->running.tail;
    while (after && after->id > q->id) after = after->prev;
    if (after == s->running.tail) {
        list_push(&s->running, q);
        return;
    }
    q->prev = after;
    q->next = after ? after->next : s->running.head;
    if (after)
        after->next = q;
    else
        s->running.head = q;
    q->next->prev = q;
    s->running.n++;
}

/* Admits waiting sequences (sched.h: policy), mapping their cached prefix. */
static void admit(sched *s) {
    while (s->waiting.head && s->running.n < s->cfg.max_seqs) {
        seq *q = s->waiting.head;
        int32_t total = bm_blocks_for(s->kv, q->n_tokens);
        if (grow((void **)&q->blocks, &q->cap_blocks, total, sizeof *q->blocks) != 0) break;
        /* The cached prefix: full blocks ending before the last token, which
         * is always computed (its logits give the next token). */
        int32_t hits = 0, hits_cached = 0;
        if (bm_prefix_caching(s->kv)) {
            int max_hit = (q->n_tokens - 1) / s->bs;
            if (ensure_hashes(s, q, max_hit) != 0) max_hit = 0;
            for (; hits < max_hit; hits++) {
                int32_t b = bm_find(s->kv, &q->hashes[hits], q->tokens + (size_t)hits * (size_t)s->bs);
                if (b < 0) break;
                q->blocks[hits] = b;
                if (bm_refcount(s->kv, b) == 0) hits_cached++; /* taken from the free count */
            }
        }
        int32_t need = total - hits + hits_cached;
        int32_t watermark =
            s->running.n > 0 ? s->watermark + s->running.n * s->cfg.headroom_blocks : 0;
        if (need + watermark > bm_n_free(s->kv)) break; /* FIFO: no overtaking */
        for (int32_t i = 0; i < hits; i++) bm_ref(s->kv, q->blocks[i]);
        for (int32_t i = hits; i < total; i++) q->blocks[i] = bm_alloc(s->kv);
        q->n_blocks = total;
        q->n_published = hits;
        q->n_computed = hits * s->bs;
        s->prefix_query_tokens += (uint64_t)q->n_tokens;
        s->prefix_hit_tokens += (uint64_t)hits * (uint64_t)s->bs;
        waiting_remove(s, q);
        q->state = SCHED_PREFILL;
        running_insert(s, q);
    }
}

/* Preemption by recompute: q (running, not in flight) releases its blocks
 * and goes back to the front of the queue with all its tokens. */
static void preempt(sched *s, seq *q) {
    list_remove(&s->running, q);
    release_blocks(s, q);
    q->n_computed = 0;
    q->state = SCHED_WAITING;
    q->preempted = true;
    s->n_waiting_preempted++;
    list_push_front(&s->waiting, q);
    s->preemptions++;
}

/* Tokens a sequence would send now (0 = nothing to do). */
static int want_tokens(const sched *s, const seq *q) {
    int left = q->n_tokens - q->n_computed;
    return left < s->cfg.prefill_chunk ? left : s->cfg.prefill_chunk;
}

/* Gives every idle running sequence the blocks its next slice needs, in
 * admission order, preempting the newest idle ones when the pool is out
 * (sched.h: policy). A sequence that cannot get them now is skipped by the
 * batch (its table stays short). */
static bool grow_tables(sched *s) {
    uint64_t preempted = s->preemptions;
    seq *q = s->running.head;
    while (q) {
        int n = q->in_flight ? 0 : want_tokens(s, q);
        int32_t need = n > 0 ? bm_blocks_for(s->kv, (int64_t)q->n_computed + n) - q->n_blocks : 0;
        if (need > 0 && grow((void **)&q->blocks, &q->cap_blocks, q->n_blocks + need,
                             sizeof *q->blocks) != 0)
            need = 0;
        bool self = false;
        while (need > 0) {
            int32_t b = bm_alloc(s->kv);
            if (b >= 0) {
                q->blocks[q->n_blocks++] = b;
                need--;
                continue;
            }
            seq *v = s->running.tail;
            while (v != q && v->in_flight) v = v->prev;
            if (v != q) {
                preempt(s, v);
                continue;
            }
            if (s->n_inflight > 0) break; /* their batches free or preempt later */
            preempt(s, q);                /* the newest, and nothing else can give way */
            self = true;
            break;
        }
        q = self ? NULL : q->next;
    }
    return s->preemptions != preempted;
}

/* Appends q's slice of n tokens to the slot's batch. -1 on out of memory or
 * when q's table does not cover them yet (grow_tables could not). */
static int add_slice(sched *s, slot *sl, seq *q, int n) {
    int32_t pos = q->n_computed;
    if (bm_blocks_for(s->kv, (int64_t)pos + n) > q->n_blocks) return -1;
    sched_batch *b = &sl->batch;
    int i = b->n_seqs;
    if (grow((void **)&sl->slices, &sl->cap_slices, i + 1, sizeof *sl->slices) ||
        grow((void **)&sl->tokens, &sl->cap_tokens, b->n_tokens + n, sizeof *sl->tokens))
        return -1;
    int cap_owners = sl->cap_slices;
    seq **no = realloc(sl->owners, sizeof *no * (size_t)cap_owners);
    if (!no) return -1;
    sl->owners = no;
    memcpy(sl->tokens + b->n_tokens, q->tokens + pos, sizeof(int32_t) * (size_t)n);
    sched_slice *x = &sl->slices[i];
    memset(x, 0, sizeof *x);
    x->seq_id = q->id;
    x->user = q->user;
    x->pos = pos;
    x->n_tokens = n;
    x->n_blocks = q->n_blocks;
    x->prefill = q->state == SCHED_PREFILL;
    x->sample = pos + n == q->n_tokens;
    sl->owners[i] = q;
    b->n_tokens += n;
    b->n_seqs = i + 1;
    return 0;
}

const sched_batch *sched_next_microbatch(sched *s) {
    if (s->n_inflight >= s->cfg.max_inflight) return NULL;
    /* The running first, then the waiting, and none of those in a step that
     * had to preempt (vLLM's order): what was just freed is for the running. */
    if (!grow_tables(s)) admit(s);
    DEBUG_VERIFY(s, "growth and admission");
    int idle = 0, active = 0;
    for (seq *q = s->running.head; q; q = q->next) {
        if (!q->in_flight && want_tokens(s, q) > 0) idle++;
        if (q->in_flight || want_tokens(s, q) > 0) active++;
    }
    if (idle == 0) return NULL;
    int free_slots = s->cfg.max_inflight - s->n_inflight;
    int take = (idle + free_slots - 1) / free_slots;
    /* Balance: no batch above its share of the active sequences, so that
     * uneven groups (a lone first request, then the rest) even out. */
    int share = (active + s->cfg.max_inflight - 1) / s->cfg.max_inflight;
    if (take > share) take = share;
    slot *sl = NULL;
    for (int i = 0; i < s->cfg.max_inflight; i++)
        if (!s->slots[i].used) {
            sl = &s->slots[i];
            break;
        }
    if (!sl) return NULL;
    sl->batch.n_seqs = 0;
    sl->batch.n_tokens = 0;
    int budget = s->cfg.max_batch_tokens;
    /* Decode steps first (latency), then prefill chunks, in admission order. */
    for (int pass = 0; pass < 2; pass++) {
        for (seq *q = s->running.head; q && sl->batch.n_seqs < take && budget > 0; q = q->next) {
            if (q->in_flight) continue;
            if ((pass == 0) != (q->state == SCHED_DECODE)) continue;
            int n = want_tokens(s, q);
            if (n <= 0) continue;
            if (n > budget) n = budget;
            if (add_slice(s, sl, q, n) != 0) continue;
            budget -= n;
        }
    }
    if (sl->batch.n_seqs == 0) return NULL;
    /* Block ids of all slices, now that the tables are final. */
    int total_blocks = 0;
    for (int i = 0; i < sl->batch.n_seqs; i++) total_blocks += sl->slices[i].n_blocks;
    if (grow((void **)&sl->blocks, &sl->cap_blocks, total_blocks > 0 ? total_blocks : 1,
             sizeof *sl->blocks) != 0)
        return NULL;
    int off = 0, toff = 0;
    for (int i = 0; i < sl->batch.n_seqs; i++) {
        sched_slice *x = &sl->slices[i];
        seq *q = sl->owners[i];
        memcpy(sl->blocks + off, q->blocks, sizeof(int32_t) * (size_t)x->n_blocks);
        if (x->prefill) s->prefill_tokens += (uint64_t)x->n_tokens;
        x->block_table = sl->blocks + off;
        x->tokens = sl->tokens + toff;
        off += x->n_blocks;
        toff += x->n_tokens;
        q->in_flight = true;
    }
    sl->used = true;
    sl->batch.id = s->next_batch_id++;
    sl->batch.seqs = sl->slices;
    sl->batch.tokens = sl->tokens;
    s->n_inflight++;
    s->batches_launched++;
    s->tokens_launched += (uint64_t)sl->batch.n_tokens;
    return &sl->batch;
}

/* Every stage has now computed q's KV up to n_computed: its full blocks
 * become findable in the prefix cache. */
static void publish_computed(sched *s, seq *q) {
    if (!bm_prefix_caching(s->kv)) return;
    int full = q->n_computed / s->bs;
    if (full > q->n_blocks) full = q->n_blocks;
    if (full <= q->n_published || ensure_hashes(s, q, full) != 0) return;
    for (int i = q->n_published; i < full; i++)
        bm_publish(s->kv, q->blocks[i], &q->hashes[i], q->tokens + (size_t)i * (size_t)s->bs);
    q->n_published = full;
}

static slot *find_slot(sched *s, uint64_t batch_id) {
    for (int i = 0; i < s->cfg.max_inflight; i++)
        if (s->slots[i].used && s->slots[i].batch.id == batch_id) return &s->slots[i];
    return NULL;
}

static void release_slot(sched *s, slot *sl) {
    sl->used = false;
    sl->batch.n_seqs = 0;
    s->n_inflight--;
}

int sched_on_tokens(sched *s, uint64_t batch_id, const int32_t *sampled, int n_sampled,
                    const sched_event **events, int *n_events, st_err *err) {
    *n_events = 0;
    if (events) *events = s->events;
    slot *sl = find_slot(s, batch_id);
    if (!sl) return st_errf(err, "sched: batch %llu is not in flight", (unsigned long long)batch_id);
    int n = sl->batch.n_seqs;
    if (n_sampled != n)
        return st_errf(err, "sched: batch %llu has %d sequences but %d sampled ids came back",
                       (unsigned long long)batch_id, n, n_sampled);
    if (grow((void **)&s->events, &s->cap_events, n, sizeof *s->events) != 0)
        return st_errf(err, "sched: out of memory");
    if (events) *events = s->events;
    int ne = 0;
    for (int i = 0; i < n; i++) {
        const sched_slice *x = &sl->slices[i];
        seq *q = sl->owners[i];
        q->in_flight = false;
        if (q->cancelled) {
            running_drop(s, q);
            continue;
        }
        q->n_computed = x->pos + x->n_tokens;
        publish_computed(s, q);
        if (!x->sample) continue;
        sched_event *ev = &s->events[ne++];
        ev->seq_id = q->id;
        ev->user = q->user;
        ev->token = sampled[i];
        ev->finish = SCHED_NOT_FINISHED;
        if (sampled[i] < 0) {
            ev->token = -1;
            ev->n_generated = q->n_gen;
            ev->finish = SCHED_FINISH_ERROR;
            running_drop(s, q);
            continue;
        }
        q->tokens[q->n_tokens++] = sampled[i];
        q->n_gen++;
        q->state = SCHED_DECODE;
        ev->n_generated = q->n_gen;
        if (s->cfg.eos_id >= 0 && sampled[i] == s->cfg.eos_id)
            ev->finish = SCHED_FINISH_STOP;
        else if (q->n_gen >= q->max_new || q->n_tokens >= s->cfg.n_ctx)
            ev->finish = SCHED_FINISH_LENGTH;
        if (ev->finish != SCHED_NOT_FINISHED) running_drop(s, q);
    }
    release_slot(s, sl);
    *n_events = ne;
    DEBUG_VERIFY(s, "a batch's tokens");
    return 0;
}

int sched_abort_batch(sched *s, uint64_t batch_id, st_err *err) {
    slot *sl = find_slot(s, batch_id);
    if (!sl) return st_errf(err, "sched: batch %llu is not in flight", (unsigned long long)batch_id);
    for (int i = 0; i < sl->batch.n_seqs; i++) {
        seq *q = sl->owners[i];
        q->in_flight = false;
        if (q->cancelled) running_drop(s, q);
    }
    release_slot(s, sl);
    DEBUG_VERIFY(s, "a batch abort");
    return 0;
}

static seq *find_seq(const seq_list *l, uint64_t id) {
    for (seq *q = l->head; q; q = q->next)
        if (q->id == id) return q;
    return NULL;
}

int sched_cancel(sched *s, uint64_t seq_id) {
    seq *q = find_seq(&s->waiting, seq_id);
    if (q) {
        waiting_remove(s, q);
        seq_free(s, q);
        return 0;
    }
    q = find_seq(&s->running, seq_id);
    if (!q || q->cancelled) return -1;
    if (q->in_flight)
        q->cancelled = true; /* freed when its batch comes back or is aborted */
    else
        running_drop(s, q);
    DEBUG_VERIFY(s, "a cancel");
    return 0;
}

void sched_stats_get(const sched *s, sched_stats *out) {
    memset(out, 0, sizeof *out);
    out->n_waiting = s->waiting.n;
    out->n_running = s->running.n;
    out->n_inflight = s->n_inflight;
    out->n_preempted_waiting = s->n_waiting_preempted;
    out->n_blocks = bm_n_blocks(s->kv);
    out->blocks_free = bm_n_free(s->kv);
    out->blocks_cached = bm_n_evictable(s->kv);
    out->blocks_used = out->n_blocks - out->blocks_free;
    out->batches_launched = s->batches_launched;
    out->tokens_launched = s->tokens_launched;
    out->prefill_tokens = s->prefill_tokens;
    out->preemptions = s->preemptions;
    out->prefix_query_tokens = s->prefix_query_tokens;
    out->prefix_hit_tokens = s->prefix_hit_tokens;
    out->evictions = bm_evictions(s->kv);
}

int64_t sched_kv_capacity_tokens(const sched *s) { return (int64_t)bm_n_blocks(s->kv) * s->bs; }

void sched_reset_prefix_cache(sched *s) { bm_reset_cache(s->kv); }

int sched_verify(const sched *s, char *msg, size_t cap) {
    int32_t nb = bm_n_blocks(s->kv);
    /* A scratch array kept with the scheduler: this runs after every step
     * in Debug/Asan builds, where a heap block per step would pile up in
     * ASan's quarantine. */
    int32_t *owners = s->verify_owners;
    if (!owners) return snprintf(msg, cap, "out of memory"), -1;
    memset(owners, 0, sizeof *owners * (size_t)nb);
    int rc = 0;
    for (const seq *q = s->waiting.head; q && rc == 0; q = q->next)
        if (q->n_blocks != 0)
            rc = -1, snprintf(msg, cap, "waiting seq %llu holds %d blocks", (unsigned long long)q->id,
                              (int)q->n_blocks);
    for (const seq *q = s->running.head; q && rc == 0; q = q->next) {
        if (q->n_blocks < bm_blocks_for(s->kv, q->n_computed)) {
            rc = -1;
            snprintf(msg, cap, "seq %llu computed %d positions but holds only %d blocks",
                     (unsigned long long)q->id, q->n_computed, (int)q->n_blocks);
            break;
        }
        for (int32_t i = 0; i < q->n_blocks; i++) {
            int32_t b = q->blocks[i];
            if (b < 0 || b >= nb) {
                rc = -1;
                snprintf(msg, cap, "seq %llu has block id %d out of range", (unsigned long long)q->id,
                         (int)b);
                break;
            }
            for (int32_t j = 0; j < i; j++)
                if (q->blocks[j] == b) {
                    rc = -1;
                    snprintf(msg, cap, "seq %llu holds block %d twice", (unsigned long long)q->id, (int)b);
                }
            owners[b]++;
        }
    }
    if (rc == 0) rc = bm_verify(s->kv, owners, msg, cap);
    return rc;
}

int sched_seq_info_get(const sched *s, uint64_t seq_id, sched_seq_info *out) {
    const seq *q = find_seq(&s->waiting, seq_id);
    if (!q) q = find_seq(&s->running, seq_id);
    if (!q) return -1;
    out->state = q->state;
    out->n_prompt = q->n_prompt;
    out->n_computed = q->n_computed;
    out->n_generated = q->n_gen;
    out->n_blocks = q->n_blocks;
    out->in_flight = q->in_flight;
    out->cancelled = q->cancelled;
    return 0;
}
