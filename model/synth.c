/* synth.c — random-weight Llama GGUF models (see synth.h): presets, metadata,
 * tokenizer copy/padding, and the streaming, counter-based weight generator.
 */
#include "model/synth.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "common/log.h"
#include "model/gguf.h"
#include "model/quantize.h"

void synth_params_default(synth_params *p) {
    *p = (synth_params){
        .name = NULL,
        .n_embd = 64,
        .n_layer = 2,
        .n_head = 4,
        .n_head_kv = 2,
        .n_ff = 128,
        .n_vocab = 0,
        .n_ctx = 256,
        .dtype = GGML_TYPE_F32,
        .seed = 1,
        .rope_freq_base = 10000.0f,
        .norm_eps = 1e-5f,
        .weight_std = 0.02f,
        .vocab_path = NULL,
        .verbose = 0,
    };
}

int synth_preset(const char *name, synth_params *p, st_err *err) {
    if (strcmp(name, "bench-1b") == 0) {
        p->n_embd = 2048, p->n_layer = 16, p->n_head = 32, p->n_head_kv = 8, p->n_ff = 8192;
        p->n_vocab = 32000, p->n_ctx = 4096, p->rope_freq_base = 10000.0f;
    } else if (strcmp(name, "llama-3-8b") == 0) {
        p->n_embd = 4096, p->n_layer = 32, p->n_head = 32, p->n_head_kv = 8, p->n_ff = 14336;
        p->n_vocab = 128256, p->n_ctx = 8192, p->rope_freq_base = 500000.0f;
    } else if (strcmp(name, "llama-3.1-70b-layers") == 0) {
        p->n_embd = 8192, p->n_layer = 2, p->n_head = 64, p->n_head_kv = 8, p->n_ff = 28672;
        p->n_vocab = 128256, p->n_ctx = 131072, p->rope_freq_base = 500000.0f;
    } else {
        return st_errf(err, "unknown preset '%s' (bench-1b, llama-3-8b, llama-3.1-70b-layers)",
                       name);
    }
    p->dtype = GGML_TYPE_F16;
    p->norm_eps = 1e-5f;
    p->weight_std = 0.02f;
    p->name = name;
    return 0;
}

#define SYNTH_MAX_DIM (1 << 22)

int synth_validate(const synth_params *p, st_err *err) {
    const struct {
        const char *n;
        int64_t v;
    } dims[] = {{"n_embd", p->n_embd}, {"n_layer", p->n_layer}, {"n_head", p->n_head},
                {"n_head_kv", p->n_head_kv}, {"n_ff", p->n_ff}, {"n_ctx", p->n_ctx}};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i].v <= 0 || dims[i].v > SYNTH_MAX_DIM)
            return st_errf(err, "synth: %s = %" PRId64 " must be in 1..%d", dims[i].n, dims[i].v,
                           SYNTH_MAX_DIM);
    if (p->n_vocab < 0 || p->n_vocab > SYNTH_MAX_DIM)
        return st_errf(err, "synth: n_vocab = %" PRId64 " must be in 1..%d", p->n_vocab,
                       SYNTH_MAX_DIM);
    if (p->n_layer > 10000) return st_errf(err, "synth: n_layer %" PRId64 " too large", p->n_layer);
    if (p->n_embd % p->n_head)
        return st_errf(err, "synth: n_head %" PRId64 " does not divide n_embd %" PRId64,
                       p->n_head, p->n_embd);
    if (p->n_head % p->n_head_kv)
        return st_errf(err, "synth: n_head_kv %" PRId64 " does not divide n_head %" PRId64,
                       p->n_head_kv, p->n_head);
    if (p->dtype != GGML_TYPE_F32 && p->dtype != GGML_TYPE_F16 && p->dtype != GGML_TYPE_BF16 &&
        p->dtype != GGML_TYPE_Q8_0)
        return st_errf(err, "synth: dtype %s not supported (f32, f16, bf16, q8_0)",
                       ggml_type_name(p->dtype));
    if (p->dtype == GGML_TYPE_Q8_0 && (p->n_embd % QK8_0 || p->n_ff % QK8_0))
        return st_errf(err, "synth: q8_0 needs n_embd (%" PRId64 ") and n_ff (%" PRId64
                       ") to be multiples of %d", p->n_embd, p->n_ff, QK8_0);
    if (!(p->weight_std >= 0) || !isfinite(p->weight_std))
        return st_errf(err, "synth: weight_std must be finite and >= 0");
    return 0;
}

