/* stage_buffers.c — one stage's data-path buffers: registered host buffers
 * (pinned on a GPU stage) kept in a pool, and the ucx-cuda device buffers
 * (stage_buffers.h). */
#include "daemon/stage_buffers.h"

#include <string.h>

#include "compute/registry.h"

#define POOL_MIN_BYTES (64u << 10)

/* The module whose pinned host memory the stage's hand-off buffers come
 * from (a GPU stage: never pageable memory, which costs the driver a bounce
 * copy per transfer), or NULL (a CPU stage: pageable, registered). */
static const backend_module *host_pin(const wstage *w)
{
    if (strcmp(w->cur.backend, "cuda")) return NULL;
    st_err err;
    const backend_module *m = backend_registry_get("cuda", &err);
    return m && m->host_alloc && m->host_free ? m : NULL;
}

static void buf_free(wstage *w, stbuf b)
{
    if (!b.m) return;
    void *p = xport_mem_ptr(b.m);
    xport_mem_unregister(w->x, b.m);
    if (b.pin) b.pin->host_free(p);
}

/* A buffer of the stage's kind, registered with UCX (ucp_mem_map), of at
 * least cap bytes. {NULL} + err on failure. */
static stbuf buf_new(wstage *w, size_t cap, st_err *err)
{
    stbuf b = {.pin = host_pin(w)};
    if (!b.pin) {
        b.m = xport_mem_alloc(w->x, cap, err);
        return b;
    }
    void *p = b.pin->host_alloc(cap, err);
    if (!p) return (stbuf){0};
    if (!(b.m = xport_mem_register(w->x, p, cap, err))) {
        b.pin->host_free(p);
        return (stbuf){0};
    }
    return b;
}

stbuf stage_buf_get(wstage *w, size_t bytes, st_err *err)
{
    const backend_module *pin = host_pin(w);
    int best = -1;
    for (int i = 0; i < w->n_pool; i++)
        if (w->pool[i].pin == pin && xport_mem_len(w->pool[i].m) >= bytes &&
            (best < 0 || xport_mem_len(w->pool[i].m) < xport_mem_len(w->pool[best].m)))
            best = i;
    if (best >= 0) {
        stbuf b = w->pool[best];
        w->pool[best] = w->pool[--w->n_pool];
        return b;
    }
    size_t cap = POOL_MIN_BYTES;
    while (cap < bytes) cap *= 2;
    return buf_new(w, cap, err);
}

void stage_buf_put(wstage *w, stbuf b)
{
    if (!b.m) return;
    if (w->shutting_down) {
        buf_free(w, b);
        return;
    }
    if (w->n_pool == POOL_MAX) { /* keep the larger buffers */
        int small = 0;
        for (int i = 1; i < w->n_pool; i++)
            if (xport_mem_len(w->pool[i].m) < xport_mem_len(w->pool[small].m)) small = i;
        if (xport_mem_len(w->pool[small].m) >= xport_mem_len(b.m)) {
            buf_free(w, b);
            return;
        }
        buf_free(w, w->pool[small]);
        w->pool[small] = b;
        return;
    }
    w->pool[w->n_pool++] = b;
}

/* ---------------------------------------------------------------- device buffers (ucx-cuda) */

/* The module whose device memory the ucx-cuda boundary uses (NULL: none). */
static const backend_module *dev_module(const wstage *w)
{
    if (strcmp(w->cur.backend, "cuda")) return NULL;
    st_err err;
    const backend_module *m = backend_registry_get("cuda", &err);
    return m && m->dev_alloc && m->dev_free ? m : NULL;
}

static int dev_device(const wstage *w) { return w->cur.n_devices ? w->cur.devices[0] : 0; }

static void dbuf_release(wstage *w, struct dbuf *d)
{
    const backend_module *m = dev_module(w);
    xport_mem_unregister(w->x, d->m);
    if (m) m->dev_free(dev_device(w), d->p);
    *d = (struct dbuf){0};
}

/* A free device buffer of at least bytes, made (64 KiB, doubled to fit) and
 * registered once when none fits; NULL + err when the module has none or
 * DBUF_MAX are busy. */
struct dbuf *stage_dbuf_get(wstage *w, size_t bytes, int state, st_err *err)
{
    const backend_module *m = dev_module(w);
    if (!m) return st_errf(err, "worker: the stage's backend has no device buffers"), NULL;
    struct dbuf *best = NULL, *empty = NULL;
    for (int i = 0; i < DBUF_MAX; i++) {
        struct dbuf *d = &w->dbufs[i];
        if (!d->p && !empty) empty = d;
        if (d->p && d->state == DBUF_FREE && d->cap >= bytes && (!best || d->cap < best->cap)) best = d;
    }
    if (!best) {
        if (!empty) { /* room: drop the smallest free one */
            for (int i = 0; i < DBUF_MAX; i++)
                if (w->dbufs[i].state == DBUF_FREE && (!empty || w->dbufs[i].cap < empty->cap)) empty = &w->dbufs[i];
            if (!empty) return st_errf(err, "worker: %d device buffers busy", DBUF_MAX), NULL;
            dbuf_release(w, empty);
            w->n_dbufs--;
        }
        size_t cap = POOL_MIN_BYTES;
        while (cap < bytes) cap *= 2;
        void *p = m->dev_alloc(dev_device(w), cap, err);
        if (!p) return NULL;
        xport_mem *xm = xport_mem_register_device(w->x, p, cap, !w->dev_host_mem, err);
        if (!xm) {
            m->dev_free(dev_device(w), p);
            return NULL;
        }
        *empty = (struct dbuf){.p = p, .m = xm, .cap = cap};
        w->n_dbufs++;
        best = empty;
    }
    best->state = state;
    return best;
}

void stage_dbuf_put(wstage *w, struct dbuf *d)
{
    if (!d || !d->p) return;
    d->state = DBUF_FREE;
    if (w->shutting_down) {
        dbuf_release(w, d);
        w->n_dbufs--;
    }
}

/* The stage's device buffer that starts at p (NULL: none). */
struct dbuf *stage_dbuf_at(wstage *w, const void *p)
{
    for (int i = 0; p && i < DBUF_MAX; i++)
        if (w->dbufs[i].p == p) return &w->dbufs[i];
    return NULL;
}

bool stage_buf_pinned(const wstage *w) { return host_pin(w) != NULL; }

void stage_buffers_drain(wstage *w)
{
    for (int i = 0; i < w->n_pool; i++) buf_free(w, w->pool[i]);
    w->n_pool = 0;
    for (int i = 0; i < DBUF_MAX; i++) /* busy ones go when their forward or receive ends (dbuf_put) */
        if (w->dbufs[i].p && w->dbufs[i].state == DBUF_FREE) {
            dbuf_release(w, &w->dbufs[i]);
            w->n_dbufs--;
        }
}
