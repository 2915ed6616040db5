/* tcp_floor.h — one-way latency of plain TCP loopback after an idle gap (see
 * tcp_floor.c): the floor that strata-bench-xport's gap rounds and the
 * cluster's per-hop figure are compared with. */
#ifndef STRATA_BENCH_TCP_FLOOR_H
#define STRATA_BENCH_TCP_FLOOR_H

#include <stddef.h>

/* Runs `rounds` replies of `bytes` (>= 8) with each receiver (after 4 warm
 * ones each), prints one "# gap ..." line and sets med_us[0] (blocked) and
 * med_us[1] (spinning) in microseconds. Returns 0, or -1 when a socket,
 * the fork or a transfer failed. */
int tcp_floor(int gap_ms, size_t bytes, int rounds, double med_us[2]);

#endif
