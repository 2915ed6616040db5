/* quantize.c — ggml's reference Q8_0/Q4_0 row quantizers and the GGUF model
 * quantizer (see quantize.h). Built with -ffp-contract=off: ggml's reference
 * results are those of plain IEEE float operations, with no fused
 * multiply-add (which a compiler could otherwise form from x * id + 8.5f).
 */
#include "model/quantize.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "model/gguf.h"

/* ---- row quantizers ---- */

#define GGML_MAX(a, b) ((a) > (b) ? (a) : (b)) /* ggml-impl.h's MAX: NaN-propagating as ggml's */

/* C's float -> int8_t conversion for values where it is defined; elsewhere
 * (NaN, ±inf, beyond int32) what x86 cvttss2si gives (INT32_MIN, low byte 0). */
static inline int8_t f32_to_i8(float v) {
    if (!(v > -2147483648.0f && v < 2147483648.0f)) return 0;
    return (int8_t)(uint8_t)(uint32_t)(int32_t)v;
}

static inline void put_f16(uint8_t *p, float v) {
    uint16_t h = st_f32_to_fp16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

void st_quantize_row_q8_0(const float *x, void *dst, int64_t n) {
    uint8_t *y = dst;
    for (int64_t b = 0; b < n / QK8_0; b++, x += QK8_0, y += 2 + QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) amax = GGML_MAX(amax, fabsf(x[j]));
        const float d = amax / ((1 << 7) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        put_f16(y, d);
        for (int j = 0; j < QK8_0; j++) {
            const float x0 = x[j] * id;
            y[2 + j] = (uint8_t)f32_to_i8(roundf(x0));
        }
    }
}

void st_quantize_row_q4_0(const float *x, void *dst, int64_t n) {
    uint8_t *y = dst;
    for (int64_t b = 0; b < n / QK4_0; b++, x += QK4_0, y += 2 + QK4_0 / 2) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK4_0; j++) {
            const float v = x[j];
            if (amax < fabsf(v)) {
                amax = fabsf(v);
                max = v;
            }
        }
        const float d = max / -8;
        const float id = d ? 1.0f / d : 0.0f;
        put_f16(y, d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const float x0 = x[j] * id;
            const float x1 = x[QK4_0 / 2 + j] * id;
            const int8_t i0 = f32_to_i8(x0 + 8.5f), i1 = f32_to_i8(x1 + 8.5f);
            const uint8_t xi0 = (uint8_t)(i0 < 15 ? i0 : 15); /* MIN(15, ...) */
            const uint8_t xi1 = (uint8_t)(i1 < 15 ? i1 : 15);
            y[2 + j] = (uint8_t)(xi0 | (xi1 << 4));
        }
    }
}

int st_quantize_row(uint32_t type, const float *x, void *dst, int64_t n) {
    if (n < 0 || n % 32) return -1;
    switch (type) {
    case GGML_TYPE_Q8_0: st_quantize_row_q8_0(x, dst, n); return 0;
    case GGML_TYPE_Q4_0: st_quantize_row_q4_0(x, dst, n); return 0;
    default: return -1;
    }
}

int st_llama_ftype(uint32_t type) {
    switch (type) {
    case GGML_TYPE_F32: return 0;   /* LLAMA_FTYPE_ALL_F32 */
    case GGML_TYPE_F16: return 1;   /* LLAMA_FTYPE_MOSTLY_F16 */
    case GGML_TYPE_Q4_0: return 2;  /* LLAMA_FTYPE_MOSTLY_Q4_0 */
    case GGML_TYPE_Q8_0: return 7;  /* LLAMA_FTYPE_MOSTLY_Q8_0 */
    case GGML_TYPE_BF16: return 32; /* LLAMA_FTYPE_MOSTLY_BF16 */
    default: return -1;
    }
}

/* ---- which tensors ---- */

static bool has(const char *s, size_t n, const char *sub) {
    size_t m = strlen(sub);
    for (size_t i = 0; i + m <= n; i++)
        if (memcmp(s + i, sub, m) == 0) return true;
    return false;
}

static bool is(const char *s, size_t n, const char *word) {
    return strlen(word) == n && memcmp(s, word, n) == 0;
}

