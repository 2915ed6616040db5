/* completions.h — the OpenAI completions surface without I/O: request parsing
 * and validation, stop strings, and the response / SSE chunk JSON (jansson).
 *
 * Shapes follow the OpenAI API reference (POST /v1/completions) and vLLM's
 * extensions (return_token_ids: `token_ids` on each choice and each chunk,
 * `prompt_token_ids` on the choice or the first chunk).
 *   response: {"id":"cmpl-…","object":"text_completion","created":s,"model":m,
 *              "choices":[{"index":0,"text":t,"logprobs":null|{…},
 *                          "finish_reason":"stop"|"length"}],
 *              "usage":{"prompt_tokens":p,"completion_tokens":c,"total_tokens":p+c}}
 *   chunk:    the same without usage ("usage":null when include_usage), text
 *             = the new text, finish_reason null until the last chunk.
 *   logprobs: {"tokens":[…],"token_logprobs":[…],"top_logprobs":[{piece:lp}…],
 *              "text_offset":[…]} (natural logs; offsets in bytes of the full text).
 *   error:    {"error":{"message":…,"type":…,"param":…|null,"code":…|null}}
 * Chat (req->chat, POST /v1/chat/completions):
 *   response: {"id":"chatcmpl-…","object":"chat.completion",…,"choices":[{"index":0,
 *              "message":{"role":"assistant","content":t},"logprobs":null|{"content":[…]},
 *              "finish_reason":…}],"usage":{…}}
 *   chunks:   "object":"chat.completion.chunk"; the first has delta
 *             {"role":"assistant","content":""}, later ones {"content":new text},
 *             the last {} (or the held-back text) with finish_reason.
 *   logprobs: {"content":[{"token":t,"logprob":lp,"bytes":[…],
 *              "top_logprobs":[{"token":t,"logprob":lp,"bytes":[…]}…]}…]}
 *
 * Text handling: generated pieces are raw bytes. They go through the same
 * pipeline as strata-run's text, so the same token ids give the same text:
 * common/utf8.h's utf8_stream (an incomplete character is held; invalid UTF-8
 * becomes one U+FFFD per maximal invalid subpart, as tok_stream does), then
 * model/stop.h's matcher (a suffix that could still become a stop string is
 * held). A matched stop string ends the completion (finish_reason "stop") and
 * is not included. text_offset is the byte offset of a token's first byte in
 * that text: for valid UTF-8 the raw byte offset (a byte token inside a
 * character points into it); a token after an unfinished character starts
 * after its U+FFFD (common/utf8.h's utf8_stream_offset).
 */
#ifndef STRATA_COORDINATOR_COMPLETIONS_H
#define STRATA_COORDINATOR_COMPLETIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "coordinator/api/api_error.h"
#include "coordinator/api/prompt.h"
#include "coordinator/serve/engine_api.h"
#include "model/tokenizer.h"
#include "common/utf8.h"
#include "model/stop.h"

#define COMPL_MAX_STOP 4        /* stop sequences a client may give */
#define COMPL_MAX_STOP_LEN 256 /* bytes per stop sequence */
#define COMPL_MAX_LOGPROBS 5   /* OpenAI's limit for completions' logprobs */
#define COMPL_MAX_TOP_LOGPROBS 20 /* OpenAI's limit for chat's top_logprobs */
#define COMPL_DEFAULT_MAX_TOKENS 16

#define COMPL_MAX_N 128             /* n: samples per prompt (COMPL_MAX_CHOICES in all) */
#define COMPL_MAX_STOP_TOKEN_IDS 64 /* stop_token_ids entries */
#define COMPL_MAX_LOGIT_BIAS 1024   /* logit_bias entries */

