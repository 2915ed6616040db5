/* cluster_key.c — the data plane's cluster key (cluster_key.h). */
#include "ib/cluster_key.h"

#include <ctype.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stdlib.h>
#include <string.h>

#include "common/secret_file.h"

#define KEY_FILE_MAX 8192

struct cluster_key {
    int n;
    /* per key: the derived HMAC keys, one per use */
    uint8_t derived[CLUSTER_KEY_MAX][2][CLUSTER_MAC_LEN];
};

/* Labels of the derived keys: a MAC made for one use is no good for another. */
static const char *const use_label[2] = {"strata/v1 data-plane handshake", "strata/v1 stage-assign token"};

static int hmac(const uint8_t *key, size_t klen, const void *msg, size_t len, uint8_t out[CLUSTER_MAC_LEN])
{
    unsigned int olen = 0;
    if (!HMAC(EVP_sha256(), key, (int)klen, msg, len, out, &olen) || olen != CLUSTER_MAC_LEN) return -1;
    return 0;
}

cluster_key *cluster_key_parse(const char *text, const char *name, st_err *err)
{
    cluster_key *k = calloc(1, sizeof *k);
    if (!k) return st_errf(err, "%s: out of memory", name), NULL;
    int line_no = 0;
    const char *p = text;
    while (*p) {
        line_no++;
        const char *eol = strchr(p, '\n');
        const char *end = eol ? eol : p + strlen(p);
        const char *a = p, *b = end;
        while (a < b && isspace((unsigned char)*a)) a++;
        while (b > a && isspace((unsigned char)b[-1])) b--;
        p = eol ? eol + 1 : end;
        if (a == b || *a == '#') continue;
        if (k->n == CLUSTER_KEY_MAX) {
            cluster_key_free(k);
            return st_errf(err, "%s:%d: more than %d keys (the current one and the previous one)", name,
                           line_no, CLUSTER_KEY_MAX), NULL;
        }
        if ((size_t)(b - a) < CLUSTER_KEY_MIN_CHARS) {
            cluster_key_free(k);
            return st_errf(err, "%s:%d: the key has %d characters, fewer than %d (make one with "
                           "`openssl rand -hex 32`)", name, line_no, (int)(b - a), CLUSTER_KEY_MIN_CHARS), NULL;
        }
        for (int u = 0; u < 2; u++)
            if (hmac((const uint8_t *)a, (size_t)(b - a), use_label[u], strlen(use_label[u]), k->derived[k->n][u])) {
                cluster_key_free(k);
                return st_errf(err, "%s: HMAC-SHA256 failed (libcrypto)", name), NULL;
            }
        k->n++;
    }
    if (k->n == 0) {
        cluster_key_free(k);
        return st_errf(err, "%s: no key in the file (make one with `openssl rand -hex 32`)", name), NULL;
    }
    return k;
}

cluster_key *cluster_key_load(const char *path, st_err *err)
{
    char *buf = malloc(KEY_FILE_MAX);
    if (!buf) return st_errf(err, "cluster key: out of memory"), NULL;
    size_t len = 0;
    cluster_key *k = NULL;
    if (st_secret_file_read(path, "cluster key", buf, KEY_FILE_MAX, &len, err) == 0) {
        if (memchr(buf, '\0', len))
            st_errf(err, "cluster key: %s holds a NUL byte (want text: one key per line)", path);
        else
            k = cluster_key_parse(buf, path, err);
    }
    OPENSSL_cleanse(buf, KEY_FILE_MAX);
    free(buf);
    return k;
}

void cluster_key_free(cluster_key *k)
{
    if (!k) return;
    OPENSSL_cleanse(k, sizeof *k);
    free(k);
}

int cluster_key_count(const cluster_key *k) { return k ? k->n : 0; }

int cluster_key_mac(const cluster_key *k, int idx, enum cluster_key_use use, const void *msg, size_t len,
                    uint8_t out[CLUSTER_MAC_LEN])
{
    if (!k || idx < 0 || idx >= k->n || (use != CLUSTER_KEY_HANDSHAKE && use != CLUSTER_KEY_ASSIGN)) return -1;
    return hmac(k->derived[idx][use], CLUSTER_MAC_LEN, msg, len, out);
}

int cluster_key_verify(const cluster_key *k, enum cluster_key_use use, const void *msg, size_t len,
                       const uint8_t *mac, size_t mac_len)
{
    if (!k || !mac || mac_len != CLUSTER_MAC_LEN) return -1;
    int found = -1;
    for (int i = 0; i < k->n; i++) { /* every key, found or not: the time does not tell which */
        uint8_t want[CLUSTER_MAC_LEN];
        if (cluster_key_mac(k, i, use, msg, len, want)) continue;
        if (CRYPTO_memcmp(want, mac, CLUSTER_MAC_LEN) == 0 && found < 0) found = i;
        OPENSSL_cleanse(want, sizeof want);
    }
    return found;
}

/* The bytes a handshake proof covers (cluster_key.h); their length. */
static size_t transcript(char dir, uint8_t role_c, uint8_t role_s, const uint8_t *ns, const uint8_t *nc,
                         uint8_t *buf)
{
    static const char label[] = "strata/v1 data-plane handshake";
    size_t n = sizeof label;
    memcpy(buf, label, sizeof label);
    buf[n++] = (uint8_t)dir;
    buf[n++] = role_c;
    buf[n++] = role_s;
    memcpy(buf + n, ns, CLUSTER_NONCE_LEN);
    n += CLUSTER_NONCE_LEN;
    memcpy(buf + n, nc, CLUSTER_NONCE_LEN);
    return n + CLUSTER_NONCE_LEN;
}
#define TRANSCRIPT_MAX (32 + 3 + 2 * CLUSTER_NONCE_LEN)

int cluster_handshake_proof(const cluster_key *k, int idx, char dir, uint8_t role_c, uint8_t role_s,
                            const uint8_t *ns, const uint8_t *nc, uint8_t out[CLUSTER_MAC_LEN])
{
    uint8_t t[TRANSCRIPT_MAX];
    return cluster_key_mac(k, idx, CLUSTER_KEY_HANDSHAKE, t, transcript(dir, role_c, role_s, ns, nc, t), out);
}

int cluster_handshake_verify(const cluster_key *k, char dir, uint8_t role_c, uint8_t role_s, const uint8_t *ns,
                             const uint8_t *nc, const uint8_t *mac)
{
    uint8_t t[TRANSCRIPT_MAX];
    return cluster_key_verify(k, CLUSTER_KEY_HANDSHAKE, t, transcript(dir, role_c, role_s, ns, nc, t), mac,
                              CLUSTER_MAC_LEN);
}

int cluster_random(void *buf, size_t n) { return RAND_bytes(buf, (int)n) == 1 ? 0 : -1; }
