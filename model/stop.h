/* stop.h — incremental stop-string matcher over streamed completion text.
 *
 * OpenAI semantics: generation ends at the first occurrence of any stop
 * string; the text before it is returned, the stop string itself is not.
 * Up to STOP_MAX_STRINGS (4, OpenAI's limit) stop strings, each 1..256 bytes,
 * matched as raw bytes.
 *
 * Streaming: feed each detokenized piece as it is produced. The matcher holds
 * back the longest suffix of the text that is a proper prefix of some stop
 * string (it might become a stop string with the next piece) and hands out
 * everything before it. When a stop string appears (possibly spread over
 * several pieces), the text before its first byte is handed out and the
 * matcher is done. At the end of generation call stop_flush to get the
 * held-back bytes. The matcher stops at the first piece after which the
 * text contains a stop string; if several are present then, the one that
 * starts first wins (then the earliest in the list), as llama.cpp's server
 * does. A longer stop string that began earlier but is not yet complete
 * does not win over a shorter one completed by this piece.
 *
 * UTF-8: if the pieces and the stop strings are valid UTF-8, every cut lands
 * on a character boundary (a match starts at the stop string's first byte).
 * Both users feed text that common/utf8.h made valid: strata-run through
 * tok_stream, the HTTP API (coordinator/api/completions.c) through utf8_stream.
 *
 * Offsets: `fed` counts the bytes fed so far, so before a feed it is the
 * offset in the whole text where that piece starts (the completions API's
 * logprobs text_offset). Nothing before a match is ever cut, so offsets of
 * the pieces fed up to the match stay offsets into the returned text.
 */
#ifndef STRATA_MODEL_STOP_H
#define STRATA_MODEL_STOP_H

#include <stddef.h>

#include "common/err.h"

#define STOP_MAX_STRINGS 4 /* stop_init's limit (a client's stop strings) */
#define STOP_MAX_EXTRA 1   /* stop_add's, beyond them (a chat template's end of turn) */
#define STOP_MAX_LEN 256

typedef struct stop_matcher {
    int n_stops;
    size_t stop_len[STOP_MAX_STRINGS + STOP_MAX_EXTRA];
    char stops[STOP_MAX_STRINGS + STOP_MAX_EXTRA][STOP_MAX_LEN];
    char *buf;        /* pending text: held-back suffix + current piece */
    size_t len, cap;
    size_t emitted;   /* bytes of buf already handed out (removed on the next feed) */
    size_t fed;       /* bytes fed so far (until the match) */
    int matched;      /* 1 once a stop string matched */
    int which;        /* index of the stop string that matched, else -1 */
} stop_matcher;

/* stops[n_stops] are NUL-terminated strings; n_stops 0..4 (0: never stops,
 * nothing is held back). Errors: too many, empty, or longer than 256 bytes. */
int stop_init(stop_matcher *m, const char *const *stops, int n_stops, st_err *err);
/* Adds one more stop string after the list (at most STOP_MAX_EXTRA; before
 * the first feed), e.g. the chat template's end of turn. Errors as stop_init. */
int stop_add(stop_matcher *m, const char *stop, st_err *err);
void stop_free(stop_matcher *m);

/* Feeds piece[len]. *emit / *emit_len receive the bytes safe to output now
 * (a pointer into the matcher, valid until the next call). Returns 1 when a
 * stop string matched in this call (the emitted bytes are the text before
 * it; later calls emit nothing and return 1), 0 otherwise, -1 on out of
 * memory. */
int stop_feed(stop_matcher *m, const char *piece, size_t len, const char **emit, size_t *emit_len,
              st_err *err);

/* End of the stream: hands out the held-back bytes (none after a match). */
void stop_flush(stop_matcher *m, const char **emit, size_t *emit_len);

#endif