/* A validated request. Strings are malloc'd, NUL-terminated, valid UTF-8. */
typedef struct compl_request {
    compl_prompt *prompts;  /* >= 1 (prompt.h); chat: exactly one, the rendered template */
    int n_prompts;
    int n;                  /* samples per prompt, 1..COMPL_MAX_N; n_prompts * n <= COMPL_MAX_CHOICES */
    char *model;            /* NULL when absent */
    int max_tokens;         /* >= 1; default 16 */
    double temperature;     /* [0, 2]; default 1; 0 = greedy */
    double top_p;           /* [0, 1]; default 1; 0 = greedy (keep the argmax, as vLLM) */
    int top_k;              /* >= 0; 0 = off (-1 in the request also means off) */
    double min_p;           /* [0, 1]; default 0 */
    bool has_seed;
    int64_t seed;           /* choice i of a prompt samples with seed + i (vLLM's rule) */
    char *stop[COMPL_MAX_STOP + 1]; /* + the chat template's turn end (chat.h) */
    int n_stop;
    bool stream;
    bool include_usage;     /* stream_options.include_usage */
    bool return_token_ids;
    bool echo;
    int logprobs;           /* -1 = none, else 0..COMPL_MAX_LOGPROBS alternatives
                               (chat: top_logprobs, 0..COMPL_MAX_TOP_LOGPROBS) */
    double presence_penalty;  /* [-2, 2] */
    double frequency_penalty; /* [-2, 2] */
    /* vLLM's sampling extras (docs/api.md) */
    double repetition_penalty; /* (0, 100]; 1 = off; over prompt + generated tokens */
    bool ignore_eos;        /* generate past EOS up to max_tokens */
    int min_tokens;         /* [0, max_tokens]: EOS and stop_token_ids masked before it */
    int32_t stop_token_ids[COMPL_MAX_STOP_TOKEN_IDS]; /* a sampled one ends the choice ("stop") */
    int n_stop_token_ids;
    bool skip_special_tokens; /* default true: control tokens add no text */
    bool add_special_tokens;  /* completions: BOS before a text prompt (default true) */
    int32_t *bias_ids;      /* logit_bias: token ids (malloc'd) ... */
    float *bias_values;     /* ... and what is added to their logits, [-100, 100] */
    int n_bias;
    int32_t *min_tokens_mask; /* min_tokens > 0: EOG ids (unless ignore_eos) + stop_token_ids */
    int n_min_tokens_mask;
    char *user;
    /* POST /v1/chat/completions (coordinator/api/chat.h): the prompt is the
     * rendered conversation; responses are chat.completion(.chunk) objects. */
    bool chat;
    /* max_tokens was not given and the request is a chat: generate up to the
     * context (the engine clamps max_tokens to n_ctx - prompt tokens). */
    bool max_tokens_auto;
    /* The response id ("cmpl-…"), set by the HTTP layer before submit: the
     * engine logs with it (STRATA_REQUEST_ID) and passes it to the workers. */
    char request_id[64];
} compl_request;

typedef struct compl_limits {
    int n_ctx;              /* max_tokens above this is refused; 0 = no check */
    const char *model_name; /* a request naming another model gets 404; NULL = any */
    int chat_format;        /* enum chat_format (model/chat_template.h) for chat requests */
    const compl_tokenizer *tok; /* token-id checks and echo text; NULL = none */
} compl_limits;

/* Parses and validates a body. -1 + e (status 400, or 404 for an unknown
 * model) on malformed JSON, invalid UTF-8, a non-object, a missing or bad
 * prompt (prompt.h), wrong types, out-of-range values, a bad stop (not a
 * string or list, more than 4, empty, longer than 256 bytes), and a field
 * this API does not know (docs/api.md: "Unrecognized request argument
 * supplied: NAME", param NAME). */
int compl_parse(const char *body, size_t len, const compl_limits *lim, compl_request *out,
                compl_error *e);
/* The same for POST /v1/chat/completions: "messages" (coordinator/api/chat.h)
 * instead of "prompt", "logprobs" a boolean with "top_logprobs" 0..20,
 * "max_completion_tokens" as an alias of "max_tokens", no "echo". */
