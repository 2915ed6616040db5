/* poll_predict.c — see poll_predict.h. */
#include "ib/poll_predict.h"

static uint64_t absdiff(uint64_t a, uint64_t b) { return a > b ? a - b : b - a; }

void pp_note_ref(poll_predict *p, uint64_t now_ns) { p->ref_ns = now_ns; }

void pp_note_arrival(poll_predict *p, uint64_t now_ns, bool caught, uint64_t woke_ns)
{
    uint64_t at = caught ? now_ns : woke_ns > p->late_ns ? woke_ns - p->late_ns : woke_ns;
    if (!p->ref_ns || at <= p->ref_ns || at - p->ref_ns > PP_GAP_MAX_NS) return;
    uint64_t g = at - p->ref_ns;
    if (p->n_gaps == 0 || g > 4 * p->gap_ns || 4 * g < p->gap_ns) {
        p->gap_ns = g; /* the first gap, or a new rhythm: learn again */
        p->jitter_ns = g / 16;
        p->n_gaps = 1;
        return;
    }
    uint64_t dev = absdiff(g, p->gap_ns);
    p->gap_ns = (p->gap_ns + g) / 2; /* successive gaps drift together (a forward grows with the context) */
    p->jitter_ns = (3 * p->jitter_ns + dev) / 4;
    p->n_gaps++;
}

void pp_note_late(poll_predict *p, uint64_t start_ns, uint64_t now_ns, uint64_t max_spin_ns)
{
    if (now_ns < start_ns) return;
    uint64_t late = now_ns - start_ns;
    if (late > max_spin_ns / 2) late = max_spin_ns / 2;
    p->late_ns = p->n_late++ ? (3 * p->late_ns + late) / 4 : late;
}

bool pp_plan(poll_predict *p, uint64_t max_spin_ns, uint64_t *start_ns, uint64_t *end_ns)
{
    if (!max_spin_ns || p->n_gaps < 2 || !p->ref_ns || p->planned_ref == p->ref_ns) return false;
    p->planned_ref = p->ref_ns;
    uint64_t a = 2 * p->jitter_ns + PP_SLACK_NS;
    if (a > max_spin_ns / 2) a = max_spin_ns / 2;
    uint64_t expect = p->ref_ns + p->gap_ns, lead = a + p->late_ns;
    *start_ns = expect > lead ? expect - lead : 0;
    *end_ns = expect + a;
    return true;
}
