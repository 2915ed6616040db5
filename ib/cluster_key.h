/* cluster_key.h — the data plane's per-cluster key and what is derived from
 * it (docs/security.md, "Data plane (UCX)"): the proofs of the connection
 * handshake (ib/transport.h, xport_require_auth) and the token of each
 * StageAssign (ib/assign_token.h).
 *
 * File: one key per line (blank lines and lines starting with '#' ignored,
 * surrounding white space trimmed), each at least CLUSTER_KEY_MIN_CHARS
 * characters, e.g. `openssl rand -hex 32`. The first key is the one this
 * process proves with and signs with; a second one is also accepted from
 * peers (key rotation: docs/security.md). The file must be readable by its
 * owner only (common/secret_file.h). The key material is never used directly:
 * each use has its own HMAC-SHA256-derived key.
 *
 * Crypto: HMAC-SHA256 (libcrypto), comparisons with CRYPTO_memcmp, nonces
 * from RAND_bytes.
 */
#ifndef STRATA_IB_CLUSTER_KEY_H
#define STRATA_IB_CLUSTER_KEY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define CLUSTER_KEY_MIN_CHARS 32
#define CLUSTER_KEY_MAX 2   /* the current key and the previous one (rotation) */
#define CLUSTER_MAC_LEN 32  /* HMAC-SHA256 */
#define CLUSTER_NONCE_LEN 32

typedef struct cluster_key cluster_key;

/* Loads the key file (format above). NULL + err: unreadable, readable by the
 * group or others, no key, a key shorter than CLUSTER_KEY_MIN_CHARS, more than
 * CLUSTER_KEY_MAX keys. Messages never contain key material. */
cluster_key *cluster_key_load(const char *path, st_err *err);
/* The same from text (tests). */
cluster_key *cluster_key_parse(const char *text, const char *name, st_err *err);
/* Wipes and frees; NULL is fine. */
void cluster_key_free(cluster_key *k);
/* Keys held (1 or 2). */
int cluster_key_count(const cluster_key *k);

/* Uses of the key: each derives its own HMAC key from the material. */
enum cluster_key_use { CLUSTER_KEY_HANDSHAKE = 0, CLUSTER_KEY_ASSIGN = 1 };

/* HMAC-SHA256 of msg under the `use` key derived from key number idx
 * (0 = the current one). 0 or -1 (libcrypto failure). */
int cluster_key_mac(const cluster_key *k, int idx, enum cluster_key_use use, const void *msg, size_t len,
                    uint8_t out[CLUSTER_MAC_LEN]);
/* The index of the key whose `use` MAC of msg equals mac (constant-time
 * comparison), or -1 when none does. */
int cluster_key_verify(const cluster_key *k, enum cluster_key_use use, const void *msg, size_t len,
                       const uint8_t *mac, size_t mac_len);

/* The handshake's proofs (ib/transport.h, docs/protocol.md "Handshake"):
 * HMAC under the handshake key of "strata/v1 data-plane handshake\0" || dir
 * || role_c || role_s || ns || nc, where dir is 'C' for the connecting side's
 * proof and 'S' for the listener's, role_c / role_s the roles the two sides
 * claim and ns / nc their CLUSTER_NONCE_LEN-byte nonces. A proof made for one
 * direction, other roles or other nonces does not verify: a reflected or
 * replayed answer fails. proof: 0 or -1; verify: the key index or -1. */
int cluster_handshake_proof(const cluster_key *k, int idx, char dir, uint8_t role_c, uint8_t role_s,
                            const uint8_t *ns, const uint8_t *nc, uint8_t out[CLUSTER_MAC_LEN]);
int cluster_handshake_verify(const cluster_key *k, char dir, uint8_t role_c, uint8_t role_s, const uint8_t *ns,
                             const uint8_t *nc, const uint8_t *mac);

/* n cryptographically random bytes (RAND_bytes). 0 or -1. */
int cluster_random(void *buf, size_t n);

#endif
