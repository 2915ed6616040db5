/* test_frame.c — FrameHeader pack/unpack round trip, every frame_validate
 * failure, and the bf16 payload helpers. */
#include <math.h>

#include "ib/frame.h"
#include "tests/ib/fixture.h"
#include "tests/testutil.h"

static int n_rejects = 0;
#define EXPECT_REJECT(f, bytes, needle)                                                        \
    do {                                                                                       \
        st_err e_ = {{0}};                                                                     \
        int rc_ = frame_validate(&(f)->h, (bytes), &e_);                                       \
        CHECK_MSG(rc_ == -1, "expected rejection (%s)", needle);                               \
        CHECK_MSG(strstr(e_.msg, needle) != NULL, "message '%s' lacks '%s'", e_.msg, needle); \
        n_rejects++;                                                                           \
    } while (0)

static void test_round_trip(void)
{
    fx f;
    fx_activations(&f, 99, 3, 10, 64, STRATA__V1__DTYPE__DTYPE_BF16, 1);
    st_err err;
    CHECK_EQ_INT(frame_validate(&f.h, 10 * 64 * 2, &err), 0);
    size_t len = 0;
    uint8_t *buf = frame_header_pack(&f.h, &len, &err);
    REQUIRE(buf);
    CHECK(len > 50);
    frame_header *h = frame_header_unpack(buf, len, &err);
    REQUIRE(h);
    CHECK_EQ_INT(h->kind, STRATA__V1__FRAME_KIND__FRAME_KIND_ACTIVATIONS);
    CHECK_EQ_INT(h->batch_id, 99);
    CHECK_EQ_INT(h->epoch, 7);
    CHECK_EQ_INT(h->stage, 1);
    CHECK_EQ_INT(h->n_seqs, 3);
    CHECK_EQ_INT(h->seqs[0]->n_tokens, 3);
    CHECK_EQ_INT(h->seqs[2]->n_tokens, 4);
    CHECK_EQ_INT(h->seqs[2]->seq_id, 102);
    CHECK_EQ_INT(h->seqs[2]->pos, 6);
    CHECK_EQ_INT(h->seqs[2]->n_block_table, 3);
    CHECK_EQ_INT(h->seqs[2]->block_table[2], 22);
    CHECK_EQ_INT(h->seqs[0]->wants_logits, 1);
    CHECK_EQ_INT(h->seqs[1]->wants_logits, 0);
    CHECK_NEAR(h->seqs[1]->sampling->temperature, 0.5, 0);
    CHECK_EQ_INT(h->seqs[1]->sampling->top_k, 40);
    CHECK_NEAR(h->seqs[1]->sampling->top_p, 0.9f, 0);
    CHECK_NEAR(h->seqs[1]->sampling->min_p, 0.05f, 0);
    CHECK_EQ_INT(h->seqs[1]->sampling->seed, 1235);
    CHECK_NEAR(h->seqs[1]->sampling->repeat_penalty, 1.1f, 0);
    CHECK_EQ_INT(h->seqs[2]->sampling->n_top_logprobs, 2);
    CHECK_EQ_INT(h->n_token_ids, 10);
    CHECK_EQ_INT(h->token_ids[9], (99 * 31 + 63) % 512);
    CHECK_EQ_INT(h->dtype, STRATA__V1__DTYPE__DTYPE_BF16);
    CHECK_EQ_INT(h->n_shape, 2);
    CHECK_EQ_INT(h->shape[0], 10);
    CHECK_EQ_INT(h->shape[1], 64);
    CHECK_EQ_INT(frame_total_tokens(h), 10);
    CHECK_EQ_INT(frame_validate(h, 10 * 64 * 2, &err), 0);
    /* repacking gives the same bytes */
    size_t len2 = 0;
    uint8_t *buf2 = frame_header_pack(h, &len2, &err);
    CHECK_EQ_INT(len2, len);
    CHECK(buf2 && memcmp(buf, buf2, len) == 0);
    free(buf2);
    frame_header_free(h);
    free(buf);
    fx_free(&f);

    fx t;
    fx_tokens(&t, 5, 3);
    CHECK_EQ_INT(frame_validate(&t.h, 0, &err), 0);
    buf = frame_header_pack(&t.h, &len, &err);
    REQUIRE(buf);
    h = frame_header_unpack(buf, len, &err);
    REQUIRE(h);
    CHECK_EQ_INT(h->kind, STRATA__V1__FRAME_KIND__FRAME_KIND_TOKENS);
    CHECK_EQ_INT(h->n_results, 3);
    CHECK_EQ_INT(h->results[2]->seq_id, 202);
    CHECK_EQ_INT(h->results[2]->token, 44);
    CHECK_NEAR(h->results[2]->logprob, -0.5, 0);
    CHECK_EQ_INT(h->results[2]->n_top, 2);
    CHECK_EQ_INT(h->results[2]->top[1]->token, 45);
    CHECK_NEAR(h->results[2]->top[1]->logprob, -1.5, 0);
    frame_header_free(h);
    free(buf);

    /* undecodable bytes */
    uint8_t junk[64];
    for (int i = 0; i < 64; i++) junk[i] = (uint8_t)(0xff - i);
    h = frame_header_unpack(junk, sizeof junk, &err);
    CHECK(h == NULL);
    CHECK(strstr(err.msg, "undecodable") != NULL);
    /* a truncated valid header */
    fx_activations(&f, 1, 2, 4, 8, STRATA__V1__DTYPE__DTYPE_F32, 1);
    buf = frame_header_pack(&f.h, &len, &err);
    REQUIRE(buf);
    h = frame_header_unpack(buf, len - 3, &err);
    CHECK(h == NULL);
    free(buf);
    fx_free(&f);
    /* empty bytes decode to a default header, which does not validate */
    h = frame_header_unpack("", 0, &err);
    REQUIRE(h);
    CHECK_EQ_INT(frame_validate(h, 0, &err), -1);
    CHECK(strstr(err.msg, "unknown kind") != NULL);
    frame_header_free(h);
}

