/* etcd_json.h — the messages of etcd's v3 JSON gateway (etcd 3.4: POST
 * /v3/kv/range, /v3/kv/txn, /v3/kv/deleterange, /v3/lease/grant,
 * /v3/lease/keepalive, /v3/lease/revoke, /v3/watch), encoded and parsed with
 * jansson; keys and values travel base64 (libcrypto's EVP_EncodeBlock).
 * Pure functions, no I/O: etcd_client.c sends them, the unit tests
 * (tests/control/test_etcd_json.c) feed them etcd's real and broken answers.
 *
 * The gateway's JSON (grpc-gateway, proto3): int64 fields are strings
 * ("revision":"12"), fields at their zero value are left out (a missing
 * "succeeded" is false, a missing "TTL" is 0), enums are names ("EQUAL").
 * The parsers accept a number where a string is expected, treat a missing
 * field as zero, and reject anything else with a message that names the
 * field ("etcd: kvs[0].key: not base64").
 *
 * Errors in a body: {"error":"...","code":N,"message":"..."} (a unary call's
 * HTTP error) or {"error":{"grpc_code":N,"http_code":N,"message":"..."}} (a
 * stream's); every parser turns either into "etcd: MESSAGE (code N)".
 */
#ifndef STRATA_COORDINATOR_ETCD_JSON_H
#define STRATA_COORDINATOR_ETCD_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define ETCD_KEY_MAX 1024

/* base64 of data[0..len): malloc'd, NUL-terminated (NULL when out of memory). */
char *etcd_b64(const void *data, size_t len);
/* Decodes base64 text (with padding) into a malloc'd buffer, NUL-terminated
 * past *len for convenience. NULL on bad base64 or out of memory. */
char *etcd_unb64(const char *text, size_t *len);

/* One key-value pair of a range or a watch event (value NUL-terminated). */
typedef struct etcd_kv {
    char *key;
    char *value;
    size_t value_len;
    int64_t create_rev, mod_rev, lease;
} etcd_kv;

typedef struct etcd_kvs {
    etcd_kv *kv;
    size_t n;
    int64_t revision; /* the store's revision when it answered (header.revision) */
} etcd_kvs;
void etcd_kvs_free(etcd_kvs *k);

/* ---- requests (malloc'd JSON text; NULL when out of memory) */

/* key, or every key starting with key when prefix. */
char *etcd_req_range(const char *key, bool prefix);
char *etcd_req_deleterange(const char *key, bool prefix);

/* One operation of a transaction: a put (value != NULL; lease 0 = none) or
 * a delete of key. */
typedef struct etcd_op {
    const char *key;
    const char *value;
    size_t value_len;
    int64_t lease;
} etcd_op;

/* A comparison of a transaction on one key. */
typedef enum { ETCD_CMP_CREATE, ETCD_CMP_LEASE, ETCD_CMP_VALUE } etcd_cmp_target;
typedef struct etcd_cmp {
    const char *key;
    etcd_cmp_target target;
    int64_t num;       /* CREATE: create_revision (0 = the key does not exist); LEASE: lease id */
    const char *value; /* VALUE: the value it must equal */
} etcd_cmp;

/* if every cmp holds (EQUAL) then `then` else `otherwise` (either may be empty). */
char *etcd_req_txn(const etcd_cmp *cmp, size_t n_cmp, const etcd_op *then, size_t n_then,
                   const etcd_op *otherwise, size_t n_otherwise);
char *etcd_req_lease_grant(int64_t ttl_s);
char *etcd_req_lease_id(int64_t id); /* keepalive and revoke */
char *etcd_req_watch(const char *key, int64_t start_rev);

/* ---- responses: 0, or -1 + err (the message names what was wrong) */

/* An error object in body, if any: 1 + err when there is one, 0 when not. */
int etcd_parse_error(const char *body, size_t len, st_err *err);
int etcd_parse_range(const char *body, size_t len, etcd_kvs *out, st_err *err);
/* *succeeded: whether the comparisons held; *revision: header.revision;
 * with range responses in the taken branch, their kvs go to out (may be NULL). */
int etcd_parse_txn(const char *body, size_t len, bool *succeeded, int64_t *revision, etcd_kvs *out, st_err *err);
/* lease grant ({"ID","TTL"}) and keepalive ({"result":{"ID","TTL"}}): TTL 0
 * from keepalive means the lease is gone. */
int etcd_parse_lease(const char *body, size_t len, int64_t *id, int64_t *ttl, st_err *err);
int etcd_parse_header(const char *body, size_t len, int64_t *revision, st_err *err); /* put, delete, revoke */

/* One message of the watch stream ({"result":{...}}): *created when it
 * confirms the watch, *deleted / *put when an event of that kind is in it;
 * *canceled when etcd ended the watch (compacted revision: err says why). */
typedef struct etcd_watch_msg {
    bool created, canceled, put, deleted;
    int64_t revision;
} etcd_watch_msg;
int etcd_parse_watch(const char *body, size_t len, etcd_watch_msg *m, st_err *err);

#endif
