/* test_synth.c — random-weight Llama models: a small shape in each dtype is
 * written, read back and checked (metadata llama.cpp needs, tensor names,
 * shapes, types, values from synth_value), determinism per seed, and the
 * tokenizer copy with padding (llama-spm) and truncation (gpt-2).
 */
#include <math.h>
#include <unistd.h>

#include "common/dtype.h"
#include "model/gguf.h"
#include "model/synth.h"
#include "tests/testutil.h"

static char tmpdir[256];

static const char *tmp_path(const char *name) {
    static char b[4][512];
    static int k;
    char *p = b[k++ % 4];
    snprintf(p, 512, "%s/%s", tmpdir, name);
    return p;
}

static uint32_t get_u32(gguf_file *f, const char *key) {
    uint32_t v = 0xdeadbeef;
    st_err err;
    if (gguf_get_u32(f, key, &v, &err)) fprintf(stderr, "%s\n", err.msg);
    return v;
}

static int same_files(const char *a, const char *b) {
    size_t na, nb;
    char *x = test_read_file(a, &na), *y = test_read_file(b, &nb);
    int same = na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

/* Expected dequantized value of element i of a tensor of `type`. */
static float expect(uint32_t type, const float *x, int64_t i) {
    switch (type) {
    case GGML_TYPE_F16: return st_fp16_to_f32(st_f32_to_fp16(x[i]));
    case GGML_TYPE_BF16: return st_bf16_to_f32(st_f32_to_bf16(x[i]));
    case GGML_TYPE_Q8_0: {
        const float *b = x + (i / 32) * 32;
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(b[j]));
        float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        return st_fp16_to_f32(st_f32_to_fp16(d)) * roundf(x[i] * id);
    }
    default: return x[i];
    }
}

static void check_model(const synth_params *p, const char *path, int64_t n_vocab) {
    st_err err;
    gguf_file *f = gguf_open(path, &err);
    REQUIRE_MSG(f, "%s", err.msg);
    char *s = NULL;
    CHECK(gguf_get_str(f, "general.architecture", &s, &err) == 0);
    CHECK_EQ_STR(s, "llama");
    free(s);
    CHECK_EQ_INT(get_u32(f, "llama.embedding_length"), p->n_embd);
    CHECK_EQ_INT(get_u32(f, "llama.block_count"), p->n_layer);
    CHECK_EQ_INT(get_u32(f, "llama.feed_forward_length"), p->n_ff);
    CHECK_EQ_INT(get_u32(f, "llama.attention.head_count"), p->n_head);
    CHECK_EQ_INT(get_u32(f, "llama.attention.head_count_kv"), p->n_head_kv);
    CHECK_EQ_INT(get_u32(f, "llama.rope.dimension_count"), p->n_embd / p->n_head);
    CHECK_EQ_INT(get_u32(f, "llama.context_length"), p->n_ctx);
    CHECK_EQ_INT(get_u32(f, "llama.vocab_size"), n_vocab);
    uint32_t ft = get_u32(f, "general.file_type");
    CHECK_EQ_INT(ft, p->dtype == GGML_TYPE_F32    ? 0
                     : p->dtype == GGML_TYPE_F16  ? 1
                     : p->dtype == GGML_TYPE_Q8_0 ? 7
                                                  : 32);
    float fb = 0, eps = 0;
    CHECK(gguf_get_f32(f, "llama.rope.freq_base", &fb, &err) == 0 && fb == p->rope_freq_base);
    CHECK(gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &eps, &err) == 0 &&
          eps == p->norm_eps);
    const gguf_kv *toks;
    CHECK(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks, &err) == 0 &&
          (int64_t)toks->arr_n == n_vocab);
    CHECK(gguf_get(f, "tokenizer.ggml.model") != NULL);
    CHECK_EQ_INT(gguf_n_tensors(f), 3 + 9 * p->n_layer);

    int64_t E = p->n_embd, KV = p->n_embd / p->n_head * p->n_head_kv;
    struct {
        const char *name;
        int64_t ne0, ne1;
        int norm;
    } want[] = {{"token_embd.weight", E, n_vocab, 0},  {"output_norm.weight", E, 1, 1},
                {"output.weight", E, n_vocab, 0},      {"blk.0.attn_q.weight", E, E, 0},
                {"blk.0.attn_k.weight", E, KV, 0},     {"blk.0.attn_v.weight", E, KV, 0},
                {"blk.0.attn_output.weight", E, E, 0}, {"blk.0.attn_norm.weight", E, 1, 1},
                {"blk.0.ffn_gate.weight", E, p->n_ff, 0}, {"blk.0.ffn_down.weight", p->n_ff, E, 0},
                {"blk.0.ffn_up.weight", E, p->n_ff, 0},   {"blk.0.ffn_norm.weight", E, 1, 1}};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        const gguf_tensor *t = gguf_find_tensor(f, want[k].name);
        CHECK_MSG(t != NULL, "%s missing", want[k].name);
        if (!t) continue;
        CHECK_MSG(gguf_tensor_at(f, (int64_t)k) == t, "%s out of order", want[k].name);
        CHECK_EQ_INT(t->n_dims, want[k].norm ? 1 : 2);
        CHECK_EQ_INT(t->ne[0], want[k].ne0);
        CHECK_EQ_INT(t->ne[1], want[k].ne1);
        CHECK_EQ_INT(t->type, want[k].norm ? GGML_TYPE_F32 : p->dtype);
        /* values of the first and last row */
        int64_t nr = gguf_tensor_nrows(t), n0 = t->ne[0];
        float *row = malloc((size_t)n0 * sizeof(float)), *x = malloc((size_t)n0 * sizeof(float));
        int bad = 0;
        for (int64_t r = 0; r < nr; r += nr - 1 > 0 ? nr - 1 : 1) {
            CHECK(gguf_tensor_rows_f32(t, r, 1, row, &err) == 0);
            for (int64_t i = 0; i < n0; i++)
                x[i] = synth_value(p->seed, p->weight_std, want[k].name, want[k].norm,
                                   (uint64_t)(r * n0 + i));
            for (int64_t i = 0; i < n0; i++)
                if (row[i] != expect(t->type, x, i)) bad++;
            if (nr == 1) break;
        }
        CHECK_MSG(bad == 0, "%s: %d values differ", want[k].name, bad);
        free(row);
        free(x);
    }
    /* value statistics of a big weight: mean ~0, sd ~std, norms ~1 */
    const gguf_tensor *t = gguf_find_tensor(f, "blk.1.ffn_up.weight");
    REQUIRE(t);
    int64_t n = gguf_tensor_nelements(t);
    float *all = malloc((size_t)n * sizeof(float));
    CHECK(gguf_tensor_rows_f32(t, 0, gguf_tensor_nrows(t), all, &err) == 0);
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < n; i++) sum += all[i], sq += (double)all[i] * all[i];
    double mean = sum / (double)n, sd = sqrt(sq / (double)n - mean * mean);
    CHECK_NEAR(mean, 0.0, 0.002);
    CHECK_NEAR(sd, p->weight_std, 0.002);
    free(all);
    t = gguf_find_tensor(f, "output_norm.weight");
    float nrm[1024];
    REQUIRE(t && t->ne[0] <= 1024);
    CHECK(gguf_tensor_rows_f32(t, 0, 1, nrm, &err) == 0 && fabsf(nrm[0] - 1.0f) < 0.1f);
    gguf_close(f);
}

