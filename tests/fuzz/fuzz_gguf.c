/* fuzz_gguf.c — libFuzzer target for the GGUF reader: open the input with
 * gguf_open_memory, walk every key/value and tensor, dequantize one row of
 * each loadable tensor, close. A refused input must carry a message that
 * names the file and the byte offset; anything else (crash, sanitizer report,
 * leak, malformed message) is a finding. Built by scripts/fuzz only.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_err err;
    err.msg[0] = 0;
    gguf_file *f = gguf_open_memory(data, size, "fuzz.gguf", &err);
    if (!f) {
        if (strncmp(err.msg, "fuzz.gguf: at byte ", 19) != 0) {
            fprintf(stderr, "error message without file/offset: \"%s\"\n", err.msg);
            abort();
        }
        return 0;
    }
    volatile double sink = 0;
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        if (kv->key.len) sink += (unsigned char)kv->key.data[kv->key.len - 1];
        if (kv->type == GGUF_TYPE_STRING && kv->v.str.len)
            sink += (unsigned char)kv->v.str.data[kv->v.str.len - 1];
        if (kv->type == GGUF_TYPE_ARRAY) {
            if (kv->arr_type == GGUF_TYPE_STRING) {
                for (uint64_t j = 0; j < kv->arr_n; j++)
                    if (kv->arr_str[j].len)
                        sink += (unsigned char)kv->arr_str[j].data[kv->arr_str[j].len - 1];
            } else if (kv->arr_n && kv->arr_type != GGUF_TYPE_ARRAY) {
                sink += gguf_arr_f64(kv, 0) + (double)gguf_arr_i64(kv, kv->arr_n - 1);
            }
        }
        if (kv->raw_len) sink += ((const uint8_t *)kv->raw)[kv->raw_len - 1];
    }
    uint32_t u;
    int64_t i64;
    float fl;
    char *s = NULL;
    gguf_get_u32(f, "llama.block_count", &u, NULL);
    gguf_get_i64(f, "tokenizer.ggml.bos_token_id", &i64, NULL);
    gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &fl, NULL);
    if (gguf_get_str(f, "general.architecture", &s, NULL) == 0) free(s);
    float *row = NULL;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if (t->nbytes) sink += ((const uint8_t *)t->data)[t->nbytes - 1];
        int64_t nr = gguf_tensor_nrows(t);
        if (nr == 0 || t->ne[0] > (1 << 24)) continue;
        float *r2 = realloc(row, (size_t)t->ne[0] * sizeof(float) + 4);
        if (!r2) break;
        row = r2;
        if (gguf_tensor_rows_f32(t, nr - 1, 1, row, &err) == 0) sink += row[0];
        else if (ggml_type_supported(t->type)) abort(); /* a loadable tensor must load */
        if (gguf_find_tensor(f, "output.weight") == t) sink += 1;
    }
    free(row);
    (void)sink;
    gguf_close(f);
    return 0;
}
