/* test_sched.c — the scheduler core with real counts: block accounting after
 * finish and cancel, micro-batches in flight per stage, chunked prefill,
 * admission by KV capacity, queue-full rejection, aborts and bad input;
 * preemption and prefix caching against a simulated pipeline whose KV
 * memory is addressed through the block tables. */
#include <string.h>

#include "coordinator/serve/sched.h"
#include "tests/testutil.h"

static sched_config base_cfg(int n_stages) {
    sched_config c = {0};
    c.n_stages = n_stages;
    c.max_queue = 64;
    c.max_seqs = 64;
    c.prefill_chunk = 512;
    c.max_batch_tokens = 4096;
    c.n_ctx = 1024;
    c.eos_id = 2;
    return c;
}

static void prompt_of(int32_t *p, int n, int seed) {
    for (int i = 0; i < n; i++) p[i] = 10 + (seed * 7 + i) % 300;
}

/* Answers a batch with sampled id 100 + seq_id for every slice. */
static int answer(sched *s, const sched_batch *b, const sched_event **ev) {
    int32_t ids[256];
    for (int i = 0; i < b->n_seqs; i++) ids[i] = b->seqs[i].sample ? (int32_t)(100 + b->seqs[i].seq_id) : -1;
    int n_ev = -1;
    st_err e;
    REQUIRE_MSG(sched_on_tokens(s, b->id, ids, b->n_seqs, ev, &n_ev, &e) == 0, "%s", e.msg);
    return n_ev;
}

static void test_finish_frees_blocks(void) {
    st_err e;
    block_manager *kv = bm_new(64, 16, false, &e);
    sched_config c = base_cfg(1);
    sched *s = sched_create(&c, kv, &e);
    REQUIRE(s);
    int32_t p[20];
    uint64_t id[3];
    for (int i = 0; i < 3; i++) {
        prompt_of(p, 20, i);
        REQUIRE(sched_add(s, p, 20, 5, NULL, &id[i], &e) == 0);
    }
    CHECK_EQ_INT(id[0], 1);
    CHECK_EQ_INT(id[2], 3);
    sched_stats st;
    sched_stats_get(s, &st);
    CHECK_EQ_INT(st.n_waiting, 3);
    CHECK_EQ_INT(st.blocks_free, 64);
    int steps = 0, finished = 0, tokens = 0;
    const sched_batch *b;
    while ((b = sched_next_microbatch(s)) != NULL) {
        steps++;
        if (steps == 1) {
            CHECK_EQ_INT(b->n_seqs, 3);
            CHECK_EQ_INT(b->n_tokens, 60);
            CHECK_EQ_INT(b->seqs[0].pos, 0);
            CHECK_EQ_INT(b->seqs[0].n_blocks, 2); /* 20 positions / 16 */
            CHECK(b->seqs[0].sample && b->seqs[0].prefill);
            prompt_of(p, 20, 1);
            CHECK_EQ_INT(b->seqs[1].tokens[0], p[0]);
            CHECK_EQ_INT(b->seqs[1].tokens[19], p[19]);
            sched_stats_get(s, &st);
            CHECK_EQ_INT(st.blocks_used, 6);
            CHECK_EQ_INT(st.n_running, 3);
            CHECK_EQ_INT(st.n_inflight, 1);
            CHECK(sched_next_microbatch(s) == NULL); /* 1 stage: 1 batch in flight */
        } else {
            CHECK_EQ_INT(b->n_seqs, 3);
            CHECK_EQ_INT(b->n_tokens, 3);
            CHECK_EQ_INT(b->seqs[0].pos, 20 + steps - 2);
            CHECK_EQ_INT(b->seqs[0].tokens[0], 101); /* the id sampled last step */
            CHECK(!b->seqs[0].prefill);
        }
        const sched_event *ev;
        int n = answer(s, b, &ev);
        CHECK_EQ_INT(n, 3);
        for (int i = 0; i < n; i++) {
            tokens++;
            CHECK_EQ_INT(ev[i].token, 100 + ev[i].seq_id);
            if (ev[i].finish) {
                finished++;
                CHECK_EQ_INT(ev[i].finish, SCHED_FINISH_LENGTH);
                CHECK_EQ_INT(ev[i].n_generated, 5);
            }
        }
        REQUIRE(steps < 50);
    }
    CHECK_EQ_INT(steps, 5); /* 1 prefill + 4 decode steps for 5 tokens */
    CHECK_EQ_INT(finished, 3);
    CHECK_EQ_INT(tokens, 15);
    sched_stats_get(s, &st);
    CHECK_EQ_INT(st.blocks_free, 64);
    CHECK_EQ_INT(st.blocks_used, 0);
    CHECK_EQ_INT(st.n_running, 0);
    CHECK_EQ_INT(st.n_inflight, 0);
    CHECK(sched_seq_info_get(s, id[0], &(sched_seq_info){0}) == -1);
    sched_destroy(s);
    bm_free(kv);
}

