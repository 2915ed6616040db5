/* test_engine_shard.c — the Llama config, the Megatron shard plan (uneven
 * splits, KV-head replication, refusals) and the paged KV allocator. */
#include <string.h>

#include "engine/stage.h"
#include "model/gguf.h"
#include "model/kv.h"
#include "model/llama.h"
#include "model/shard.h"
#include "tests/testutil.h"

static llama_config stories(void) {
    llama_config c = {.n_layer = 5, .n_embd = 64, .n_head = 8, .n_head_kv = 4, .n_ff = 172,
                      .head_dim = 8, .n_vocab = 512, .n_rot = 8, .rope_base = 10000.0f,
                      .rms_eps = 1e-5f, .n_ctx_train = 2048, .bos_id = 1, .eos_id = 2, .add_bos = true};
    return c;
}

static void test_config(void) {
    st_err err;
    gguf_file *f = gguf_open(test_shared_path("models/stories260K.gguf"), &err);
    REQUIRE_MSG(f, "%s", err.msg);
    llama_config c;
    REQUIRE_MSG(llama_config_from_gguf(f, &c, &err) == 0, "%s", err.msg);
    CHECK_EQ_INT(c.n_layer, 5);
    CHECK_EQ_INT(c.n_embd, 64);
    CHECK_EQ_INT(c.n_head, 8);
    CHECK_EQ_INT(c.n_head_kv, 4);
    CHECK_EQ_INT(c.n_ff, 172);
    CHECK_EQ_INT(c.head_dim, 8);
    CHECK_EQ_INT(c.n_vocab, 512);
    CHECK_EQ_INT(c.n_rot, 8);
    CHECK_NEAR(c.rope_base, 10000.0, 0);
    CHECK_NEAR(c.rms_eps, 1e-5, 1e-12);
    CHECK_EQ_INT(c.n_ctx_train, 2048);
    CHECK(!c.tied_output);
    CHECK(!c.has_rope_freqs);
    CHECK_EQ_INT(c.bos_id, 1);
    CHECK_EQ_INT(c.eos_id, 2);
    CHECK(c.add_bos);
    gguf_close(f);

    llama_config bad = stories();
    bad.head_dim = 7;
    CHECK(llama_config_validate(&bad, &err) == -1);
    CHECK(strstr(err.msg, "n_embd 64 != n_head 8 * head_dim 7") != NULL);
    bad = stories();
    bad.n_head_kv = 3;
    CHECK(llama_config_validate(&bad, &err) == -1);
    CHECK(strstr(err.msg, "not a multiple of n_head_kv 3") != NULL);
}

