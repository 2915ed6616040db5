/* llama.c — reads and validates the Llama configuration from GGUF metadata.
 * Key names and defaults follow llama.cpp (src/llama-model.cpp, LLM_ARCH_LLAMA). */
#include "model/llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *llama_tensor_name(char *buf, size_t bufsz, int layer, const char *what) {
    snprintf(buf, bufsz, "blk.%d.%s.weight", layer, what);
    return buf;
}

/* Optional integer key: absent → def; present but wrong type/range → error. */
static int get_int_opt(const gguf_file *f, const char *key, int64_t def, int64_t *out,
                       st_err *err) {
    if (!gguf_get(f, key)) {
        *out = def;
        return 0;
    }
    return gguf_get_i64(f, key, out, err);
}

static int get_int_req(const gguf_file *f, const char *key, int *out, st_err *err) {
    int64_t v;
    if (!gguf_get(f, key)) return st_errf(err, "%s: missing required key %s", gguf_path(f), key);
    if (gguf_get_i64(f, key, &v, err) != 0) return -1;
    if (v <= 0 || v > (1 << 30)) return st_errf(err, "%s: %s = %lld is out of range", gguf_path(f), key, (long long)v);
    *out = (int)v;
    return 0;
}

static int get_f32_opt(const gguf_file *f, const char *key, float def, float *out, st_err *err) {
    if (!gguf_get(f, key)) {
        *out = def;
        return 0;
    }
    return gguf_get_f32(f, key, out, err);
}

int llama_config_validate(const llama_config *c, st_err *err) {
    if (c->n_layer <= 0 || c->n_embd <= 0 || c->n_head <= 0 || c->n_head_kv <= 0 || c->n_ff <= 0 ||
        c->head_dim <= 0 || c->n_vocab <= 0)
        return st_errf(err,
                       "llama config: sizes must be positive (n_layer %d, n_embd %d, n_head %d, "
                       "n_head_kv %d, n_ff %d, head_dim %d, n_vocab %d)",
                       c->n_layer, c->n_embd, c->n_head, c->n_head_kv, c->n_ff, c->head_dim,
                       c->n_vocab);
    if ((int64_t)c->n_head * c->head_dim != c->n_embd)
        return st_errf(err, "llama config: n_embd %d != n_head %d * head_dim %d", c->n_embd,
                       c->n_head, c->head_dim);
    if (c->n_head % c->n_head_kv != 0)
        return st_errf(err, "llama config: n_head %d is not a multiple of n_head_kv %d", c->n_head,
                       c->n_head_kv);
    if (c->n_rot <= 0 || c->n_rot > c->head_dim || c->n_rot % 2 != 0)
        return st_errf(err, "llama config: rope dimension count %d must be even and in (0, head_dim %d]",
                       c->n_rot, c->head_dim);
    if (!(c->rope_base > 0)) return st_errf(err, "llama config: rope freq base %g must be > 0", c->rope_base);
    if (!(c->rms_eps > 0)) return st_errf(err, "llama config: rms eps %g must be > 0", c->rms_eps);
    if (c->bos_id < 0 || c->bos_id >= c->n_vocab || c->eos_id < 0 || c->eos_id >= c->n_vocab)
        return st_errf(err, "llama config: bos %d / eos %d outside the vocabulary [0, %d)", c->bos_id,
                       c->eos_id, c->n_vocab);
    return 0;
}

static int check_tensor(const gguf_file *f, const char *name, int64_t ne0, int64_t ne1,
                        st_err *err) {
    const gguf_tensor *t = gguf_find_tensor(f, name);
    if (!t) return st_errf(err, "%s: missing tensor %s", gguf_path(f), name);
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != 1 || t->ne[3] != 1)
        return st_errf(err, "%s: tensor %s has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]",
                       gguf_path(f), name, (long long)t->ne[0], (long long)t->ne[1],
                       (long long)t->ne[2], (long long)t->ne[3], (long long)ne0, (long long)ne1);
    if (!ggml_type_supported(t->type))
        return st_errf(err, "%s: tensor %s has unsupported type %s", gguf_path(f), name,
                       ggml_type_name(t->type));
    return 0;
}