static void test_eos_stop(void) {
    st_err e;
    block_manager *kv = bm_new(16, 16, false, &e);
    sched_config c = base_cfg(1);
    sched *s = sched_create(&c, kv, &e);
    int32_t p[3] = {1, 50, 60};
    uint64_t id;
    REQUIRE(sched_add(s, p, 3, 100, NULL, &id, &e) == 0);
    const sched_batch *b = sched_next_microbatch(s);
    REQUIRE(b);
    int32_t eos = 2;
    const sched_event *ev;
    int n;
    REQUIRE(sched_on_tokens(s, b->id, &eos, 1, &ev, &n, &e) == 0);
    CHECK_EQ_INT(n, 1);
    CHECK_EQ_INT(ev[0].token, 2);
    CHECK_EQ_INT(ev[0].finish, SCHED_FINISH_STOP);
    CHECK_EQ_INT(bm_n_free(kv), 16);
    sched_destroy(s);
    bm_free(kv);
}

static void test_pipeline_microbatches(void) {
    st_err e;
    block_manager *kv = bm_new(128, 16, false, &e);
    sched_config c = base_cfg(2);
    sched *s = sched_create(&c, kv, &e);
    int32_t p[4];
    for (int i = 0; i < 8; i++) {
        prompt_of(p, 4, i);
        REQUIRE(sched_add(s, p, 4, 10, NULL, NULL, &e) == 0);
    }
    const sched_batch *b1 = sched_next_microbatch(s);
    const sched_batch *b2 = sched_next_microbatch(s);
    REQUIRE(b1 && b2);
    CHECK(sched_next_microbatch(s) == NULL); /* 2 stages: 2 in flight */
    CHECK_EQ_INT(b1->n_seqs, 4);
    CHECK_EQ_INT(b2->n_seqs, 4);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) CHECK(b1->seqs[i].seq_id != b2->seqs[j].seq_id);
    CHECK_EQ_INT(b1->seqs[0].seq_id, 1);
    CHECK_EQ_INT(b2->seqs[0].seq_id, 5);
    sched_stats st;
    sched_stats_get(s, &st);
    CHECK_EQ_INT(st.n_inflight, 2);
    uint64_t b2_id = b2->id;
    /* Steady state: every launch has 4 sequences and 2 batches are in flight. */
    const sched_event *ev;
    answer(s, b1, &ev);
    const sched_batch *b3 = sched_next_microbatch(s);
    REQUIRE(b3);
    CHECK_EQ_INT(b3->n_seqs, 4);
    CHECK_EQ_INT(b3->seqs[0].seq_id, 1);
    CHECK_EQ_INT(b3->seqs[0].pos, 4);
    CHECK_EQ_INT(b3->seqs[0].tokens[0], 101);
    CHECK(sched_next_microbatch(s) == NULL);
    int launched = 3, max_inflight_seen = 2;
    uint64_t pending[2] = {b2_id, b3->id};
    int rounds = 0, total_events = 0;
    while (pending[0] || pending[1]) {
        /* Answer the older batch, launch the next one. */
        int k = pending[0] ? 0 : 1;
        int32_t ids[8];
        for (int i = 0; i < 8; i++) ids[i] = 200;
        int n_ev;
        REQUIRE(sched_on_tokens(s, pending[k], ids, 4, &ev, &n_ev, &e) == 0);
        total_events += n_ev;
        pending[k] = pending[1 - k];
        pending[1 - k] = 0;
        const sched_batch *nb = sched_next_microbatch(s);
        if (nb) {
            launched++;
            CHECK_EQ_INT(nb->n_seqs, 4);
            if (pending[0])
                pending[1] = nb->id;
            else
                pending[0] = nb->id;
        }
        sched_stats_get(s, &st);
        if (st.n_inflight > max_inflight_seen) max_inflight_seen = st.n_inflight;
        REQUIRE(++rounds < 100);
    }
    CHECK_EQ_INT(launched, 20); /* 8 seqs x 10 tokens / 4 per batch */
    CHECK_EQ_INT(total_events + 4, 80); /* the 4 events of b1 were counted before the loop */
    CHECK_EQ_INT(max_inflight_seen, 2);
    sched_stats_get(s, &st);
    CHECK_EQ_INT(st.blocks_free, 128);
    CHECK_EQ_INT(st.batches_launched, 20);
    sched_destroy(s);
    bm_free(kv);
}

