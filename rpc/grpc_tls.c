/* grpc_tls.c — reading and checking the mutual-TLS files of grpc_tls.h with
 * libcrypto (OpenSSL). The TLS itself is gRPC's. */
#include "rpc/grpc_tls.h"

#include <errno.h>
#include <pthread.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/log.h"

#define PEM_MAX_BYTES (1 << 20) /* a certificate chain or key is a few KiB */

static bool given(const char *p) { return p && *p; }

int rpc_tls_given(const rpc_tls *t, const char *flag_prefix, st_err *err)
{
    int n = given(t->ca) + given(t->cert) + given(t->key);
    if (n == 0) return 0;
    if (n == 3) return 1;
    const char *pf = flag_prefix ? flag_prefix : "--";
    char missing[128] = "";
    const char *names[3] = {"ca", "cert", "key"};
    const char *vals[3] = {t->ca, t->cert, t->key};
    size_t off = 0;
    for (int i = 0; i < 3; i++)
        if (!given(vals[i]))
            off += (size_t)snprintf(missing + off, sizeof missing - off, " %s%s", pf, names[i]);
    return st_errf(err, "mutual TLS needs %sca, %scert and %skey together; missing:%s", pf, pf, pf, missing);
}

/* The whole file, NUL-terminated. */
static char *read_file(const char *what, const char *path, st_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return st_errf(err, "%s %s: %s", what, path, strerror(errno)), NULL;
    char *buf = malloc(PEM_MAX_BYTES + 1);
    size_t n = buf ? fread(buf, 1, PEM_MAX_BYTES + 1, f) : 0;
    bool bad = ferror(f);
    fclose(f);
    if (!buf) return st_errf(err, "out of memory"), NULL;
    if (bad || n == 0 || n > PEM_MAX_BYTES) {
        free(buf);
        return st_errf(err, "%s %s: %s", what, path,
                       bad ? "read error" : n == 0 ? "empty file" : "larger than 1 MiB (not a PEM file)"),
               NULL;
    }
    buf[n] = 0;
    return buf;
}

/* The last OpenSSL error as text ("" when none), and the queue cleared. */
static const char *ssl_reason(char *buf, size_t cap)
{
    unsigned long e = ERR_peek_last_error();
    buf[0] = 0;
    if (e) ERR_error_string_n(e, buf, cap);
    ERR_clear_error();
    return buf;
}

static X509 *parse_cert(const char *what, const char *path, const char *pem, st_err *err)
{
    BIO *b = BIO_new_mem_buf(pem, -1);
    X509 *x = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
    BIO_free(b);
    if (!x) {
        char r[256];
        st_errf(err, "%s %s: not a PEM certificate (%s)", what, path, ssl_reason(r, sizeof r));
    }
    return x;
}

/* "2027-01-31 12:00:00 UTC" */
static void fmt_asn1_time(const ASN1_TIME *t, char *out, size_t cap)
{
    struct tm tm;
    if (ASN1_TIME_to_tm(t, &tm) == 1)
        strftime(out, cap, "%Y-%m-%d %H:%M:%S UTC", &tm);
    else
        snprintf(out, cap, "(unreadable date)");
}

/* Every certificate of the CA file (a bundle of several CAs is allowed,
 * e.g. the old and the new one while rotating) into a new store. */
static X509_STORE *ca_store(const rpc_tls *t, const char *pem, st_err *err)
{
    X509_STORE *store = X509_STORE_new();
    BIO *b = BIO_new_mem_buf(pem, -1);
    int n = 0;
    X509 *x;
    while (store && b && (x = PEM_read_bio_X509(b, NULL, NULL, NULL))) {
        n += X509_STORE_add_cert(store, x) == 1;
        X509_free(x);
    }
    BIO_free(b);
    ERR_clear_error();
    if (!store || n == 0) {
        X509_STORE_free(store);
        st_errf(err, "CA certificate %s: no PEM certificate in it", t->ca);
        return NULL;
    }
    return store;
}

