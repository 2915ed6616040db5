/* http_tls.c — the OpenSSL server context and bufferevents. See http_tls.h. */
#include "coordinator/api/http_tls.h"

#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdlib.h>

struct http_tls {
    SSL_CTX *ctx;
};

/* The newest OpenSSL error as text (empties the error queue). */
static const char *ssl_reason(char *buf, size_t n) {
    unsigned long e = ERR_peek_last_error();
    if (!e) return "unknown OpenSSL error";
    ERR_error_string_n(e, buf, n);
    ERR_clear_error();
    return buf;
}

http_tls *http_tls_new(const char *cert_file, const char *key_file, st_err *err) {
    char why[256];
    if (!cert_file || !*cert_file || !key_file || !*key_file)
        return (void)st_errf(err, "http tls: both a certificate (--tls-cert) and a key (--tls-key) are needed"),
               NULL;
    http_tls *t = calloc(1, sizeof *t);
    if (!t) return (void)st_errf(err, "http tls: out of memory"), NULL;
    t->ctx = SSL_CTX_new(TLS_server_method());
    if (!t->ctx) {
        st_errf(err, "http tls: %s", ssl_reason(why, sizeof why));
        goto fail;
    }
    SSL_CTX_set_min_proto_version(t->ctx, TLS1_2_VERSION);
    /* Client-initiated renegotiation costs the server a handshake per request. */
    SSL_CTX_set_options(t->ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    if (SSL_CTX_use_certificate_chain_file(t->ctx, cert_file) != 1) {
        st_errf(err, "http tls: %s: %s", cert_file, ssl_reason(why, sizeof why));
        goto fail;
    }
    if (SSL_CTX_use_PrivateKey_file(t->ctx, key_file, SSL_FILETYPE_PEM) != 1) {
        st_errf(err, "http tls: %s: %s", key_file, ssl_reason(why, sizeof why));
        goto fail;
    }
    if (SSL_CTX_check_private_key(t->ctx) != 1) {
        st_errf(err, "http tls: %s does not match the certificate %s", key_file, cert_file);
        ERR_clear_error();
        goto fail;
    }
    return t;
fail:
    http_tls_free(t);
    return NULL;
}

void http_tls_free(http_tls *t) {
    if (!t) return;
    SSL_CTX_free(t->ctx);
    free(t);
}

struct bufferevent *http_tls_bufferevent(http_tls *t, struct event_base *base) {
    SSL *ssl = SSL_new(t->ctx);
    if (!ssl) {
        ERR_clear_error();
        return NULL;
    }
    struct bufferevent *bev =
        bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_ACCEPTING, BEV_OPT_CLOSE_ON_FREE);
    if (!bev) {
        SSL_free(ssl);
        return NULL;
    }
    /* Clients that close without a close_notify (most HTTP clients) end the
     * connection like an EOF instead of an error. */
    bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    return bev;
}