static void test_chunked_prefill(void) {
    st_err e;
    block_manager *kv = bm_new(32, 16, false, &e);
    sched_config c = base_cfg(1);
    c.prefill_chunk = 16;
    sched *s = sched_create(&c, kv, &e);
    int32_t p[50];
    prompt_of(p, 50, 3);
    uint64_t id;
    REQUIRE(sched_add(s, p, 50, 3, NULL, &id, &e) == 0);
    int want_pos[4] = {0, 16, 32, 48}, want_n[4] = {16, 16, 16, 2}, want_blocks[4] = {4, 4, 4, 4}; /* the prompt's blocks from admission */
    for (int k = 0; k < 4; k++) {
        const sched_batch *b = sched_next_microbatch(s);
        REQUIRE(b);
        CHECK_EQ_INT(b->n_seqs, 1);
        CHECK_EQ_INT(b->seqs[0].pos, want_pos[k]);
        CHECK_EQ_INT(b->seqs[0].n_tokens, want_n[k]);
        CHECK_EQ_INT(b->seqs[0].n_blocks, want_blocks[k]);
        CHECK_EQ_INT(b->seqs[0].tokens[0], p[want_pos[k]]);
        CHECK_EQ_INT(b->seqs[0].sample, k == 3);
        CHECK(b->seqs[0].prefill);
        const sched_event *ev;
        int n = answer(s, b, &ev);
        CHECK_EQ_INT(n, k == 3 ? 1 : 0);
        sched_seq_info inf;
        REQUIRE(sched_seq_info_get(s, id, &inf) == 0);
        CHECK_EQ_INT(inf.n_computed, want_pos[k] + want_n[k]);
        CHECK_EQ_INT(inf.state, k == 3 ? SCHED_DECODE : SCHED_PREFILL);
    }
    const sched_batch *b = sched_next_microbatch(s);
    REQUIRE(b);
    CHECK_EQ_INT(b->seqs[0].pos, 50);
    CHECK_EQ_INT(b->seqs[0].n_tokens, 1);
    CHECK_EQ_INT(b->seqs[0].n_blocks, 4);
    sched_destroy(s);
    CHECK_EQ_INT(bm_n_free(kv), 32); /* destroy frees the blocks too */
    bm_free(kv);

    /* A token budget per micro-batch: 2 prompts of 30 with max_batch_tokens 40
     * -> first batch: 30 + 10, then the remaining 20. */
    kv = bm_new(32, 16, false, &e);
    c = base_cfg(1);
    c.max_batch_tokens = 40;
    s = sched_create(&c, kv, &e);
    int32_t q[30];
    prompt_of(q, 30, 1);
    REQUIRE(sched_add(s, q, 30, 2, NULL, NULL, &e) == 0);
    REQUIRE(sched_add(s, q, 30, 2, NULL, NULL, &e) == 0);
    const sched_batch *x = sched_next_microbatch(s);
    REQUIRE(x);
    CHECK_EQ_INT(x->n_tokens, 40);
    CHECK_EQ_INT(x->seqs[1].n_tokens, 10);
    CHECK(!x->seqs[1].sample);
    const sched_event *ev;
    CHECK_EQ_INT(answer(s, x, &ev), 1);
    x = sched_next_microbatch(s);
    REQUIRE(x);
    CHECK_EQ_INT(x->n_seqs, 2);
    CHECK_EQ_INT(x->seqs[0].n_tokens, 1);  /* seq 1 decodes first */
    CHECK_EQ_INT(x->seqs[1].pos, 10);
    CHECK_EQ_INT(x->seqs[1].n_tokens, 20);
    CHECK(x->seqs[1].sample);
    sched_destroy(s);
    bm_free(kv);
}

