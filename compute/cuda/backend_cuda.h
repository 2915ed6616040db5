/* backend_cuda.h — the CUDA implementation of compute/backend.h: one instance
 * is one TP rank on one GPU, with its own stream and cuBLAS handle. Built only
 * when STRATA_CUDA is on (compute/cuda/CMakeLists.txt); see docs/cuda-backend.md.
 *
 * Memory: alloc/weight_upload are cudaMalloc'd device memory; the per-op host
 * metadata (positions, slots, block tables, ids, rows, rope factors) is copied
 * into a device buffer the backend owns. Ops are enqueued on the backend's
 * stream; upload and download synchronize it (so host buffers may be reused at
 * once), the others do not. all_reduce synchronizes the stream, then calls the
 * comm, which must be an NCCL comm (compute/cuda/comm_nccl.h) on this device.
 * Every op first makes the backend's device current on the calling thread, so
 * a backend may be used (one thread at a time) from any thread.
 *
 * Numerics (compute/backend.h formulas; the CPU backend's order of operations):
 *   matmul F32           cublasSgemm (full f32, no TF32).
 *   matmul F16/BF16/Q8_0/Q4_0, T <= 8: a dequantizing matvec kernel (weight
 *                        elements to f32, f32 activations, f32 sums).
 *   matmul F16/BF16/Q8_0/Q4_0, T > 8: weight row tiles dequantized to f32 in a
 *                        scratch buffer (<= 64 MiB), then cublasSgemm per tile:
 *                        activations are never rounded, as on the CPU backend.
 *                        With backend_cuda_set_half_gemm(b, 1) F16/BF16 use
 *                        cublasGemmEx instead (activations rounded to the
 *                        weight type, f32 compute: tensor cores, llama.cpp's
 *                        CUDA choice), which no longer matches the CPU bit for bit.
 *   rmsnorm sum of squares in double; attention f32 with online max/sum, q and
 *   the softmax weights rounded to f16 for an F16 cache (as the CPU backend).
 * Errors: every CUDA/cuBLAS failure and bad argument returns -1 with a
 * message "cuda backend (device D): ..."; nothing aborts. Kernel execution
 * errors surface at the next synchronizing op (upload, download, all_reduce)
 * unless STRATA_CUDA_SYNC=1, which synchronizes after every op.
 */
#ifndef STRATA_COMPUTE_CUDA_BACKEND_CUDA_H
#define STRATA_COMPUTE_CUDA_BACKEND_CUDA_H

#include <stddef.h>

#include "common/err.h"
#include "compute/backend.h"

/* CUDA devices visible to this process; 0 when there is none or no driver. */
int backend_cuda_device_count(void);

/* A backend on CUDA device `device` (0-based). NULL + err when the device does
 * not exist or its stream/cuBLAS handle cannot be created. */
backend *backend_cuda_new(int device, st_err *err);

/* F16/BF16 prefill GEMM through cublasGemmEx with rounded activations (on = 1)
 * or dequantized f32 tiles + cublasSgemm (on = 0, the default). The
 * environment variable STRATA_CUDA_HALF_GEMM=1 sets it for new backends.
 * -1 with err when b is not a CUDA backend. */
int backend_cuda_set_half_gemm(backend *b, int on, st_err *err);

/* Device bytes of the backend's own scratch (dequantized weight tiles,
 * converted activations, op metadata), which buf_bytes does not count. */
size_t backend_cuda_scratch_bytes(const backend *b);

/* Op metadata uploads through the pinned ring so far: copies made, and
 * uploads that re-used the device bytes of an identical earlier one of the
 * same kind (every layer's positions, slots and block tables). -1 when b is
 * not a CUDA backend. */
int backend_cuda_meta_stats(const backend *b, unsigned long long *copies, unsigned long long *reused);

#endif
