/* matmul.c — cpu_matmul: argument checks, run-time SIMD dispatch, and the
 * split of the work over the pool's threads (kernels: matmul_{scalar,avx2,avx512}.c).
 *
 * T < CPU_MATVEC_MAX_T: matvec, weight rows split evenly over the threads;
 * each row is read once and dotted with every token row (memory bound).
 * Q8_0 weights take llama.cpp's route at every T: the token rows are
 * quantized to Q8_0 blocks first (cpu_quantize_q8) and dotted in integers,
 * by the matvec for small T and by the level's integer GEMM (gemm_q8_*.c,
 * VNNI on the avx512 level where the CPU has it, cpu_matmul_set_vnni) for larger T, both in the
 * canonical Q8_0 order (the same bits). cpu_matmul_set_q8_float(1) sends
 * Q8_0 to the dequantized-float GEMM instead (the tests' reference).
 * Otherwise GEMM: the level's own register-blocked kernel (x packed
 * transposed once per chunk of tokens, by all threads). Every level computes
 * the canonical summation order of simd.h, so the results are the same bits
 * at every level. STRATA_GEMM=blas uses OpenBLAS sgemm instead (one thread:
 * our pool splits the rows) on tiles of weight rows converted to f32; its
 * summation order is OpenBLAS's own, so it is a tuning option, not a default.
 *
 * The level is detected once (pthread_once); STRATA_SIMD=scalar|avx2|avx512
 * forces a lower one, cpu_matmul_set_level() changes it (tests, benches).
 * STRATA_MATVEC_MAX_T overrides the matvec/GEMM threshold (tuning);
 * STRATA_VNNI=0 keeps the avx512 level's Q8_0 GEMM off AVX512-VNNI.
 */
#include "compute/cpu/matmul.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "common/log.h"
#include "compute/cpu/simd.h"

/* Measured on a 2-core AVX-512 VM (strata-bench-matmul --model-gb 2.2, F16,
 * 2 threads, with the matvec's software prefetch): matvec vs GEMM GFLOP/s
 * 71 vs 42 at T=8, 72 vs 66 at T=12, 68 vs 77 at T=16. So T < 14 streams the
 * weights through the matvec (token rows share each pass over a weight row),
 * larger T goes to the GEMM (fixed cost of a 16-token tile). */
#define CPU_MATVEC_MAX_T 14
#define BLAS_TILE_ROWS 64

/* Process-wide dispatch state (a cached CPU probe, not model state). */
static pthread_once_t mm_once = PTHREAD_ONCE_INIT;
static int mm_best = CPU_SIMD_SCALAR;
static atomic_int mm_level = CPU_SIMD_SCALAR;
static atomic_int mm_blas_gemm = 0;
static atomic_int mm_matvec_max_t = CPU_MATVEC_MAX_T;
static int mm_vnni; /* the CPU has AVX512-VNNI */
static atomic_int mm_use_vnni; /* the avx512 level's Q8_0 GEMM uses it (default: where the CPU has it) */
static atomic_int mm_q8_float = 0;

static const char *level_names[] = {"scalar", "avx2", "avx512"};

static int parse_level(const char *s) {
    for (int i = 0; i < 3; i++)
        if (s && strcmp(s, level_names[i]) == 0) return i;
    return -1;
}

void openblas_set_num_threads(int num_threads);