/* The certificate chains to a CA of the store and is valid now; warns when
 * it expires within 30 days. */
static int check_issued(const rpc_tls *t, X509_STORE *store, X509 *cert, STACK_OF(X509) *chain, st_err *err)
{
    char when[64];
    if (X509_cmp_current_time(X509_get0_notAfter(cert)) < 0) {
        fmt_asn1_time(X509_get0_notAfter(cert), when, sizeof when);
        return st_errf(err, "certificate %s expired on %s", t->cert, when);
    }
    if (X509_cmp_current_time(X509_get0_notBefore(cert)) > 0) {
        fmt_asn1_time(X509_get0_notBefore(cert), when, sizeof when);
        return st_errf(err, "certificate %s is not valid before %s", t->cert, when);
    }
    time_t soon = time(NULL) + 30 * 86400;
    if (X509_cmp_time(X509_get0_notAfter(cert), &soon) < 0) {
        fmt_asn1_time(X509_get0_notAfter(cert), when, sizeof when);
        ST_WARN("tls: certificate %s expires on %s: issue a new one (scripts/strata-ca, docs/security.md)", t->cert,
                when);
    }
    X509_STORE_CTX *ctx = X509_STORE_CTX_new();
    int rc = -1;
    if (ctx && X509_STORE_CTX_init(ctx, store, cert, chain) == 1) {
        if (X509_verify_cert(ctx) == 1)
            rc = 0;
        else
            st_errf(err, "certificate %s is not issued by the CA %s (%s)", t->cert, t->ca,
                    X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx)));
    } else {
        st_errf(err, "tls: cannot set up certificate verification");
    }
    X509_STORE_CTX_free(ctx);
    ERR_clear_error();
    return rc;
}

/* The certificates after the first in a chain file (intermediates). */
static STACK_OF(X509) *chain_rest(const char *pem)
{
    STACK_OF(X509) *sk = sk_X509_new_null();
    BIO *b = BIO_new_mem_buf(pem, -1);
    X509 *x = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL; /* the leaf */
    X509_free(x);
    while (sk && b && (x = PEM_read_bio_X509(b, NULL, NULL, NULL)))
        if (!sk_X509_push(sk, x)) X509_free(x);
    BIO_free(b);
    ERR_clear_error();
    return sk;
}

int rpc_tls_load(const rpc_tls *t, rpc_tls_pem *out, st_err *err)
{
    memset(out, 0, sizeof *out);
    X509_STORE *ca = NULL;
    X509 *cert = NULL;
    STACK_OF(X509) *chain = NULL;
    EVP_PKEY *key = NULL;
    if (!(out->ca = read_file("CA certificate", t->ca, err)) || !(out->cert = read_file("certificate", t->cert, err)) ||
        !(out->key = read_file("private key", t->key, err)))
        goto fail;
    if (!(ca = ca_store(t, out->ca, err)) ||
        !(cert = parse_cert("certificate", t->cert, out->cert, err)))
        goto fail;
    BIO *b = BIO_new_mem_buf(out->key, -1);
    key = b ? PEM_read_bio_PrivateKey(b, NULL, NULL, NULL) : NULL;
    BIO_free(b);
    if (!key) {
        char r[256];
        st_errf(err, "private key %s: not an unencrypted PEM private key (%s)", t->key, ssl_reason(r, sizeof r));
        goto fail;
    }
    if (X509_check_private_key(cert, key) != 1) {
        ERR_clear_error();
        st_errf(err, "private key %s does not belong to certificate %s", t->key, t->cert);
        goto fail;
    }
    chain = chain_rest(out->cert);
    if (check_issued(t, ca, cert, chain, err) != 0) goto fail;
    struct stat sb;
    if (stat(t->key, &sb) == 0 && (sb.st_mode & 077))
        ST_WARN("tls: private key %s is readable by group or others (mode %03o): chmod 600 it", t->key,
                (unsigned)(sb.st_mode & 0777));
    X509_STORE_free(ca);
    X509_free(cert);
    sk_X509_pop_free(chain, X509_free);
    EVP_PKEY_free(key);
    return 0;
fail:
    X509_STORE_free(ca);
    X509_free(cert);
    sk_X509_pop_free(chain, X509_free);
    EVP_PKEY_free(key);
    rpc_tls_pem_free(out);
    return -1;
}

