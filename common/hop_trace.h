/* hop_trace.h — time stamps along the activation path, for finding where a
 * hop's time goes (bench/cluster_bench.sh --hop-only prints the breakdown;
 * docs/protocol.md, "Where a hop's time goes").
 *
 * Off unless STRATA_HOP_TRACE=PREFIX is in the environment at the first
 * call: then each mark (event name, batch id, CLOCK_MONOTONIC ns) goes into
 * an in-memory table of the first 65536 marks (no I/O on the path), written
 * at exit to PREFIX.<pid>, one "event batch_id ns" line per mark. Every
 * process on a machine reads the same clock, so the files of a coordinator
 * and its workers join by batch id. Marks of batch id 0 (control frames) are
 * not kept. Safe from any thread. Event names must be string literals.
 */
#ifndef STRATA_COMMON_HOP_TRACE_H
#define STRATA_COMMON_HOP_TRACE_H

#include <stdbool.h>
#include <stdint.h>

/* Whether marks are kept (STRATA_HOP_TRACE set). Cheap after the first call. */
bool st_hop_trace_on(void);
/* Keeps (event, batch_id, ns) when tracing is on. */
void st_hop_mark(const char *event, uint64_t batch_id, uint64_t ns);

#endif