int64_t synth_n_params(const synth_params *p) {
    int64_t e = p->n_embd, kv = p->n_embd / p->n_head * p->n_head_kv;
    int64_t layer = 2 * e + 2 * e * e + 2 * e * kv + 3 * e * p->n_ff;
    return 2 * e * p->n_vocab + e + p->n_layer * layer;
}

/* ---- values ---- */

static inline uint64_t mix64(uint64_t z) { /* splitmix64 finalizer */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t tensor_key(uint64_t seed, const char *name) {
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *s = (const unsigned char *)name; *s; s++) h = (h ^ *s) * 1099511628211ull;
    return mix64(mix64(seed) ^ h);
}

/* Sum of four 16-bit uniforms: mean 131070, sd 65536/sqrt(3) (exactly sqrt(4*(65536^2-1)/12)). */
#define IH_MEAN 131070.0f
#define IH_INV_SD (1.0f / 37837.2259f)

static inline float gen(uint64_t key, uint64_t index, float std, int is_norm) {
    uint64_t r = mix64(key + index * 0x9e3779b97f4a7c15ull);
    uint32_t s = (uint32_t)(r & 0xffff) + (uint32_t)((r >> 16) & 0xffff) +
                 (uint32_t)((r >> 32) & 0xffff) + (uint32_t)(r >> 48);
    float v = ((float)s - IH_MEAN) * IH_INV_SD * std;
    return is_norm ? 1.0f + v : v;
}

float synth_value(uint64_t seed, float std, const char *name, int is_norm, uint64_t index) {
    return gen(tensor_key(seed, name), index, std, is_norm);
}

/* ---- streaming fill ---- */

typedef struct stensor {
    char name[64];
    uint32_t type;
    int is_norm;
    int64_t ne[2];
    uint32_t n_dims;
    uint64_t key;
} stensor;

typedef struct sctx {
    const synth_params *p;
    stensor *t;
    float *tmp; /* one row of f32 */
} sctx;

static int fill(void *vctx, int64_t ti, int64_t row0, int64_t n_rows, void *dst, st_err *err) {
    sctx *c = vctx;
    const stensor *t = &c->t[ti];
    int64_t n = t->ne[0];
    float std = c->p->weight_std;
    size_t rb = ggml_row_bytes(t->type, n);
    for (int64_t r = 0; r < n_rows; r++) {
        uint8_t *out = (uint8_t *)dst + (size_t)r * rb;
        uint64_t base = (uint64_t)(row0 + r) * (uint64_t)n;
        switch (t->type) {
        case GGML_TYPE_F32: {
            float *o = (float *)out;
            for (int64_t i = 0; i < n; i++) o[i] = gen(t->key, base + i, std, t->is_norm);
            break;
        }
        case GGML_TYPE_F16:
        case GGML_TYPE_BF16: {
            int bf = t->type == GGML_TYPE_BF16;
            for (int64_t i = 0; i < n; i++) {
                float v = gen(t->key, base + i, std, t->is_norm);
                uint16_t h = bf ? st_f32_to_bf16(v) : st_f32_to_fp16(v);
                memcpy(out + 2 * i, &h, 2);
            }
            break;
        }
        case GGML_TYPE_Q8_0: {
            float *x = c->tmp;
            for (int64_t i = 0; i < n; i++) x[i] = gen(t->key, base + i, std, t->is_norm);
            st_quantize_row_q8_0(x, out, n);
            break;
        }
        default:
            return st_errf(err, "synth: cannot generate type %s", ggml_type_name(t->type));
        }
    }
    return 0;
}

