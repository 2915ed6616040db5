/* registry.h — the compute backends by name, chosen at run time (as ggml's
 * GGML_BACKEND_DL): "cpu" is built in; "cuda" lives in a module,
 * libstrata-cuda.so, loaded with dlopen the first time it is asked for, so
 * one strata-worker binary runs on CPU-only nodes and never links the CUDA
 * libraries itself.
 *
 * Module search (first hit wins): $STRATA_BACKEND_PATH (a directory or the
 * file itself); the executable's directory, its ../lib and ../lib/strata;
 * the build tree's lib/ (STRATA_MODULE_DIR, compiled in); then the dynamic
 * loader's own path. The module exports strata_backend_module_init (see
 * backend_module), which is asked for BACKEND_MODULE_ABI; a module of another
 * ABI is refused with a message, never called.
 *
 * Thread safety: backend_registry_get may be called from any thread (the
 * first load is serialised); the returned table lives for the process.
 */
#ifndef STRATA_COMPUTE_REGISTRY_H
#define STRATA_COMPUTE_REGISTRY_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "compute/backend.h"
#include "compute/comm.h"

#define BACKEND_MODULE_ABI 3
#define BACKEND_MODULE_SYMBOL "strata_backend_module_init"

/* One device as registration reports it. */
typedef struct backend_device_info {
    char name[256];       /* "NVIDIA H100 80GB HBM3", "cpu" (CUDA's 256) */
    uint64_t memory_bytes; /* total device memory */
    char pci_bus_id[32];  /* "0000:17:00.0", "" when none */
} backend_device_info;

/* A TP group of this backend (shared memory for "cpu", NCCL for "cuda"). */
typedef struct backend_group backend_group;

/* The entry points of one backend; for a module, what its init returns. */
typedef struct backend_module {
    int abi;                     /* BACKEND_MODULE_ABI */
    const char *name;            /* "cpu", "cuda" */
    bool device_memory;          /* buffers are device memory (not host-addressable) */
    int (*device_count)(void);   /* usable devices; 0 when none (no driver, no GPU) */
    int (*device_info)(int device, backend_device_info *out, st_err *err);
    /* A backend for TP rank on `device` (n_threads: the CPU backend's pool). */
    backend *(*backend_new)(int device, int n_threads, st_err *err);
    /* A TP group of n ranks (rank r on devices[r]; devices NULL: device r),
     * its rank handles, its end. */
    backend_group *(*group_new)(int n, const int *devices, st_err *err);
    comm *(*group_rank)(backend_group *g, int rank);
    void (*group_free)(backend_group *g);
    /* Pinned (page-locked) host memory for the activation hand-off between
     * the device and the transport (cudaHostAlloc, portable): a copy from or
     * to it is a direct DMA, where pageable memory costs the driver a bounce
     * copy. NULL + err on failure. NULL entries (cpu): plain host memory. */
    void *(*host_alloc)(size_t bytes, st_err *err);
    void (*host_free)(void *p);
    /* Device memory on `device` that the transport receives into and sends
     * from (ib/act_transport.h "ucx-cuda": cudaMalloc, callable from any
     * thread). NULL + err on failure. NULL entries (cpu): none. */
    void *(*dev_alloc)(int device, size_t bytes, st_err *err);
    void (*dev_free)(int device, void *p);
    /* NCCL point-to-point (below); NULL for "cpu". */
    const struct backend_p2p_ops *p2p;
} backend_module;

/* NCCL point-to-point between two processes: the activation transport of one
 * pipeline boundary (ib/act_transport.h "nccl"; a 2-rank communicator, rank 0
 * = the sending stage). Device buffers only. Every call that waits polls
 * ncclCommGetAsyncError against its deadline and, on an error or past it,
 * aborts the communicator (ncclCommAbort) and returns -1 with err: it never
 * hangs the caller. After a failure only close may be called. */
typedef struct backend_p2p backend_p2p;
struct backend_p2p_ops {
    int id_bytes; /* NCCL_UNIQUE_ID_BYTES (128) */
    /* A fresh ncclUniqueId (the sender makes it; it reaches the peer over the
     * data plane's control frames). */
    int (*unique_id)(uint8_t *out, st_err *err);
    /* Joins the communicator of id as rank (0 or 1) on CUDA device `device`
     * (non-blocking init, waited for up to timeout_s). */
    backend_p2p *(*open)(const uint8_t *id, int rank, int device, double timeout_s, st_err *err);
    /* bytes from / into device memory on the communicator's device, to / from
     * the other rank; returns once the transfer completed (timeout_s). */
    int (*send)(backend_p2p *p, const void *dev, size_t bytes, double timeout_s, st_err *err);
    int (*recv)(backend_p2p *p, void *dev, size_t bytes, double timeout_s, st_err *err);
    void (*close)(backend_p2p *p);
};
typedef struct backend_p2p_ops backend_p2p_ops;

/* The module's exported init: returns its table when it speaks `abi`, else NULL. */
typedef const backend_module *(*backend_module_init_fn)(int abi);

/* The backend called `name` ("cpu", "cuda"): loads its module on first use.
 * NULL + err when the name is unknown ("backend 'x' is not available ('cpu'
 * or 'cuda')") or the module cannot be loaded ("backend cuda: no CUDA device
 * (module libstrata-cuda.so: <why>)"). */
const backend_module *backend_registry_get(const char *name, st_err *err);

/* The device kind this node reports and its devices: "cuda" with its GPUs
 * when the module loads and sees one, else "cpu" (n = 0). Fills up to max. */
const char *backend_registry_detect(backend_device_info *out, int max, int *n);

#endif
