/* cuda_placeholder.c — the CUDA backend will implement compute/backend.h here.
 * Until then this target only proves the toolkit, cuBLAS and NCCL link. */
#include <cublas_v2.h>
#include <nccl.h>

int st_cuda_nccl_version(void) {
    int v = 0;
    ncclGetVersion(&v);
    return v;
}
