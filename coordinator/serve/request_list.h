/* request_list.h — the engine requests a cluster holds: one record per
 * sequence (its prompt, the tokens generated so far, its sink), kept in a
 * doubly linked list, newest first.
 *
 * A record is the scheduler's `user` (sched.h) for its sequence. The list
 * never calls the scheduler on its own, except where a function says so.
 * Threading: the loop thread only. */
#ifndef STRATA_COORDINATOR_SERVE_REQUEST_LIST_H
#define STRATA_COORDINATOR_SERVE_REQUEST_LIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "coordinator/serve/engine_api.h"
#include "coordinator/serve/sched.h"

/* One request (one sequence). */
typedef struct creq {
    struct creq *prev, *next;
    uint64_t id;       /* the scheduler's sequence id */
    coord_request req; /* req.prompt points to prompt */
    coord_sink sink;
    void *ctx;
    int32_t *prompt;
    int n_prompt;
    int32_t *gen; /* generated tokens (the penalties' history) */
    int n_gen, cap_gen;
    uint64_t seed;
    bool prompt_sent;
    bool scheduled; /* sink.on_scheduled was called (its first batch went out) */
    int n_failed;   /* hold mode: its batches that failed in a row (BatchError) */
    bool in_cb;     /* a sink callback of this request is running */
    bool dead;      /* cancelled from inside a callback: freed after it returns */
} creq;

/* Frees r and what it owns (NULL: nothing). It must be unlinked. */
void creq_free(creq *r);
/* Puts r at the head of *head. */
void creq_push(creq **head, creq *r);
/* Takes r out of *head (it stays allocated). */
void creq_unlink(creq **head, creq *r);
/* The request with sequence id `id`, NULL when none. */
creq *creq_find(creq *head, uint64_t id);
/* Ends r: unlinked, sink.on_finish(why, msg), freed. The scheduler must be
 * done with it already (finished, or cancelled by the caller). */
void creq_finish(creq **head, creq *r, enum coord_finish why, const char *msg);
/* Ends every request with ERROR and msg, cancelling each in s (may be NULL). */
void creq_fail_all(creq **head, sched *s, const char *msg);
/* How many requests; with ids/cap, the first cap sequence ids; with tokens,
 * the sum of their prompt + generated tokens. */
int creq_count(const creq *head, uint64_t *ids, int cap, int64_t *tokens);
/* "[cmpl-a, cmpl-b, ...]" (at most 8, then ", ..."; "#seq" for a request
 * without a request id) into buf for log lines; returns buf. */
const char *creq_ids_text(const creq *head, char *buf, size_t cap);
/* Appends a generated token to r's history; -1 when out of memory. */
int creq_add_generated(creq *r, int32_t token);
/* The most tokens a request may generate with an n_prompt-token prompt:
 * max_tokens, or when it was not given (max_tokens_auto), up to the context
 * n_ctx and to what the whole KV pool of s holds (blocks are taken as the
 * sequence grows; nothing is reserved ahead). s may be NULL (not ready). */
int creq_max_new(const coord_request *q, int n_prompt, int n_ctx, const sched *s);
/* A new record for req (the prompt and the sampling parameters copied; the
 * seed is the request's, else `seed`) after checking that it fits the
 * context n_ctx and the KV pool of s. COORD_OK, or COORD_EINVAL (no prompt
 * tokens, a prompt the KV pool cannot hold), COORD_ECONTEXT (prompt +
 * max_tokens over n_ctx, with OpenAI's message), COORD_EINTERNAL (out of
 * memory), with err set. *max_new gets the tokens it may generate. */
int creq_create(const coord_request *req, const coord_sink *sink, void *ctx, uint64_t seed, int n_ctx,
                const sched *s, creq **out, int *max_new, st_err *err);
/* Queues r in s again, as a new sequence of its prompt plus the tokens
 * generated so far, with max_new - n_gen left to generate (re-prefill: the
 * KV cache of its old sequence is not reused). r->id becomes the new
 * sequence id. -1 + err when nothing is left to generate, out of memory, or
 * sched_add refuses it. */
int creq_requeue(creq *r, sched *s, int max_new, st_err *err);
/* Every request of *from is unlinked (and cancelled in from_s, unless NULL),
 * re-queued in to_s (creq_requeue with creq_max_new for n_ctx) and put on
 * *to. One that cannot be ends with ERROR (sched_add's message, else
 * fail_msg). on_moved (may be NULL) gets each old and new sequence id (0:
 * it ended). Returns how many moved; *tokens (may be NULL) the tokens they
 * re-prefill. */
int creq_requeue_all(creq **from, sched *from_s, creq **to, sched *to_s, int n_ctx, const char *fail_msg,
                     void (*on_moved)(void *ud, uint64_t old_id, uint64_t new_id), void *ud, int64_t *tokens);

#endif
