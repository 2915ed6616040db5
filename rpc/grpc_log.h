/* grpc_log.h — gRPC's own log lines (a failed TLS handshake, a bad HTTP/2
 * preface...) go to common/log.h, each source line of gRPC at most once per
 * GRPC_LOG_INTERVAL_S with the count left out, so that a peer that opens
 * connections in a loop cannot flood the log (issue 14). gRPC errors are
 * logged as warnings: they describe what a peer did, not a fault here.
 */
#ifndef STRATA_RPC_GRPC_LOG_H
#define STRATA_RPC_GRPC_LOG_H

#define GRPC_LOG_INTERVAL_S 10.0

/* Installs the hook (once per process; thread-safe). rpc_server_create and
 * rpc_client_create call it. */
void rpc_log_install(void);

#endif