/* ---- tokenizer ---- */

static const char *llama_ftype_key = "general.file_type";

/* Adds tokens/scores/token_type of n_vocab entries from `src` (n_src entries;
 * scores may be NULL), padding with <unused_N>. */
static int add_token_lists(gguf_writer *w, const gguf_str *toks, const float *scores,
                           const int32_t *types, int64_t n_src, int64_t n_vocab,
                           int with_scores, st_err *err) {
    gguf_str *t = calloc((size_t)n_vocab ? (size_t)n_vocab : 1, sizeof *t);
    float *s = calloc((size_t)n_vocab ? (size_t)n_vocab : 1, sizeof *s);
    int32_t *ty = calloc((size_t)n_vocab ? (size_t)n_vocab : 1, sizeof *ty);
    char *names = NULL;
    int rc = -1;
    if (!t || !s || !ty) {
        st_errf(err, "synth: out of memory");
        goto out;
    }
    int64_t n_pad = n_vocab > n_src ? n_vocab - n_src : 0;
    names = malloc((size_t)n_pad * 24 + 1);
    if (!names) {
        st_errf(err, "synth: out of memory");
        goto out;
    }
    char *np = names;
    for (int64_t i = 0; i < n_vocab; i++) {
        if (i < n_src) {
            t[i] = toks[i];
            s[i] = scores ? scores[i] : 0.0f;
            ty[i] = types ? types[i] : 1;
        } else {
            int len = snprintf(np, 24, "<unused_%" PRId64 ">", i - n_src);
            t[i] = (gguf_str){(uint64_t)len, np};
            np += len;
            s[i] = 0.0f;
            ty[i] = 5; /* LLAMA_TOKEN_TYPE_UNUSED */
        }
    }
    if (gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", t, (uint64_t)n_vocab, err)) goto out;
    if (with_scores &&
        gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, s, (uint64_t)n_vocab, err))
        goto out;
    if (gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, ty,
                            (uint64_t)n_vocab, err))
        goto out;
    rc = 0;
out:
    free(t), free(s), free(ty), free(names);
    return rc;
}

static void notice_resize(const synth_params *p, const char *src, int64_t n_src, int64_t n_vocab) {
    if (n_src == n_vocab) return;
    if (n_vocab > n_src)
        ST_INFO("synth: vocabulary from %s has %" PRId64 " tokens; padded to n_vocab %" PRId64
                " with %" PRId64 " <unused_N> tokens", src, n_src, n_vocab, n_vocab - n_src);
    else
        ST_WARN("synth: vocabulary from %s has %" PRId64 " tokens; truncated to n_vocab %" PRId64
                " (merges and special ids past the end may not work)", src, n_src, n_vocab);
    (void)p;
}

static int builtin_vocab(gguf_writer *w, const synth_params *p, int64_t n_vocab, st_err *err) {
    enum { NB = 3 + 256 };
    gguf_str toks[NB];
    float scores[NB];
    int32_t types[NB];
    char bytes[256][8];
    toks[0] = (gguf_str){5, "<unk>"}, toks[1] = (gguf_str){3, "<s>"}, toks[2] = (gguf_str){4, "</s>"};
    types[0] = 2, types[1] = 3, types[2] = 3; /* UNKNOWN, CONTROL */
    scores[0] = scores[1] = scores[2] = 0.0f;
    for (int i = 0; i < 256; i++) {
        snprintf(bytes[i], sizeof bytes[i], "<0x%02X>", i);
        toks[3 + i] = (gguf_str){6, bytes[i]};
        types[3 + i] = 6; /* BYTE */
        scores[3 + i] = 0.0f;
    }
    int64_t n_src = n_vocab < NB ? n_vocab : NB;
    if (p->verbose) notice_resize(p, "the built-in byte vocabulary", NB, n_vocab);
    if (gguf_writer_set_str(w, "tokenizer.ggml.model", "llama", err) ||
        add_token_lists(w, toks, scores, types, n_src, n_vocab, 1, err) ||
        gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0, err) ||
        gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1, err) ||
        gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2, err) ||
        gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true, err) ||
        gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false, err))
        return -1;
    return 0;
}