static void test_queue_and_admission(void) {
    st_err e;
    block_manager *kv = bm_new(8, 16, false, &e);
    sched_config c = base_cfg(1);
    c.max_queue = 2;
    c.max_seqs = 8;
    sched *s = sched_create(&c, kv, &e);
    int32_t p[40];
    prompt_of(p, 40, 0);
    /* Admission takes the prompt's blocks only (no worst-case reservation):
     * 40 tokens = 3 blocks, so 8 blocks admit 2 while 3 + 3 + 3 > 8. */
    uint64_t a, b, d;
    REQUIRE(sched_add(s, p, 40, 80, NULL, &a, &e) == 0);
    REQUIRE(sched_add(s, p, 40, 80, NULL, &b, &e) == 0);
    CHECK_EQ_INT(sched_add(s, p, 40, 10, NULL, &d, &e), SCHED_EFULL);
    CHECK(strstr(e.msg, "queue is full") != NULL);
    const sched_batch *x = sched_next_microbatch(s);
    REQUIRE(x);
    CHECK_EQ_INT(x->n_seqs, 2);
    REQUIRE(sched_add(s, p, 40, 10, NULL, &d, &e) == 0); /* room in the queue again */
    sched_stats st;
    sched_stats_get(s, &st);
    CHECK_EQ_INT(st.n_waiting, 1);
    CHECK_EQ_INT(st.n_running, 2);
    CHECK_EQ_INT(st.blocks_used, 6);
    const sched_event *ev;
    answer(s, x, &ev);
    x = sched_next_microbatch(s);
    REQUIRE(x);
    CHECK_EQ_INT(x->n_seqs, 2); /* d still waits: 2 free blocks < 3 */
    sched_stats_get(s, &st);
    CHECK_EQ_INT(st.n_waiting, 1);
    /* Cancel a (in flight): its blocks stay until the batch returns. */
    CHECK_EQ_INT(sched_cancel(s, a), 0);
    CHECK_EQ_INT(sched_cancel(s, a), -1);
    sched_stats_get(s, &st);
    CHECK_EQ_INT(st.blocks_used, 6);
    int n = answer(s, x, &ev);
    CHECK_EQ_INT(n, 1); /* only b's token; a is gone silently */
    CHECK_EQ_INT(ev[0].seq_id, b);
    sched_stats_get(s, &st);
    CHECK_EQ_INT(st.blocks_used, 3);
    /* Now d is admitted. */
    x = sched_next_microbatch(s);
    REQUIRE(x);
    CHECK_EQ_INT(x->n_seqs, 2);
    CHECK_EQ_INT(x->seqs[1].seq_id, d);
    answer(s, x, &ev);
    char msg[200];
    CHECK_EQ_INT(sched_verify(s, msg, sizeof msg), 0);
    /* Cancel idle running sequences and a waiting one. */
    uint64_t w;
    REQUIRE(sched_add(s, p, 40, 10, NULL, &w, &e) == 0);
    CHECK_EQ_INT(sched_cancel(s, w), 0);
    CHECK_EQ_INT(sched_cancel(s, b), 0);
    CHECK_EQ_INT(sched_cancel(s, d), 0);
    sched_stats_get(s, &st);
    CHECK_EQ_INT(st.blocks_free, 8);
    CHECK_EQ_INT(st.n_running + st.n_waiting, 0);
    CHECK(sched_next_microbatch(s) == NULL);
    CHECK_EQ_INT(sched_cancel(s, 999), -1);
    sched_destroy(s);
    bm_free(kv);
}

