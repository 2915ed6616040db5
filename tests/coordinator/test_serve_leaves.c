/* test_serve_leaves.c — the serving engine's leaves on their own (issue 24's
 * split of coordinator/serve/cluster.c): the static recovery's state machine
 * (static_recovery.h), the per-micro-batch deadline (hang_detect.h with
 * inflight.h and stage_stats.h), and the request list's re-queue
 * (request_list.h), with exact values. */
#include <event2/event.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "coordinator/serve/block_manager.h"
#include "coordinator/serve/hang_detect.h"
#include "coordinator/serve/inflight.h"
#include "coordinator/serve/request_list.h"
#include "coordinator/serve/sched.h"
#include "coordinator/serve/stage_stats.h"
#include "coordinator/serve/static_recovery.h"
#include "tests/testutil.h"

/* ---- static recovery -------------------------------------------------- */

typedef struct rec_log {
    char ev[16][24];
    int n;
    int last_stage;
    double last_timeout;
    struct event_base *base;
} rec_log;

static void note(rec_log *l, const char *what) {
    if (l->n < 16) snprintf(l->ev[l->n++], sizeof l->ev[0], "%s", what);
}
static void r_relink(void *ud, int stage) { ((rec_log *)ud)->last_stage = stage, note(ud, "relink"); }
static void r_reassign(void *ud) { note(ud, "reassign"); }
static void r_resume(void *ud, double s) { (void)s, note(ud, "resume"); }
static void r_expire(void *ud, double t) {
    rec_log *l = ud;
    l->last_timeout = t;
    note(l, "expire");
    event_base_loopbreak(l->base);
}

static void test_static_recovery(void) {
    struct event_base *base = event_base_new();
    rec_log log = {.base = base};
    static_recovery_ops ops = {r_relink, r_reassign, r_resume, r_expire, &log};
    static_recovery r;
    CHECK_EQ_INT(static_recovery_init(&r, base, 0, &ops), 0);
    CHECK(r.timeout_s == 60.0); /* <= 0: the default */
    CHECK(!static_recovery_active(&r) && !static_recovery_holding(&r));
    static_recovery_all_ready(&r); /* IDLE: nothing happens */
    CHECK_EQ_INT(log.n, 0);

    /* lost -> RECONNECTING (relink) -> all ready -> REASSIGNING (reassign) ->
     * a stage dropped -> RECONNECTING -> all ready -> REASSIGNING -> all ready -> IDLE (resume) */
    static_recovery_lost(&r, 1);
    CHECK_EQ_INT(r.phase, RECOVERY_RECONNECTING);
    CHECK_EQ_INT(log.last_stage, 1);
    CHECK(static_recovery_holding(&r));
    CHECK_EQ_INT(r.n_recoveries, 1);
    static_recovery_all_ready(&r);
    CHECK_EQ_INT(r.phase, RECOVERY_REASSIGNING);
    static_recovery_stage_dropped(&r);
    CHECK_EQ_INT(r.phase, RECOVERY_RECONNECTING);
    static_recovery_all_ready(&r);
    static_recovery_load_failed(&r, 0);
    CHECK_EQ_INT(r.phase, RECOVERY_RECONNECTING);
    CHECK_EQ_INT(log.last_stage, 0);
    static_recovery_all_ready(&r);
    static_recovery_all_ready(&r);
    CHECK_EQ_INT(r.phase, RECOVERY_IDLE);
    const char *want[] = {"relink", "reassign", "reassign", "relink", "reassign", "resume"};
    CHECK_EQ_INT(log.n, 6);
    for (int i = 0; i < 6 && i < log.n; i++) CHECK_MSG(!strcmp(log.ev[i], want[i]), "event %d: %s", i, log.ev[i]);
    static_recovery_load_failed(&r, 0); /* IDLE: ignored */
    CHECK_EQ_INT(log.n, 6);
    static_recovery_free(&r);

    /* The deadline: expired, still active, no longer holding; the resume ends it. */
    log.n = 0;
    CHECK_EQ_INT(static_recovery_init(&r, base, 0.05, &ops), 0);
    static_recovery_lost(&r, 2);
    event_base_dispatch(base);
    CHECK_EQ_INT(log.n, 2);
    CHECK(log.n == 2 && !strcmp(log.ev[1], "expire"));
    CHECK(fabs(log.last_timeout - 0.05) < 1e-12);
    CHECK(r.expired && static_recovery_active(&r) && !static_recovery_holding(&r));
    static_recovery_all_ready(&r);
    static_recovery_all_ready(&r);
    CHECK(!r.expired && !static_recovery_active(&r));
    CHECK_EQ_INT(r.n_recoveries, 1);
    static_recovery_free(&r);
    event_base_free(base);
}

/* ---- hang detection ----------------------------------------------------- */

