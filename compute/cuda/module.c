/* module.c — libstrata-cuda.so's entry point: the "cuda" backend's table for
 * compute/registry.h (ABI BACKEND_MODULE_ABI). The worker, strata-run and the
 * engine reach CUDA, cuBLAS and NCCL only through it. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>

#include "compute/cuda/backend_cuda.h"
#include "compute/cuda/comm_nccl.h"
#include "compute/cuda/p2p_nccl.h"
#include "compute/registry.h"

static int cuda_device_info(int device, backend_device_info *out, st_err *err) {
    struct cudaDeviceProp p;
    memset(out, 0, sizeof *out);
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return st_errf(err, "cuda: device %d: %s", device, cudaGetErrorString(e));
    }
    snprintf(out->name, sizeof out->name, "%s", p.name);
    out->memory_bytes = (uint64_t)p.totalGlobalMem;
    if (cudaDeviceGetPCIBusId(out->pci_bus_id, (int)sizeof out->pci_bus_id, device) != cudaSuccess) {
        cudaGetLastError();
        out->pci_bus_id[0] = 0;
    }
    /* CUDA writes "0000:17:00.0" in upper case hex; sysfs and nvidia-smi -q use lower. */
    for (char *c = out->pci_bus_id; *c; c++)
        if (*c >= 'A' && *c <= 'F') *c = (char)(*c - 'A' + 'a');
    return 0;
}

static backend *cuda_backend_new(int device, int n_threads, st_err *err) {
    (void)n_threads;
    return backend_cuda_new(device, err);
}

static backend_group *cuda_group_new(int n, const int *devices, st_err *err) {
    return (backend_group *)comm_nccl_group_new_on(n, devices, err);
}
static comm *cuda_group_rank(backend_group *g, int r) { return comm_nccl_rank((comm_nccl_group *)g, r); }
static void cuda_group_free(backend_group *g) { comm_nccl_group_free((comm_nccl_group *)g); }

static void *cuda_host_alloc(size_t bytes, st_err *err) {
    void *p = NULL;
    cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        cudaGetLastError();
        st_errf(err, "cuda: pinned host buffer of %zu bytes: %s", bytes, cudaGetErrorString(e));
        return NULL;
    }
    return p;
}
static void cuda_host_free(void *p) {
    if (p) cudaFreeHost(p);
}

static void *cuda_dev_alloc(int device, size_t bytes, st_err *err) {
    void *p = NULL;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        cudaGetLastError();
        st_errf(err, "cuda: device buffer of %zu bytes on GPU %d: %s", bytes, device, cudaGetErrorString(e));
        return NULL;
    }
    return p;
}
static void cuda_dev_free(int device, void *p) {
    if (!p) return;
    cudaSetDevice(device);
    cudaFree(p);
}

static const backend_module k_cuda = {
    .abi = BACKEND_MODULE_ABI,
    .name = "cuda",
    .device_memory = true,
    .device_count = backend_cuda_device_count,
    .device_info = cuda_device_info,
    .backend_new = cuda_backend_new,
    .group_new = cuda_group_new,
    .group_rank = cuda_group_rank,
    .group_free = cuda_group_free,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .dev_alloc = cuda_dev_alloc,
    .dev_free = cuda_dev_free,
    .p2p = &p2p_nccl_ops,
};

__attribute__((visibility("default"))) const backend_module *strata_backend_module_init(int abi) {
    return abi == BACKEND_MODULE_ABI ? &k_cuda : NULL;
}