static void test_validation(void)
{
    const int F32 = STRATA__V1__DTYPE__DTYPE_F32, BF16 = STRATA__V1__DTYPE__DTYPE_BF16;
    fx f;
    st_err err;
#define FRESH() (fx_free(&f), fx_activations(&f, 1, 2, 6, 16, F32, 1))
    fx_activations(&f, 1, 2, 6, 16, F32, 1);
    const size_t ok = 6 * 16 * 4;
    CHECK_EQ_INT(frame_validate(&f.h, ok, &err), 0);
    EXPECT_REJECT(&f, ok - 4, "payload");          /* shape x dtype != bytes */
    EXPECT_REJECT(&f, ok + 4, "payload");
    EXPECT_REJECT(&f, 0, "payload");
    FRESH(); f.h.dtype = BF16;                       /* bf16 halves the bytes */
    EXPECT_REJECT(&f, ok, "payload");
    CHECK_EQ_INT(frame_validate(&f.h, ok / 2, &err), 0);
    FRESH(); f.h.dtype = 0;
    EXPECT_REJECT(&f, ok, "dtype");
    FRESH(); f.h.dtype = 9;
    EXPECT_REJECT(&f, ok, "dtype");
    FRESH(); f.h.n_shape = 1;
    EXPECT_REJECT(&f, ok, "dims");
    FRESH(); f.shape[0] = 5;                         /* shape[0] != sum n_tokens */
    EXPECT_REJECT(&f, 5 * 16 * 4, "sum of n_tokens");
    FRESH(); f.shape[1] = 0;
    EXPECT_REJECT(&f, 0, "empty shape");
    FRESH(); f.shape[1] = 65537;
    EXPECT_REJECT(&f, (size_t)6 * 65537 * 4, "n_embd");
    /* payload_p2p: the rows follow on the boundary's NCCL communicator */
    FRESH(); f.h.payload_p2p = 1; f.h.n_token_ids = 0;
    CHECK_EQ_INT(frame_validate(&f.h, 0, &err), 0);
    EXPECT_REJECT(&f, ok, "payload_p2p with");
    FRESH(); f.h.payload_p2p = 1; f.h.dtype = BF16;
    EXPECT_REJECT(&f, 0, "payload_p2p rows must be f32");
    FRESH(); f.h.payload_p2p = 1; f.h.n_shape = 0;
    EXPECT_REJECT(&f, 0, "payload_p2p needs the rows' shape");
    FRESH(); f.h.payload_p2p = 1; f.shape[0] = 5;
    EXPECT_REJECT(&f, 0, "sum of n_tokens");
    FRESH(); f.h.payload_p2p = 1; f.h.kind = STRATA__V1__FRAME_KIND__FRAME_KIND_CONTROL;
    EXPECT_REJECT(&f, 0, "not ACTIVATIONS");
    FRESH(); f.seq[1].n_tokens = 0;
    EXPECT_REJECT(&f, ok, "n_tokens");
    FRESH(); f.seq[0].pos = -1;
    EXPECT_REJECT(&f, ok, "pos");
    FRESH(); f.seq[1].n_block_table = 0;
    EXPECT_REJECT(&f, ok, "empty block table");
    FRESH(); f.blocks[0][0] = -3;
    EXPECT_REJECT(&f, ok, "block id");
    FRESH(); f.h.n_token_ids = 5;                    /* token id count */
    EXPECT_REJECT(&f, ok, "token ids");
    FRESH(); f.tokens[2] = -1;
    EXPECT_REJECT(&f, ok, "token id -1");
    FRESH(); f.samp[0].temperature = -1.0f;
    EXPECT_REJECT(&f, ok, "temperature");
    FRESH(); f.samp[0].temperature = NAN;
    EXPECT_REJECT(&f, ok, "temperature");
    FRESH(); f.samp[1].top_k = -1;
    EXPECT_REJECT(&f, ok, "top_k");
    FRESH(); f.samp[1].top_p = 1.5f;
    EXPECT_REJECT(&f, ok, "top_p");
    FRESH(); f.samp[1].min_p = -0.1f;
    EXPECT_REJECT(&f, ok, "min_p");
    FRESH(); f.samp[1].repeat_penalty = -1.0f;
    EXPECT_REJECT(&f, ok, "repeat_penalty");
    FRESH(); f.samp[1].presence_penalty = INFINITY;
    EXPECT_REJECT(&f, ok, "penalties");
    FRESH(); f.samp[1].penalty_last_n = -2;
    EXPECT_REJECT(&f, ok, "penalty_last_n");
    FRESH(); f.samp[1].n_top_logprobs = 21;
    EXPECT_REJECT(&f, ok, "n_top_logprobs");
    FRESH(); f.h.kind = 0;
    EXPECT_REJECT(&f, ok, "unknown kind");
    FRESH(); f.h.kind = 77;
    EXPECT_REJECT(&f, ok, "unknown kind");
    FRESH(); f.h.n_seqs = 0;                          /* activations need sequences */
    f.h.n_token_ids = 0; f.h.n_shape = 0;
    EXPECT_REJECT(&f, 0, "without sequences");
    FRESH(); f.h.n_token_ids = 0; f.h.n_shape = 0;    /* neither tokens nor payload */
    EXPECT_REJECT(&f, 0, "neither");
    FRESH(); f.h.n_shape = 0; f.h.dtype = 0;          /* tokens only: valid */
    CHECK_EQ_INT(frame_validate(&f.h, 0, &err), 0);
    FRESH(); f.h.n_seqs = FRAME_MAX_SEQS + 1;
    EXPECT_REJECT(&f, ok, "seqs exceeds");
    FRESH(); f.seq[1].n_tokens = FRAME_MAX_TOKENS;
    EXPECT_REJECT(&f, ok, "more than");
    FRESH();
    EXPECT_REJECT(&f, (size_t)FRAME_MAX_PAYLOAD + 1, "exceeds");
    fx_free(&f);

    fx t;
    fx_tokens(&t, 1, 3);
    CHECK_EQ_INT(frame_validate(&t.h, 0, &err), 0);
    EXPECT_REJECT(&t, 16, "TOKENS with a payload");
    t.h.n_results = 0;
    EXPECT_REJECT(&t, 0, "without results");
    fx_tokens(&t, 1, 3);
    t.res[1].token = -5;
    EXPECT_REJECT(&t, 0, "token -5");
    fx_tokens(&t, 1, 3);
    t.res[2].seq_id = 200;
    EXPECT_REJECT(&t, 0, "duplicate seq id");
    fx_tokens(&t, 1, 3);
    t.res[0].n_top = 21;
    EXPECT_REJECT(&t, 0, "top logprobs");
    fx_tokens(&t, 1, 3);
    t.top[1][0].token = -1;
    EXPECT_REJECT(&t, 0, "bad top logprob");
    fx_tokens(&t, 1, 3);
    t.h.n_seqs = 1; /* an ACTIVATIONS-only field in a TOKENS frame is fine... */
    frame_seq s; strata__v1__seq_record__init(&s); s.n_tokens = 1; int32_t b0 = 0; s.block_table = &b0; s.n_block_table = 1;
    frame_seq *sp = &s; t.h.seqs = &sp;
    CHECK_EQ_INT(frame_validate(&t.h, 0, &err), 0);
    fx a;
    fx_activations(&a, 1, 1, 2, 4, F32, 0);
    a.h.results = t.resp; a.h.n_results = 1;         /* ...but results in ACTIVATIONS are not */
    EXPECT_REJECT(&a, 2 * 4 * 4, "carrying results");
    fx_free(&a);

    frame_header c;
    strata__v1__frame_header__init(&c);
    c.kind = STRATA__V1__FRAME_KIND__FRAME_KIND_CONTROL;
    c.control.data = (uint8_t *)"hi";
    c.control.len = 2;
    CHECK_EQ_INT(frame_validate(&c, 0, &err), 0);
    CHECK_EQ_INT(frame_validate(&c, 8, &err), -1); /* payload without shape */
    CHECK(strstr(err.msg, "dims") != NULL || strstr(err.msg, "CONTROL") != NULL);
    c.control.len = FRAME_MAX_CONTROL + 1;
    CHECK_EQ_INT(frame_validate(&c, 0, &err), -1);
    CHECK(strstr(err.msg, "control") != NULL);
    CHECK_EQ_INT(frame_validate(NULL, 0, &err), -1);
    CHECK(n_rejects >= 35);
#undef FRESH
}

