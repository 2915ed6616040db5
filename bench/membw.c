/* membw.c — strata-membw: the machine's memory-read bandwidth, the roofline
 * for decode (each token streams every weight once).
 *
 *   strata-membw [--size MIB] [--window MIB] [--threads N] [--runs R]
 *                [--isa avx512|avx2|scalar] [--small-pages] [--json]
 *
 * Allocates a buffer much larger than the last-level cache (default 2048 MiB;
 * this VM has 32 MiB of L3) on transparent huge pages, as the CPU backend
 * allocates weights (--small-pages: 4 KiB pages), and reads it with 1 thread
 * and with N threads (default: all CPUs), each thread a contiguous slice.
 * A run reads one window (default 256 MiB) and the runs rotate through the
 * buffer, so a window was evicted from L3 by the others since its last read.
 *
 * The figure is meant as an upper bound on what a decode kernel can stream,
 * so several read kernels are measured and the best one counts. One plain
 * loop of vector loads leaves bandwidth on the table on some machines (it read
 * 18.9-20.4 GB/s with 2 threads where llama.cpp's decode streamed weights at
 * 22.5 GB/s), because a core reaches DRAM bandwidth only with enough misses in
 * flight, and how to get them there differs between CPUs:
 *   plain     aligned vector loads, 4 independent accumulators; relies on the
 *             hardware prefetcher alone.
 *   pf1k/pf2k/pf4k
 *             plain + a software prefetch (_mm_prefetch, T0) of every line
 *             1, 2 or 4 KiB ahead: more misses in flight than the hardware
 *             prefetcher keeps when it ramps up slowly or stops at 4 KiB pages.
 *   streams2/streams4
 *             each thread reads 2 or 4 equal sub-slices of its slice
 *             interleaved (256 bytes of each in turn): several sequential
 *             streams train several prefetcher entries and spread the reads
 *             over more DRAM pages/banks, as a matmul reading several weight
 *             rows at once does.
 *   nt        non-temporal loads (MOVNTDQA, _mm512/_mm256_stream_load_*): on
 *             write-back memory most CPUs treat them as plain loads, but some
 *             fill fewer cache levels with them; a vector ISA only.
 * Each kernel runs with every vector ISA the CPU has (avx512, avx2, scalar
 * 64-bit loads; --isa keeps one), interleaved run by run so that noise from
 * other processes hits all of them alike. Prints the best of R runs (default
 * 16) per kernel in GB/s (1e9 bytes/s), and the best kernel per thread count:
 * short runs make the best one meaningful even when other processes share the
 * cores.
 *
 * The best run is a burst. On a VM that shares its host's memory, one kernel
 * on one window reads anywhere from 28 to 63 GB/s from run to run (2 threads
 * on the 2-vCPU test VM), and a decode, which streams the whole model every
 * token for seconds on end, meets the typical moment, not the best. So after
 * the runs the best kernel also streams the whole buffer R times, as a
 * decode token streams the model, and "sustained" is the median of those
 * passes: the bandwidth a long stream can count on. bench/roofline.sh prints
 * decode's share of both.
 *
 * --json: {"buffer_mib", "window_mib", "runs", "hugepages", "kernel" (the
 * best kernel at N threads, "isa/name"), "kernels" (every name measured),
 * "results": [{"threads", "read_gbps" (best over kernels), "best_kernel",
 * "kernel_gbps": {"isa/name": GB/s, ...}, "sustained_gbps" (the median
 * whole-buffer pass of best_kernel)}, ...]}; read_gbps keeps its meaning for
 * bench/roofline.sh.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/clock.h"
#include "compute/cpu/threadpool.h"

/* Reads n bytes at p (n a multiple of 1024: see rd_fn) and folds them into a
 * value the caller keeps, so the loads cannot be dropped. */
typedef uint64_t (*read_fn)(const uint8_t *p, size_t n);

/* The kernel variants; every ISA below instantiates each (scalar: not nt). */
typedef struct {
    const char *name;
    int streams;  /* interleaved sub-slices per thread: 1, 2 or 4 */
    size_t pf;    /* software-prefetch distance in bytes, 0 = none */
    int nt;       /* non-temporal loads */
} kvariant;

enum { K_PLAIN, K_PF1K, K_PF2K, K_PF4K, K_STREAMS2, K_STREAMS4, K_NT, N_KERNELS };
static const kvariant variants[N_KERNELS] = {
    [K_PLAIN] = {"plain", 1, 0, 0},        [K_PF1K] = {"pf1k", 1, 1024, 0},
    [K_PF2K] = {"pf2k", 1, 2048, 0},       [K_PF4K] = {"pf4k", 1, 4096, 0},
    [K_STREAMS2] = {"streams2", 2, 0, 0},  [K_STREAMS4] = {"streams4", 4, 0, 0},
    [K_NT] = {"nt", 1, 0, 1},
};