static void test_dtypes(void) {
    const uint32_t types[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0};
    for (size_t k = 0; k < 4; k++) {
        synth_params p;
        synth_params_default(&p);
        p.n_embd = 64, p.n_layer = 2, p.n_head = 4, p.n_head_kv = 2, p.n_ff = 96;
        p.n_vocab = 300, p.n_ctx = 512, p.dtype = types[k], p.seed = 42;
        st_err err;
        const char *a = tmp_path("a.gguf"), *b = tmp_path("b.gguf"), *c = tmp_path("c.gguf");
        REQUIRE_MSG(synth_write(&p, a, &err) == 0, "%s", err.msg);
        check_model(&p, a, 300);
        /* deterministic per seed, different for another seed */
        REQUIRE_MSG(synth_write(&p, b, &err) == 0, "%s", err.msg);
        CHECK_MSG(same_files(a, b), "dtype %s: not deterministic", ggml_type_name(types[k]));
        p.seed = 43;
        REQUIRE_MSG(synth_write(&p, c, &err) == 0, "%s", err.msg);
        CHECK(!same_files(a, c));
        unlink(a), unlink(b), unlink(c);
    }
    /* values depend on (seed, name, index) only */
    CHECK(synth_value(1, 0.02f, "x", 0, 5) == synth_value(1, 0.02f, "x", 0, 5));
    CHECK(synth_value(1, 0.02f, "x", 0, 5) != synth_value(2, 0.02f, "x", 0, 5));
    CHECK(synth_value(1, 0.02f, "x", 0, 5) != synth_value(1, 0.02f, "y", 0, 5));
}

