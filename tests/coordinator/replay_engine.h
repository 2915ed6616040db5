/* replay_engine.h — TEST DOUBLE of coord_engine (coordinator/serve/engine_api.h):
 * it generates nothing; it replays a fixed script of (id, piece) tokens on
 * event-loop timers, one token per tick, so the HTTP layer can be tested
 * without a model. Its tokenizer double (replay_tokenizer, for the HTTP
 * layer): BOS (1) then one id per byte (byte + 3). Finishes LENGTH at max_tokens, else STOP at the script's end.
 * Counts submits and cancels so tests can check that a disconnect cancels.
 */
#ifndef STRATA_TESTS_REPLAY_ENGINE_H
#define STRATA_TESTS_REPLAY_ENGINE_H

#include <stdint.h>

#include "coordinator/api/completions.h"
#include "coordinator/serve/engine_api.h"

struct event_base;

typedef struct replay_seq replay_seq;

typedef struct replay_engine {
    struct event_base *base;
    int n_script;
    const int32_t *script_ids;
    const char *const *script_pieces;
    double interval_s;   /* seconds between tokens */
    int n_ctx;           /* prompt + max_tokens beyond it -> COORD_ECONTEXT */
    int busy;            /* submit answers COORD_EBUSY */
    int unhealthy;       /* health answers -1 */
    int fail_after;      /* > 0: finish with ERROR after this many tokens */
    /* counters */
    int submits, cancels, finished, active;
    replay_seq *seqs;
    uint64_t next_id;
} replay_engine;

void replay_engine_init(replay_engine *r, struct event_base *base);
coord_engine replay_engine_iface(replay_engine *r);
void replay_engine_free(replay_engine *r);
compl_tokenizer replay_tokenizer(void);

#endif