/* The prefetch address is formed as an integer: it may lie past the buffer
 * (a prefetch never faults), which pointer arithmetic would not allow. */
#define PF_ADDR(q, d) ((const char *)((uintptr_t)(q) + (d)))
/* Prefetch the 4 lines of the 256-byte step that lies d bytes after q (spelt
 * out: -O2 leaves a 4-trip loop rolled). */
#define PREFETCH_STEP(prefetch, q, d)                                                              \
    do {                                                                                           \
        prefetch(PF_ADDR(q, d));                                                                   \
        prefetch(PF_ADDR(q, (d) + 64));                                                            \
        prefetch(PF_ADDR(q, (d) + 128));                                                           \
        prefetch(PF_ADDR(q, (d) + 192));                                                           \
    } while (0)
#define PF_T0(a) _mm_prefetch((a), _MM_HINT_T0)
#define PF_BUILTIN(a) __builtin_prefetch((a), 0, 3)

/* One body per ISA, always inlined into wrappers with constant (streams, pf,
 * nt), so each variant is a loop of its own with no per-block branches (the
 * Release build is -O2, which does not unswitch loops). Every body reads 256
 * bytes of each stream per step into 4 independent accumulators. */
#define BODY_BEGIN                                                                                 \
    const size_t sub = n / (size_t)streams; /* a multiple of 256 */                               \
    for (size_t off = 0; off < sub; off += 256)                                                    \
        for (int s = 0; s < streams; s++) {                                                        \
            const uint8_t *q = p + (size_t)s * sub + off;
#define BODY_END }

#if defined(__x86_64__)
#define AVX512_INLINE __attribute__((target("avx512f"), always_inline)) static inline
#define AVX2_INLINE __attribute__((target("avx2"), always_inline)) static inline

AVX512_INLINE uint64_t body512(const uint8_t *p, size_t n, int streams, size_t pf, int nt) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    BODY_BEGIN
    if (pf) PREFETCH_STEP(PF_T0, q, pf);
    if (nt) { /* the intrinsic takes a non-const pointer; it only reads */
        a0 = _mm512_xor_si512(a0, _mm512_stream_load_si512((void *)(uintptr_t)(q)));
        a1 = _mm512_xor_si512(a1, _mm512_stream_load_si512((void *)(uintptr_t)(q + 64)));
        a2 = _mm512_xor_si512(a2, _mm512_stream_load_si512((void *)(uintptr_t)(q + 128)));
        a3 = _mm512_xor_si512(a3, _mm512_stream_load_si512((void *)(uintptr_t)(q + 192)));
    } else {
        a0 = _mm512_xor_si512(a0, _mm512_load_si512((const void *)(q)));
        a1 = _mm512_xor_si512(a1, _mm512_load_si512((const void *)(q + 64)));
        a2 = _mm512_xor_si512(a2, _mm512_load_si512((const void *)(q + 128)));
        a3 = _mm512_xor_si512(a3, _mm512_load_si512((const void *)(q + 192)));
    }
    BODY_END
    a0 = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
    return (uint64_t)_mm512_reduce_add_epi64(a0);
}

AVX2_INLINE uint64_t body256(const uint8_t *p, size_t n, int streams, size_t pf, int nt) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    BODY_BEGIN
    if (pf) PREFETCH_STEP(PF_T0, q, pf);
    const __m256i *v = (const __m256i *)q;
    if (nt) {
        a0 = _mm256_xor_si256(a0, _mm256_xor_si256(_mm256_stream_load_si256(v), _mm256_stream_load_si256(v + 4)));
        a1 = _mm256_xor_si256(a1, _mm256_xor_si256(_mm256_stream_load_si256(v + 1), _mm256_stream_load_si256(v + 5)));
        a2 = _mm256_xor_si256(a2, _mm256_xor_si256(_mm256_stream_load_si256(v + 2), _mm256_stream_load_si256(v + 6)));
        a3 = _mm256_xor_si256(a3, _mm256_xor_si256(_mm256_stream_load_si256(v + 3), _mm256_stream_load_si256(v + 7)));
    } else {
        a0 = _mm256_xor_si256(a0, _mm256_xor_si256(_mm256_load_si256(v), _mm256_load_si256(v + 4)));
        a1 = _mm256_xor_si256(a1, _mm256_xor_si256(_mm256_load_si256(v + 1), _mm256_load_si256(v + 5)));
        a2 = _mm256_xor_si256(a2, _mm256_xor_si256(_mm256_load_si256(v + 2), _mm256_load_si256(v + 6)));
        a3 = _mm256_xor_si256(a3, _mm256_xor_si256(_mm256_load_si256(v + 3), _mm256_load_si256(v + 7)));
    }
    BODY_END
    a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    return (uint64_t)_mm256_extract_epi64(a0, 0) ^ (uint64_t)_mm256_extract_epi64(a0, 3);
}
#endif

