/* tok_internal.h — what the tokenizer's files share: the tok_vocab layout,
 * a string→id hash map, a binary heap and UTF-8 helpers. Not a public API;
 * only model/tok*.c and model/tokenizer.c include it.
 */
#ifndef STRATA_MODEL_TOK_INTERNAL_H
#define STRATA_MODEL_TOK_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/utf8.h"
#include "model/tokenizer.h"

/* ---- string → int32 map (open addressing, FNV-1a). Keys are not copied:
 * they must outlive the map. ---- */
typedef struct tok_map_entry {
    const char *key; /* NULL: empty slot */
    uint32_t len;
    int32_t val;
    uint64_t hash;
} tok_map_entry;

typedef struct tok_map {
    tok_map_entry *slots;
    size_t cap; /* power of two */
    size_t n;
} tok_map;

int tok_map_init(tok_map *m, size_t expected);
void tok_map_free(tok_map *m);
/* Inserts key→val. An existing key is overwritten when `overwrite`, else
 * kept. -1 when the map is full (it holds `expected` keys; it never grows). */
int tok_map_put(tok_map *m, const char *key, size_t len, int32_t val, bool overwrite);
/* Value of key, or -1. */
int32_t tok_map_get(const tok_map *m, const char *key, size_t len);
/* Value of the key a + sep + b (sep one byte), built without copying, or -1. */
int32_t tok_map_get_pair(const tok_map *m, const char *a, size_t alen, char sep, const char *b,
                         size_t blen);

/* ---- binary max-heap of fixed-size elements; `lower(a, b)` says a has lower
 * priority than b (std::priority_queue's comparator). ---- */
typedef struct tok_heap {
    char *data;
    size_t n, cap, esz;
    bool (*lower)(const void *a, const void *b);
} tok_heap;

void tok_heap_init(tok_heap *h, size_t esz, bool (*lower)(const void *, const void *));
void tok_heap_free(tok_heap *h);
int tok_heap_push(tok_heap *h, const void *elem); /* -1 on out of memory */
bool tok_heap_pop(tok_heap *h, void *out);        /* false when empty */

/* ---- growable int32 array ---- */
typedef struct tok_ids {
    int32_t *v;
    size_t n, cap;
} tok_ids;
int tok_ids_push(tok_ids *a, int32_t id); /* -1 on out of memory */

/* ---- UTF-8 ---- */
/* Length of a UTF-8 sequence from its first byte, llama.cpp's
 * unicode_len_utf8 (continuation and invalid lead bytes count 1). */
size_t tok_utf8_len(uint8_t lead);
/* Strict decoding and encoding: common/utf8.h (utf8_decode, utf8_encode). */

/* ---- the vocabulary ---- */
enum tok_pre { TOK_PRE_GPT2 = 0, TOK_PRE_LLAMA3 = 1 };

struct tok_vocab {
    enum tok_model model;
    enum tok_pre pre;
    int32_t n;
    char *text_blob;     /* all token strings, each NUL-terminated */
    size_t *text_off;    /* [n] */
    uint32_t *text_len;  /* [n] */
    float *score;        /* [n] */
    uint8_t *type;       /* [n] enum tok_type */
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

static inline const char *tok_text(const tok_vocab *v, int32_t id) {
    return v->text_blob + v->text_off[id];
}

/* Appends the tokens of one raw-text fragment. */
int tok_spm_encode(const tok_vocab *v, const char *text, size_t len, bool space_prefix,
                   tok_ids *out, st_err *err);
int tok_bpe_encode(const tok_vocab *v, const char *text, size_t len, tok_ids *out, st_err *err);

/* BPE setup: byte alphabet, merges, regex. Called by tok_vocab_load. */
int tok_bpe_init(tok_vocab *v, const gguf_file *f, const char *pre, st_err *err);
void tok_bpe_free(tok_vocab *v);

#endif
