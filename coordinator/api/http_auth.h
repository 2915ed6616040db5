/* http_auth.h — API keys of the HTTP API (docs/security.md, "HTTP API").
 *
 * Keys come from a file (--api-key-file, [cluster] api_key_file) and/or one
 * key in the environment (STRATA_API_KEY). The file has one key per line,
 * optionally "name:key" so that logs and limits can name the key without
 * showing it; blank lines and lines starting with '#' are ignored; leading
 * and trailing white space is trimmed. A key is 8 to 512 printable ASCII
 * characters without spaces; an unnamed key is called "key-N" (its line
 * number), the environment's "env".
 *
 * Clients send "Authorization: Bearer KEY". Keys are compared in constant
 * time (CRYPTO_memcmp over a SHA-256 of each side, so neither the content nor
 * the length of a key leaks through timing).
 *
 * Per-key limits: each key may have at most max_in_flight requests queued
 * or running at once (0 = no limit); http_key_acquire refuses the next one,
 * and the HTTP layer answers 429 with Retry-After.
 *
 * Reloading (SIGHUP): a new table replaces the old one, which stays valid
 * until the last key acquired from it is released. Counts start at 0 in the
 * new table, so for as long as old requests run, a key may briefly have up
 * to twice its limit.
 */
#ifndef STRATA_COORDINATOR_API_HTTP_AUTH_H
#define STRATA_COORDINATOR_API_HTTP_AUTH_H

#include <stdbool.h>

#include "common/err.h"

typedef struct http_keys http_keys;
typedef struct http_key http_key;

/* Loads the keys: path (NULL = none) and env_key (NULL or "" = none).
 * Returns NULL + err on an unreadable file, a malformed line (named by file
 * and line), a duplicate key or name, or a file that holds no key. With
 * neither source it returns an empty table (http_keys_count 0: no auth). */
http_keys *http_keys_load(const char *path, const char *env_key, int max_in_flight, st_err *err);
/* Drops the owner's hold: freed now, or at the last http_key_release of a
 * key acquired from it. */
void http_keys_free(http_keys *k);
int http_keys_count(const http_keys *k);

/* The outcome of checking a request's Authorization header. */
enum http_auth_result {
    HTTP_AUTH_OK = 0,
    HTTP_AUTH_MISSING, /* no Authorization header, or not "Bearer ..." */
    HTTP_AUTH_WRONG,   /* a Bearer token that is no configured key */
};

/* Checks the value of the Authorization header (NULL = absent). On OK,
 * *key is the matching key. */
enum http_auth_result http_keys_check(const http_keys *k, const char *authorization, http_key **key);

/* The key's name (never the key itself), for logs and messages. */
const char *http_key_name(const http_key *key);
/* Counts one more request of the key in flight; false (nothing counted)
 * when it already has max_in_flight. */
bool http_key_acquire(http_key *key);
void http_key_release(http_key *key);
int http_key_in_flight(const http_key *key);

#endif
