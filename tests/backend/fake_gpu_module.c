/* fake_gpu_module.c — a "cuda" backend module that computes on the CPU, so
 * the worker's GPU-stage data path runs on a machine without a GPU
 * (tests/cluster/act_transport_test.py "pinned"): one device ("fake GPU"),
 * device_memory true, ranks on the CPU backend and TP groups on the CPU
 * shared-memory group, and a pinned-host allocator that is page-aligned
 * memory, counted and logged to stderr one line a call:
 *   fake-gpu: host_alloc BYTES live N
 *   fake-gpu: host_free live N
 * so a test sees which buffers the worker took from it and that it gave
 * every one back. No NCCL point-to-point (p2p NULL). Loaded through
 * STRATA_BACKEND_PATH. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compute/registry.h"

static atomic_int live;

static int fake_count(void) { return 1; }

static int fake_info(int device, backend_device_info *out, st_err *err)
{
    if (device != 0) return st_errf(err, "fake gpu: no device %d", device);
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "Fake GPU (CPU backend)");
    out->memory_bytes = 1ull << 30;
    snprintf(out->pci_bus_id, sizeof out->pci_bus_id, "0000:00:00.0");
    return 0;
}

static backend *fake_backend_new(int device, int n_threads, st_err *err)
{
    (void)device;
    return backend_cpu_new(n_threads, err);
}

static backend_group *fake_group_new(int n, const int *devices, st_err *err)
{
    (void)devices;
    return (backend_group *)comm_cpu_group_new(n, err);
}
static comm *fake_group_rank(backend_group *g, int r) { return comm_cpu_rank((comm_cpu_group *)g, r); }
static void fake_group_free(backend_group *g) { comm_cpu_group_free((comm_cpu_group *)g); }

static void *fake_host_alloc(size_t bytes, st_err *err)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytes ? bytes : 1)) {
        st_errf(err, "fake gpu: pinned host buffer of %zu bytes: out of memory", bytes);
        return NULL;
    }
    fprintf(stderr, "fake-gpu: host_alloc %zu live %d\n", bytes, atomic_fetch_add(&live, 1) + 1);
    return p;
}

static void fake_host_free(void *p)
{
    if (!p) return;
    free(p);
    fprintf(stderr, "fake-gpu: host_free live %d\n", atomic_fetch_sub(&live, 1) - 1);
}

static const backend_module k_fake = {
    .abi = BACKEND_MODULE_ABI,
    .name = "cuda",
    .device_memory = true,
    .device_count = fake_count,
    .device_info = fake_info,
    .backend_new = fake_backend_new,
    .group_new = fake_group_new,
    .group_rank = fake_group_rank,
    .group_free = fake_group_free,
    .host_alloc = fake_host_alloc,
    .host_free = fake_host_free,
};

__attribute__((visibility("default"))) const backend_module *strata_backend_module_init(int abi)
{
    return abi == BACKEND_MODULE_ABI ? &k_fake : NULL;
}
