/* xport_mem.h — registered memory of the transport (ucp_mem_map): the
 * caller's regions, host or device (ib/transport.h's xport_mem_*), and the
 * pool of registered buffers that rendezvous payloads land in when the rx
 * sink gives none. Takes only the ucp context. */
#ifndef STRATA_IB_XPORT_MEM_H
#define STRATA_IB_XPORT_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <ucp/api/ucp.h>

#include "ib/transport.h"

struct xport_mem {
    ucp_mem_h memh;
    void *ptr;
    size_t len;
    bool owned;  /* xport_mem_alloc: the buffer is freed with the registration */
    bool device; /* xport_mem_register_device */
    ucs_memory_type_t mtype;
};

/* The caller's [ptr, ptr+len) as host memory. NULL + err. */
xport_mem *xm_register(ucp_context_h ctx, void *ptr, size_t len, st_err *err);
/* A page-aligned buffer of len bytes, owned by the registration. */
xport_mem *xm_alloc(ucp_context_h ctx, size_t len, st_err *err);
/* [ptr, ptr+len) as CUDA memory (cuda false: as host memory flagged device,
 * the test hook of ib/transport.h). */
xport_mem *xm_register_device(ucp_context_h ctx, void *ptr, size_t len, bool cuda, st_err *err);
void xm_unregister(ucp_context_h ctx, xport_mem *m);

#define XPORT_POOL_MAX 8 /* registered receive buffers kept */

struct xm_rbuf { /* registered receive buffer of the pool */
    void *ptr;
    size_t cap;
    ucp_mem_h memh;
    bool in_use; /* lent to a receive; the receiver clears it when done */
};
typedef struct xm_pool {
    struct xm_rbuf buf[XPORT_POOL_MAX];
} xm_pool;

/* A free pool buffer of at least len bytes (growing or replacing one),
 * marked in use, or NULL when every slot is busy. */
struct xm_rbuf *xm_pool_get(ucp_context_h ctx, xm_pool *pool, size_t len);
/* Unmaps and frees every buffer. */
void xm_pool_free(ucp_context_h ctx, xm_pool *pool);

#endif