static void test_shard(void) {
    llama_config c = stories();
    shard_plan p;
    st_err err;
    /* n_ff 172 at t=8: 22,22,22,22,21,21,21,21; contiguous and complete. */
    const int ff8[8] = {22, 22, 22, 22, 21, 21, 21, 21};
    int64_t at = 0;
    for (int r = 0; r < 8; r++) {
        REQUIRE_MSG(shard_plan_make(&c, 8, r, &p, &err) == 0, "%s", err.msg);
        CHECK_EQ_INT(p.n_ff_local, ff8[r]);
        CHECK_EQ_INT(p.ff.lo, at);
        at = p.ff.hi;
        /* 8 query heads, 4 KV heads at t=8: one query head each, KV replicated 2x. */
        CHECK_EQ_INT(p.n_head_local, 1);
        CHECK_EQ_INT(p.q_heads.lo, r);
        CHECK_EQ_INT(p.kv_replicated, 1);
        CHECK_EQ_INT(p.n_head_kv_local, 1);
        CHECK_EQ_INT(p.kv_heads.lo, r / 2); /* = r * n_head_kv / t; query head r uses KV head r / 2 */
        CHECK_EQ_INT(p.n_vocab_local, 64);
    }
    CHECK_EQ_INT(at, 172);
    /* TP 2: even splits, no replication. */
    REQUIRE(shard_plan_make(&c, 2, 1, &p, &err) == 0);
    CHECK_EQ_INT(p.q_heads.lo, 4);
    CHECK_EQ_INT(p.q_heads.hi, 8);
    CHECK_EQ_INT(p.kv_heads.lo, 2);
    CHECK_EQ_INT(p.kv_heads.hi, 4);
    CHECK_EQ_INT(p.kv_replicated, 0);
    CHECK_EQ_INT(p.n_ff_local, 86);
    CHECK_EQ_INT(p.vocab.lo, 256);
    /* vocab 512 at t=3 (n_head 12 so that heads divide): 171, 171, 170. */
    llama_config c3 = stories();
    c3.n_head = 12;
    c3.n_head_kv = 3;
    c3.n_embd = 96;
    const int v3[3] = {171, 171, 170};
    at = 0;
    for (int r = 0; r < 3; r++) {
        REQUIRE_MSG(shard_plan_make(&c3, 3, r, &p, &err) == 0, "%s", err.msg);
        CHECK_EQ_INT(p.n_vocab_local, v3[r]);
        CHECK_EQ_INT(p.vocab.lo, at);
        at = p.vocab.hi;
        CHECK_EQ_INT(p.n_head_kv_local, 1);
        CHECK_EQ_INT(p.kv_heads.lo, r);
    }
    CHECK_EQ_INT(at, 512);
    /* Refusals. */
    CHECK(shard_plan_make(&c, 3, 0, &p, &err) == -1);
    CHECK_MSG(strstr(err.msg, "n_head 8 is not divisible by the TP degree 3") != NULL, "%s", err.msg);
    CHECK(shard_plan_make(&c, 0, 0, &p, &err) == -1);
    CHECK(shard_plan_make(&c, 2, 2, &p, &err) == -1);
    llama_config c6 = stories();
    c6.n_head = 12; c6.n_embd = 96; c6.n_head_kv = 4; /* t=6 > 4 kv heads but not a multiple */
    CHECK(shard_plan_make(&c6, 6, 0, &p, &err) == -1);
    CHECK_MSG(strstr(err.msg, "multiple") != NULL, "%s", err.msg);

    /* The stage refuses TP 3 on the real model with the same message. */
    stage_params sp = {.model_path = test_shared_path("models/stories260K.gguf"), .last_layer = -1,
                       .tp = 3, .n_threads = 1, .kv_blocks = 4};
    stage *s = stage_open(&sp, &err);
    CHECK(s == NULL);
    CHECK_MSG(strstr(err.msg, "not divisible by the TP degree 3") != NULL, "%s", err.msg);
    sp.tp = 2;
    sp.first_layer = 3;
    sp.last_layer = 9;
    s = stage_open(&sp, &err);
    CHECK(s == NULL);
    CHECK_MSG(strstr(err.msg, "layer range [3, 9)") != NULL, "%s", err.msg);
    sp.model_path = "/nonexistent/model.gguf";
    CHECK(stage_open(&sp, &err) == NULL);
}

static void test_kv(void) {
    st_err err;
    CHECK(kv_alloc_new(0, 16, &err) == NULL);
    kv_alloc *a = kv_alloc_new(4, 16, &err);
    REQUIRE(a);
    CHECK_EQ_INT(kv_blocks_for(a, 0), 0);
    CHECK_EQ_INT(kv_blocks_for(a, 16), 1);
    CHECK_EQ_INT(kv_blocks_for(a, 17), 2);
    kv_table t1, t2;
    kv_table_init(&t1);
    kv_table_init(&t2);
    CHECK(kv_table_reserve(a, &t1, 20, &err) == 0);
    CHECK_EQ_INT(t1.n_blocks, 2);
    CHECK_EQ_INT(t1.blocks[0], 0);
    CHECK_EQ_INT(t1.blocks[1], 1);
    CHECK_EQ_INT(kv_alloc_n_free(a), 2);
    CHECK(kv_table_reserve(a, &t2, 48, &err) == -1); /* 3 blocks, 2 free: refused, unchanged */
    CHECK_EQ_INT(t2.n_blocks, 0);
    CHECK_EQ_INT(kv_alloc_n_free(a), 2);
    CHECK(kv_table_reserve(a, &t2, 32, &err) == 0);
    CHECK_EQ_INT(kv_alloc_n_free(a), 0);
    CHECK(kv_block_get(a, &err) == -1);
    kv_table_release(a, &t1);
    CHECK_EQ_INT(kv_alloc_n_free(a), 2);
    CHECK_EQ_INT(kv_block_get(a, &err), 0); /* lowest free first */
    CHECK(kv_block_put(a, 0, &err) == 0);
    CHECK(kv_block_put(a, 0, &err) == -1); /* double free */
    CHECK(kv_block_put(a, 9, &err) == -1);
    kv_table_release(a, &t2);
    CHECK_EQ_INT(kv_alloc_n_free(a), 4);
    kv_alloc_free(a);
}

int main(void) {
    test_config();
    test_shard();
    test_kv();
    return test_summary();
}
