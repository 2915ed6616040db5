/* registration.h — the worker's side of the control plane: a small thread
 * that registers the node with the coordinator's gRPC control service
 * (strata.v1.Control/Register, proto/control.proto) and then heartbeats every
 * heartbeat_interval_ms (the coordinator's RegisterReply; default 1000).
 *
 * Register carries: the node name; its devices (CPU workers: one entry, kind
 * "cpu", count = online cores, memory each = host memory / cores); host
 * memory (/proc/meminfo MemTotal, or the --memory override) and NUMA nodes
 * (/sys/devices/system/node); the data-plane address; every model file with
 * its size and sha256. Hashes are computed once per process and cached next
 * to the file in FILE.sha256 ("HEX SIZE MTIME_NS"), reused while size and
 * mtime match (a read-only directory just skips the cache).
 *
 * The thread owns its rpc_client (blocking calls, so never on the worker's
 * event loop). A refused Register (e.g. FAILED_PRECONDITION: a different model
 * checksum) is logged and retried every 2 s; an unreachable coordinator is
 * retried every 0.5 s. A heartbeat answered `reregister` (the coordinator
 * restarted, or declared the node dead) registers again.
 *
 * Mutual TLS (docs/security.md): with ca/cert/key the channel is TLS; the
 * coordinator's certificate must be issued by the CA and name the
 * coordinator's host, and ours must be the node's (CN "node:NAME" with NAME
 * = reg_opts.node, or the coordinator refuses: PERMISSION_DENIED, logged and
 * retried like any refusal). reg_start checks the files first.
 *
 * Load figures come from the loop thread through reg_set_load (thread-safe).
 */
#ifndef STRATA_DAEMON_REGISTRATION_H
#define STRATA_DAEMON_REGISTRATION_H

#include <stdint.h>

#include "common/err.h"

typedef struct reg_client reg_client;

/* Every call's deadline (Register, Heartbeat, Leave), seconds; and the wait
 * before Register again after a refusal / when the coordinator is
 * unreachable or timed out, ms. (bench/fleet_sim.c simulates the same.) */
#define REG_CALL_TIMEOUT_S 2.0
#define REG_RETRY_REFUSED_MS 2000
#define REG_RETRY_UNREACHABLE_MS 500

typedef struct reg_opts {
    const char *coordinator;   /* gRPC address "host:port", or several, comma-separated (a leader
                                * and its standbys: registration.c fail_over) */
    const char *node;          /* node name */
    const char *data_address;  /* data plane "host:port" */
    const char *const *models; /* model file paths */
    int n_models;
    uint64_t memory_bytes;     /* advertised host memory; 0 = MemTotal */
    const char *ca, *cert, *key; /* mutual TLS PEM paths: all three or none (NULL: plaintext) */
} reg_opts;

/* What a heartbeat reports (latest values from the loop). */
typedef struct reg_load {
    uint32_t running_sequences;
    uint32_t kv_blocks_used, kv_blocks_free;
    double busy_seconds, uptime_seconds; /* cumulative: busy fraction = delta/delta */
    uint64_t bytes_sent;
} reg_load;

/* Checks the mutual-TLS files of reg_opts (all three or none; rpc_tls_load's
 * checks): 0 when they are usable or absent, -1 with the reason in err. The
 * worker calls it before it listens, so that a wrong file stops it at once. */
int reg_check_tls(const char *ca, const char *cert, const char *key, st_err *err);

/* Hashes nothing yet: checks the TLS files (rpc_tls_load) and starts the
 * thread (which hashes, then registers). NULL + err on a bad TLS file. */
reg_client *reg_start(const reg_opts *o, st_err *err);
void reg_set_load(reg_client *r, const reg_load *l);
/* 1 once registered with the current coordinator (for logs and tests). */
int reg_registered(reg_client *r);
/* The placement epoch the current coordinator serves, as its last
 * RegisterReply / HeartbeatReply said (0: none answered yet, it serves none,
 * or it changed: a fail-over or a reregister resets it). Thread-safe. */
uint64_t reg_serving_epoch(reg_client *r);
/* Stops and joins the thread (a call in flight ends within its deadline). NULL ok. */
void reg_stop(reg_client *r);
/* As reg_stop, but first tells the coordinator that this node leaves
 * (strata.v1.Control/Leave with reason, when registered): its stage is
 * re-placed at once (coordinator/control/leave.c). Blocks up to one call
 * deadline (2 s) more. NULL ok. */
void reg_leave(reg_client *r, const char *reason);

/* What Register reports of the host: MemTotal of /proc/meminfo in bytes (0
 * when unreadable), and the NUMA nodes of /sys/devices/system/node (>= 1). */
uint64_t reg_host_memory(void);
uint32_t reg_numa_nodes(void);

/* sha256 of a file as 64 lowercase hex digits into hex[65] (with the FILE.sha256
 * cache described above). */
int reg_file_sha256(const char *path, char hex[65], uint64_t *size, st_err *err);

#endif
