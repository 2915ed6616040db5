/* sched.c — queue, sequence states, KV block tables and micro-batch formation.
 * See sched.h for the policy. */
#include "coordinator/serve/sched.h"

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
    int32_t reserve;     /* worst-case blocks, held from admission to the end */
    kv_table table;
    bool in_flight, cancelled;
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
    kv_alloc *kv;
    seq_list waiting, running;
    slot *slots;
    int n_inflight;
    uint64_t next_seq_id, next_batch_id;
    int32_t reserved_unallocated; /* sum over running of reserve - table.n_blocks */
    sched_event *events;
    int cap_events;
    uint64_t batches_launched, tokens_launched;
};

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

sched *sched_create(const sched_config *cfg, kv_alloc *kv, st_err *err) {
    sched_config c = *cfg;
    if (!kv) return (void)st_errf(err, "sched: no KV allocator"), NULL;
    if (c.n_stages < 1) return (void)st_errf(err, "sched: n_stages %d < 1", c.n_stages), NULL;
    if (c.max_inflight == 0) c.max_inflight = c.n_stages;
    if (c.max_inflight < c.n_stages || c.max_inflight > 4096)
        return (void)st_errf(err, "sched: max_inflight %d outside [n_stages=%d, 4096]",
                             c.max_inflight, c.n_stages),
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
    s->slots = calloc((size_t)c.max_inflight, sizeof *s->slots);
    if (!s->slots) {
        free(s);
        return (void)st_errf(err, "sched: out of memory"), NULL;
    }
    s->next_seq_id = 1;
    s->next_batch_id = 1;
    return s;
}

static void seq_free(sched *s, seq *q) {
    if (q->state != SCHED_WAITING) s->reserved_unallocated -= q->reserve - q->table.n_blocks;
    kv_table_release(s->kv, &q->table);
    free(q->table.blocks);
    free(q->tokens);
    free(q);
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
        list_remove(&s->waiting, q);
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
    int32_t need = kv_blocks_for(s->kv, (int64_t)n_prompt + max_new);
    if (need > kv_alloc_n_blocks(s->kv))
        return st_errf(err, "the request needs %d KV blocks but the cluster has %d",
                       (int)need, (int)kv_alloc_n_blocks(s->kv)),
               SCHED_EINVAL;
    if (s->waiting.n >= s->cfg.max_queue)
        return st_errf(err, "the request queue is full (%d waiting)", s->waiting.n), SCHED_EFULL;
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
    q->reserve = need;
    kv_table_init(&q->table);
    list_push(&s->waiting, q);
    if (id_out) *id_out = q->id;
    return 0;
}

static void admit(sched *s) {
    while (s->waiting.head && s->running.n < s->cfg.max_seqs) {
        seq *q = s->waiting.head;
        int32_t avail = kv_alloc_n_free(s->kv) - s->reserved_unallocated;
        if (q->reserve > avail) break; /* FIFO: no overtaking, so nobody starves */
        list_remove(&s->waiting, q);
        q->state = SCHED_PREFILL;
        s->reserved_unallocated += q->reserve;
        list_push(&s->running, q);
    }
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

/* Tokens a sequence would send now (0 = nothing to do). */
static int want_tokens(const sched *s, const seq *q) {
    if (q->state == SCHED_DECODE) return 1;
    int left = q->n_prompt - q->n_computed;
    return left < s->cfg.prefill_chunk ? left : s->cfg.prefill_chunk;
}

/* Appends q's slice of n tokens to the slot's batch. -1 on out of memory or
 * out of blocks (neither should happen: admission reserved the blocks). */
static int add_slice(sched *s, slot *sl, seq *q, int n) {
    int32_t pos = q->n_computed;
    int32_t before = q->table.n_blocks;
    if (kv_table_reserve(s->kv, &q->table, (int64_t)pos + n, NULL) != 0) return -1;
    s->reserved_unallocated -= q->table.n_blocks - before;
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
    x->n_blocks = q->table.n_blocks;
    x->prefill = q->state == SCHED_PREFILL;
    x->sample = q->state == SCHED_DECODE || pos + n == q->n_prompt;
    sl->owners[i] = q;
    b->n_tokens += n;
    b->n_seqs = i + 1;
    return 0;
}

const sched_batch *sched_next_microbatch(sched *s) {
    if (s->n_inflight >= s->cfg.max_inflight) return NULL;
    admit(s);
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
        memcpy(sl->blocks + off, q->table.blocks, sizeof(int32_t) * (size_t)x->n_blocks);
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
        list_remove(&s->waiting, q);
        seq_free(s, q);
        return 0;
    }
    q = find_seq(&s->running, seq_id);
    if (!q || q->cancelled) return -1;
    if (q->in_flight)
        q->cancelled = true; /* freed when its batch comes back or is aborted */
    else
        running_drop(s, q);
    return 0;
}

void sched_stats_get(const sched *s, sched_stats *out) {
    memset(out, 0, sizeof *out);
    out->n_waiting = s->waiting.n;
    out->n_running = s->running.n;
    out->n_inflight = s->n_inflight;
    out->n_blocks = kv_alloc_n_blocks(s->kv);
    out->blocks_free = kv_alloc_n_free(s->kv);
    out->blocks_used = out->n_blocks - out->blocks_free;
    out->batches_launched = s->batches_launched;
    out->tokens_launched = s->tokens_launched;
}

int sched_seq_info_get(const sched *s, uint64_t seq_id, sched_seq_info *out) {
    const seq *q = find_seq(&s->waiting, seq_id);
    if (!q) q = find_seq(&s->running, seq_id);
    if (!q) return -1;
    out->state = q->state;
    out->n_prompt = q->n_prompt;
    out->n_computed = q->n_computed;
    out->n_generated = q->n_gen;
    out->n_blocks = q->table.n_blocks;
    out->in_flight = q->in_flight;
    out->cancelled = q->cancelled;
    return 0;
}
