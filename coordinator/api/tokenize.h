/* tokenize.h — POST /tokenize and POST /detokenize, as vLLM serves them (and
 * llama-server, with vLLM's shapes), for clients that count tokens before
 * they send.
 *
 *   /tokenize   {"prompt": "text", "add_special_tokens": true}
 *            or {"messages": [...], "add_generation_prompt": true,
 *                "add_special_tokens": true}
 *      -> {"tokens": [ids], "count": N, "max_model_len": n_ctx, "token_strs": null}
 *      ("return_token_strs": true: "token_strs" lists each id's vocabulary
 *      string, e.g. "▁Once", as vLLM's convert_ids_to_tokens)
 *      The ids are exactly what a completion (prompt) or chat completion
 *      (messages) of the same input feeds the model: text prompts parse no
 *      special-token text; messages go through the chat template with the
 *      contents guarded (prompt.h). add_special_tokens adds BOS as the
 *      vocabulary asks (default true for both: Strata's templates leave BOS
 *      to the tokenizer, so the ids equal usage.prompt_tokens' count).
 *   /detokenize {"tokens": [ids]} -> {"prompt": "text"}: Hugging Face's
 *      decode(skip_special_tokens=True) (a leading BOS and control tokens
 *      give no text, the SentencePiece space prefix is stripped), so
 *      /detokenize(/tokenize(t)) == t for plain text. Bytes that end inside
 *      a character become U+FFFD.
 * "model" must name the served model (404 otherwise), as on the other
 * routes. Errors: 400 (param named) for a body that is not a JSON object, a
 * missing or mistyped field, ids outside [0, n_vocab), an unknown field; 501
 * when the tokenizer cannot decode (test doubles).
 */
#ifndef STRATA_COORDINATOR_API_TOKENIZE_H
#define STRATA_COORDINATOR_API_TOKENIZE_H

#include <stddef.h>

#include "coordinator/api/completions.h"

/* The answer body (malloc'd JSON), or NULL with e. lim->tok must be set. */
char *api_tokenize(const char *body, size_t len, const compl_limits *lim, compl_error *e);
char *api_detokenize(const char *body, size_t len, const compl_limits *lim, compl_error *e);

#endif