/* headroom_blocks: admission keeps that many free blocks per running
 * sequence; 0 admits while the prompts fit. */
static void test_admission_headroom(void) {
    for (int headroom = 0; headroom <= 4; headroom += 4) {
        st_err e;
        block_manager *kv = bm_new(16, 16, false, &e);
        sched_config c = base_cfg(1);
        c.headroom_blocks = headroom;
        sched *s = sched_create(&c, kv, &e);
        REQUIRE(s);
        int32_t p[20];
        prompt_of(p, 20, 4);
        for (int i = 0; i < 8; i++) REQUIRE(sched_add(s, p, 20, 100, NULL, NULL, &e) == 0);
        const sched_batch *b = sched_next_microbatch(s);
        REQUIRE(b);
        /* 2 blocks each: 8 fit with no headroom; with 4 per running sequence
         * the 4th would need 2 + 3 x 4 = 14 of the 10 left. */
        CHECK_EQ_INT(b->n_seqs, headroom ? 3 : 8);
        sched_destroy(s);
        bm_free(kv);
    }
    sched_config bad = base_cfg(1);
    bad.headroom_blocks = -1;
    st_err e;
    block_manager *kv = bm_new(4, 16, false, &e);
    CHECK(sched_create(&bad, kv, &e) == NULL);
    bm_free(kv);
}

/* ---- a simulated pipeline: KV memory addressed through the block tables ----
 * Each slice writes its tokens into kvmem[block][slot] at its positions; a
 * sample reads positions [0, end) back through the block table and hashes
 * them (so a wrong table, a skipped re-prefill or a wrongly shared block
 * changes the next token). Sampled ids are 3 + hash % 500 (never EOS 2). */
#define SIM_BLOCKS 256
#define SIM_BS 16
static int32_t kvmem[SIM_BLOCKS][SIM_BS];

static int32_t sim_sample(const sched_slice *x) {
    uint32_t h = 2166136261u;
    for (int32_t p = 0; p < x->pos + x->n_tokens; p++) {
        h ^= (uint32_t)kvmem[x->block_table[p / SIM_BS]][p % SIM_BS];
        h *= 16777619u;
    }
    return (int32_t)(3 + h % 500);
}

#define SIM_MAX_SEQS 16
#define SIM_MAX_GEN 200
typedef struct sim_out {
    int32_t tok[SIM_MAX_SEQS][SIM_MAX_GEN];
    int n[SIM_MAX_SEQS];
    int finished;
} sim_out;

/* Runs one batch through the simulated stages; answers it; records the
 * events of sequence ids 1..SIM_MAX_SEQS in out. */
static int sim_step(sched *s, const sched_batch *b, sim_out *out) {
    const sched_event *evs, **ev = &evs;
    int32_t ids[256];
    REQUIRE(b->n_seqs <= 256);
    for (int i = 0; i < b->n_seqs; i++) {
        const sched_slice *x = &b->seqs[i];
        for (int t = 0; t < x->n_tokens; t++) {
            int32_t p = x->pos + t;
            REQUIRE(p / SIM_BS < x->n_blocks);
            kvmem[x->block_table[p / SIM_BS]][p % SIM_BS] = x->tokens[t];
        }
        ids[i] = x->sample ? sim_sample(x) : -1;
    }
    int n_ev = -1;
    st_err e;
    REQUIRE_MSG(sched_on_tokens(s, b->id, ids, b->n_seqs, ev, &n_ev, &e) == 0, "%s", e.msg);
    for (int i = 0; i < n_ev; i++) {
        int q = (int)evs[i].seq_id - 1;
        REQUIRE(q >= 0 && q < SIM_MAX_SEQS && out->n[q] < SIM_MAX_GEN);
        out->tok[q][out->n[q]++] = evs[i].token;
        CHECK_EQ_INT(evs[i].n_generated, out->n[q]);
        if (evs[i].finish) out->finished++;
    }
    return n_ev;
}

