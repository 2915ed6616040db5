/* quantize.h — ggml's reference quantizers (Q8_0, Q4_0) and the model
 * quantizer behind `strata-gguf quantize IN OUT q8_0|q4_0` (llama.cpp's
 * llama-quantize for those two types).
 *
 * Row quantizers: byte-for-byte ggml-quants.c quantize_row_q8_0_ref and
 * quantize_row_q4_0_ref (what llama-quantize runs for Q8_0/Q4_0 without an
 * importance matrix). The block layouts are in common/dtype.h.
 *   Q8_0: amax = max |x| of the 32-block, d = amax / 127, id = d ? 1/d : 0,
 *         q[i] = roundf(x[i] * id) (ties away from zero), d stored as fp16.
 *   Q4_0: max = the element with the largest |x| (the first one on ties),
 *         keeping its sign; d = max / -8, id = d ? 1/d : 0,
 *         q[i] = MIN(15, (int8_t)(x[i] * id + 8.5f)); byte j holds q[j] in the
 *         low nibble and q[j + 16] in the high one; d stored as fp16.
 * For finite inputs the results equal ggml's. ggml converts a float to int8_t
 * with C's (undefined when out of range) cast; here such values (NaN, ±inf,
 * from a subnormal scale whose inverse overflows) are converted as x86's
 * cvttss2si does (the low byte of INT32_MIN: 0) so the functions never invoke
 * undefined behaviour. quantize_file refuses non-finite inputs anyway.
 *
 * Model quantizer (quantize_file): which tensors, which type.
 *  - A tensor is quantized when llama-quantize would (quantize_eligible):
 *    at least 2 dimensions, name ending in "weight", not a norm
 *    ("_norm.weight") and not one of llama.cpp's exclusions (expert gates,
 *    position/token-type embeddings, SSM conv1d, RWKV time_mix, T5 relative
 *    bias, ...). For a Llama model: token_embd, output, attn_q/k/v/output,
 *    ffn_gate/up/down. Everything else (1-D norms) is copied byte for byte.
 *  - Every such tensor gets the requested type, like `llama-quantize --pure`.
 *    (Without --pure llama-quantize makes output.weight — or a tied
 *    token_embd — Q6_K for Q4_0, a type Strata cannot load.)
 *  - A tensor whose row length (ne[0]) is not a multiple of 32 is kept as it
 *    is and reported through the notice callback (llama-quantize stops with
 *    "no tensor type fallback is defined" there).
 *  - Sources F32, F16 and BF16 are converted to f32 first (exactly). A source
 *    already of the target type is copied unchanged. A source of another
 *    quantized type is refused, as llama-quantize does ("requantizing ... is
 *    disabled"), unless allow_requantize: then Q8_0/Q4_0 are dequantized to
 *    f32 and quantized again (lossy). Other types (K-quants, integers) are
 *    refused. Non-finite values, and scales that overflow fp16, are refused.
 *  - Metadata: every key/value is copied in order, except
 *    general.quantization_version (set to 2, GGML_QNT_VERSION) and
 *    general.file_type (LLAMA_FTYPE_MOSTLY_Q8_0 = 7, MOSTLY_Q4_0 = 2), which
 *    are appended last as llama.cpp's gguf_set_val_u32 does. Split files
 *    (split.count > 1) are refused.
 *  - Tensors keep their order (llama-quantize sorts them by name) and the
 *    input's general.alignment.
 *  - OUT is written as OUT.tmp and renamed (gguf_writer_write), so a failure
 *    never leaves a partial OUT. Data are streamed a few MiB at a time.
 */
#ifndef STRATA_MODEL_QUANTIZE_H
#define STRATA_MODEL_QUANTIZE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* n must be a multiple of 32; dst receives n/32 blocks (34 bytes each for
 * Q8_0, 18 for Q4_0). */
void st_quantize_row_q8_0(const float *x, void *dst, int64_t n);
void st_quantize_row_q4_0(const float *x, void *dst, int64_t n);
/* Either of the above by type; -1 for another type or n not a multiple of 32. */
int st_quantize_row(uint32_t type, const float *x, void *dst, int64_t n);

/* llama.cpp's general.file_type (enum llama_ftype) for a model whose weights
 * are `type`: F32 0, F16 1, Q4_0 2, Q8_0 7, BF16 32; -1 for other types. */
int st_llama_ftype(uint32_t type);

/* True when llama-quantize would quantize a tensor of this name (name_len
 * bytes, no NUL needed) and number of dimensions. */
bool quantize_eligible(const char *name, size_t name_len, uint32_t n_dims);

typedef struct quantize_params {
    uint32_t type;         /* GGML_TYPE_Q8_0 or GGML_TYPE_Q4_0 */
    bool allow_requantize; /* Q8_0 <-> Q4_0 sources: dequantize and quantize again */
    /* Called with a one-line message for each weight kept unquantized because
     * of its shape; NULL: silent. */
    void (*notice)(void *ctx, const char *msg);
    void *notice_ctx;
} quantize_params;

typedef struct quantize_stats {
    int64_t n_tensors;
    int64_t n_quantized; /* converted to the target type */
    int64_t n_same;      /* weights already of the target type, copied */
    int64_t n_kept;      /* weights kept as they were: row length not a multiple of 32 */
    int64_t n_copied;    /* not weights to quantize (norms, ...), copied */
    uint64_t bytes_in, bytes_out; /* tensor data, without padding */
} quantize_stats;

/* Quantizes the GGUF model `in` into `out` (see above). stats may be NULL.
 * Errors name the file and the tensor. */
int quantize_file(const char *in, const char *out, const quantize_params *p, quantize_stats *stats,
                  st_err *err);

#endif
