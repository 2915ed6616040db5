/* grpc_tls.h — the files of one side of a mutual-TLS gRPC connection
 * (docs/security.md, "Control plane (gRPC)"): the cluster CA that verifies
 * the peer, and this side's certificate and private key, all PEM.
 *
 * rpc_tls_load reads the three files and checks them with libcrypto before
 * gRPC sees them, so that a wrong file is a clear start-up error instead of
 * a handshake that fails later without a reason:
 *   - each file exists and holds a PEM certificate / private key;
 *   - the key belongs to the certificate;
 *   - the certificate is signed by the CA and is within its validity period
 *     (a certificate that expires within 30 days is logged as a warning);
 *   - a key file that group or others can read is logged as a warning.
 * Errors: -1 with a one-line message naming the file in the caller's st_err.
 */
#ifndef STRATA_RPC_GRPC_TLS_H
#define STRATA_RPC_GRPC_TLS_H

#include <stdbool.h>

#include "common/err.h"

/* Paths (NULL or "" = not given). */
typedef struct rpc_tls {
    const char *ca;   /* the cluster CA certificate: verifies the peer */
    const char *cert; /* this side's certificate (a chain is allowed) */
    const char *key;  /* its private key (unencrypted PEM) */
} rpc_tls;

/* The files' contents, NUL-terminated (what gRPC's credentials take). */
typedef struct rpc_tls_pem {
    char *ca, *cert, *key;
} rpc_tls_pem;

/* 1 when all three paths are given, 0 when none is; -1 with a message naming
 * the missing flags when only some are (`flag_prefix` "--grpc-" or "--"
 * makes the message name "--grpc-ca" / "--ca"). */
int rpc_tls_given(const rpc_tls *t, const char *flag_prefix, st_err *err);

/* Reads and checks the three files (see above) into *out (free with
 * rpc_tls_pem_free). */
int rpc_tls_load(const rpc_tls *t, rpc_tls_pem *out, st_err *err);
void rpc_tls_pem_free(rpc_tls_pem *p);

/* Rotation without a restart (the gRPC server's certificate fetcher): a
 * watch remembers each file's inode, size and modification time at its last
 * good load. Thread-safe. */
typedef struct rpc_tls_watch rpc_tls_watch;

/* Copies the paths; nothing is read yet. NULL when out of memory. */
rpc_tls_watch *rpc_tls_watch_new(const rpc_tls *t);
void rpc_tls_watch_free(rpc_tls_watch *w);

/* 1 with the files' contents in *out (rpc_tls_pem_free them) on the first
 * call and whenever a file changed since the last good load and the new set
 * passes rpc_tls_load (logged: "reloaded"); 0 when nothing changed, or when
 * the changed files are wrong (a warning once per change; the previous ones
 * stay in use). */
int rpc_tls_watch_poll(rpc_tls_watch *w, rpc_tls_pem *out);

#endif