static void mm_init(void) {
    __builtin_cpu_init();
    int best = CPU_SIMD_SCALAR;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        best = CPU_SIMD_AVX2;
    if (best == CPU_SIMD_AVX2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        best = CPU_SIMD_AVX512;
    mm_best = best;
    mm_vnni = best == CPU_SIMD_AVX512 && __builtin_cpu_supports("avx512vnni");
    const char *vn = getenv("STRATA_VNNI"); /* 0: the avx512 level's Q8_0 GEMM without VNNI (tuning) */
    atomic_store(&mm_use_vnni, mm_vnni && !(vn && strcmp(vn, "0") == 0));
    int lv = best;
    const char *env = getenv("STRATA_SIMD");
    if (env && *env) {
        int want = parse_level(env);
        if (want < 0)
            ST_WARN("STRATA_SIMD=%s is not scalar, avx2 or avx512; using %s", env, level_names[best]);
        else if (want > best)
            ST_WARN("STRATA_SIMD=%s is not supported by this CPU; using %s", env, level_names[best]);
        else
            lv = want;
    }
    atomic_store(&mm_level, lv);
    const char *g = getenv("STRATA_GEMM");
    if (g && strcmp(g, "blas") == 0) atomic_store(&mm_blas_gemm, 1);
    const char *mt = getenv("STRATA_MATVEC_MAX_T"); /* tuning: T below this uses the matvec */
    if (mt && atoi(mt) >= 1) mm_matvec_max_t = atoi(mt);
    openblas_set_num_threads(1);
}

const char *cpu_simd_level(void) {
    pthread_once(&mm_once, mm_init);
    return level_names[atomic_load(&mm_level)];
}

int cpu_matmul_set_level(const char *level, st_err *err) {
    pthread_once(&mm_once, mm_init);
    int lv = parse_level(level);
    if (lv < 0) return st_errf(err, "matmul: unknown SIMD level '%s' (scalar, avx2, avx512)", level ? level : "(null)");
    if (lv > mm_best)
        return st_errf(err, "matmul: SIMD level %s is not supported by this CPU (best: %s)", level, level_names[mm_best]);
    atomic_store(&mm_level, lv);
    return 0;
}

int cpu_matmul_matvec_max_t(void) {
    pthread_once(&mm_once, mm_init);
    return atomic_load(&mm_matvec_max_t);
}

void cpu_matmul_set_matvec_max_t(int t) {
    pthread_once(&mm_once, mm_init);
    atomic_store(&mm_matvec_max_t, t >= 1 ? t : 1);
}

void cpu_matmul_set_q8_float(int on) {
    pthread_once(&mm_once, mm_init);
    atomic_store(&mm_q8_float, on ? 1 : 0);
}

int cpu_matmul_vnni(void) {
    pthread_once(&mm_once, mm_init);
    return atomic_load(&mm_use_vnni) && atomic_load(&mm_level) == CPU_SIMD_AVX512;
}

int cpu_matmul_set_vnni(int on, st_err *err) {
    pthread_once(&mm_once, mm_init);
    if (on && !mm_vnni) return st_errf(err, "matmul: this CPU has no AVX512-VNNI");
    atomic_store(&mm_use_vnni, on ? 1 : 0);
    return 0;
}

void cpu_matmul_set_blas_gemm(int on) {
    pthread_once(&mm_once, mm_init);
    atomic_store(&mm_blas_gemm, on ? 1 : 0);
}

static const cpu_kernels *kernels_for(int lv) {
    switch (lv) {
    case CPU_SIMD_AVX512: return &cpu_kernels_avx512;
    case CPU_SIMD_AVX2: return &cpu_kernels_avx2;
    default: return &cpu_kernels_scalar;
    }
}

typedef struct {
    const cpu_kernels *kn;
    float *y;
    const float *x;
    const int8_t *xq; /* Q8_0 weights: x quantized (T*K values, T*K/32 scales) */
    float *xd;
    int xbias;        /* Q8_0 GEMM on VNNI: xq is stored ^ 0x80 */
    void (*gemm_q8)(const uint8_t *w, size_t rb, int64_t nrows, const int8_t *xq, const float *xd, int64_t T,
                    int64_t K, float *y, int64_t ldy, void *panel);
    const uint8_t *w;
    uint32_t wtype;
    int64_t T, K, N;
    size_t rb;
    float *scratch;   /* per thread: scratch_n floats each */
    size_t scratch_n;
    cpu_gemm_args g;  /* own GEMM */
    atomic_long next_row; /* matvec and GEMMs: first weight row not yet claimed */
    long min_rows;        /* smallest chunk of rows a thread claims */
    long granule;         /* chunks are multiples of this many rows (16, or the own GEMM's tile) */
} mm_job;

/* The matvec hands out weight rows in chunks from one counter, largest
 * first (guided scheduling: a chunk is the unclaimed rows / (2 * nth),
 * rounded up to the granule, 16 rows, and at least min_rows, about 64 KiB of
 * weights; the own GEMM claims whole CPU_GEMM_NB-row tiles the same way).
 * A statically split matvec waits for its slowest thread, and on a machine
 * shared with other work a thread that loses its core for a time slice
 * stalls every matmul it is in; here the other thread takes over the
 * unclaimed rows. A thread's first chunk is a quarter of the rows (2
 * threads), so each still streams long contiguous runs. Which thread
 * computes a row does not change its bits. Returns 0 when none are left. */
static int claim_rows(mm_job *j, int nth, long *lo, long *hi) {
    const long n = (long)j->N;
    long cur = atomic_load_explicit(&j->next_row, memory_order_relaxed);
    for (;;) {
        if (cur >= n) return 0;
        long take = (n - cur + 2L * nth - 1) / (2L * nth);
        take = (take + j->granule - 1) / j->granule * j->granule;
        if (take < j->min_rows) take = j->min_rows;
        if (take > n - cur) take = n - cur;
        if (atomic_compare_exchange_weak_explicit(&j->next_row, &cur, cur + take, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *lo = cur;
            *hi = cur + take;
            return 1;
        }
    }
}

static void run_matvec(void *p, int ith, int nth) {
    mm_job *j = p;
    long lo, hi;
    float *scratch = j->scratch ? j->scratch + (size_t)ith * j->scratch_n : NULL;
    while (claim_rows(j, nth, &lo, &hi))
        j->kn->matvec(j->wtype, j->w + (size_t)lo * j->rb, j->rb, hi - lo, j->x, j->T, j->K, j->y + lo, j->N,
                      scratch);
}

static void run_matvec_q8(void *p, int ith, int nth) {
    mm_job *j = p;
    long lo, hi;
    (void)ith;
    while (claim_rows(j, nth, &lo, &hi))
        j->kn->matvec_q8(j->w + (size_t)lo * j->rb, j->rb, hi - lo, j->xq, j->xd, j->T, j->K, j->y + lo, j->N);
}

/* Q8_0 GEMM: rows claimed in chunks as the matvec does (claim_rows: guided,
 * multiples of 16 = CPU_Q8_ROWS, the VNNI panel), so that a thread that
 * loses its core for a while does not hold up the call; each thread packs
 * its panels in its own scratch. */
_Static_assert(16 % CPU_Q8_ROWS == 0, "claim_rows hands out multiples of 16 rows");
static void run_gemm_q8(void *p, int ith, int nth) {
    mm_job *j = p;
    long lo, hi;
    void *panel = j->scratch + (size_t)ith * j->scratch_n;
    while (claim_rows(j, nth, &lo, &hi))
        j->gemm_q8(j->w + (size_t)lo * j->rb, j->rb, hi - lo, j->xq, j->xd, j->T, j->K, j->y + lo, j->N, panel);
}

/* Quantizes x to Q8_0 (j->xq, j->xd), blocks split over the threads. */
static void run_quant(void *p, int ith, int nth) {
    mm_job *j = p;
    long lo, hi;
    st_split_range((long)(j->T * j->K / QK8_0), ith, nth, &lo, &hi);
    int8_t *q = (int8_t *)j->xq + lo * QK8_0;
    j->kn->quantize_q8(j->x + lo * QK8_0, (hi - lo) * QK8_0, q, j->xd + lo);
    if (j->xbias)
        for (long i = 0; i < (hi - lo) * QK8_0; i++) q[i] = (int8_t)((uint8_t)q[i] ^ 0x80);
}

/* About 64 KiB of weights, a multiple of 16 rows (the AVX-512 matvec's
 * group). */
static long matvec_min_rows(size_t rb) {
    long r = (long)((64u << 10) / (rb ? rb : 1));
    r = (r + 15) / 16 * 16;
    return r < 16 ? 16 : r;
}

void cpu_quantize_q8(const float *x, int64_t n, int8_t *q, float *d) {
    for (int64_t b = 0; b < n / QK8_0; b++) {
        const float *xb = x + b * QK8_0;
        float amax = 0.0f;
        for (int i = 0; i < QK8_0; i++) amax = fmaxf(amax, fabsf(xb[i]));
        d[b] = st_fp16_to_f32(st_f32_to_fp16(amax / 127.0f));
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        for (int i = 0; i < QK8_0; i++) {
            float v = nearbyintf(xb[i] * id); /* round half to even, as _mm256_round_ps */
            q[b * QK8_0 + i] = (int8_t)(v == v ? (v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v) : 0.0f);
        }
    }
}

/* xp[k*Tp + t] = x[t*K + k] (t < T), 0 for T <= t < Tp; threads split k. */
static void run_pack(void *p, int ith, int nth) {
    mm_job *j = p;
    const cpu_gemm_args *g = &j->g;
    long lo, hi;
    st_split_range((long)j->K, ith, nth, &lo, &hi);
    float *xp = (float *)g->xp;
    for (long k = lo; k < hi; k++) memset(xp + k * g->Tp + g->T, 0, sizeof(float) * (size_t)(g->Tp - g->T));
    for (int64_t t = 0; t < g->T; t++) {
        const float *xt = j->x + t * j->K;
        for (long k = lo; k < hi; k++) xp[k * g->Tp + t] = xt[k];
    }
}

/* The own GEMM over weight rows [n_lo, n_hi): tiles of CPU_GEMM_NB rows ×
 * CPU_GEMM_KC columns converted to f32 (wc, zero rows padding to a multiple
 * of MR), the level's micro-kernel over MR-row groups (outer: a group's rows
 * stay in L1) and token tiles (inner); partial sums stay in cbuf between
 * column tiles, so each output is one sequential FMA sum over k. */
/* Prefetches rows [r, r + nr) ∩ [0, n_hi), columns [k0, k0 + kc) of W: the
 * next weight tile, a few rows per micro-kernel call, so that its
 * conversion does not wait on DRAM (a tile's short row pieces are too
 * scattered for the hardware prefetcher). */
static void prefetch_tile_rows(const cpu_gemm_args *a, int64_t r, int64_t nr, int64_t n_hi, int64_t k0, int64_t kc) {
    if (r + nr > n_hi) nr = n_hi - r;
    if (nr <= 0 || k0 >= a->K) return;
    if (k0 + kc > a->K) kc = a->K - k0;
    const size_t off = ggml_row_bytes(a->wtype, k0), len = ggml_row_bytes(a->wtype, kc);
    for (int64_t i = 0; i < nr; i++) {
        const char *p = (const char *)a->w + (size_t)(r + i) * a->rb + off;
        for (size_t b = 0; b < len + 63; b += 64) __builtin_prefetch(p + b, 0, 3);
    }
}

static void gemm_rows(const cpu_kernels *kn, const cpu_gemm_args *a, int64_t n_lo, int64_t n_hi, float *wc,
                      float *cbuf) {
    const int64_t K = a->K, Tp = a->Tp;
    for (int64_t nb0 = n_lo; nb0 < n_hi; nb0 += CPU_GEMM_NB) {
        const int64_t nb = n_hi - nb0 < CPU_GEMM_NB ? n_hi - nb0 : CPU_GEMM_NB;
        const int64_t nbp = (nb + CPU_GEMM_MR - 1) / CPU_GEMM_MR * CPU_GEMM_MR;
        for (int64_t k0 = 0; k0 < K; k0 += CPU_GEMM_KC) {
            const int64_t kc = K - k0 < CPU_GEMM_KC ? K - k0 : CPU_GEMM_KC;
            kn->to_f32(a->wtype, a->w + (size_t)nb0 * a->rb, a->rb, nb, k0, kc, wc, kc);
            memset(wc + nb * kc, 0, sizeof(float) * (size_t)((nbp - nb) * kc));
            /* The next tile: the next columns of these rows, or the next rows' first columns. */
            const int64_t pn0 = k0 + CPU_GEMM_KC < K ? nb0 : nb0 + CPU_GEMM_NB;
            const int64_t pk0 = k0 + CPU_GEMM_KC < K ? k0 + CPU_GEMM_KC : 0;
            for (int64_t m0 = 0; m0 < nbp; m0 += CPU_GEMM_MR) {
                prefetch_tile_rows(a, pn0 + m0, CPU_GEMM_MR, n_hi, pk0, CPU_GEMM_KC);
                for (int64_t t0 = 0; t0 < Tp; t0 += kn->gemm_tokens) {
                    const int nt = Tp - t0 < kn->gemm_tokens ? (int)(Tp - t0) : kn->gemm_tokens;
                    kn->micro(kc, wc + m0 * kc, kc, a->xp + k0 * Tp + t0, Tp, cbuf + m0 * Tp + t0, Tp, k0 == 0, nt);
                }
            }
        }
        for (int64_t t = 0; t < a->T; t++) {
            float *yt = a->y + t * a->N + nb0;
            for (int64_t n = 0; n < nb; n++) yt[n] = cbuf[n * Tp + t];
        }
    }
}

/* Rows claimed in whole tiles as the matvec claims them (claim_rows), so
 * that a thread that loses its core does not hold up the call; each row is
 * one sequential FMA sum over k whichever thread and tile compute it. */
static void run_own_gemm(void *p, int ith, int nth) {
    mm_job *j = p;
    long lo, hi;
    float *wc = j->scratch + (size_t)ith * j->scratch_n;
    while (claim_rows(j, nth, &lo, &hi)) gemm_rows(j->kn, &j->g, lo, hi, wc, wc + CPU_GEMM_NB * CPU_GEMM_KC);
}

static void run_blas_gemm(void *p, int ith, int nth) {
    mm_job *j = p;
    long lo, hi;
    st_split_range((long)j->N, ith, nth, &lo, &hi);
    float *tile = j->scratch + (size_t)ith * j->scratch_n;
    for (long n0 = lo; n0 < hi; n0 += BLAS_TILE_ROWS) {
        int64_t nb = hi - n0 < BLAS_TILE_ROWS ? hi - n0 : BLAS_TILE_ROWS;
        const float *b = tile;
        if (j->wtype == GGML_TYPE_F32)
            b = (const float *)(j->w + (size_t)n0 * j->rb); /* already f32: no copy */
        else
            j->kn->to_f32(j->wtype, j->w + (size_t)n0 * j->rb, j->rb, nb, 0, j->K, tile, j->K);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)j->T, (int)nb, (int)j->K, 1.0f, j->x,
                    (int)j->K, b, (int)j->K, 0.0f, j->y + n0, (int)j->N);
    }
}

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
/* The AVX-512 kernels are built without ASan instrumentation (see
 * compute/cpu/CMakeLists.txt): check each call's ranges here instead; a
 * poisoned byte is read through an instrumented access, so ASan reports it
 * as usual. */