/* Portable 64-bit loads (nt has no scalar form; the wrapper is plain). */
static inline __attribute__((always_inline)) uint64_t body64(const uint8_t *p, size_t n, int streams,
                                                               size_t pf, int nt) {
    (void)nt;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    BODY_BEGIN
    const uint64_t *w = (const uint64_t *)q;
    if (pf) PREFETCH_STEP(PF_BUILTIN, q, pf);
    for (int i = 0; i < 32; i += 4) a0 ^= w[i], a1 ^= w[i + 1], a2 ^= w[i + 2], a3 ^= w[i + 3];
    BODY_END
    return a0 ^ a1 ^ a2 ^ a3;
}

/* The wrappers: ISA_plain, ISA_pf1k, ... with the variant table's constants. */
#define WRAPPERS(isa, attr, body)                                                                  \
    attr static uint64_t isa##_plain(const uint8_t *p, size_t n) { return body(p, n, 1, 0, 0); }  \
    attr static uint64_t isa##_pf1k(const uint8_t *p, size_t n) { return body(p, n, 1, 1024, 0); } \
    attr static uint64_t isa##_pf2k(const uint8_t *p, size_t n) { return body(p, n, 1, 2048, 0); } \
    attr static uint64_t isa##_pf4k(const uint8_t *p, size_t n) { return body(p, n, 1, 4096, 0); } \
    attr static uint64_t isa##_streams2(const uint8_t *p, size_t n) { return body(p, n, 2, 0, 0); } \
    attr static uint64_t isa##_streams4(const uint8_t *p, size_t n) { return body(p, n, 4, 0, 0); }
#define NT_WRAPPER(isa, attr, body)                                                                \
    attr static uint64_t isa##_nt(const uint8_t *p, size_t n) { return body(p, n, 1, 0, 1); }
#define WRAPPER_TABLE(isa)                                                                         \
    {isa##_plain, isa##_pf1k, isa##_pf2k, isa##_pf4k, isa##_streams2, isa##_streams4, isa##_nt}

WRAPPERS(scalar, , body64)
#if defined(__x86_64__)
WRAPPERS(avx2, __attribute__((target("avx2"))), body256)
NT_WRAPPER(avx2, __attribute__((target("avx2"))), body256)
WRAPPERS(avx512, __attribute__((target("avx512f"))), body512)
NT_WRAPPER(avx512, __attribute__((target("avx512f"))), body512)
#endif

enum { ISA_AVX512, ISA_AVX2, ISA_SCALAR, N_ISAS }; /* widest first */
static const char *const isa_names[N_ISAS] = {"avx512", "avx2", "scalar"};
static const read_fn kernel_fns[N_ISAS][N_KERNELS] = {
#if defined(__x86_64__)
    [ISA_AVX512] = WRAPPER_TABLE(avx512),
    [ISA_AVX2] = WRAPPER_TABLE(avx2),
#endif
    [ISA_SCALAR] = {scalar_plain, scalar_pf1k, scalar_pf2k, scalar_pf4k, scalar_streams2,
                    scalar_streams4, NULL},
};

static int isa_supported(int isa) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (isa == ISA_AVX512) return __builtin_cpu_supports("avx512f");
    if (isa == ISA_AVX2) return __builtin_cpu_supports("avx2");
#else
    if (isa != ISA_SCALAR) return 0;
#endif
    return 1;
}

typedef struct {
    const uint8_t *buf;
    size_t bytes;
    read_fn fn;
    uint64_t sink[64];
} rd_job;

/* Each thread reads a contiguous slice of whole 4 KiB chunks, so a slice
 * splits into 1, 2 or 4 sub-slices of whole 256-byte steps. */
