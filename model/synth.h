/* synth.h — random-weight Llama models written as GGUF (for benchmarks and for
 * tests that need a model of a given shape).
 *
 * The file has the metadata and tensor names llama.cpp expects for
 * architecture "llama" (general.*, llama.*, tokenizer.*), and llama.cpp's
 * shapes (ne[0] is the input dimension):
 *   token_embd.weight   [n_embd, n_vocab]      output.weight   [n_embd, n_vocab]
 *   output_norm.weight  [n_embd]  (F32)
 *   blk.N.attn_norm / ffn_norm  [n_embd]  (F32)
 *   blk.N.attn_q [n_embd, n_embd]   attn_k, attn_v [n_embd, n_head_kv * head_dim]
 *   blk.N.attn_output [n_embd, n_embd]
 *   blk.N.ffn_gate, ffn_up [n_embd, n_ff]   ffn_down [n_ff, n_embd]
 * with head_dim = n_embd / n_head.
 *
 * Values: weights are approximately N(0, weight_std) (the sum of four uniform
 * variates, so bounded by ±3.47 std), norm weights 1 + the same noise. They
 * depend only on (seed, tensor name, element index) — not on the layer count
 * or the order of writing — via a counter-based generator; see
 * synth_value(). Q8_0 weights are quantized from those values with
 * st_quantize_row_q8_0 (model/quantize.h: ggml's quantize_row_q8_0_ref).
 *
 * The tokenizer is copied from another GGUF file (all tokenizer.* keys). When
 * n_vocab differs from the copied vocabulary, the token lists are padded with
 * "<unused_N>" tokens (type UNUSED, score 0) or truncated, and a notice is
 * logged. Without a vocabulary file a built-in byte-level SentencePiece
 * vocabulary is used: <unk>, <s>, </s>, then <0x00>..<0xFF>.
 *
 * Data is streamed to disk a few MiB at a time, so a model larger than
 * memory can be written.
 */
#ifndef STRATA_MODEL_SYNTH_H
#define STRATA_MODEL_SYNTH_H

#include <stdint.h>

#include "common/err.h"

typedef struct synth_params {
    const char *name; /* general.name; NULL: "strata-synth" */
    int64_t n_embd, n_layer, n_head, n_head_kv, n_ff;
    int64_t n_vocab; /* 0: the size of the copied vocabulary */
    int64_t n_ctx;   /* llama.context_length */
    uint32_t dtype;  /* GGML_TYPE_F32, F16, BF16 or Q8_0: the 2-D weights; norms are F32 */
    uint64_t seed;
    float rope_freq_base; /* llama.rope.freq_base */
    float norm_eps;       /* llama.attention.layer_norm_rms_epsilon */
    float weight_std;     /* standard deviation of the weights */
    const char *vocab_path; /* GGUF to copy tokenizer.* from; NULL: built-in byte vocab */
    int verbose;            /* log notices (vocabulary padding) at info level */
} synth_params;

/* A small default: n_embd 64, 2 layers, 4 heads, 2 KV heads, n_ff 128,
 * n_vocab 0 (= the vocabulary's size), ctx 256, F32, seed 1, rope base 10000,
 * eps 1e-5, std 0.02, built-in vocabulary. */
void synth_params_default(synth_params *p);

/* Applies a preset on top of *p (keeps seed, vocab_path, verbose):
 *   "bench-1b":             2048 embd, 16 layers, 32 heads, 8 KV, n_ff 8192, vocab 32000, F16,
 *                           ctx 4096, rope base 10000 (1.10 B parameters)
 *   "llama-3-8b":           4096, 32 layers, 32 heads, 8 KV, n_ff 14336, vocab 128256, F16,
 *                           ctx 8192, rope base 500000
 *   "llama-3.1-70b-layers": 8192, 2 layers (choose with n_layer), 64 heads, 8 KV, n_ff 28672,
 *                           vocab 128256, F16, ctx 131072, rope base 500000
 * -1 + err for an unknown name. */
int synth_preset(const char *name, synth_params *p, st_err *err);

/* Checks the shape (positive sizes, n_head divides n_embd, n_head_kv divides
 * n_head, Q8_0 needs n_embd and n_ff multiples of 32). */
int synth_validate(const synth_params *p, st_err *err);

/* Number of parameters of the model described by p (n_vocab must be set). */
int64_t synth_n_params(const synth_params *p);

/* Writes the model to path. */
int synth_write(const synth_params *p, const char *path, st_err *err);

/* The f32 value (before any conversion to dtype) of element `index` (row-major
 * within the tensor) of tensor `name`, for seed and std as in synth_write.
 * `is_norm` selects the 1 + noise form. */
float synth_value(uint64_t seed, float std, const char *name, int is_norm, uint64_t index);

#endif
