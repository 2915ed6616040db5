/* tokenizer.h — text <-> token ids from a GGUF vocabulary, token-exact with llama.cpp.
 *
 * Two tokenizer models are supported, chosen by `tokenizer.ggml.model`:
 *   - "llama": SentencePiece BPE (llama.cpp's llm_tokenizer_spm): spaces are
 *     escaped to U+2581 "▁", a leading "▁" is prepended when add_space_prefix,
 *     the text is split into UTF-8 characters, adjacent pairs that form a
 *     vocabulary token are merged highest score first (ties: leftmost), and
 *     characters that form no token fall back to byte tokens "<0xAB>" (or
 *     <unk> when the vocabulary has none).
 *   - "gpt2": byte-level BPE (llama.cpp's llm_tokenizer_bpe): the text is
 *     split by a pre-tokenizer regex (PCRE2, UTF + UCP) chosen by
 *     `tokenizer.ggml.pre` ("default"/"gpt2"/"gpt-2" → GPT-2's;
 *     "llama3"/"llama-v3"/"llama-bpe" → Llama 3's; anything else → GPT-2's
 *     with a logged warning), each word's bytes are mapped to GPT-2's
 *     byte-unicode alphabet, and merges (`tokenizer.ggml.merges`) are applied
 *     lowest rank first (ties: leftmost).
 * Any other model is refused with an error naming it.
 *
 * Special tokens: control/unknown tokens (token_type 3/2) are recognised in
 * the text only when parse_special; user-defined tokens (type 4) always are,
 * longest first, as in llama.cpp's tokenizer_st_partition.
 *
 * Decoding: a token's piece is the bytes it stands for: "▁" → ' ', "<0xAB>"
 * → byte 0xAB (SPM), the GPT-2 byte-unicode mapping reversed (BPE);
 * user-defined tokens give their text; control and unknown tokens give
 * nothing. Pieces need not be valid UTF-8 on their own (byte fallback
 * splits characters across tokens); tok_stream reassembles them.
 *
 * A tok_vocab is immutable after loading and may be shared by threads.
 * Token ids are int32_t in [0, tok_n_vocab). All functions are safe on bad
 * input: invalid UTF-8 text or out-of-range ids give an error or U+FFFD,
 * never a crash.
 */
#ifndef STRATA_MODEL_TOKENIZER_H
#define STRATA_MODEL_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "model/gguf.h"

typedef struct tok_vocab tok_vocab;

enum tok_model { TOK_MODEL_SPM = 1, TOK_MODEL_BPE = 2 };

/* Token types: the values of `tokenizer.ggml.token_type` (llama.cpp's llama_token_type). */
enum tok_type {
    TOK_TYPE_UNDEFINED = 0,
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
};

/* Loads the vocabulary from a GGUF file's `tokenizer.ggml.*` metadata. The
 * result copies what it needs and does not reference `f` afterwards.
 * Defaults when keys are absent: SPM: bos 1, eos 2, unk 0, add_bos true,
 * add_space_prefix true; BPE: no bos/eos/unk, add_bos false (true for the
 * llama3 pre-tokenizer), add_space_prefix false. Special ids out of range
 * (e.g. 0xFFFFFFFF for "none") are ignored with a warning. NULL + err on a
 * missing/ill-typed key or an unsupported tokenizer model. */
tok_vocab *tok_vocab_load(const gguf_file *f, st_err *err);
void tok_vocab_free(tok_vocab *v);

enum tok_model tok_model_kind(const tok_vocab *v);
int32_t tok_n_vocab(const tok_vocab *v);
/* Special ids; -1 when the vocabulary has none. */
int32_t tok_bos(const tok_vocab *v);
int32_t tok_eos(const tok_vocab *v);
int32_t tok_unk(const tok_vocab *v);
int32_t tok_pad(const tok_vocab *v);
bool tok_add_bos(const tok_vocab *v);
bool tok_add_eos(const tok_vocab *v);
bool tok_add_space_prefix(const tok_vocab *v);
/* End of generation: EOS, EOT/EOM when given, and control tokens whose text is
 * one of llama.cpp's EOG names (<|eot_id|>, <|im_end|>, <|end|>,
 * <end_of_turn>, <|endoftext|>, <|eom_id|>, <EOT>). False for bad ids. */
