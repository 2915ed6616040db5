/* sha256.h — the SHA-256 digest (FIPS 180-4) of a file or of buffers, through libcrypto's
 * EVP interface; in the library st_sha256 (common/CMakeLists.txt), so that
 * only its users link libcrypto. Model files are compared across nodes by it
 * (Register's ModelFile.sha256, the coordinator's model checksum).
 */
#ifndef STRATA_COMMON_SHA256_H
#define STRATA_COMMON_SHA256_H

#include <stddef.h>

#include "common/err.h"

/* The digest of n buffers back to back (parts[i] of lens[i] bytes; a NULL
 * part must have length 0) into out. 0, or -1 on a libcrypto failure. Used
 * for content addresses (the KV prefix cache's chain hashes). */
int st_sha256_parts(const void *const *parts, const size_t *lens, int n, unsigned char out[32]);

/* Reads the file at path in 1 MiB blocks and writes its digest as 64
 * lowercase hex digits and a NUL into hex. 0, or -1 with err: "PATH: REASON"
 * (strerror) when it cannot be opened, "PATH: cannot hash the file" on a read
 * or libcrypto failure. */
int st_file_sha256(const char *path, char hex[65], st_err *err);

#endif