static void rd_fn(void *p, int ith, int nth) {
    rd_job *j = p;
    long lo, hi, chunks = (long)(j->bytes / 4096);
    st_split_range(chunks, ith, nth, &lo, &hi);
    j->sink[ith % 64] += j->fn(j->buf + (size_t)lo * 4096, (size_t)(hi - lo) * 4096);
}

typedef struct {
    uint8_t *buf;
    size_t bytes;
} fill_job;

static void fill_fn(void *p, int ith, int nth) { /* first touch from the reading threads */
    fill_job *f = p;
    long lo, hi;
    st_split_range((long)(f->bytes / 4096), ith, nth, &lo, &hi);
    memset(f->buf + (size_t)lo * 4096, ith + 1, (size_t)(hi - lo) * 4096);
}

/* One timed read of the next window (windows rotate over all measurements). */
static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double measure_once(st_pool *pool, const uint8_t *buf, size_t bytes, size_t window, read_fn fn) {
    static size_t next_win;
    size_t nwin = bytes / window;
    rd_job j = {.buf = buf + next_win++ % nwin * window, .bytes = window / 4096 * 4096, .fn = fn};
    double t0 = st_now_s();
    st_pool_run(pool, rd_fn, &j);
    double gbps = (double)j.bytes / (st_now_s() - t0) / 1e9;
    if (j.sink[0] == 42) fprintf(stderr, "(sink)\n"); /* keep the reads observable */
    return gbps;
}

/* MiB of this process's anonymous memory on huge pages (smaps_rollup), -1 if unknown. */
static long anon_huge_mib(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f) return -1;
    char line[256];
    long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "AnonHugePages: %ld kB", &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : kb / 1024;
}

static void usage(void) {
    fprintf(stderr, "usage: strata-membw [--size MIB] [--window MIB] [--threads N] [--runs R]\n"
                    "                    [--isa avx512|avx2|scalar] [--small-pages] [--json]\n");
}

