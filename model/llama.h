/* llama.h — the Llama model configuration, read from GGUF metadata.
 *
 * Architecture `llama` (llama.cpp's LLM_ARCH_LLAMA). Keys read (prefix "llama."):
 *   block_count, embedding_length, attention.head_count, attention.head_count_kv
 *   (default = head_count), feed_forward_length, attention.key_length (head_dim,
 *   default n_embd / n_head), rope.dimension_count (default head_dim),
 *   rope.freq_base (default 10000), attention.layer_norm_rms_epsilon (default 1e-5),
 *   context_length, vocab_size (default: rows of token_embd.weight).
 * Tokenizer keys: tokenizer.ggml.bos_token_id (default 1), eos_token_id (default 2),
 *   add_bos_token (default true).
 * Tensors checked for presence and shape: token_embd.weight [n_vocab, n_embd],
 *   output_norm.weight, output.weight (absent → tied to token_embd), and, when
 *   present, rope_freqs.weight [n_rot/2] (Llama 3.1 RoPE scaling factors: the
 *   angle of pair i is divided by factor[i], as llama.cpp's rope with freq_factors).
 * Validation: n_embd == n_head * head_dim, n_head % n_head_kv == 0, n_rot even and
 *   <= head_dim, every size > 0; violations are errors naming the key and values.
 */
#ifndef STRATA_MODEL_LLAMA_H
#define STRATA_MODEL_LLAMA_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "model/gguf.h"

typedef struct llama_config {
    int n_layer;      /* transformer blocks */
    int n_embd;       /* hidden size */
    int n_head;       /* query heads */
    int n_head_kv;    /* key/value heads (GQA: n_head % n_head_kv == 0) */
    int n_ff;         /* FFN inner size (gate/up rows) */
    int head_dim;     /* per-head size (attention.key_length) */
    int n_vocab;      /* vocabulary size (rows of token_embd / output) */
    int n_rot;        /* RoPE dimension count (<= head_dim, even) */
    float rope_base;  /* RoPE frequency base theta */
    bool has_rope_freqs; /* rope_freqs.weight present (Llama 3.1 scaling) */
    float rms_eps;    /* RMSNorm epsilon */
    int n_ctx_train;  /* context_length */
    bool tied_output; /* no output.weight: the LM head is token_embd.weight */
    int32_t bos_id, eos_id;
    bool add_bos;
} llama_config;

/* Fills *cfg from an open GGUF file. -1 with err (naming the key) when the
 * architecture is not llama, a required key is missing or values are inconsistent. */
int llama_config_from_gguf(const gguf_file *f, llama_config *cfg, st_err *err);

/* Checks the invariants listed above (used by llama_config_from_gguf, and by
 * tests that build configs by hand). */
int llama_config_validate(const llama_config *cfg, st_err *err);

/* GGUF tensor names: writes e.g. "blk.3.attn_q.weight" into buf. `what` is the
 * per-layer suffix ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
 * "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"). */
const char *llama_tensor_name(char *buf, size_t bufsz, int layer, const char *what);

#endif
