/* poll_predict.h — when to spin for the next data frame (adaptive polling;
 * docs/protocol.md, "Polling"). Pure arithmetic on CLOCK_MONOTONIC ns, no
 * I/O: ib/xport_poll.c feeds it and acts on its plans.
 *
 * A pipeline's frames come in a rhythm: a stage sends its result and the
 * next micro-batch comes one round of the other stages later; the
 * coordinator sends a micro-batch and its tokens come one pipeline later.
 * The predictor learns the gap from the last data frame sent or delivered
 * (the reference, pp_note_ref) to the next data frame's arrival
 * (pp_note_arrival), with its mean deviation (jitter), and how late a timer
 * wakes the sleeping loop (pp_note_late). A plan (pp_plan) is a window
 * [start, end] around the expected arrival: a timer at start, then a spin on
 * the transport until the frame comes or end. With
 *   a = min(2 jitter + PP_SLACK_NS, max_spin / 2):
 *   start = ref + gap - a - late (the timer fires about `late` after it),
 *   end   = ref + gap + a.
 * One plan per gap; none until two gaps are known; a gap 4x longer or
 * shorter than the prediction (a pause, another load) starts the learning
 * again; a gap over PP_GAP_MAX_NS is no rhythm at all.
 */
#ifndef STRATA_IB_POLL_PREDICT_H
#define STRATA_IB_POLL_PREDICT_H

#include <stdbool.h>
#include <stdint.h>

#define PP_SLACK_NS 20000u            /* added to each side of the window */
#define PP_GAP_MAX_NS 10000000000ull  /* 10 s */

typedef struct poll_predict {
    uint64_t ref_ns;      /* the last data frame sent or delivered (0: none yet) */
    uint64_t gap_ns;      /* predicted ref -> next arrival */
    uint64_t jitter_ns;   /* mean deviation of the gaps from the prediction */
    uint64_t late_ns;     /* how late the timer wakes the loop */
    int n_gaps, n_late;
    uint64_t planned_ref; /* ref_ns of the last plan: one per gap */
} poll_predict;

/* A data frame was sent or delivered at now_ns: the next gap starts. */
void pp_note_ref(poll_predict *p, uint64_t now_ns);

/* A data frame arrived. caught: the loop was spinning when it came, so it
 * came at now_ns; otherwise the loop woke at woke_ns, about one timer
 * lateness after it came. */
void pp_note_arrival(poll_predict *p, uint64_t now_ns, bool caught, uint64_t woke_ns);

/* The timer of a plan that started at start_ns fired at now_ns; lateness
 * samples are clipped to max_spin_ns / 2. */
void pp_note_late(poll_predict *p, uint64_t start_ns, uint64_t now_ns, uint64_t max_spin_ns);

/* The window for the current gap: true with *start_ns / *end_ns, at most once
 * per reference, never with max_spin_ns 0 or fewer than two gaps known. */
bool pp_plan(poll_predict *p, uint64_t max_spin_ns, uint64_t *start_ns, uint64_t *end_ns);

#endif