int llama_config_from_gguf(const gguf_file *f, llama_config *c, st_err *err) {
    memset(c, 0, sizeof *c);
    char *arch = NULL;
    if (gguf_get_str(f, "general.architecture", &arch, err) != 0) return -1;
    if (strcmp(arch, "llama") != 0) {
        st_errf(err, "%s: architecture '%s' is not supported (only 'llama')", gguf_path(f), arch);
        free(arch);
        return -1;
    }
    free(arch);
    int64_t v;
    if (get_int_req(f, "llama.block_count", &c->n_layer, err) ||
        get_int_req(f, "llama.embedding_length", &c->n_embd, err) ||
        get_int_req(f, "llama.attention.head_count", &c->n_head, err) ||
        get_int_req(f, "llama.feed_forward_length", &c->n_ff, err))
        return -1;
    if (get_int_opt(f, "llama.attention.head_count_kv", c->n_head, &v, err)) return -1;
    c->n_head_kv = (int)v;
    if (get_int_opt(f, "llama.attention.key_length", c->n_embd / c->n_head, &v, err)) return -1;
    c->head_dim = (int)v;
    if (get_int_opt(f, "llama.rope.dimension_count", c->head_dim, &v, err)) return -1;
    c->n_rot = (int)v;
    if (get_int_opt(f, "llama.context_length", 2048, &v, err)) return -1;
    c->n_ctx_train = (int)v;
    if (get_f32_opt(f, "llama.rope.freq_base", 10000.0f, &c->rope_base, err)) return -1;
    if (get_f32_opt(f, "llama.attention.layer_norm_rms_epsilon", 1e-5f, &c->rms_eps, err)) return -1;
    if (get_int_opt(f, "tokenizer.ggml.bos_token_id", 1, &v, err)) return -1;
    c->bos_id = (int32_t)v;
    if (get_int_opt(f, "tokenizer.ggml.eos_token_id", 2, &v, err)) return -1;
    c->eos_id = (int32_t)v;
    c->add_bos = true;
    if (gguf_get(f, "tokenizer.ggml.add_bos_token") &&
        gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &c->add_bos, err))
        return -1;

    const gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
    if (!emb) return st_errf(err, "%s: missing tensor token_embd.weight", gguf_path(f));
    if (get_int_opt(f, "llama.vocab_size", emb->ne[1], &v, err)) return -1;
    if (v <= 0 || v > (1 << 30)) return st_errf(err, "%s: vocab size %lld out of range", gguf_path(f), (long long)v);
    c->n_vocab = (int)v;
    if (llama_config_validate(c, err)) return st_err_prefix(err, "%s", gguf_path(f));

    /* Tensors the forward needs, with their shapes. */
    if (check_tensor(f, "token_embd.weight", c->n_embd, c->n_vocab, err) ||
        check_tensor(f, "output_norm.weight", c->n_embd, 1, err))
        return -1;
    c->tied_output = gguf_find_tensor(f, "output.weight") == NULL;
    if (!c->tied_output && check_tensor(f, "output.weight", c->n_embd, c->n_vocab, err)) return -1;
    c->has_rope_freqs = gguf_find_tensor(f, "rope_freqs.weight") != NULL;
    if (c->has_rope_freqs && check_tensor(f, "rope_freqs.weight", c->n_rot / 2, 1, err)) return -1;
    const int64_t q = (int64_t)c->n_head * c->head_dim, kv = (int64_t)c->n_head_kv * c->head_dim;
    char name[96];
    for (int l = 0; l < c->n_layer; l++) {
        if (check_tensor(f, llama_tensor_name(name, sizeof name, l, "attn_norm"), c->n_embd, 1, err) ||
            check_tensor(f, llama_tensor_name(name, sizeof name, l, "attn_q"), c->n_embd, q, err) ||
            check_tensor(f, llama_tensor_name(name, sizeof name, l, "attn_k"), c->n_embd, kv, err) ||
            check_tensor(f, llama_tensor_name(name, sizeof name, l, "attn_v"), c->n_embd, kv, err) ||
            check_tensor(f, llama_tensor_name(name, sizeof name, l, "attn_output"), q, c->n_embd, err) ||
            check_tensor(f, llama_tensor_name(name, sizeof name, l, "ffn_norm"), c->n_embd, 1, err) ||
            check_tensor(f, llama_tensor_name(name, sizeof name, l, "ffn_gate"), c->n_embd, c->n_ff, err) ||
            check_tensor(f, llama_tensor_name(name, sizeof name, l, "ffn_up"), c->n_embd, c->n_ff, err) ||
            check_tensor(f, llama_tensor_name(name, sizeof name, l, "ffn_down"), c->n_ff, c->n_embd, err))
            return -1;
    }
    return 0;
}
