/* engine_totals.h — the serving engine's counters that outlive one cluster.
 *
 * A live coordinator serves one cluster per placement epoch (control/). The
 * /metrics counters must never go back when an epoch ends, so what each
 * cluster counts is added to one engine_totals that its owner keeps for the
 * process: frames fenced (results of another epoch, or after a stage was
 * lost), the scheduler's KV counters (folded in by each cluster), and the
 * recovery timings (detection and resume, the last COORD_RECOVERY_KEEP of
 * each, coord_engine_stats in engine_api.h).
 *
 * Units: seconds for the timings, tokens and events for the counters.
 * Threading: the loop thread only. No errors: every call succeeds. */
#ifndef STRATA_COORDINATOR_SERVE_ENGINE_TOTALS_H
#define STRATA_COORDINATOR_SERVE_ENGINE_TOTALS_H

#include <stdint.h>

#include "coordinator/serve/engine_api.h"

typedef struct engine_totals {
    uint64_t fenced_frames;
    uint64_t preemptions, prefix_query_tokens, prefix_hit_tokens, prefill_tokens;
    uint64_t n_detections, n_resumes;
    double detection_s[COORD_RECOVERY_KEEP], resume_s[COORD_RECOVERY_KEEP];
} engine_totals;

/* A stage was declared lost `seconds` after its last sign of life. */
void engine_totals_note_detection(engine_totals *t, double seconds);
/* Held requests resumed `seconds` after the loss. */
void engine_totals_note_resume(engine_totals *t, double seconds);
/* Copies the counters and both timing rings into the matching fields of *out
 * (fenced_frames, preemptions, prefix_cache_*, prefill_tokens, n_detections,
 * detection_s, n_resumes, resume_s); the other fields are left alone. */
void engine_totals_report(const engine_totals *t, coord_engine_stats *out);

#endif
