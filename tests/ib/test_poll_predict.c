/* test_poll_predict.c — ib/poll_predict.h: the adaptive poll's windows, on
 * made-up clocks (no sleeping, no wall time). */
#include "ib/poll_predict.h"
#include "tests/testutil.h"

#define US 1000ull
#define MS 1000000ull

/* One gap: a frame sent or delivered at t, the next one arriving g later. */
static void gap(poll_predict *p, uint64_t *t, uint64_t g, bool caught, uint64_t woke_after)
{
    pp_note_ref(p, *t);
    *t += g;
    pp_note_arrival(p, *t, caught, *t + woke_after);
    *t += 50 * US; /* the stage's own work before its next send */
}

int main(void)
{
    poll_predict p = {0};
    uint64_t t = 1000 * MS, start = 0, end = 0;

    /* nothing known: no plan, and none with polling off */
    pp_note_ref(&p, t);
    CHECK(!pp_plan(&p, 1000 * US, &start, &end));
    gap(&p, &t, 40 * MS, true, 0);
    CHECK_EQ_INT(p.n_gaps, 1);
    CHECK(!pp_plan(&p, 1000 * US, &start, &end)); /* one gap is no rhythm yet */
    gap(&p, &t, 40 * MS, true, 0);
    CHECK_EQ_INT(p.n_gaps, 2);
    CHECK_EQ_INT(p.gap_ns, 40 * MS);
    /* jitter: the first gap's 1/16 (2.5 ms), then 3/4 of it (0 deviation) */
    CHECK_EQ_INT(p.jitter_ns, 1875 * US);
    pp_note_ref(&p, t);
    CHECK(!pp_plan(&p, 0, &start, &end)); /* polling off */
    /* a = min(2 * 1875 + 20, 1000 / 2) us = 500 us; no lateness known yet */
    CHECK(pp_plan(&p, 1000 * US, &start, &end));
    CHECK_EQ_INT(start, t + 40 * MS - 500 * US);
    CHECK_EQ_INT(end, t + 40 * MS + 500 * US);
    CHECK(!pp_plan(&p, 1000 * US, &start, &end)); /* one plan per gap */

    /* the timer fired 120 us late, then 80 us: lateness 120, then (3*120+80)/4 */
    pp_note_late(&p, start, start + 120 * US, 1000 * US);
    CHECK_EQ_INT(p.late_ns, 120 * US);
    pp_note_late(&p, start, start + 80 * US, 1000 * US);
    CHECK_EQ_INT(p.late_ns, 110 * US);
    pp_note_late(&p, start, start + 90 * MS, 1000 * US); /* a preempted loop: clipped to max/2 */
    CHECK_EQ_INT(p.late_ns, (3 * 110 + 500) * US / 4);
    p.late_ns = 100 * US;

    /* steady gaps: the jitter decays to a quarter each time; the window
     * narrows to 2 jitter + 20 us and starts one lateness earlier */
    for (int i = 0; i < 30; i++) gap(&p, &t, 40 * MS, true, 0);
    CHECK_EQ_INT(p.gap_ns, 40 * MS);
    CHECK(p.jitter_ns < 1 * US);
    pp_note_ref(&p, t);
    CHECK(pp_plan(&p, 1000 * US, &start, &end));
    uint64_t a = 2 * p.jitter_ns + PP_SLACK_NS;
    CHECK_EQ_INT(start, t + 40 * MS - a - 100 * US);
    CHECK_EQ_INT(end, t + 40 * MS + a);

    /* a frame the loop did not catch came about one lateness before it woke */
    t += 40 * MS;
    pp_note_arrival(&p, t + 5 * US, false, t + 100 * US);
    CHECK_EQ_INT(p.gap_ns, 40 * MS);
    t += 1 * MS;

    /* drift: the prediction follows half-way each gap */
    gap(&p, &t, 42 * MS, true, 0);
    CHECK_EQ_INT(p.gap_ns, 41 * MS);
    gap(&p, &t, 42 * MS, true, 0);
    CHECK_EQ_INT(p.gap_ns, 41500 * US);

    /* a pause (5 s between requests: over 4x) starts the learning again */
    gap(&p, &t, 5000 * MS, true, 0);
    CHECK_EQ_INT(p.n_gaps, 1);
    CHECK_EQ_INT(p.gap_ns, 5000 * MS);
    pp_note_ref(&p, t);
    CHECK(!pp_plan(&p, 1000 * US, &start, &end));
    /* and so does a burst (under a quarter) */
    gap(&p, &t, 10 * MS, true, 0);
    CHECK_EQ_INT(p.n_gaps, 1);
    CHECK_EQ_INT(p.gap_ns, 10 * MS);

    /* no rhythm: over 10 s, an arrival before the reference, no reference */
    uint64_t g0 = p.gap_ns;
    int n0 = p.n_gaps;
    gap(&p, &t, PP_GAP_MAX_NS + 1, true, 0);
    pp_note_ref(&p, t);
    pp_note_arrival(&p, t - 1, true, t - 1);
    CHECK_EQ_INT(p.gap_ns, g0);
    CHECK_EQ_INT(p.n_gaps, n0);
    poll_predict q = {0};
    pp_note_arrival(&q, t, true, t);
    CHECK_EQ_INT(q.n_gaps, 0);

    /* short gaps (a burst of micro-batches): the window starts at once */
    poll_predict b = {0};
    t = 2000 * MS;
    for (int i = 0; i < 3; i++) gap(&b, &t, 200 * US, true, 0);
    b.late_ns = 300 * US; /* the window (about 34 us each side) starts a lateness early: before now */
    pp_note_ref(&b, t);
    CHECK(pp_plan(&b, 1000 * US, &start, &end));
    CHECK(start <= t);
    CHECK(end > t + 200 * US);
    return test_summary();
}
