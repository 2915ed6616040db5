/* prompt.h — the prompts of an OpenAI request and how they become token ids.
 *
 * POST /v1/completions "prompt" takes the four shapes OpenAI and vLLM accept:
 *   "text"                  one text prompt
 *   ["a", "b", ...]         a batch of text prompts
 *   [15043, 29892, ...]     one token-id prompt
 *   [[1, 15043], [1, 22]]   a batch of token-id prompts
 * A batch gives one choice per prompt (times n), indices in prompt order.
 * Token ids are used as given (no BOS is added: send it when the model wants
 * it, as /tokenize returns it) and must lie in [0, n_vocab). Text must not
 * hold NUL; lists must not be empty or mixed. Each violation is a 400 with
 * param "prompt" and a message saying which element is wrong.
 *
 * Chat prompts are the rendered template plus the byte spans of the
 * messages' contents: those are encoded with special-token parsing off
 * (tok_encode_guarded), so content such as "<s></s>hi" stays text.
 */
#ifndef STRATA_COORDINATOR_API_PROMPT_H
#define STRATA_COORDINATOR_API_PROMPT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "coordinator/api/api_error.h"
#include "model/tokenizer.h"

#define COMPL_MAX_CHOICES 128 /* prompts x n in one request */

/* How the API turns text into token ids and back: the model's vocabulary
 * (compl_tokenizer_vocab) or a test double.
 *   encode: *ids (malloc'd) for text; add_special adds BOS as the vocabulary
 *           asks; parse_special reads control-token text, except inside the
 *           n_plain spans `plain` (tok_encode_guarded). 0 or -1 + err.
 *   decode: text of ids as Hugging Face's decode(skip_special_tokens=True):
 *           a leading BOS and control tokens give nothing, the SentencePiece
 *           space prefix is stripped; malloc'd, NUL terminated. NULL when the double has none (echo of token-id
 *           prompts is then empty; /detokenize answers 501).
 *   special_text: the text of a control token (e.g. "</s>"), NULL for any
 *           other id (skip_special_tokens false shows it). May be NULL.
 *   is_eog: the token ends generation (min_tokens masks these). May be NULL.
 *   token_text: the vocabulary string of a token ("▁Once", "<0x0A>": Hugging
 *           Face's convert_ids_to_tokens), NULL for a bad id. May be NULL.
 *   n_vocab: ids must be below it; 0 = not checked here (the engine does). */
typedef struct compl_tokenizer {
    int (*encode)(void *ctx, const char *text, size_t len, bool add_special, bool parse_special,
                  const tok_span *plain, size_t n_plain, int32_t **ids, size_t *n, st_err *err);
    int (*decode)(void *ctx, const int32_t *ids, size_t n, char **text, size_t *len,
                  st_err *err);
    const char *(*special_text)(void *ctx, int32_t id, size_t *len);
    bool (*is_eog)(void *ctx, int32_t id);
    const char *(*token_text)(void *ctx, int32_t id, size_t *len);
    int32_t n_vocab;
    void *ctx;
} compl_tokenizer;
compl_tokenizer compl_tokenizer_vocab(const tok_vocab *vocab);

/* One prompt. text (malloc'd, NUL-terminated) is what echo returns: the
 * text given, or the decoded ids of a token-id prompt. */
typedef struct compl_prompt {
    char *text;
    size_t len;
    int32_t *ids;      /* token-id prompt: the ids as given; NULL for text */
    int n_ids;
    tok_span *plain;   /* chat: the messages' content spans in text */
    size_t n_plain;
} compl_prompt;

/* Parses the "prompt" value p (NULL or null: "'prompt' is required") into
 * *out[*n] (malloc'd; free with compl_prompts_free). tok may be NULL (no id
 * check, no decode). -1 + e (400, param "prompt"). */
int compl_prompts_parse(json_t *p, const compl_tokenizer *tok, compl_prompt **out, int *n,
                        compl_error *e);
void compl_prompts_free(compl_prompt *p, int n);

/* The token ids of prompt p: token-id prompts copied, text encoded (chat:
 * guarded, see above; add_special: BOS). *ids malloc'd. -1 + e (400) when
 * encoding fails or gives no tokens. */
int compl_prompt_ids(const compl_prompt *p, const compl_tokenizer *tok, bool chat,
                     bool add_special, int32_t **ids, int *n, compl_error *e);

#endif
