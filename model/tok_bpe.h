/* tok_bpe.h — byte-level BPE (GPT-2 style): its setup at load and the
 * encoding of one raw-text fragment (tok_bpe.c). Not a public API:
 * tokenizer.c calls it for "gpt2" vocabularies.
 */
#ifndef STRATA_MODEL_TOK_BPE_H
#define STRATA_MODEL_TOK_BPE_H

#include <stddef.h>

#include "common/err.h"
#include "model/gguf.h"
#include "model/tok_util.h"
#include "model/tok_vocab.h"

/* BPE setup: byte alphabet, pre-tokenizer regex chosen by `pre`
 * (tokenizer.ggml.pre, may be NULL), merges from tokenizer.ggml.merges.
 * Called by tok_vocab_load once the tokens are loaded. -1 + err. */
int tok_bpe_init(tok_vocab *v, const gguf_file *f, const char *pre, st_err *err);
/* Frees what tok_bpe_init allocated (safe on a partly initialised v). */
void tok_bpe_free(tok_vocab *v);

/* Appends the tokens of len bytes of text to out. -1 + err on out of memory
 * or a regex failure. */
int tok_bpe_encode(const tok_vocab *v, const char *text, size_t len, tok_ids *out, st_err *err);

#endif