static void asan_check_range(const void *p, size_t bytes) {
    const volatile char *bad = __asan_region_is_poisoned((void *)p, bytes);
    if (bad) (void)*bad;
}
#endif

static void *alloc64(size_t nfloats) {
    size_t bytes = (nfloats * sizeof(float) + 63) / 64 * 64;
    return aligned_alloc(64, bytes ? bytes : 64);
}

int cpu_matmul(st_pool *pool, float *y, const float *x, const void *w, uint32_t wtype, int64_t T,
               int64_t K, int64_t N, st_err *err) {
    pthread_once(&mm_once, mm_init);
    if (!ggml_type_supported(wtype))
        return st_errf(err, "matmul: unsupported weight type %s (%u)", ggml_type_name(wtype), wtype);
    if (T < 0 || K <= 0 || N < 0 || T > INT32_MAX || K > INT32_MAX || N > INT32_MAX)
        return st_errf(err, "matmul: bad shape T=%lld K=%lld N=%lld", (long long)T, (long long)K, (long long)N);
    size_t rb = ggml_row_bytes(wtype, K);
    if (rb == 0)
        return st_errf(err, "matmul: K=%lld is not a multiple of the %s block size %d", (long long)K,
                       ggml_type_name(wtype), ggml_block_size(wtype));
    if (T == 0 || N == 0) return 0;
    if (!y || !x || !w) return st_errf(err, "matmul: NULL buffer");

#if defined(__SANITIZE_ADDRESS__)
    asan_check_range(w, rb * (size_t)N);
    asan_check_range(x, sizeof(float) * (size_t)T * (size_t)K);
    asan_check_range(y, sizeof(float) * (size_t)T * (size_t)N);
#endif
    int lv = atomic_load(&mm_level);
    const cpu_kernels *kn = kernels_for(lv);
    int nth = st_pool_size(pool);
    mm_job j = {.kn = kn, .y = y, .x = x, .w = w, .wtype = wtype, .T = T, .K = K, .N = N, .rb = rb,
                .min_rows = matvec_min_rows(rb), .granule = 16};
    atomic_init(&j.next_row, 0);

    const int q8_float = wtype == GGML_TYPE_Q8_0 && atomic_load(&mm_q8_float);
    const int matvec = T < atomic_load(&mm_matvec_max_t) && !q8_float; /* the float path is the GEMM's */
    if (wtype == GGML_TYPE_Q8_0 && !q8_float) {
        if (!matvec && kn->gemm_q8) {
            const int vnni = lv == CPU_SIMD_AVX512 && atomic_load(&mm_use_vnni);
            j.gemm_q8 = vnni ? cpu_gemm_q8_vnni : kn->gemm_q8;
            j.xbias = vnni;
            j.scratch_n = CPU_Q8_PANEL_BYTES(K) / sizeof(float);
            j.scratch = alloc64(j.scratch_n * (size_t)nth);
            if (!j.scratch) return st_errf(err, "matmul: out of memory");
        }
        int8_t *xq = malloc((size_t)(T * K));
        float *xd = malloc(sizeof(float) * (size_t)(T * K / QK8_0));
        if (!xq || !xd) {
            free(xq);
            free(xd);
            free(j.scratch);
            return st_errf(err, "matmul: out of memory");
        }
        j.xq = xq;
        j.xd = xd;
        if (j.gemm_q8)
            st_pool_run(pool, run_quant, &j);
        else
            run_quant(&j, 0, 1); /* decode: a few K values, not worth a pool wake-up */
        st_pool_run(pool, j.gemm_q8 ? run_gemm_q8 : run_matvec_q8, &j);
        free(xq);
        free(xd);
        free(j.scratch);
        return 0;
    }

    if (matvec) {
        if (lv == CPU_SIMD_SCALAR) {
            j.scratch_n = (size_t)K;
            j.scratch = malloc(sizeof(float) * j.scratch_n * (size_t)nth);
            if (!j.scratch) return st_errf(err, "matmul: out of memory");
        }
        st_pool_run(pool, run_matvec, &j);
        free(j.scratch);
        return 0;
    }

    if (!atomic_load(&mm_blas_gemm)) {
        int64_t tc_max = T < CPU_GEMM_TC ? T : CPU_GEMM_TC;
        int64_t tp_max = (tc_max + 15) / 16 * 16;
        j.scratch_n = (size_t)(CPU_GEMM_NB * CPU_GEMM_KC + CPU_GEMM_NB * tp_max);
        j.scratch = alloc64(j.scratch_n * (size_t)nth);
        float *xp = alloc64((size_t)K * (size_t)tp_max);
        if (!j.scratch || !xp) {
            free(j.scratch);
            free(xp);
            return st_errf(err, "matmul: out of memory");
        }
        for (int64_t t0 = 0; t0 < T; t0 += CPU_GEMM_TC) {
            int64_t tc = T - t0 < CPU_GEMM_TC ? T - t0 : CPU_GEMM_TC;
            j.x = x + t0 * K;
            j.g = (cpu_gemm_args){.w = w, .rb = rb, .wtype = wtype, .K = K, .N = N, .xp = xp, .T = tc,
                                  .Tp = (tc + 15) / 16 * 16, .y = y + t0 * N};
            st_pool_run(pool, run_pack, &j);
            j.granule = j.min_rows = CPU_GEMM_NB;
            atomic_store(&j.next_row, 0);
            st_pool_run(pool, run_own_gemm, &j);
        }
        free(xp);
        free(j.scratch);
        return 0;
    }

    if (wtype != GGML_TYPE_F32) {
        j.scratch_n = (size_t)BLAS_TILE_ROWS * (size_t)K;
        j.scratch = alloc64(j.scratch_n * (size_t)nth);
        if (!j.scratch) return st_errf(err, "matmul: out of memory");
    }
    st_pool_run(pool, run_blas_gemm, &j);
    free(j.scratch);
    return 0;
}