/* llama.cpp src/llama-quant.cpp tensor_allows_quantization(). */
bool quantize_eligible(const char *name, size_t n, uint32_t n_dims) {
    if (n_dims < 2) return false;
    if (n < 6 || memcmp(name + n - 6, "weight", 6) != 0) return false;
    static const char *const never[] = {
        "_norm.weight",      "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight",
        "altup",             "laurel",              "per_layer_model_proj",
        "ssm_conv1d",        "shortconv.conv.weight", "indexer.k_proj.weight",
        "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight",
        "time_mix_w1.weight", "time_mix_w2.weight", "time_mix_v0.weight",
        "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight",
        "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
        "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
        "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd",
        "sam.pos_embd",      "sam.neck.",           "sam.net_",
        ".rel_pos",          ".patch_embd",         ".patch_merger",
        "a.rvq.codebook",    "mm.a.code_embd",
    };
    for (size_t i = 0; i < sizeof never / sizeof never[0]; i++)
        if (has(name, n, never[i])) return false;
    /* LLM_TENSOR_POS_EMBD and LLM_TENSOR_TOKEN_TYPES */
    if (is(name, n, "position_embd.weight") || is(name, n, "token_types.weight")) return false;
    return true;
}

/* ---- the model ---- */

enum action { COPY, QUANTIZE };

typedef struct qtensor {
    const gguf_tensor *src;
    enum action act;
    uint64_t src_row_bytes;
} qtensor;

typedef struct qctx {
    const gguf_file *f;
    uint32_t type;
    qtensor *t;
    float *row; /* one row of f32 */
    st_err err; /* the fill error, reported as is (without the writer's prefix) */
    int failed;
} qctx;

static const char *src_name(const gguf_tensor *t, char *buf, size_t cap) {
    size_t n = t->name.len < cap - 1 ? (size_t)t->name.len : cap - 1;
    memcpy(buf, t->name.data, n);
    buf[n] = 0;
    return buf;
}

static int fill(void *vctx, int64_t ti, int64_t row0, int64_t n_rows, void *dst, st_err *err) {
    qctx *c = vctx;
    const qtensor *q = &c->t[ti];
    const gguf_tensor *t = q->src;
    const uint8_t *src = (const uint8_t *)t->data + (uint64_t)row0 * q->src_row_bytes;
    size_t span = (size_t)((uint64_t)n_rows * q->src_row_bytes);
    if (q->act == COPY) {
        memcpy(dst, src, span);
    } else {
        const int64_t n = t->ne[0];
        const size_t rb = ggml_row_bytes(c->type, n);
        for (int64_t r = 0; r < n_rows; r++) {
            if (st_dequant_row(t->type, src + (size_t)r * q->src_row_bytes, c->row, n)) {
                c->failed = 1;
                return st_errf(err, "internal: cannot convert a %s row", ggml_type_name(t->type));
            }
            for (int64_t i = 0; i < n; i++)
                if (!isfinite(c->row[i])) {
                    char nm[256];
                    c->failed = 1;
                    return st_errf(&c->err, "%s: tensor '%s': element %" PRId64 " of row %" PRId64
                                   " is %s; cannot quantize", gguf_path(c->f),
                                   src_name(t, nm, sizeof nm), i, row0 + r,
                                   isnan(c->row[i]) ? "nan" : "inf");
                }
            uint8_t *out = (uint8_t *)dst + (size_t)r * rb;
            st_quantize_row(c->type, c->row, out, n);
            const size_t bb = ggml_row_bytes(c->type, 32); /* bytes per block */
            for (int64_t b = 0; b < n / QK8_0; b++) {
                uint16_t h = (uint16_t)(out[b * bb] | (out[b * bb + 1] << 8));
                if ((h & 0x7c00) == 0x7c00) {
                    char nm[256];
                    c->failed = 1;
                    return st_errf(&c->err, "%s: tensor '%s': row %" PRId64 ", block %" PRId64
                                   ": the %s scale overflows f16 (values too large)",
                                   gguf_path(c->f), src_name(t, nm, sizeof nm), row0 + r, b,
                                   ggml_type_name(c->type));
                }
            }
        }
    }
    gguf_release_pages(c->f, src, span);
    return 0;
}

