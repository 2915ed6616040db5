/* grpc_absl.h — abseil settings for a process that uses gRPC.
 *
 * Debian's abseil is built without NDEBUG, so every absl::Mutex lock inside
 * gRPC runs abseil's deadlock detector (a lock-order graph, GraphCycles). It
 * finds lock-order bugs in gRPC, not in Strata, and it costs: 4.5% of the
 * coordinator's CPU samples at 1,000 heartbeating nodes, and more as the
 * mutexes grow with the connections (its pointer map has a fixed 8171
 * buckets). rpc_absl_debug_off turns it off with abseil's own switch,
 * absl::SetMutexDeadlockDetectionMode(kIgnore), a C++ function called here by
 * its (Debian) name; with an abseil that lacks it nothing happens. Release
 * builds of abseil have it off already. Idempotent, any thread; the rpc
 * server and client call it when they start.
 */
#ifndef STRATA_RPC_GRPC_ABSL_H
#define STRATA_RPC_GRPC_ABSL_H

void rpc_absl_debug_off(void);

#endif
