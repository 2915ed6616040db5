/* etcd_client.h — a small blocking client of etcd's v3 API through its JSON
 * gateway (etcd >= 3.4 serves POST /v3/... on its client port), over
 * libevent's evhttp client on a private event loop, with TLS by
 * bufferevent_openssl. Messages: etcd_json.h.
 *
 * Threads: every call blocks the calling thread for at most timeout_s and
 * runs only the client's own event loop; one thread uses a client at a time
 * (the coordinator's election thread, ha.c). The coordinator's event loop
 * never calls it.
 *
 * Endpoints: "http://HOST:PORT" or "https://HOST:PORT", comma-separated; a
 * call that cannot reach one (connection refused, timeout, a 5xx) tries the
 * next before it fails, and the client stays on the one that answered.
 * Plaintext to a non-loopback host needs `insecure` (common/exposure.h);
 * https needs cacert (the CA of etcd's server certificate, which must name
 * the host or IP of the endpoint); cert + key, when given, are our client
 * certificate (etcd --client-cert-auth).
 */
#ifndef STRATA_COORDINATOR_ETCD_CLIENT_H
#define STRATA_COORDINATOR_ETCD_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "coordinator/control/etcd_json.h"

typedef struct etcd_client etcd_client;

typedef struct etcd_client_opts {
    const char *endpoints;           /* "http://127.0.0.1:2379[,https://h:p...]" */
    const char *cacert, *cert, *key; /* PEM paths; NULL when not used */
    bool insecure;                   /* allow http:// to a non-loopback host */
    double timeout_s;                /* per call (default 2) */
} etcd_client_opts;

/* Checks the endpoints and TLS files (no connection yet). NULL + err on a bad
 * URL, plaintext to a non-loopback host without insecure, https without
 * cacert, or an unreadable certificate or key. */
etcd_client *etcd_client_create(const etcd_client_opts *o, st_err *err);
void etcd_client_destroy(etcd_client *c);
/* The endpoint in use ("http://127.0.0.1:2379"). */
const char *etcd_client_endpoint(const etcd_client *c);

/* POST path (e.g. "/v3/kv/range") with a JSON body; *out (malloc'd,
 * NUL-terminated, free it) gets a 200's body. -1 + err when no endpoint
 * answered, or on an HTTP error (err carries etcd's message). */
int etcd_call(etcd_client *c, const char *path, const char *body, char **out, size_t *out_len, st_err *err);

/* The calls (etcd_json.h for the shapes). */
int etcd_range(etcd_client *c, const char *key, bool prefix, etcd_kvs *out, st_err *err);
int etcd_txn(etcd_client *c, const etcd_cmp *cmp, size_t n_cmp, const etcd_op *then, size_t n_then,
             const etcd_op *otherwise, size_t n_otherwise, bool *succeeded, int64_t *revision, etcd_kvs *out,
             st_err *err);
int etcd_lease_grant(etcd_client *c, int64_t ttl_s, int64_t *id, st_err *err);
/* *ttl: seconds left after the renewal; 0 when the lease is gone (expired or revoked). */
int etcd_lease_keepalive(etcd_client *c, int64_t id, int64_t *ttl, st_err *err);
int etcd_lease_revoke(etcd_client *c, int64_t id, st_err *err);

/* Watches key from revision start_rev (> 0) for at most timeout_s: 1 when
 * an event came (*m says which), 0 when the time passed without one,
 * -1 + err on failure (also a canceled watch). */
int etcd_watch(etcd_client *c, const char *key, int64_t start_rev, double timeout_s, etcd_watch_msg *m,
               st_err *err);

#endif