static void test_bf16(void)
{
    float src[6] = {1.0f, -2.5f, 3.14159265f, 0.0f, 65504.0f, 1e-3f};
    uint16_t b[6];
    float back[6];
    frame_f32_to_bf16(src, b, 6);
    CHECK_EQ_INT(b[0], 0x3f80);
    CHECK_EQ_INT(b[1], 0xc020);
    CHECK_EQ_INT(b[2], 0x4049); /* 3.14159 -> 0x40490fdb rounds down to 0x4049 */
    CHECK_EQ_INT(b[3], 0x0000);
    frame_bf16_to_f32(b, back, 6);
    CHECK_NEAR(back[0], 1.0, 0);
    CHECK_NEAR(back[1], -2.5, 0);
    CHECK_NEAR(back[2], 3.140625, 0);
    for (int i = 0; i < 6; i++) CHECK_NEAR(back[i], src[i], fabsf(src[i]) / 128.0f);
    CHECK_EQ_INT(frame_dtype_size(STRATA__V1__DTYPE__DTYPE_F32), 4);
    CHECK_EQ_INT(frame_dtype_size(STRATA__V1__DTYPE__DTYPE_BF16), 2);
    CHECK_EQ_INT(frame_dtype_size(0), 0);
}

int main(void)
{
    test_round_trip();
    test_validation();
    test_bf16();
    return test_summary();
}
