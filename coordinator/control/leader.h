/* leader.h — coordinator high availability on etcd (docs/recovery.md
 * "Coordinator failover"): leader election with an etcd lease and a
 * transaction, and the leader's fenced writes, on a thread of its own
 * (etcd_client.h blocks; the coordinator's event loop never waits for etcd).
 *
 * Keys under PREFIX (--etcd-prefix, default /strata/<cluster>):
 *   PREFIX/leader        the leader's record, {"name","http","grpc","pid"},
 *                        attached to its lease (TTL --leader-ttl)
 *   PREFIX/state         placement + epochs (state_file.h's JSON, no nodes)
 *   PREFIX/nodes/NAME    one per known node, {"name","addr"}
 *   PREFIX/seq           the write sequence: "REV.N", put by every write of
 *                        the leader elected at revision REV (below)
 *
 * Election: grant a lease of TTL s; txn "if create_revision(leader) == 0 then
 * put leader (with the lease)". The winner keeps the lease alive every TTL/3.
 * The others watch the leader key (v3 watch) and campaign when it is deleted
 * (the lease expired or was revoked at a clean stop).
 *
 * Fencing: every write of the leader is a txn "if create_revision(leader) ==
 * the revision that made us leader", so a deposed leader cannot write. A
 * leader whose lease is gone (keep-alive says TTL 0, a fenced write failed,
 * the key is not ours any more: checked with every renewal), or that could
 * not renew it for TTL - min(1 s, TTL/3) since the last renewal it sent
 * (checked every 50 ms by a fence thread of its own, which no blocked etcd
 * call delays), stops at once: the process exits with status 75 (EX_TEMPFAIL),
 * its listeners and worker connections close with it, and its supervisor
 * (systemd Restart=) starts it again as a standby. A standby cannot win
 * before the old lease expired on etcd, and the old leader is gone by then.
 *
 * Writes (docs/recovery.md "Coordinator failover", "The leader's writes"):
 * queued changes are coalesced per key (the last change of a key wins; etcd
 * refuses a txn that names a key twice) into txns of at most TXN_OPS_MAX keys.
 * Each txn also compares PREFIX/seq with the value of our previous write and
 * puts the next one, so a write whose answer was lost (a timeout) but that
 * reaches etcd late cannot overwrite a newer one. A txn etcd refuses (an
 * answer other than its passing states: not leader, timeouts, too many
 * requests) is logged, counted and written again one key per txn; a key etcd
 * refuses on its own is logged, counted and dropped (a later change of the key
 * is written afresh). The same fence thread steps down (status 75) when a
 * change has not reached etcd for longer than the TTL (still queued, or
 * dropped as refused and not written since): the state it serves is then state
 * a successor could not see.
 */
#ifndef STRATA_COORDINATOR_LEADER_H
#define STRATA_COORDINATOR_LEADER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "coordinator/control/etcd_json.h"

#define LEADER_EXIT_STATUS 75

struct event_base;

typedef struct leader_opts {
    const char *etcd;                /* endpoints (etcd_client.h) */
    const char *cacert, *cert, *key; /* TLS to etcd */
    bool insecure;
    const char *prefix;              /* "/strata/default" */
    double ttl_s;                    /* lease TTL (default 3, at least 1) */
    const char *name;                /* this coordinator in logs and the record */
    const char *http;                /* advertised HTTP base URL ("http://10.0.0.1:8000") */
    const char *grpc;                /* advertised gRPC address ("10.0.0.1:7070") */
} leader_opts;

typedef struct leader leader;

/* Called on the loop thread of base once this process won the election;
 * `state` holds every key under the prefix, read after the win (the
 * callee may keep nothing of it past the call). */
typedef void (*leader_elected_fn)(void *ud, const etcd_kvs *state);

/* Connects nothing yet: checks the options and starts the election thread.
 * NULL + err on bad options (etcd_client_create's errors). */
leader *leader_start(const leader_opts *o, struct event_base *base, leader_elected_fn fn, void *ud, st_err *err);

bool leader_is_leader(leader *l);
/* The key prefix, without a trailing '/'. */
const char *leader_prefix(const leader *l);
/* The current leader's advertised addresses as this process last saw them
 * ("" when unknown: an election is under way). */
void leader_current(leader *l, char *http, size_t http_cap, char *grpc, size_t grpc_cap);

/* Queues a put (value != NULL) or a delete of PREFIX/rel_key; the election
 * thread writes queued changes in order, batched, each batch one fenced
 * txn. Only while leader (dropped otherwise). O(1) on the calling thread. */
void leader_write(leader *l, const char *rel_key, const char *value);

/* The write path's health, for GetStatus and /metrics. */
typedef struct leader_write_stats {
    uint64_t refused_batches;  /* txns etcd refused (not its passing states) */
    uint64_t dropped_changes;  /* changes etcd refused on their own: dropped */
    uint64_t queued;           /* changes not written yet */
    double unwritten_s;        /* age of the oldest change etcd misses (0: none) */
    char last_refusal[320];    /* the latest refusal, "KEY or 'a txn': etcd's message" ("" none) */
    double last_refusal_age_s; /* seconds since it */
} leader_write_stats;
void leader_stats(leader *l, leader_write_stats *out);

/* The write path's pure steps (tests/control/test_leader_batch.c):
 * leader_coalesce takes the longest prefix of the queue q[0..n) that names at
 * most cap keys (*used: its length) and writes one op per key to out (the
 * key's last change: a put then a delete is a delete, a delete then a put is
 * the put), in the order of each key's first change; returns their number.
 * leader_refusal: whether an etcd_txn error message is etcd refusing the txn
 * (true: the same txn would be refused again) rather than no answer or a
 * passing state worth the same call again. */
size_t leader_coalesce(const etcd_op *q, size_t n, etcd_op *out, size_t cap, size_t *used);
bool leader_refusal(const char *msg);

/* A clean stop: writes what is queued, revokes the lease (a standby takes
 * over at once), joins the thread. NULL ok. */
void leader_stop(leader *l);

#endif