int compl_parse_chat(const char *body, size_t len, const compl_limits *lim, compl_request *out,
                     compl_error *e);
void compl_request_free(compl_request *r);

/* Choices: choice c answers prompt c / n with sample c % n. */
static inline int compl_n_choices(const compl_request *q) { return q->n_prompts * q->n; }

/* The engine's request for choice `choice` of q (serve/engine_api.h): its
 * prompt's ids (compl_prompt_ids), the sampling parameters (seed + sample
 * index), limits and request id. *ids (malloc'd, the caller frees) backs
 * out->prompt. -1 with e (400) when the prompt does not tokenize or has no
 * tokens. */
int compl_engine_request(const compl_request *q, int choice, const compl_tokenizer *tok,
                         coord_request *out, int32_t **ids, compl_error *e);

/* Identity of a response: shared by every chunk of a stream. */
typedef struct compl_meta {
    char id[48];        /* "cmpl-…" */
    int64_t created;    /* unix seconds */
    const char *model;
} compl_meta;

/* The growing output of one choice. */
typedef struct compl_output {
    const compl_request *req;
    int index;           /* the choice's index in the response */
    const compl_prompt *prompt; /* its prompt (echo) */
    bool counts_prompt;  /* usage counts its prompt tokens (sample 0 of each prompt) */
    utf8_stream utf8;    /* raw piece bytes -> valid UTF-8 */
    stop_matcher stop;   /* the request's stop strings, over that text */
    char *text;          /* completion text released by the matcher (ready to emit) */
    size_t len, cap;
    size_t sent;         /* bytes already emitted in chunks */
    bool stopped;        /* a stop string matched: ignore further tokens */
    bool flushed;        /* the end: held-back bytes were released */
    bool echo_sent, prompt_ids_sent;
    bool role_sent;      /* chat streams: the delta.role chunk went out */
    int32_t *ids;        /* every generated id */
    int n_ids, cap_ids, ids_sent;
    int32_t *prompt_ids;
    int n_prompt;
    void *lp;            /* json_t* logprobs arrays (internal) */
    int lp_sent;
} compl_output;

/* -1 on out of memory or a stop list the matcher refuses (a parsed request
 * never has one). compl_output_init is choice 0. */
int compl_output_init(compl_output *o, const compl_request *req);
int compl_output_init_choice(compl_output *o, const compl_request *req, int choice);
void compl_output_free(compl_output *o);
/* The prompt's token ids (for usage and prompt_token_ids). */
int compl_output_prompt(compl_output *o, const int32_t *ids, int n);
/* Appends a generated token and its text piece. Returns 1 when a stop string
 * has now matched or the token is one of stop_token_ids (its text is then
 * left out, as vLLM does; the caller stops the sequence), 0 otherwise, -1 on
 * out of memory. After a match further calls only count the token. */
int compl_output_token(compl_output *o, int32_t id, const char *piece, size_t len,
                       const coord_logprobs *lp);
/* Streaming: "data: {chunk}\n\n" payload JSON (malloc'd) with what is new and
 * ready, or NULL when nothing is (*none = true). finish != NULL makes it the
 * last chunk: everything held back is flushed and finish_reason is set
 * ("stop" when the flushed U+FFFD of an unfinished character completes a stop
 * string, as in strata-run). */
char *compl_output_chunk(compl_output *o, const compl_meta *m, const char *finish, bool *none);
/* Chat streams: the first chunk, delta {"role":"assistant","content":""}. */
char *compl_output_role_chunk(compl_output *o, const compl_meta *m);
/* The usage-only final chunk of stream_options.include_usage, over the
 * choices o[0..n): prompt tokens of each prompt once, completion tokens of
 * every choice. */
char *compl_output_usage_chunk(compl_output *o, int n, const compl_meta *m);
/* The whole non-streaming response of choices o[0..n) with finish[i]. */
char *compl_output_response(compl_output *o, int n, const compl_meta *m,
                            const char *const *finish);

#endif
