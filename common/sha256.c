/* sha256.c — SHA-256 of a file or of buffers through libcrypto's EVP (sha256.h). */
#include "common/sha256.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK (1u << 20)

int st_file_sha256(const char *path, char hex[65], st_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return st_errf(err, "%s: %s", path, strerror(errno));
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned char md[32];
    unsigned int mdlen = 0;
    int rc = -1;
    unsigned char *buf = malloc(BLOCK);
    if (ctx && buf && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1) {
        size_t n;
        rc = 0;
        while ((n = fread(buf, 1, BLOCK, f)) > 0)
            if (EVP_DigestUpdate(ctx, buf, n) != 1) rc = -1;
        if (ferror(f)) rc = -1;
        if (rc == 0 && EVP_DigestFinal_ex(ctx, md, &mdlen) != 1) rc = -1;
    }
    free(buf);
    EVP_MD_CTX_free(ctx);
    fclose(f);
    if (rc != 0 || mdlen != 32) return st_errf(err, "%s: cannot hash the file", path);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
    return 0;
}

int st_sha256_parts(const void *const *parts, const size_t *lens, int n, unsigned char out[32])
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned int mdlen = 0;
    int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1;
    for (int i = 0; ok && i < n; i++)
        if (lens[i] > 0) ok = EVP_DigestUpdate(ctx, parts[i], lens[i]) == 1;
    if (ok) ok = EVP_DigestFinal_ex(ctx, out, &mdlen) == 1 && mdlen == 32;
    EVP_MD_CTX_free(ctx);
    return ok ? 0 : -1;
}
