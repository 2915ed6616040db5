/* test_gguf_corrupt.c — stories260K.gguf truncated at every offset through the
 * end of the tensor table and at sampled offsets in the data, every header and
 * metadata byte flipped, and seeded random overwrites of counts and lengths.
 * Each case must end in a clean error (or, for flips that keep the file
 * valid, a clean open whose tensors can all be read): no crash, and nothing
 * ASan can see. Truncated prefixes are exact-size heap copies so that any
 * read past the end is caught.
 */
#include <stdint.h>
#include <time.h>

#include "model/gguf.h"
#include "tests/testutil.h"

/* Walks everything a user of the reader would touch. */
static void walk(gguf_file *f) {
    volatile double sink = 0;
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const gguf_kv *kv = gguf_kv_at(f, i);
        if (kv->key.len) sink += (unsigned char)kv->key.data[kv->key.len - 1];
        if (kv->type == GGUF_TYPE_ARRAY) {
            if (kv->arr_type == GGUF_TYPE_STRING) {
                for (uint64_t j = 0; j < kv->arr_n; j++)
                    if (kv->arr_str[j].len) sink += (unsigned char)kv->arr_str[j].data[kv->arr_str[j].len - 1];
            } else if (kv->arr_n) {
                sink += gguf_arr_f64(kv, kv->arr_n - 1);
            }
        }
    }
    float *row = NULL;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if (t->nbytes) sink += ((const uint8_t *)t->data)[t->nbytes - 1];
        if (!ggml_type_supported(t->type) || gguf_tensor_nrows(t) == 0) continue;
        row = realloc(row, (size_t)t->ne[0] * sizeof(float) + 1);
        st_err err;
        if (gguf_tensor_rows_f32(t, gguf_tensor_nrows(t) - 1, 1, row, &err) == 0) sink += row[0];
    }
    free(row);
    (void)sink;
}

int main(void) {
    size_t size;
    char *file = test_read_file(test_shared_path("models/stories260K.gguf"), &size);
    st_err err;
    gguf_file *f = gguf_open_memory(file, size, "stories260K.gguf", &err);
    REQUIRE_MSG(f, "%s", err.msg);
    size_t data_off = gguf_data_offset(f);
    /* end of the tensor table = end of the last tensor info (before padding) */
    CHECK_EQ_INT(data_off, 14176);
    gguf_close(f);
    clock_t c0 = clock();

    /* 1. Truncation at every offset up to and including the data section start. */
    int bad = 0, n = 0;
    for (size_t len = 0; len <= data_off; len++) {
        char *copy = malloc(len ? len : 1);
        memcpy(copy, file, len);
        err.msg[0] = 0;
        f = gguf_open_memory(copy, len, "stories260K.gguf", &err);
        n++;
        if (f || strncmp(err.msg, "stories260K.gguf: at byte ", 26) != 0 ||
            (!strstr(err.msg, "truncated") && !strstr(err.msg, "larger than the file"))) {
            if (bad++ < 5)
                fprintf(stderr, "truncation at %zu: %s\n", len, f ? "opened" : err.msg);
        }
        gguf_close(f);
        free(copy);
    }
    CHECK_EQ_INT(bad, 0);
    /* 2. Sampled truncations in the data section, plus the last bytes. */
    bad = 0;
    for (size_t len = data_off + 1; len < size; len += (len < size - 64 ? 7919 : 1)) {
        char *copy = malloc(len);
        memcpy(copy, file, len);
        f = gguf_open_memory(copy, len, "stories260K.gguf", &err);
        n++;
        if (f || !strstr(err.msg, "truncated data")) {
            if (bad++ < 5) fprintf(stderr, "truncation at %zu: %s\n", len, f ? "opened" : err.msg);
        }
        gguf_close(f);
        free(copy);
    }
    CHECK_EQ_INT(bad, 0);
    printf("%d truncations in %.1f s\n", n, (double)(clock() - c0) / CLOCKS_PER_SEC);

    /* 3. Every byte of the header, metadata and tensor table flipped (xor 0xff),
     * then the high bit of the first 2 KiB and of the tensor table. The buffer is exact-size on the heap. */
    char *buf = malloc(size);
    memcpy(buf, file, size);
    int opened = 0, failed = 0;
    for (int pass = 0; pass < 2; pass++) {
        uint8_t mask = pass ? 0x80 : 0xff;
        for (size_t i = 0; i < data_off; i++) {
            /* the high-bit pass: counts and key lengths, and the tensor table */
            if (pass && i >= 2048 && i < data_off - 2200) continue;
            buf[i] ^= (char)mask;
            err.msg[0] = 0;
            f = gguf_open_memory(buf, size, "stories260K.gguf", &err);
            if (f) {
                opened++;
                walk(f);
                gguf_close(f);
            } else {
                failed++;
                test_checks++;
                if (strncmp(err.msg, "stories260K.gguf: at byte ", 26) != 0) {
                    test_failures++;
                    fprintf(stderr, "flip at %zu: bad message \"%s\"\n", i, err.msg);
                }
            }
            buf[i] ^= (char)mask;
        }
    }
    printf("byte flips: %d opened, %d refused, %.1f s\n", opened, failed,
           (double)(clock() - c0) / CLOCKS_PER_SEC);
    CHECK(failed > 100); /* magic, version, counts, lengths, types... */
    CHECK(opened > 100); /* token text, scores */

    /* 4. Seeded random overwrites of 1-8 bytes with interesting values in the
     * first 2 KiB (counts, lengths, types) and in the last 2200 bytes before the
     * data (the tensor table). */
    uint64_t s = 12345;
    const uint64_t vals[] = {0, 1, 0x7f, 0xff, 0xffff, 0xffffffffull, 0x7fffffffffffffffull,
                             0xffffffffffffffffull, 1ull << 32, 1ull << 40, 64, 31};
    for (int it = 0; it < 3000; it++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t r = s >> 11;
        size_t pos = (it & 1) ? (size_t)(r % 2048) : (size_t)(data_off - 2200 + r % 2200);
        size_t w = 1 + (r >> 20) % 8;
        if (pos + w > size) continue;
        uint64_t v = vals[(r >> 30) % (sizeof vals / sizeof vals[0])];
        char saved[8];
        memcpy(saved, buf + pos, w);
        memcpy(buf + pos, &v, w);
        f = gguf_open_memory(buf, size, "stories260K.gguf", &err);
        if (f) {
            walk(f);
            gguf_close(f);
        } else {
            test_checks++;
            if (strncmp(err.msg, "stories260K.gguf: at byte ", 26) != 0) {
                test_failures++;
                fprintf(stderr, "overwrite at %zu: bad message \"%s\"\n", pos, err.msg);
            }
        }
        memcpy(buf + pos, saved, w);
    }
    CHECK(memcmp(buf, file, size) == 0);
    printf("total %.1f s\n", (double)(clock() - c0) / CLOCKS_PER_SEC);
    free(buf);
    free(file);
    return test_summary();
}