static void test_hang(void) {
    sched_batch b1 = {.id = 7, .n_tokens = 1}, b2 = {.id = 8, .n_tokens = 64};
    inflight_table t = {0};
    CHECK_EQ_INT(inflight_init(&t, 2), 0);
    /* Cold: no round trip yet, the bound is HANG_COLD_S. */
    inflight_put(&t, &b1, 1000);
    CHECK(hang_batch_bound(&t, 0) == HANG_COLD_S);
    CHECK_EQ_INT(inflight_slot(&t, 7), 0);
    CHECK_EQ_INT(inflight_slot(&t, 8), -1);
    /* A 10 ms round trip of one token: bound = max(2 s, 20 x 10 ms) = 2 s;
     * a 64-token batch expects 64 x 10 ms: bound 12.8 s. */
    inflight_complete(&t, 0, 1000 + 10000000);
    CHECK_EQ_INT(t.rtt_n, 1);
    CHECK_EQ_INT(inflight_count(&t), 0);
    inflight_put(&t, &b1, 0);
    inflight_put(&t, &b2, 0);
    CHECK_EQ_INT(inflight_count(&t), 2);
    CHECK(fabs(hang_batch_bound(&t, 0) - HANG_FLOOR_S) < 1e-9);
    CHECK(fabs(hang_batch_bound(&t, 1) - 12.8) < 1e-9);

    stage_stats s[3] = {0};
    const stage_stats *v[3] = {&s[0], &s[1], &s[2]};
    double now = 100.0;
    for (int i = 0; i < 3; i++) s[i].have_stats = true, s[i].stats_at = now - 0.1, s[i].fwd_moved_at = now - 0.1;
    CHECK_EQ_INT(hang_find_stage(v, 3, now, 2.0), -1);
    s[2].queue_depth = 1, s[2].fwd_moved_at = now - 3.0; /* compute wedged, loop answers */
    CHECK_EQ_INT(hang_find_stage(v, 3, now, 2.0), 2);
    s[1].stats_at = now - 2.5, s[0].stats_at = now - 4.0; /* silent ones first, the oldest */
    CHECK_EQ_INT(hang_find_stage(v, 3, now, 2.0), 0);

    /* hang_check: the 1-token batch launched 3 s ago is past its 2 s bound. */
    uint64_t now_ns = st_now_ns();
    double now_s = st_now_s();
    for (int i = 0; i < 3; i++) s[i] = (stage_stats){.have_stats = true, .stats_at = now_s, .fwd_moved_at = now_s};
    t.launched_ns[0] = now_ns - 3000000000ull;
    t.launched_ns[1] = now_ns;
    double tick = now_s;
    char why[256] = "";
    CHECK_EQ_INT(hang_check(&t, v, 3, &tick, why, sizeof why), -1); /* every stage answers: wait */
    CHECK(t.overdue_warned[0]);
    s[1].stats_at = now_s - 5.0;
    CHECK_EQ_INT(hang_check(&t, v, 3, &tick, why, sizeof why), 1);
    CHECK_MSG(strstr(why, "batch 7 not back after 3.0 s, bound 2.0 s; no stats from the stage for 5.0 s") != NULL,
              "%s", why);
    /* A poll long after the previous one gives no verdict. */
    tick = st_now_s() - 1.0;
    CHECK_EQ_INT(hang_check(&t, v, 3, &tick, why, sizeof why), -1);
    inflight_free(&t);
}

/* ---- the request list ----------------------------------------------------- */

static int finished_error;
static void on_finish(void *ctx, enum coord_finish why, const char *msg) {
    (void)ctx, (void)msg;
    finished_error += why == COORD_FINISH_ERROR;
}

static void test_requests(void) {
    st_err err = {{0}};
    block_manager *kv = bm_new(64, 16, false, &err);
    sched_config sc = {.n_stages = 1, .max_inflight = 1, .max_queue = 16, .max_seqs = 8, .prefill_chunk = 64,
                       .max_batch_tokens = 256, .n_ctx = 128, .eos_id = -1, .headroom_blocks = 0};
    sched *s = kv ? sched_create(&sc, kv, &err) : NULL;
    REQUIRE(s != NULL);
    coord_sink sink = {.on_finish = on_finish};
    int32_t prompt[5] = {1, 2, 3, 4, 5};
    coord_request q = {.prompt = prompt, .n_prompt = 5, .max_tokens = 10};
    creq *list = NULL, *r = NULL;
    int max_new = 0;
    /* The context check: 5 + 200 > 128. */
    q.max_tokens = 200;
    CHECK_EQ_INT(creq_create(&q, &sink, NULL, 1, 128, s, &r, &max_new, &err), COORD_ECONTEXT);
    CHECK(strstr(err.msg, "maximum context length is 128 tokens") != NULL);
    q.max_tokens = 10;
    for (int i = 0; i < 3; i++) {
        REQUIRE(creq_create(&q, &sink, NULL, 42, 128, s, &r, &max_new, &err) == COORD_OK);
        CHECK_EQ_INT(max_new, 10);
        CHECK_EQ_INT(r->seed, 42);
        REQUIRE(sched_add(s, r->prompt, r->n_prompt, max_new, r, &r->id, &err) == 0);
        creq_push(&list, r);
    }
    /* Two tokens generated by the newest: it re-prefills 7, with 8 left. */
    CHECK_EQ_INT(creq_add_generated(list, 9), 0);
    CHECK_EQ_INT(creq_add_generated(list, 10), 0);
    int64_t tok = 0;
    uint64_t ids[3];
    CHECK_EQ_INT(creq_count(list, ids, 3, &tok), 3);
    CHECK_EQ_INT(tok, 17);
    char text[64];
    creq_ids_text(list, text, sizeof text);
    CHECK_MSG(!strcmp(text, "[#3, #2, #1]"), "%s", text);
    creq *moved = NULL;
    int64_t re = 0;
    CHECK_EQ_INT(creq_requeue_all(&list, s, &moved, s, 128, "x", NULL, NULL, &re), 3);
    CHECK(list == NULL);
    CHECK_EQ_INT(re, 17);
    CHECK_EQ_INT(creq_count(moved, NULL, 0, NULL), 3);
    creq_fail_all(&moved, s, "gone");
    CHECK_EQ_INT(finished_error, 3);
    CHECK(moved == NULL);
    sched_destroy(s);
    bm_free(kv);
}

int main(void) {
    test_static_recovery();
    test_hang();
    test_requests();
    return test_summary();
}
