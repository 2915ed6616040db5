/* model_path.h — confining the model files a StageAssign may name to the
 * worker's model directory (docs/security.md, "Model files").
 *
 * A name is a relative path under the directory: not absolute, no empty, "."
 * or ".." component, at most MODEL_NAME_MAX bytes. It is opened one component
 * at a time with openat(..., O_NOFOLLOW) from the directory's descriptor
 * (directories with O_DIRECTORY), the file itself with O_NONBLOCK so that a
 * FIFO or a device never blocks the open, then fstat must say a regular file.
 * A symbolic link anywhere under the directory is refused (ELOOP / ENOTDIR).
 * Messages name the path and the rule it broke; nothing is read from a file
 * before it passed, so no byte of a refused file reaches a message.
 */
#ifndef STRATA_DAEMON_MODEL_PATH_H
#define STRATA_DAEMON_MODEL_PATH_H

#include "common/err.h"

#define MODEL_NAME_MAX 1024

/* Checks the syntax of name (the rules above). 0 or -1 + err. */
int model_name_check(const char *name, st_err *err);

/* Opens name under the directory dirfd (rules above). Returns the file's
 * descriptor (O_RDONLY, close-on-exec; the caller closes it) or -1 + err. */
int model_path_open(int dirfd, const char *name, st_err *err);

/* The model files a worker may load: its --model paths and its
 * --model-dir, opened (dirfd; -1: none, every path under it refused). */
typedef struct model_files {
    char **models;
    int n_models;
    int dirfd;
} model_files;

/* Opens StageAssign.model_path: a bare file name that one of the --model
 * files has is that file (in its own directory); anything else is looked up
 * under --model-dir (model_path_open). The descriptor, or -1 + err. */
int model_files_open(const model_files *mf, const char *name, st_err *err);

#endif