void rpc_tls_pem_free(rpc_tls_pem *p)
{
    if (!p) return;
    free(p->ca);
    if (p->key) { /* the key does not linger in freed memory */
        memset(p->key, 0, strlen(p->key));
        free(p->key);
    }
    free(p->cert);
    memset(p, 0, sizeof *p);
}

/* ---------------------------------------------------------------- watch */

typedef struct file_sig {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
    bool ok; /* stat succeeded */
} file_sig;

struct rpc_tls_watch {
    char *ca, *cert, *key;
    pthread_mutex_t mu;
    bool loaded;         /* a good load happened */
    file_sig good[3];    /* at the last good load */
    file_sig bad[3];     /* at the last failed load (warned once) */
    bool have_bad;
};

static void sigs(const rpc_tls_watch *w, file_sig out[3])
{
    const char *p[3] = {w->ca, w->cert, w->key};
    for (int i = 0; i < 3; i++) {
        struct stat sb;
        memset(&out[i], 0, sizeof out[i]);
        if (stat(p[i], &sb) != 0) continue;
        out[i] = (file_sig){sb.st_dev, sb.st_ino, sb.st_size, sb.st_mtim, true};
    }
}

static bool same_sigs(const file_sig a[3], const file_sig b[3])
{
    for (int i = 0; i < 3; i++)
        if (a[i].ok != b[i].ok || a[i].dev != b[i].dev || a[i].ino != b[i].ino || a[i].size != b[i].size ||
            a[i].mtime.tv_sec != b[i].mtime.tv_sec || a[i].mtime.tv_nsec != b[i].mtime.tv_nsec)
            return false;
    return true;
}

rpc_tls_watch *rpc_tls_watch_new(const rpc_tls *t)
{
    rpc_tls_watch *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->ca = strdup(t->ca);
    w->cert = strdup(t->cert);
    w->key = strdup(t->key);
    if (!w->ca || !w->cert || !w->key) {
        rpc_tls_watch_free(w);
        return NULL;
    }
    pthread_mutex_init(&w->mu, NULL);
    return w;
}

void rpc_tls_watch_free(rpc_tls_watch *w)
{
    if (!w) return;
    if (w->ca && w->cert && w->key) pthread_mutex_destroy(&w->mu);
    free(w->ca);
    free(w->cert);
    free(w->key);
    free(w);
}

int rpc_tls_watch_poll(rpc_tls_watch *w, rpc_tls_pem *out)
{
    file_sig now[3];
    pthread_mutex_lock(&w->mu);
    sigs(w, now);
    int rc = 0;
    if (w->loaded && same_sigs(now, w->good)) goto out;
    if (w->have_bad && same_sigs(now, w->bad)) goto out; /* already warned about these files */
    rpc_tls t = {w->ca, w->cert, w->key};
    st_err err = {{0}};
    if (rpc_tls_load(&t, out, &err) != 0) {
        ST_WARN("tls: %s; %s", err.msg,
                w->loaded ? "keeping the certificate loaded before" : "no certificate loaded yet");
        memcpy(w->bad, now, sizeof w->bad);
        w->have_bad = true;
        goto out;
    }
    if (w->loaded) ST_INFO("tls: reloaded %s, %s and %s (new connections use them)", w->ca, w->cert, w->key);
    memcpy(w->good, now, sizeof w->good);
    w->loaded = true;
    w->have_bad = false;
    rc = 1;
out:
    pthread_mutex_unlock(&w->mu);
    return rc;
}
