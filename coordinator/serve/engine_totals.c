/* engine_totals.c — counters that outlive one cluster (engine_totals.h). */
#include "coordinator/serve/engine_totals.h"

#include <string.h>

void engine_totals_note_detection(engine_totals *t, double seconds) {
    t->detection_s[t->n_detections++ % COORD_RECOVERY_KEEP] = seconds > 0 ? seconds : 0;
}

void engine_totals_note_resume(engine_totals *t, double seconds) {
    t->resume_s[t->n_resumes++ % COORD_RECOVERY_KEEP] = seconds;
}

void engine_totals_report(const engine_totals *t, coord_engine_stats *out) {
    out->fenced_frames = t->fenced_frames;
    out->preemptions = t->preemptions;
    out->prefix_cache_queries = t->prefix_query_tokens;
    out->prefix_cache_hits = t->prefix_hit_tokens;
    out->prefill_tokens = t->prefill_tokens;
    out->n_detections = t->n_detections;
    out->n_resumes = t->n_resumes;
    memcpy(out->detection_s, t->detection_s, sizeof t->detection_s);
    memcpy(out->resume_s, t->resume_s, sizeof t->resume_s);
}