int main(int argc, char **argv) {
    long size_mib = 2048, window_mib = 256;
    int threads = st_cpu_count(), runs = 16, json = 0, small_pages = 0, only_isa = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--small-pages")) {
            small_pages = 1;
        } else if (!strcmp(a, "--size") && i + 1 < argc) {
            size_mib = strtol(argv[++i], NULL, 10);
        } else if (!strcmp(a, "--window") && i + 1 < argc) {
            window_mib = strtol(argv[++i], NULL, 10);
        } else if (!strcmp(a, "--threads") && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else if (!strcmp(a, "--runs") && i + 1 < argc) {
            runs = atoi(argv[++i]);
        } else if (!strcmp(a, "--isa") && i + 1 < argc) {
            const char *v = argv[++i];
            for (int k = 0; k < N_ISAS; k++)
                if (!strcmp(v, isa_names[k])) only_isa = k;
            if (only_isa < 0) {
                fprintf(stderr, "strata-membw: --isa %s: expected avx512, avx2 or scalar\n", v);
                return 2;
            }
            if (!isa_supported(only_isa)) {
                fprintf(stderr, "strata-membw: --isa %s: not supported by this CPU\n", v);
                return 2;
            }
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        } else {
            fprintf(stderr, "strata-membw: bad argument '%s'\n", a);
            usage();
            return 2;
        }
    }
    if (size_mib < 1 || size_mib > (1L << 20) || threads < 1 || threads > 1024 || runs < 1 || window_mib < 1 ||
        window_mib > size_mib) {
        fprintf(stderr, "strata-membw: --size must be 1..1048576 MiB, --window 1..size, --threads 1..1024, --runs >= 1\n");
        return 2;
    }

    /* The kernels to measure: every (ISA, variant) this CPU runs. */
    struct {
        int isa, var;
        char name[32];
        double best[2]; /* [0]: 1 thread, [1]: N threads */
    } ks[N_ISAS * N_KERNELS];
    int nk = 0;
    for (int isa = 0; isa < N_ISAS; isa++) {
        if ((only_isa >= 0 && isa != only_isa) || !isa_supported(isa)) continue;
        for (int v = 0; v < N_KERNELS; v++) {
            if (!kernel_fns[isa][v]) continue;
            ks[nk].isa = isa, ks[nk].var = v, ks[nk].best[0] = ks[nk].best[1] = 0;
            snprintf(ks[nk].name, sizeof ks[nk].name, "%s/%s", isa_names[isa], variants[v].name);
            nk++;
        }
    }

    size_t bytes = (size_t)size_mib << 20, huge = (size_t)2 << 20;
    size_t alloc = (bytes + huge - 1) / huge * huge;
    uint8_t *buf = aligned_alloc(huge, alloc);
    if (!buf) {
        fprintf(stderr, "strata-membw: cannot allocate %ld MiB\n", size_mib);
        return 1;
    }
    if (!small_pages) madvise(buf, alloc, MADV_HUGEPAGE); /* before the first touch */
    st_err err = {{0}};
    st_pool *pool = st_pool_new(threads, &err);
    if (!pool) {
        fprintf(stderr, "strata-membw: %s\n", err.msg);
        free(buf);
        return 1;
    }
    fill_job f = {buf, bytes};
    st_pool_run(pool, fill_fn, &f);
    long huge_mib = anon_huge_mib();

    size_t window = (size_t)window_mib << 20;
    int nconf = threads > 1 ? 2 : 1;
    for (int r = 0; r < runs; r++)
        for (int c = 0; c < nconf; c++)
            for (int k = 0; k < nk; k++) {
                double g = measure_once(c ? pool : NULL, buf, bytes, window, kernel_fns[ks[k].isa][ks[k].var]);
                if (g > ks[k].best[c]) ks[k].best[c] = g;
            }
    if (nconf == 1)
        for (int k = 0; k < nk; k++) ks[k].best[1] = ks[k].best[0];
    int top[2] = {0, 0};
    for (int c = 0; c < 2; c++)
        for (int k = 1; k < nk; k++)
            if (ks[k].best[c] > ks[top[c]].best[c]) top[c] = k;
    double sustained[2] = {0, 0}, *pass = malloc(sizeof(double) * (size_t)runs);
    for (int c = 0; c < nconf && pass; c++) {
        for (int r = 0; r < runs; r++)
            pass[r] = measure_once(c ? pool : NULL, buf, bytes, bytes, kernel_fns[ks[top[c]].isa][ks[top[c]].var]);
        qsort(pass, (size_t)runs, sizeof *pass, cmp_double);
        sustained[c] = pass[runs / 2];
    }
    free(pass);
    if (nconf == 1) sustained[1] = sustained[0];

    if (json) {
        printf("{\"buffer_mib\": %ld, \"window_mib\": %ld, \"runs\": %d, \"hugepages\": %s, "
               "\"hugepage_mib\": %ld, \"kernel\": \"%s\", \"kernels\": [",
               size_mib, window_mib, runs, small_pages ? "false" : "true", huge_mib, ks[top[1]].name);
        for (int k = 0; k < nk; k++) printf("%s\"%s\"", k ? ", " : "", ks[k].name);
        printf("], \"results\": [");
        int tcount[2] = {1, threads};
        for (int c = 0; c < nconf; c++) {
            printf("%s{\"threads\": %d, \"read_gbps\": %.2f, \"best_kernel\": \"%s\", \"kernel_gbps\": {",
                   c ? ", " : "", tcount[c], ks[top[c]].best[c], ks[top[c]].name);
            for (int k = 0; k < nk; k++) printf("%s\"%s\": %.2f", k ? ", " : "", ks[k].name, ks[k].best[c]);
            printf("}, \"sustained_gbps\": %.2f}", sustained[c]);
        }
        printf("]}\n");
    } else {
        printf("memory read bandwidth: %ld MiB buffer, %ld MiB windows, best of %d runs, ", size_mib,
               window_mib, runs);
        if (small_pages)
            printf("4 KiB pages\n");
        else if (huge_mib >= 0)
            printf("huge pages asked (%ld MiB granted)\n", huge_mib);
        else
            printf("huge pages asked\n");
        char hdr[32];
        snprintf(hdr, sizeof hdr, "%d threads", threads);
        printf("%-18s %10s", "GB/s", "1 thread");
        if (nconf > 1) printf(" %10s", hdr);
        printf("\n");
        for (int k = 0; k < nk; k++) {
            printf("%-18s %10.2f", ks[k].name, ks[k].best[0]);
            if (nconf > 1) printf(" %10.2f", ks[k].best[1]);
            printf("\n");
        }
        printf("best: %.2f GB/s with 1 thread (%s)", ks[top[0]].best[0], ks[top[0]].name);
        if (nconf > 1) printf(", %.2f GB/s with %d threads (%s)", ks[top[1]].best[1], threads, ks[top[1]].name);
        printf("\nsustained (that kernel's median pass over the whole %ld MiB, %d passes): %.2f GB/s with 1 thread",
               size_mib, runs, sustained[0]);
        if (nconf > 1) printf(", %.2f GB/s with %d threads", sustained[1], threads);
        printf("\n");
    }
    st_pool_free(pool);
    free(buf);
    return 0;
}
