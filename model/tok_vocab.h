/* tok_vocab.h — the layout of a loaded vocabulary (struct tok_vocab), plain
 * data: tokenizer.c fills it at load and frees it, the encoders tok_spm.c and
 * tok_bpe.c read it (tok_bpe_init also fills its BPE part). It declares no
 * functions. Not a public API: tokenizer.h keeps tok_vocab opaque.
 * It does not include tokenizer.h, so that the encoders below the owner do
 * not depend on the owner's header.
 */
#ifndef STRATA_MODEL_TOK_VOCAB_H
#define STRATA_MODEL_TOK_VOCAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/tok_util.h"

typedef struct tok_vocab tok_vocab; /* the same typedef as tokenizer.h's */

/* The BPE pre-tokenizer regex (tok_bpe.c). */
enum tok_pre { TOK_PRE_GPT2 = 0, TOK_PRE_LLAMA3 = 1 };

struct tok_vocab {
    int model; /* enum tok_model (tokenizer.h) */
    enum tok_pre pre;
    int32_t n;
    char *text_blob;     /* all token strings, each NUL-terminated */
    size_t *text_off;    /* [n] */
    uint32_t *text_len;  /* [n] */
    float *score;        /* [n] */
    uint8_t *type;       /* [n] enum tok_type (tokenizer.h) */
    uint8_t *eog;        /* [n] 1 when end-of-generation */
    char *piece_blob;    /* decoded pieces (see tok_piece) */
    size_t *piece_off;   /* [n + 1] */
    size_t max_piece_len;
    tok_map tokens; /* text → id (later ids win, as llama.cpp's token_to_id) */
    tok_map merges; /* "left right" → rank (first occurrence wins); BPE only */
    char *merge_blob;
    int32_t bos, eos, eot, eom, unk, pad;
    bool add_bos, add_eos, add_space_prefix, ignore_merges, clean_spaces;
    int32_t byte_token[256]; /* SPM byte-fallback ids (-1: none) */
    int32_t *special;        /* ids of control/unknown/user-defined tokens, longest first */
    size_t n_special;
    void *re;                /* pcre2_code_8 *, BPE only */
    uint32_t byte_cp[256];   /* GPT-2 bytes_to_unicode */
    int16_t cp_byte[324];    /* inverse (-1: not in the alphabet) */
};

/* The NUL-terminated text of a valid id. */
static inline const char *tok_text(const tok_vocab *v, int32_t id) {
    return v->text_blob + v->text_off[id];
}

#endif