/* Copies tokenizer.* from an open vocab file, resizing the token lists. */
static int copy_vocab(gguf_writer *w, const synth_params *p, const gguf_file *v, int64_t n_vocab,
                      st_err *err) {
    const gguf_kv *toks;
    if (gguf_get_arr(v, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks, err)) return -1;
    int64_t n_src = (int64_t)toks->arr_n;
    const gguf_kv *scores = gguf_get(v, "tokenizer.ggml.scores");
    const gguf_kv *types = gguf_get(v, "tokenizer.ggml.token_type");
    if (scores && (scores->type != GGUF_TYPE_ARRAY || scores->arr_type != GGUF_TYPE_FLOAT32 ||
                   scores->arr_n != toks->arr_n))
        return st_errf(err, "%s: tokenizer.ggml.scores is not %" PRId64 " f32 values",
                       gguf_path(v), n_src);
    if (types && (types->type != GGUF_TYPE_ARRAY || types->arr_type != GGUF_TYPE_INT32 ||
                  types->arr_n != toks->arr_n))
        return st_errf(err, "%s: tokenizer.ggml.token_type is not %" PRId64 " i32 values",
                       gguf_path(v), n_src);
    if (p->verbose) notice_resize(p, gguf_path(v), n_src, n_vocab);
    int64_t n_copy = n_src < n_vocab ? n_src : n_vocab;
    float *sc = NULL;
    int32_t *ty = NULL;
    int rc = -1;
    if (scores) {
        sc = malloc((size_t)(n_copy ? n_copy : 1) * sizeof *sc);
        if (!sc) goto oom;
        memcpy(sc, scores->arr_data, (size_t)n_copy * sizeof *sc);
    }
    if (types) {
        ty = malloc((size_t)(n_copy ? n_copy : 1) * sizeof *ty);
        if (!ty) goto oom;
        memcpy(ty, types->arr_data, (size_t)n_copy * sizeof *ty);
    }
    for (int64_t i = 0; i < gguf_n_kv(v); i++) {
        const gguf_kv *kv = gguf_kv_at(v, i);
        if (kv->key.len < 10 || memcmp(kv->key.data, "tokenizer.", 10) != 0) continue;
        if (kv == toks) {
            if (add_token_lists(w, toks->arr_str, sc, ty, n_copy, n_vocab, scores != NULL, err))
                goto out;
            continue;
        }
        if (kv == scores || kv == types) continue; /* written with the tokens */
        if (gguf_writer_copy_kv(w, kv, err)) goto out;
        if (p->verbose && kv->type == GGUF_TYPE_UINT32 && kv->key.len > 9 &&
            memcmp(kv->key.data + kv->key.len - 9, "_token_id", 9) == 0 &&
            kv->v.u32 != UINT32_MAX && (int64_t)kv->v.u32 >= n_vocab)
            ST_WARN("synth: %.*s = %u is past n_vocab %" PRId64, (int)kv->key.len, kv->key.data,
                    kv->v.u32, n_vocab);
    }
    rc = 0;
    goto out;
oom:
    st_errf(err, "synth: out of memory");
out:
    free(sc), free(ty);
    return rc;
}

/* ---- the model ---- */

