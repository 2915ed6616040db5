/* xport_mem.c — see xport_mem.h. */
#include "ib/xport_mem.h"

#include <stdlib.h>
#include <string.h>

#define XPORT_POOL_MIN_BYTES (64u << 10)

static xport_mem *map_type(ucp_context_h ctx, void *ptr, size_t len, bool owned, bool device,
                           ucs_memory_type_t mtype, st_err *err)
{
    xport_mem *m = calloc(1, sizeof *m);
    if (!m) {
        st_errf(err, "xport: out of memory");
        return NULL;
    }
    ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                               .address = ptr,
                               .length = len};
    if (device) {
        mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
        mp.memory_type = mtype;
    }
    ucs_status_t st = ucp_mem_map(ctx, &mp, &m->memh);
    if (st != UCS_OK) {
        free(m);
        st_errf(err, "xport: ucp_mem_map %zu bytes: %s", len, ucs_status_string(st));
        return NULL;
    }
    m->ptr = ptr;
    m->len = len;
    m->owned = owned;
    m->device = device;
    m->mtype = device ? mtype : UCS_MEMORY_TYPE_HOST;
    return m;
}

static xport_mem *map_host(ucp_context_h ctx, void *ptr, size_t len, bool owned, st_err *err)
{
    return map_type(ctx, ptr, len, owned, false, UCS_MEMORY_TYPE_HOST, err);
}

xport_mem *xm_register_device(ucp_context_h ctx, void *ptr, size_t len, bool cuda, st_err *err)
{
    if (!ptr || !len) {
        st_errf(err, "xport: cannot register an empty region");
        return NULL;
    }
    return map_type(ctx, ptr, len, false, true, cuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST, err);
}

xport_mem *xm_register(ucp_context_h ctx, void *ptr, size_t len, st_err *err)
{
    if (!ptr || !len) {
        st_errf(err, "xport: cannot register an empty region");
        return NULL;
    }
    return map_host(ctx, ptr, len, false, err);
}

xport_mem *xm_alloc(ucp_context_h ctx, size_t len, st_err *err)
{
    void *ptr = NULL;
    if (!len || posix_memalign(&ptr, 4096, len)) {
        st_errf(err, "xport: cannot allocate %zu bytes", len);
        return NULL;
    }
    xport_mem *m = map_host(ctx, ptr, len, true, err);
    if (!m) free(ptr);
    return m;
}

void xm_unregister(ucp_context_h ctx, xport_mem *m)
{
    if (!m) return;
    ucp_mem_unmap(ctx, m->memh);
    if (m->owned) free(m->ptr);
    free(m);
}

/* ---- receive buffer pool ---- */

static int rbuf_map(ucp_context_h ctx, struct xm_rbuf *b, size_t cap)
{
    void *ptr = NULL;
    if (posix_memalign(&ptr, 4096, cap)) return -1;
    ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                               .address = ptr,
                               .length = cap};
    if (ucp_mem_map(ctx, &mp, &b->memh) != UCS_OK) {
        free(ptr);
        return -1;
    }
    b->ptr = ptr;
    b->cap = cap;
    b->in_use = false;
    return 0;
}

static void rbuf_unmap(ucp_context_h ctx, struct xm_rbuf *b)
{
    if (!b->ptr) return;
    ucp_mem_unmap(ctx, b->memh);
    free(b->ptr);
    memset(b, 0, sizeof *b);
}

struct xm_rbuf *xm_pool_get(ucp_context_h ctx, xm_pool *pool, size_t len)
{
    struct xm_rbuf *best = NULL, *empty = NULL, *small = NULL;
    for (int i = 0; i < XPORT_POOL_MAX; i++) {
        struct xm_rbuf *b = &pool->buf[i];
        if (!b->ptr) {
            if (!empty) empty = b;
        } else if (!b->in_use) {
            if (b->cap >= len) {
                if (!best || b->cap < best->cap) best = b;
            } else if (!small) {
                small = b;
            }
        }
    }
    if (!best) {
        struct xm_rbuf *slot = empty ? empty : small;
        if (!slot) return NULL;
        rbuf_unmap(ctx, slot);
        size_t cap = XPORT_POOL_MIN_BYTES;
        while (cap < len) cap *= 2;
        if (rbuf_map(ctx, slot, cap)) return NULL;
        best = slot;
    }
    best->in_use = true;
    return best;
}

void xm_pool_free(ucp_context_h ctx, xm_pool *pool)
{
    for (int i = 0; i < XPORT_POOL_MAX; i++) rbuf_unmap(ctx, &pool->buf[i]);
}
