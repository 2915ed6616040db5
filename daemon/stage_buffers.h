/* stage_buffers.h — one stage's data-path buffers (the pool and dbufs of
 * daemon/wstage.h):
 *   host buffers, registered with UCX (ucp_mem_map): pageable on a CPU
 *     stage; pinned by the CUDA module on a GPU stage, so the device copies
 *     are direct DMA. Kept in a pool of POOL_MAX free ones, the larger kept;
 *   device buffers of a ucx-cuda boundary (the module's dev_alloc,
 *     registered as device memory): made once per size (64 KiB, doubled to
 *     fit), at most DBUF_MAX, FREE, lent to a receive (RECV) or a forward's
 *     (JOB).
 * A stage that is shutting down frees what comes back instead of keeping it.
 * Loop thread.
 */
#ifndef STRATA_DAEMON_STAGE_BUFFERS_H
#define STRATA_DAEMON_STAGE_BUFFERS_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"
#include "daemon/wstage.h"

/* Whether st's host buffers are pinned (a GPU stage whose module pins). */
bool stage_buf_pinned(const wstage *st);
/* A host buffer of st's kind of at least bytes: the smallest that fits from
 * the pool, else a new one. {NULL} + err on failure. */
stbuf stage_buf_get(wstage *st, size_t bytes, st_err *err);
/* Gives b back to the pool (NULL b.m: nothing). */
void stage_buf_put(wstage *st, stbuf b);

/* A free device buffer of at least bytes, now in state (DBUF_RECV or
 * DBUF_JOB); NULL + err when the module has none or DBUF_MAX are busy. */
struct dbuf *stage_dbuf_get(wstage *st, size_t bytes, int state, st_err *err);
/* Gives d back (NULL: nothing). */
void stage_dbuf_put(wstage *st, struct dbuf *d);
/* st's device buffer that starts at p (NULL: none). */
struct dbuf *stage_dbuf_at(wstage *st, const void *p);

/* Unregisters st's free buffers (busy ones go when their forward or receive ends). */
void stage_buffers_drain(wstage *st);

#endif
