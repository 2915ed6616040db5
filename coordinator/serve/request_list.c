/* request_list.c — the requests a cluster holds (request_list.h). */
#include "coordinator/serve/request_list.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/serve/seq_sampling.h"

void creq_free(creq *r) {
    if (!r) return;
    seq_sampling_release(&r->req);
    free(r->prompt);
    free(r->gen);
    free(r);
}

void creq_push(creq **head, creq *r) {
    r->prev = NULL;
    r->next = *head;
    if (*head) (*head)->prev = r;
    *head = r;
}

void creq_unlink(creq **head, creq *r) {
    if (r->prev)
        r->prev->next = r->next;
    else if (*head == r)
        *head = r->next;
    if (r->next) r->next->prev = r->prev;
    r->prev = r->next = NULL;
}

creq *creq_find(creq *head, uint64_t id) {
    for (creq *r = head; r; r = r->next)
        if (r->id == id) return r;
    return NULL;
}

void creq_finish(creq **head, creq *r, enum coord_finish why, const char *msg) {
    creq_unlink(head, r);
    r->in_cb = true;
    r->sink.on_finish(r->ctx, why, msg);
    creq_free(r);
}

void creq_fail_all(creq **head, sched *s, const char *msg) {
    while (*head) {
        creq *r = *head;
        if (s) sched_cancel(s, r->id);
        creq_finish(head, r, COORD_FINISH_ERROR, msg);
    }
}

int creq_count(const creq *head, uint64_t *ids, int cap, int64_t *tokens) {
    int n = 0;
    int64_t t = 0;
    for (const creq *r = head; r; r = r->next) {
        if (n < cap && ids) ids[n] = r->id;
        n++;
        t += r->n_prompt + r->n_gen;
    }
    if (tokens) *tokens = t;
    return n;
}

const char *creq_ids_text(const creq *head, char *buf, size_t cap) {
    size_t n = 0;
    int k = 0;
    buf[0] = '\0';
    n += (size_t)snprintf(buf + n, cap - n, "[");
    for (const creq *r = head; r && n + 1 < cap; r = r->next, k++) {
        if (k == 8) {
            n += (size_t)snprintf(buf + n, cap - n, ", ...");
            break;
        }
        if (r->req.request_id[0])
            n += (size_t)snprintf(buf + n, cap - n, "%s%s", k ? ", " : "", r->req.request_id);
        else
            n += (size_t)snprintf(buf + n, cap - n, "%s#%llu", k ? ", " : "", (unsigned long long)r->id);
    }
    if (n + 1 < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

int creq_add_generated(creq *r, int32_t token) {
    if (r->n_gen == r->cap_gen) {
        int cap = r->cap_gen ? r->cap_gen * 2 : 64;
        int32_t *g = realloc(r->gen, sizeof *g * (size_t)cap);
        if (!g) return -1;
        r->gen = g;
        r->cap_gen = cap;
    }
    r->gen[r->n_gen++] = token;
    return 0;
}

int creq_requeue(creq *r, sched *s, int max_new, st_err *err) {
    int n = r->n_prompt + r->n_gen, left = max_new - r->n_gen;
    int32_t *all = malloc(sizeof *all * (size_t)(n ? n : 1));
    int rc = -1;
    if (all && left >= 1 && s) {
        memcpy(all, r->prompt, sizeof *all * (size_t)r->n_prompt);
        if (r->n_gen) memcpy(all + r->n_prompt, r->gen, sizeof *all * (size_t)r->n_gen);
        rc = sched_add(s, all, n, left, r, &r->id, err);
    }
    free(all);
    return rc != 0 ? -1 : 0;
}

int creq_requeue_all(creq **from, sched *from_s, creq **to, sched *to_s, int n_ctx, const char *fail_msg,
                     void (*on_moved)(void *ud, uint64_t old_id, uint64_t new_id), void *ud, int64_t *tokens) {
    int moved = 0;
    int64_t n_tok = 0;
    while (*from) {
        creq *r = *from;
        creq_unlink(from, r);
        if (from_s) sched_cancel(from_s, r->id);
        uint64_t old_id = r->id;
        st_err err = {{0}};
        if (creq_requeue(r, to_s, creq_max_new(&r->req, r->n_prompt, n_ctx, to_s), &err) != 0) {
            if (on_moved) on_moved(ud, old_id, 0);
            r->in_cb = true;
            r->sink.on_finish(r->ctx, COORD_FINISH_ERROR, err.msg[0] ? err.msg : fail_msg);
            creq_free(r);
            continue;
        }
        r->n_failed = 0;
        creq_push(to, r);
        if (on_moved) on_moved(ud, old_id, r->id);
        moved++;
        n_tok += r->n_prompt + r->n_gen;
    }
    if (tokens) *tokens = n_tok;
    return moved;
}

int creq_max_new(const coord_request *q, int n_prompt, int n_ctx, const sched *s) {
    int max_new = q->max_tokens;
    if (!q->max_tokens_auto) return max_new;
    if ((int64_t)n_prompt + max_new > n_ctx) max_new = n_ctx - n_prompt;
    int64_t cap = s ? sched_kv_capacity_tokens(s) : n_ctx;
    if ((int64_t)n_prompt + max_new > cap) max_new = (int)(cap - n_prompt);
    return max_new;
}

int creq_create(const coord_request *req, const coord_sink *sink, void *ctx, uint64_t seed, int n_ctx,
                const sched *s, creq **out, int *max_new_out, st_err *err) {
    *out = NULL;
    if (!req->prompt || req->n_prompt < 1) return st_errf(err, "the prompt has no tokens"), COORD_EINVAL;
    const size_t n = (size_t)req->n_prompt;
    int max_new = creq_max_new(req, (int)n, n_ctx, s);
    if (req->max_tokens_auto && max_new < 1 && (int64_t)n < n_ctx)
        return st_errf(err, "the prompt has %zu tokens but the KV cache holds at most %lld", n,
                       (long long)sched_kv_capacity_tokens(s)),
               COORD_EINVAL;
    if (max_new < 1 || (int64_t)n + max_new > n_ctx)
        return st_errf(err,
                       "This model's maximum context length is %d tokens. However, you requested %lld "
                       "tokens (%zu in the prompt, %d for the completion).",
                       n_ctx, (long long)n + (max_new < 1 ? 1 : max_new), n, max_new < 1 ? 1 : max_new),
               COORD_ECONTEXT;
    creq *r = calloc(1, sizeof *r);
    if (!r || !(r->prompt = malloc(sizeof(int32_t) * n))) {
        creq_free(r);
        return st_errf(err, "out of memory"), COORD_EINTERNAL;
    }
    memcpy(r->prompt, req->prompt, sizeof(int32_t) * n);
    r->n_prompt = req->n_prompt;
    r->req = *req;
    r->req.prompt = r->prompt;
    if (seq_sampling_own(&r->req, err) != 0) {
        creq_free(r);
        return COORD_EINTERNAL;
    }
    r->sink = *sink;
    r->ctx = ctx;
    r->seed = req->has_seed ? req->sampling.seed : seed;
    *out = r;
    *max_new_out = max_new;
    return COORD_OK;
}