static void test_builtin_vocab(void) {
    synth_params p;
    synth_params_default(&p);
    st_err err;
    const char *a = tmp_path("v.gguf");
    REQUIRE_MSG(synth_write(&p, a, &err) == 0, "%s", err.msg);
    gguf_file *f = gguf_open(a, &err);
    REQUIRE_MSG(f, "%s", err.msg);
    const gguf_kv *toks, *types;
    CHECK(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks, &err) == 0);
    CHECK_EQ_INT(toks->arr_n, 259);
    CHECK(toks->arr_str[1].len == 3 && memcmp(toks->arr_str[1].data, "<s>", 3) == 0);
    CHECK(toks->arr_str[3 + 0x41].len == 6 && memcmp(toks->arr_str[3 + 0x41].data, "<0x41>", 6) == 0);
    CHECK(gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, &types, &err) == 0);
    CHECK(gguf_arr_i64(types, 0) == 2 && gguf_arr_i64(types, 2) == 3 && gguf_arr_i64(types, 258) == 6);
    CHECK_EQ_INT(get_u32(f, "tokenizer.ggml.eos_token_id"), 2);
    gguf_close(f);
    unlink(a);
    /* invalid shapes are refused */
    p.n_head = 5;
    CHECK(synth_write(&p, a, &err) == -1 && strstr(err.msg, "n_head 5 does not divide"));
    synth_params_default(&p);
    p.dtype = GGML_TYPE_Q8_0, p.n_ff = 100;
    CHECK(synth_write(&p, a, &err) == -1 && strstr(err.msg, "multiples of 32"));
    CHECK(access(a, F_OK) != 0);
    CHECK(synth_preset("nope", &p, &err) == -1);
    CHECK(synth_preset("bench-1b", &p, &err) == 0);
    CHECK_EQ_INT(p.n_embd, 2048);
    p.n_vocab = 32000;
    CHECK_EQ_INT(synth_n_params(&p), 1104218112LL); /* 1.10 B */
    CHECK(synth_preset("llama-3-8b", &p, &err) == 0);
    CHECK_EQ_INT(synth_n_params(&p), 8030261248LL); /* Llama-3-8B: 8.03 B */
    CHECK(synth_preset("llama-3.1-70b-layers", &p, &err) == 0 && p.n_layer == 2 &&
          p.n_head == 64 && p.n_ff == 28672 && p.rope_freq_base == 500000.0f);
}

static void test_vocab_copy(void) {
    synth_params p;
    synth_params_default(&p);
    p.n_layer = 1;
    p.vocab_path = test_shared_path("tokenizer/ggml-vocab-llama-spm.gguf");
    p.n_vocab = 32010;
    st_err err;
    const char *a = tmp_path("spm.gguf");
    REQUIRE_MSG(synth_write(&p, a, &err) == 0, "%s", err.msg);
    gguf_file *f = gguf_open(a, &err);
    REQUIRE_MSG(f, "%s", err.msg);
    const gguf_kv *toks, *scores, *types;
    CHECK(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks, &err) == 0);
    CHECK_EQ_INT(toks->arr_n, 32010);
    CHECK(toks->arr_str[15043].len == 8 && memcmp(toks->arr_str[15043].data, "\xe2\x96\x81Hello", 8) == 0);
    CHECK(toks->arr_str[32005].len == 10 && memcmp(toks->arr_str[32005].data, "<unused_5>", 10) == 0);
    CHECK(gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, &scores, &err) == 0);
    CHECK(scores->arr_n == 32010 && gguf_arr_f64(scores, 31999) == -31740.0 &&
          gguf_arr_f64(scores, 32009) == 0.0);
    CHECK(gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, &types, &err) == 0);
    CHECK(types->arr_n == 32010 && gguf_arr_i64(types, 32000) == 5 && gguf_arr_i64(types, 3) == 6);
    char *pre = NULL;
    CHECK(gguf_get_str(f, "tokenizer.ggml.pre", &pre, &err) == 0);
    CHECK_EQ_STR(pre, "default");
    free(pre);
    bool b = false;
    CHECK(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &b, &err) == 0 && b);
    CHECK(gguf_get(f, "llama.rope.freq_base") != NULL);
    CHECK_EQ_INT(gguf_find_tensor(f, "token_embd.weight")->ne[1], 32010);
    gguf_close(f);

    /* gpt-2 vocabulary truncated to 1000 tokens: merges kept, no scores invented */
    p.vocab_path = test_shared_path("tokenizer/ggml-vocab-gpt-2.gguf");
    p.n_vocab = 1000;
    REQUIRE_MSG(synth_write(&p, a, &err) == 0, "%s", err.msg);
    f = gguf_open(a, &err);
    REQUIRE_MSG(f, "%s", err.msg);
    const gguf_kv *merges;
    CHECK(gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks, &err) == 0 &&
          toks->arr_n == 1000);
    CHECK(gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_TYPE_STRING, &merges, &err) == 0 &&
          merges->arr_n == 50000);
    CHECK(gguf_get(f, "tokenizer.ggml.scores") == NULL);
    CHECK_EQ_INT(get_u32(f, "llama.vocab_size"), 1000);
    gguf_close(f);
    /* n_vocab 0: the vocabulary's own size */
    p.n_vocab = 0;
    REQUIRE_MSG(synth_write(&p, a, &err) == 0, "%s", err.msg);
    f = gguf_open(a, &err);
    REQUIRE_MSG(f, "%s", err.msg);
    CHECK_EQ_INT(get_u32(f, "llama.vocab_size"), 50257);
    gguf_close(f);
    unlink(a);
    /* a missing vocabulary file is a clean error */
    p.vocab_path = "/nonexistent/vocab.gguf";
    CHECK(synth_write(&p, a, &err) == -1 && strstr(err.msg, "/nonexistent/vocab.gguf"));
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/strata-test-synth-XXXXXX");
    REQUIRE(mkdtemp(tmpdir) != NULL);
    test_dtypes();
    test_builtin_vocab();
    test_vocab_copy();
    rmdir(tmpdir);
    return test_summary();
}
