/* tok_spm.h — SentencePiece BPE encoding of one raw-text fragment (tok_spm.c).
 * Not a public API: tokenizer.c calls it for "llama" vocabularies.
 */
#ifndef STRATA_MODEL_TOK_SPM_H
#define STRATA_MODEL_TOK_SPM_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"
#include "model/tok_util.h"
#include "model/tok_vocab.h"

/* Appends the tokens of len bytes of text to out; space_prefix prepends ' '
 * (add_space_prefix at the start of the text or after a special token).
 * -1 + err on out of memory or a character with no byte/unk fallback. */
int tok_spm_encode(const tok_vocab *v, const char *text, size_t len, bool space_prefix,
                   tok_ids *out, st_err *err);

#endif