/* Drives s to the end with up to n_stages batches in flight (answering the
 * oldest first), checking the invariants after every step; events of
 * sequence ids 1..SIM_MAX_SEQS go to out. */
static void sim_run(sched *s, sim_out *out) {
    const sched_batch *fl[8];
    int nfl = 0, steps = 0;
    char msg[256];
    for (;;) {
        const sched_batch *b;
        while (nfl < 8 && (b = sched_next_microbatch(s)) != NULL) fl[nfl++] = b;
        REQUIRE_MSG(sched_verify(s, msg, sizeof msg) == 0, "%s", msg);
        if (nfl == 0) break;
        sim_step(s, fl[0], out);
        for (int k = 1; k < nfl; k++) fl[k - 1] = fl[k];
        nfl--;
        REQUIRE_MSG(sched_verify(s, msg, sizeof msg) == 0, "%s", msg);
        REQUIRE(++steps < 100000);
    }
}

/* A pool far too small for the worst case: 6 sequences of 20 + 60 tokens
 * (5 blocks each, 30 in all) on 12 blocks. Every one completes, preemptions
 * happen, each output equals the sequence run alone, and every block comes
 * back. On 2 stages (2 batches in flight), with prefix caching on and off,
 * and with a headroom of 1 block per running sequence. */
static void test_preemption(void) {
    for (int variant = 0; variant < 6; variant++) {
        int caching = variant & 1, stages = 1 + ((variant >> 1) & 1), headroom = variant >= 4 ? 1 : 0;
        {
            st_err e;
            sim_out alone = {0}, shared = {0};
            int32_t p[20];
            /* Reference: each alone in a big pool. */
            for (int i = 0; i < 6; i++) {
                block_manager *kv = bm_new(64, SIM_BS, caching, &e);
                sched_config c = base_cfg(stages);
                sched *s = sched_create(&c, kv, &e);
                REQUIRE(s);
                /* ids 1..6: add i dummies first so the id matches. */
                sim_out one = {0};
                for (int d = 0; d < i; d++) {
                    uint64_t id;
                    prompt_of(p, 20, 99);
                    REQUIRE(sched_add(s, p, 20, 1, NULL, &id, &e) == 0);
                    CHECK_EQ_INT(sched_cancel(s, id), 0);
                }
                prompt_of(p, 20, i);
                REQUIRE(sched_add(s, p, 20, 60, NULL, NULL, &e) == 0);
                sim_run(s, &one);
                CHECK_EQ_INT(one.n[i], 60);
                alone.n[i] = one.n[i];
                memcpy(alone.tok[i], one.tok[i], sizeof one.tok[i]);
                sched_destroy(s);
                bm_free(kv);
            }
            block_manager *kv = bm_new(12, SIM_BS, caching, &e);
            sched_config c = base_cfg(stages);
            c.headroom_blocks = headroom;
            sched *s = sched_create(&c, kv, &e);
            for (int i = 0; i < 6; i++) {
                prompt_of(p, 20, i);
                REQUIRE(sched_add(s, p, 20, 60, NULL, NULL, &e) == 0);
            }
            sim_run(s, &shared);
            CHECK_EQ_INT(shared.finished, 6);
            for (int i = 0; i < 6; i++) {
                CHECK_EQ_INT(shared.n[i], 60);
                for (int t = 0; t < 60; t++) CHECK_EQ_INT(shared.tok[i][t], alone.tok[i][t]);
            }
            sched_stats st;
            sched_stats_get(s, &st);
            CHECK(st.preemptions >= (headroom ? 1 : 3));
            CHECK_EQ_INT(st.blocks_free, 12);
            CHECK_EQ_INT(st.blocks_used, 0);
            CHECK_EQ_INT(st.n_preempted_waiting, 0);
            if (!caching) CHECK_EQ_INT(st.prefix_hit_tokens, 0);
            /* Each preempted sequence re-prefilled what it had: more prefill than 6 x 20. */
            CHECK(st.prefill_tokens > 120);
            sched_destroy(s);
            bm_free(kv);
        }
    }
}