int synth_write(const synth_params *p, const char *path, st_err *err) {
    if (synth_validate(p, err)) return -1;
    gguf_file *v = NULL;
    int64_t n_vocab = p->n_vocab;
    if (p->vocab_path) {
        v = gguf_open(p->vocab_path, err);
        if (!v) return st_err_prefix(err, "synth: vocabulary");
        if (n_vocab == 0) {
            const gguf_kv *toks;
            if (gguf_get_arr(v, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks, err)) {
                gguf_close(v);
                return -1;
            }
            n_vocab = (int64_t)toks->arr_n;
        }
    } else if (n_vocab == 0) {
        n_vocab = 3 + 256;
    }
    if (n_vocab <= 0) {
        gguf_close(v);
        return st_errf(err, "synth: n_vocab must be positive");
    }

    int64_t E = p->n_embd, KV = p->n_embd / p->n_head * p->n_head_kv;
    size_t n_t = 3 + 9 * (size_t)p->n_layer;
    sctx c = {.p = p};
    c.t = calloc(n_t, sizeof *c.t);
    int64_t max_row = E > p->n_ff ? E : p->n_ff;
    c.tmp = malloc((size_t)max_row * sizeof(float));
    gguf_writer *w = gguf_writer_new();
    int rc = -1;
    if (!c.t || !c.tmp || !w) {
        st_errf(err, "synth: out of memory");
        goto out;
    }

    char name[128];
    snprintf(name, sizeof name, "%s", p->name ? p->name : "strata-synth");
    if (gguf_writer_set_str(w, "general.architecture", "llama", err) ||
        gguf_writer_set_str(w, "general.name", name, err) ||
        gguf_writer_set_u32(w, llama_ftype_key, (uint32_t)st_llama_ftype(p->dtype), err) ||
        gguf_writer_set_u32(w, "llama.context_length", (uint32_t)p->n_ctx, err) ||
        gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)E, err) ||
        gguf_writer_set_u32(w, "llama.block_count", (uint32_t)p->n_layer, err) ||
        gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)p->n_ff, err) ||
        gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)p->n_head, err) ||
        gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)p->n_head_kv, err) ||
        gguf_writer_set_u32(w, "llama.rope.dimension_count", (uint32_t)(E / p->n_head), err) ||
        gguf_writer_set_f32(w, "llama.rope.freq_base", p->rope_freq_base, err) ||
        gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", p->norm_eps, err) ||
        gguf_writer_set_u32(w, "llama.vocab_size", (uint32_t)n_vocab, err))
        goto out;
    if (v ? copy_vocab(w, p, v, n_vocab, err) : builtin_vocab(w, p, n_vocab, err)) goto out;

    /* Tensors, in the order llama.cpp's converter writes them. */
    size_t k = 0;
#define T(nm, norm, e0, e1)                                                                  \
    do {                                                                                     \
        stensor *t = &c.t[k];                                                                \
        snprintf(t->name, sizeof t->name, "%s", nm);                                         \
        t->is_norm = norm;                                                                   \
        t->type = norm ? GGML_TYPE_F32 : p->dtype;                                           \
        t->ne[0] = e0, t->ne[1] = e1, t->n_dims = norm ? 1 : 2;                              \
        t->key = tensor_key(p->seed, t->name);                                               \
        if (gguf_writer_add_tensor_fill(w, t->name, t->type, t->n_dims, t->ne, fill, &c,     \
                                        (int64_t)k, err))                                    \
            goto out;                                                                        \
        k++;                                                                                 \
    } while (0)
    T("token_embd.weight", 0, E, n_vocab);
    T("output_norm.weight", 1, E, 1);
    T("output.weight", 0, E, n_vocab);
    for (int64_t l = 0; l < p->n_layer; l++) {
        char nm[64];
#define B(suffix, norm, e0, e1)                                                     \
    snprintf(nm, sizeof nm, "blk.%" PRId64 ".%s.weight", l, suffix);                \
    T(nm, norm, e0, e1)
        B("attn_q", 0, E, E);
        B("attn_k", 0, E, KV);
        B("attn_v", 0, E, KV);
        B("attn_output", 0, E, E);
        B("attn_norm", 1, E, 1);
        B("ffn_gate", 0, E, p->n_ff);
        B("ffn_down", 0, p->n_ff, E);
        B("ffn_up", 0, E, p->n_ff);
        B("ffn_norm", 1, E, 1);
#undef B
    }
#undef T
    if (gguf_writer_write(w, path, err)) goto out;
    rc = 0;
out:
    gguf_writer_free(w);
    gguf_close(v);
    free(c.t);
    free(c.tmp);
    return rc;
}
