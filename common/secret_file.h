/* secret_file.h — reading a small secret (a key, a token list) from a file
 * that only its owner may read (docs/security.md).
 *
 * The file must be a regular file (a symlink to one is followed: secret
 * stores often publish files that way) of at most `cap - 1` bytes whose mode
 * gives the group and others no access at all (chmod 600), as OpenSSH asks
 * of private keys: a key that others on the host can read is refused, with a
 * message naming the file, its mode and the fix. Nothing of the content is
 * ever put in a message.
 */
#ifndef STRATA_COMMON_SECRET_FILE_H
#define STRATA_COMMON_SECRET_FILE_H

#include <stddef.h>

#include "common/err.h"

/* Reads the file at path into buf (cap bytes, NUL-terminated; *len = bytes
 * read). `what` names it in messages ("--cluster-key-file"). 0, or -1 + err. */
int st_secret_file_read(const char *path, const char *what, char *buf, size_t cap, size_t *len,
                        st_err *err);

#endif