int quantize_file(const char *in, const char *out, const quantize_params *p, quantize_stats *stats,
                  st_err *err) {
    if (p->type != GGML_TYPE_Q8_0 && p->type != GGML_TYPE_Q4_0)
        return st_errf(err, "quantize: type %s not supported (q8_0, q4_0)",
                       ggml_type_name(p->type));
    quantize_stats st = {0};
    gguf_file *f = gguf_open(in, err);
    if (!f) return -1;
    qctx c = {.f = f, .type = p->type};
    gguf_writer *w = NULL;
    char **names = NULL;
    int rc = -1;
    int64_t nt = gguf_n_tensors(f);
    const char *tn = ggml_type_name(p->type);

    int64_t n_split = 0;
    if (gguf_get(f, "split.count") && gguf_get_i64(f, "split.count", &n_split, NULL) == 0 &&
        n_split > 1) {
        st_errf(err, "%s: is one part of a split model (split.count %" PRId64 "); merge it "
                "first (llama-gguf-split --merge)", in, n_split);
        goto out;
    }

    c.t = calloc((size_t)(nt ? nt : 1), sizeof *c.t);
    names = calloc((size_t)(nt ? nt : 1), sizeof *names);
    w = gguf_writer_new();
    if (!c.t || !names || !w) {
        st_errf(err, "quantize: out of memory");
        goto out;
    }

    /* Decide every tensor first, so that refusals come before any writing. */
    int64_t max_row = 0;
    for (int64_t i = 0; i < nt; i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        qtensor *q = &c.t[i];
        q->src = t;
        names[i] = malloc((size_t)t->name.len + 1);
        if (!names[i]) {
            st_errf(err, "quantize: out of memory");
            goto out;
        }
        memcpy(names[i], t->name.data, (size_t)t->name.len);
        names[i][t->name.len] = 0;
        int64_t rows = gguf_tensor_nrows(t);
        q->src_row_bytes = rows ? t->nbytes / (uint64_t)rows : 0;
        q->act = COPY;
        st.n_tensors++;
        st.bytes_in += t->nbytes;
        if (!quantize_eligible(t->name.data, (size_t)t->name.len, t->n_dims)) {
            st.n_copied++;
            continue;
        }
        if (t->type == p->type) {
            st.n_same++;
            continue;
        }
        if (t->ne[0] % 32) {
            st.n_kept++;
            if (p->notice) {
                char msg[512];
                snprintf(msg, sizeof msg, "%s: row length %" PRId64 " is not a multiple of 32; "
                         "kept as %s", names[i], t->ne[0], gguf_tensor_type_name(t->type));
                p->notice(p->notice_ctx, msg);
            }
            continue;
        }
        switch (t->type) {
        case GGML_TYPE_F32:
        case GGML_TYPE_F16:
        case GGML_TYPE_BF16:
            break;
        case GGML_TYPE_Q8_0:
        case GGML_TYPE_Q4_0:
            if (p->allow_requantize) break;
            st_errf(err, "%s: tensor '%s' is already %s; requantizing it to %s is disabled "
                    "(pass --allow-requantize to dequantize and quantize again)", in, names[i],
                    ggml_type_name(t->type), tn);
            goto out;
        default:
            st_errf(err, "%s: tensor '%s' has type %s, which cannot be converted to %s", in,
                    names[i], gguf_tensor_type_name(t->type), tn);
            goto out;
        }
        q->act = QUANTIZE;
        st.n_quantized++;
        if (t->ne[0] > max_row) max_row = t->ne[0];
    }
    c.row = malloc((size_t)(max_row ? max_row : 1) * sizeof(float));
    if (!c.row) {
        st_errf(err, "quantize: out of memory");
        goto out;
    }

    /* Metadata: every key in order, then the two llama-quantize sets. */
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        if (is(kv->key.data, (size_t)kv->key.len, "general.quantization_version") ||
            is(kv->key.data, (size_t)kv->key.len, "general.file_type"))
            continue;
        if (gguf_writer_copy_kv(w, kv, err)) goto out;
    }
    if (gguf_writer_set_u32(w, "general.quantization_version", 2, err) || /* GGML_QNT_VERSION */
        gguf_writer_set_u32(w, "general.file_type", (uint32_t)st_llama_ftype(p->type), err))
        goto out;

    for (int64_t i = 0; i < nt; i++) {
        const qtensor *q = &c.t[i];
        uint32_t type = q->act == QUANTIZE ? p->type : q->src->type;
        if (gguf_writer_add_tensor_fill(w, names[i], type, q->src->n_dims, q->src->ne, fill, &c, i,
                                        err))
            goto out;
    }
    if (gguf_writer_write(w, out, err)) {
        if (c.failed && c.err.msg[0]) *err = c.err;
        goto out;
    }

    gguf_file *o = gguf_open(out, err);
    if (!o) {
        st_err_prefix(err, "quantize: the written file does not read back");
        goto out;
    }
    for (int64_t i = 0; i < gguf_n_tensors(o); i++) st.bytes_out += gguf_tensor_at(o, i)->nbytes;
    gguf_close(o);
    rc = 0;
out:
    if (stats) *stats = st;
    if (names)
        for (int64_t i = 0; i < nt; i++) free(names[i]);
    free(names);
    free(c.t);
    free(c.row);
    gguf_writer_free(w);
    gguf_close(f);
    return rc;
}