/* Prefix caching: a 40-token shared prefix (2 full blocks) is computed once. */
static void test_prefix_caching(void) {
    st_err e;
    for (int caching = 0; caching < 2; caching++) {
        block_manager *kv = bm_new(64, SIM_BS, caching, &e);
        sched_config c = base_cfg(1);
        sched *s = sched_create(&c, kv, &e);
        int32_t p[8][50];
        for (int i = 0; i < 8; i++) {
            prompt_of(p[i], 50, 5);              /* the shared 40 */
            for (int t = 40; t < 50; t++) p[i][t] = 400 + i * 10 + t;
        }
        sim_out out = {0};
        REQUIRE(sched_add(s, p[0], 50, 5, NULL, NULL, &e) == 0);
        sim_run(s, &out);
        sched_stats st;
        sched_stats_get(s, &st);
        CHECK_EQ_INT(st.prefill_tokens, 50);
        CHECK_EQ_INT(st.prefix_hit_tokens, 0);
        CHECK_EQ_INT(st.prefix_query_tokens, 50);
        /* 50 + 5 tokens: blocks 0..2 full when computed (48 of 54 positions). */
        CHECK_EQ_INT(st.blocks_cached, caching ? 3 : 0);
        /* 7 more at once: each maps blocks 0 and 1 and prefills 18 tokens. */
        for (int i = 1; i < 8; i++) REQUIRE(sched_add(s, p[i], 50, 5, NULL, NULL, &e) == 0);
        const sched_batch *b = sched_next_microbatch(s);
        REQUIRE(b);
        CHECK_EQ_INT(b->n_seqs, 7);
        for (int i = 0; i < b->n_seqs; i++) {
            CHECK_EQ_INT(b->seqs[i].pos, caching ? 32 : 0);
            CHECK_EQ_INT(b->seqs[i].n_tokens, caching ? 18 : 50);
            if (caching && i > 0) CHECK_EQ_INT(b->seqs[i].block_table[1], b->seqs[0].block_table[1]);
        }
        if (caching) CHECK_EQ_INT(bm_refcount(kv, b->seqs[0].block_table[0]), 7);
        sim_step(s, b, &out);
        sim_run(s, &out);
        CHECK_EQ_INT(out.finished, 8);
        sched_stats_get(s, &st);
        CHECK_EQ_INT(st.prefix_query_tokens, 8 * 50);
        CHECK_EQ_INT(st.prefix_hit_tokens, caching ? 7 * 32 : 0);
        CHECK_EQ_INT(st.prefill_tokens, caching ? 50 + 7 * 18 : 8 * 50);
        /* The same prompt again: 3 blocks mapped (the last token is computed). */
        REQUIRE(sched_add(s, p[3], 50, 5, NULL, NULL, &e) == 0);
        b = sched_next_microbatch(s);
        REQUIRE(b);
        CHECK_EQ_INT(b->seqs[0].pos, caching ? 48 : 0);
        sim_step(s, b, &out);
        sim_run(s, &out);
        /* A 48-token prompt equal to the first 48 of p[0]: 2 blocks mapped, not 3. */
        REQUIRE(sched_add(s, p[0], 48, 5, NULL, NULL, &e) == 0);
        b = sched_next_microbatch(s);
        REQUIRE(b);
        CHECK_EQ_INT(b->seqs[0].pos, caching ? 32 : 0);
        CHECK_EQ_INT(b->seqs[0].n_tokens, caching ? 16 : 48);
        sim_step(s, b, &out);
        sim_run(s, &out);
        CHECK_EQ_INT(out.finished, 10);
        /* Outputs: sequences 2..8 and 9 (p[3] again) computed alone. */
        for (int i = 1; i < 10; i++) CHECK_EQ_INT(out.n[i], 5);
        for (int t = 0; t < 5; t++) CHECK_EQ_INT(out.tok[8][t], out.tok[3][t]);
        sched_stats_get(s, &st);
        CHECK_EQ_INT(st.blocks_free, 64);
        sched_reset_prefix_cache(s);
        sched_stats_get(s, &st);
        CHECK_EQ_INT(st.blocks_cached, 0);
        REQUIRE(sched_add(s, p[0], 50, 1, NULL, NULL, &e) == 0);
        b = sched_next_microbatch(s);
        REQUIRE(b);
        CHECK_EQ_INT(b->seqs[0].pos, 0); /* nothing cached after the reset */
        sim_step(s, b, &out);
        sched_destroy(s);
        bm_free(kv);
    }
}