bool tok_is_eog(const tok_vocab *v, int32_t id);
/* enum tok_type of a token; TOK_TYPE_UNDEFINED for bad ids. */
int tok_token_type(const tok_vocab *v, int32_t id);
float tok_token_score(const tok_vocab *v, int32_t id);
/* The raw vocabulary string (e.g. "▁the", "<0x0A>", "Ġthe"), NUL-terminated,
 * owned by v; NULL for bad ids. *len_out (may be NULL) gets its byte length. */
const char *tok_token_text(const tok_vocab *v, int32_t id, size_t *len_out);
/* Id of an exact vocabulary string, or -1. */
int32_t tok_lookup(const tok_vocab *v, const char *text, size_t len);

/* Tokenizes len bytes of text (need not be NUL-terminated; may contain NULs
 * and invalid UTF-8). add_special: prepend BOS when tok_add_bos (and append
 * EOS when tok_add_eos). parse_special: recognise control tokens such as
 * "<s>" written in the text. *ids_out is malloc'd (free() it; non-NULL even
 * when *n_out is 0). Returns 0, or -1 + err (out of memory, no byte/unk
 * fallback token, regex failure). */
int tok_encode(const tok_vocab *v, const char *text, size_t len, bool add_special,
               bool parse_special, int32_t **ids_out, size_t *n_out, st_err *err);

/* A byte range [off, off + len) of a text. */
typedef struct tok_span {
    size_t off, len;
} tok_span;

/* tok_encode with parse_special, except that a control/unknown token's text
 * is recognised only where it overlaps none of the n_plain byte ranges
 * `plain` (sorted or not): the chat API passes the messages' contents there,
 * so only the template's own text yields special tokens and a user cannot
 * forge a turn or an end of sequence. User-defined tokens are recognised
 * everywhere, as in tok_encode. With n_plain 0 it equals tok_encode(...,
 * parse_special = true). */
int tok_encode_guarded(const tok_vocab *v, const char *text, size_t len, bool add_special,
                       const tok_span *plain, size_t n_plain, int32_t **ids_out, size_t *n_out,
                       st_err *err);

/* The bytes of one token's piece (see above). Returns the piece length n and
 * writes it to buf only when n <= cap (so call with cap 0 to size it);
 * returns -1 for an out-of-range id. At most tok_max_piece_len(v) bytes. */
int tok_piece(const tok_vocab *v, int32_t id, char *buf, size_t cap);
size_t tok_max_piece_len(const tok_vocab *v);

/* Whole-sequence decode, as llama.cpp's llama_detokenize(remove_special,
 * unparse_special = false): with remove_special a leading BOS (when add_bos)
 * and a trailing EOS (when add_eos) are dropped; when add_space_prefix one
 * leading space is stripped from the first piece unless a BOS was dropped.
 * For BPE vocabularies llama.cpp's clean_spaces passes follow (" ," → ",",
 * " 's" → "'s", ...). The result is the raw bytes (not UTF-8 checked),
 * NUL-terminated, malloc'd. -1 + err for an out-of-range id. */
int tok_detokenize(const tok_vocab *v, const int32_t *ids, size_t n, bool remove_special,
                   char **text_out, size_t *len_out, st_err *err);

/* Streaming decoder for generated tokens: each push returns the bytes that
 * are ready, always whole valid UTF-8 characters. An incomplete trailing
 * sequence is held until the bytes that complete it arrive; a sequence that
 * cannot be completed (invalid byte, truncated character) comes out as
 * U+FFFD (one per maximal invalid subpart, as in the Unicode standard's
 * "U+FFFD substitution of maximal subparts"; common/utf8.h's utf8_stream,
 * which the HTTP API's text uses too). An out-of-range id gives
 * U+FFFD. Pieces are concatenated unchanged (as llama-server builds its
 * completion text), except that with strip_first_space one leading space of
 * the first pushed token's piece is dropped (llama_detokenize's rule for a
 * sequence starting a SentencePiece text). */
typedef struct tok_stream tok_stream;

tok_stream *tok_stream_new(const tok_vocab *v, bool strip_first_space);
void tok_stream_free(tok_stream *ts);
/* Output bytes one push or flush can produce at most; `out` of this size
 * always suffices. */
size_t tok_stream_max_out(const tok_stream *ts);
/* Decodes one token into out. Returns the number of bytes written (may be
 * 0), or -1 when cap < tok_stream_max_out (nothing is consumed then). */
int tok_stream_push(tok_stream *ts, int32_t id, char *out, size_t cap);
/* Emits held-back bytes (an incomplete character at the end → U+FFFD) and
 * resets the held state. Same return convention as tok_stream_push. */
int tok_stream_flush(tok_stream *ts, char *out, size_t cap);

#endif
