/* http_auth.c — API keys: loading, constant-time check, per-key counts.
 * See http_auth.h. */
#include "coordinator/api/http_auth.h"

#include <ctype.h>
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY_MIN 8
#define KEY_MAX 512
#define NAME_MAX_LEN 64
#define LINE_MAX_LEN 1024

struct http_key {
    http_keys *table;
    char name[NAME_MAX_LEN + 1];
    unsigned char digest[32]; /* SHA-256 of the key: what is compared */
    int in_flight;
    int max_in_flight;
};

struct http_keys {
    http_key *keys;
    int n, cap;
    int refs;     /* keys acquired and not released yet */
    bool retired; /* http_keys_free was called: freed at the last release */
};

static int digest(const char *s, size_t n, unsigned char out[32]) {
    unsigned int len = 0;
    return EVP_Digest(s, n, out, &len, EVP_sha256(), NULL) == 1 && len == 32 ? 0 : -1;
}

static bool valid_key(const char *s) {
    size_t n = strlen(s);
    if (n < KEY_MIN || n > KEY_MAX) return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] <= ' ' || s[i] > '~') return false;
    return true;
}

static bool valid_name(const char *s, size_t n) {
    if (n == 0 || n > NAME_MAX_LEN) return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '-' && s[i] != '_' && s[i] != '.') return false;
    return true;
}

/* Adds one key; -1 + err on a duplicate or out of memory. where names the
 * source for messages. */
static void keys_destroy(http_keys *k) {
    if (k->keys) OPENSSL_cleanse(k->keys, (size_t)k->cap * sizeof *k->keys);
    free(k->keys);
    free(k);
}

static int add_key(http_keys *k, const char *name, const char *key, int max_in_flight,
                   const char *where, st_err *err) {
    unsigned char d[32];
    if (digest(key, strlen(key), d) != 0) return st_errf(err, "%s: cannot hash the key", where), -1;
    for (int i = 0; i < k->n; i++) {
        if (CRYPTO_memcmp(k->keys[i].digest, d, sizeof d) == 0)
            return st_errf(err, "%s: the same key as '%s'", where, k->keys[i].name), -1;
        if (strcmp(k->keys[i].name, name) == 0)
            return st_errf(err, "%s: the key name '%s' is used twice", where, name), -1;
    }
    if (k->n == k->cap) {
        int cap = k->cap ? 2 * k->cap : 8;
        http_key *nk = realloc(k->keys, (size_t)cap * sizeof *nk);
        if (!nk) return st_errf(err, "%s: out of memory", where), -1;
        k->keys = nk;
        k->cap = cap;
    }
    http_key *e = &k->keys[k->n++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    memcpy(e->digest, d, sizeof d);
    e->max_in_flight = max_in_flight;
    return 0;
}

static char *trim(char *s) {
    while (*s && isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
    return s;
}

static int load_file(http_keys *k, const char *path, int max_in_flight, st_err *err) {
    FILE *f = fopen(path, "r");
    if (!f) return st_errf(err, "api key file %s: %s", path, strerror(errno)), -1;
    char line[LINE_MAX_LEN + 2];
    int lineno = 0, before = k->n, rc = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char where[600];
        snprintf(where, sizeof where, "api key file %s:%d", path, lineno);
        if (!strchr(line, '\n') && !feof(f)) {
            st_errf(err, "%s: line longer than %d characters", where, LINE_MAX_LEN);
            rc = -1;
            break;
        }
        char *s = trim(line);
        if (!*s || *s == '#') continue;
        char name[NAME_MAX_LEN + 1];
        const char *key = s;
        char *colon = strchr(s, ':');
        if (colon && valid_name(s, (size_t)(colon - s))) {
            memcpy(name, s, (size_t)(colon - s));
            name[colon - s] = '\0';
            key = trim(colon + 1);
        } else {
            snprintf(name, sizeof name, "key-%d", lineno);
        }
        if (!valid_key(key)) {
            /* Never echo the line: it may hold a real key with a typo. */
            st_errf(err, "%s: not a key (8 to %d printable characters without spaces, or NAME:KEY)",
                    where, KEY_MAX);
            rc = -1;
            break;
        }
        if (add_key(k, name, key, max_in_flight, where, err) != 0) {
            rc = -1;
            break;
        }
    }
    if (rc == 0 && ferror(f)) {
        st_errf(err, "api key file %s: read error", path);
        rc = -1;
    }
    fclose(f);
    if (rc == 0 && k->n == before) {
        st_errf(err, "api key file %s: no key in the file", path);
        rc = -1;
    }
    return rc;
}

http_keys *http_keys_load(const char *path, const char *env_key, int max_in_flight, st_err *err) {
    http_keys *k = calloc(1, sizeof *k);
    if (!k) return (void)st_errf(err, "out of memory"), NULL;
    if (path && *path && load_file(k, path, max_in_flight, err) != 0) {
        http_keys_free(k);
        return NULL;
    }
    if (env_key && *env_key) {
        if (!valid_key(env_key) ||
            add_key(k, "env", env_key, max_in_flight, "STRATA_API_KEY", err) != 0) {
            if (!valid_key(env_key))
                st_errf(err, "STRATA_API_KEY: not a key (8 to %d printable characters without spaces)",
                        KEY_MAX);
            http_keys_free(k);
            return NULL;
        }
    }
    for (int i = 0; i < k->n; i++) k->keys[i].table = k; /* the array is final now */
    return k;
}

void http_keys_free(http_keys *k) {
    if (!k) return;
    k->retired = true;
    if (k->refs == 0) keys_destroy(k);
}

int http_keys_count(const http_keys *k) { return k ? k->n : 0; }

enum http_auth_result http_keys_check(const http_keys *k, const char *authorization, http_key **key) {
    *key = NULL;
    if (!authorization) return HTTP_AUTH_MISSING;
    /* RFC 7235: the scheme is case-insensitive; one or more spaces follow. */
    if (strncasecmp(authorization, "Bearer", 6) != 0 || (authorization[6] != ' ' && authorization[6] != '\t'))
        return HTTP_AUTH_MISSING;
    const char *tok = authorization + 7;
    while (*tok == ' ' || *tok == '\t') tok++;
    size_t n = strlen(tok);
    while (n && (tok[n - 1] == ' ' || tok[n - 1] == '\t')) n--;
    if (n == 0) return HTTP_AUTH_MISSING;
    unsigned char d[32];
    if (digest(tok, n, d) != 0) return HTTP_AUTH_WRONG;
    /* Every key is compared, whichever matches, so the time does not say which. */
    http_key *found = NULL;
    for (int i = 0; i < k->n; i++)
        if (CRYPTO_memcmp(k->keys[i].digest, d, sizeof d) == 0) found = &k->keys[i];
    OPENSSL_cleanse(d, sizeof d);
    if (!found) return HTTP_AUTH_WRONG;
    *key = found;
    return HTTP_AUTH_OK;
}

const char *http_key_name(const http_key *key) { return key ? key->name : "-"; }

bool http_key_acquire(http_key *key) {
    if (key->max_in_flight > 0 && key->in_flight >= key->max_in_flight) return false;
    key->in_flight++;
    key->table->refs++;
    return true;
}

void http_key_release(http_key *key) {
    if (!key || key->in_flight <= 0) return;
    key->in_flight--;
    http_keys *k = key->table;
    if (--k->refs == 0 && k->retired) keys_destroy(k);
}

int http_key_in_flight(const http_key *key) { return key->in_flight; }