static void test_abort_and_errors(void) {
    st_err e;
    block_manager *kv = bm_new(8, 16, false, &e);
    sched_config c = base_cfg(2);
    c.n_ctx = 64;
    sched *s = sched_create(&c, kv, &e);
    int32_t p[40];
    prompt_of(p, 40, 2);
    uint64_t id;
    CHECK_EQ_INT(sched_add(s, p, 40, 30, NULL, &id, &e), SCHED_EINVAL); /* 70 > n_ctx 64 */
    CHECK(strstr(e.msg, "maximum context length is 64") != NULL);
    CHECK_EQ_INT(sched_add(s, p, 0, 3, NULL, &id, &e), SCHED_EINVAL);
    CHECK_EQ_INT(sched_add(s, p, 3, 0, NULL, &id, &e), SCHED_EINVAL);
    REQUIRE(sched_add(s, p, 40, 3, NULL, &id, &e) == 0);
    const sched_batch *b = sched_next_microbatch(s);
    REQUIRE(b);
    uint64_t bid = b->id;
    int32_t ids[2] = {5, 6};
    int n;
    CHECK(sched_on_tokens(s, bid + 7, ids, 1, NULL, &n, &e) == -1);
    CHECK(strstr(e.msg, "not in flight") != NULL);
    CHECK(sched_on_tokens(s, bid, ids, 2, NULL, &n, &e) == -1);
    REQUIRE(sched_abort_batch(s, bid, &e) == 0);
    CHECK(sched_abort_batch(s, bid, &e) == -1);
    b = sched_next_microbatch(s); /* re-sent from the same position */
    REQUIRE(b);
    CHECK_EQ_INT(b->seqs[0].pos, 0);
    CHECK_EQ_INT(b->seqs[0].n_tokens, 40);
    CHECK_EQ_INT(b->seqs[0].n_blocks, 3);
    /* A negative id from the wire finishes the sequence with an error. */
    int32_t bad = -5;
    const sched_event *ev;
    REQUIRE(sched_on_tokens(s, b->id, &bad, 1, &ev, &n, &e) == 0);
    CHECK_EQ_INT(n, 1);
    CHECK_EQ_INT(ev[0].finish, SCHED_FINISH_ERROR);
    CHECK_EQ_INT(bm_n_free(kv), 8);
    /* A request larger than the whole cache is refused up front. */
    block_manager *small = bm_new(2, 16, false, &e);
    sched *s2 = sched_create(&c, small, &e);
    CHECK_EQ_INT(sched_add(s2, p, 40, 3, NULL, &id, &e), SCHED_EINVAL);
    CHECK(strstr(e.msg, "needs 3 KV blocks but the cluster has 2") != NULL);
    sched_destroy(s2);
    bm_free(small);
    /* Bad configs. */
    sched_config bc = base_cfg(2);
    bc.max_inflight = 1;
    CHECK(sched_create(&bc, kv, &e) == NULL);
    bc = base_cfg(0);
    CHECK(sched_create(&bc, kv, &e) == NULL);
    sched_destroy(s);
    bm_free(kv);
}

int main(void) {
    test_finish_frees_blocks();
    test_eos_stop();
    test_pipeline_microbatches();
    test_chunked_prefill();
    test_queue_and_admission();
    test_abort_and_errors();
    test_admission_headroom();
    test_preemption();
    test_prefix_caching();
    return test_summary();
}
