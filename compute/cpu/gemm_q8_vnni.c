/* gemm_q8_vnni.c — cpu_gemm_q8_vnni: gemm_q8_avx512.c built with
 * AVX512-VNNI (vpdpbusd; see there). One implementation, two builds. */
#define Q8_VNNI 1
#include "gemm_q8_avx512.c"
