/* dev_bufs.h — the device buffers of the activation hand-off
 * (stage_dev_alloc): freed ones are kept (up to DEV_BUFS_KEEP) and handed out
 * again, so that a forward does not allocate device memory once the sizes
 * have been seen; at most DEV_BUFS_MAX in all. */
#ifndef STRATA_ENGINE_DEV_BUFS_H
#define STRATA_ENGINE_DEV_BUFS_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"
#include "compute/backend.h"

#define DEV_BUFS_MAX 64 /* buffers in use or kept for reuse */
#define DEV_BUFS_KEEP 8 /* freed ones kept: no cudaMalloc/cudaFree per forward */

typedef struct dev_bufs {
    struct dev_buf {
        void *p;
        size_t cap;
        bool used;
    } bufs[DEV_BUFS_MAX];
    int n;
} dev_bufs;

/* A buffer of at least `bytes` from be: the smallest kept one that fits, else
 * a new one (a power of two, 64 KiB at least). NULL + err when DEV_BUFS_MAX
 * are live or be is out of memory. */
void *dev_bufs_get(dev_bufs *d, backend *be, size_t bytes, st_err *err);
/* Hands p back (ignored when it is not from d). */
void dev_bufs_put(dev_bufs *d, backend *be, void *p);
/* Releases every buffer, in use or kept. */
void dev_bufs_release(dev_bufs *d, backend *be);

#endif
