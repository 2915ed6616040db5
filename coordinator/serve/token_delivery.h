/* token_delivery.h — a sampled token to its request's sink: the history for
 * the penalties, the prompt callback before the first token, end of
 * generation (unless ignore_eos), the token's piece (tok_piece: raw bytes;
 * the HTTP layer reassembles UTF-8) and its logprobs with each top
 * alternative's piece, then the finish at max_tokens or the context.
 * Threading: the loop thread only. */
#ifndef STRATA_COORDINATOR_SERVE_TOKEN_DELIVERY_H
#define STRATA_COORDINATOR_SERVE_TOKEN_DELIVERY_H

#include <stddef.h>

#include "coordinator/serve/request_list.h"
#include "coordinator/serve/sched.h"
#include "ib/frame.h"
#include "model/tokenizer.h"

typedef struct token_delivery {
    const tok_vocab *vocab;
    sched *s;           /* a sequence that ends early is cancelled here */
    creq **reqs;        /* the list the request is on */
    char *piece_buf;    /* piece_cap + 1 bytes */
    size_t piece_cap;   /* tok_max_piece_len(vocab) + 1 */
} token_delivery;

/* Delivers the scheduler's event ev of request r; res is the last stage's
 * result for it (logprobs), NULL when it sent none. r may be finished and
 * freed on return (also by a cancel from inside its own sink callback). */
void token_deliver(const token_delivery *d, creq *r, const sched_event *ev, const frame_result *res);

#endif
