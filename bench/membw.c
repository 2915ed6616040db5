/* membw.c — strata-membw: the machine's memory-read bandwidth, the roofline
 * for decode (each token streams every weight once).
 *
 *   strata-membw [--size MIB] [--window MIB] [--threads N] [--runs R] [--json]
 *
 * Allocates a buffer much larger than the last-level cache (default 2048 MiB;
 * this VM reports 300 MiB of L3) and reads it with 1 thread and with N threads
 * (default: all CPUs), 64-byte vector loads, each thread a contiguous slice.
 * A run reads one window (default 256 MiB) and the runs rotate through the
 * buffer, so a window was evicted from L3 by the others since its last read.
 * Prints the best of R runs (default 16) in GB/s (1e9 bytes/s): short runs
 * make the best one meaningful even when other processes share the cores.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "compute/cpu/threadpool.h"

typedef struct {
    const uint8_t *buf;
    size_t bytes;
    int use512, use256;
    uint64_t sink[64];
} rd_job;

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static uint64_t read512(const uint8_t *p, size_t n) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 256 <= n; i += 256) {
        a0 = _mm512_xor_si512(a0, _mm512_load_si512((const void *)(p + i)));
        a1 = _mm512_xor_si512(a1, _mm512_load_si512((const void *)(p + i + 64)));
        a2 = _mm512_xor_si512(a2, _mm512_load_si512((const void *)(p + i + 128)));
        a3 = _mm512_xor_si512(a3, _mm512_load_si512((const void *)(p + i + 192)));
    }
    a0 = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
    return (uint64_t)_mm512_reduce_add_epi64(a0);
}
__attribute__((target("avx2"))) static uint64_t read256(const uint8_t *p, size_t n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        a0 = _mm256_xor_si256(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    return (uint64_t)_mm256_extract_epi64(a0, 0) ^ (uint64_t)_mm256_extract_epi64(a0, 3);
}
#endif

static uint64_t read_scalar(const uint8_t *p, size_t n) {
    const uint64_t *q = (const uint64_t *)p;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i + 4 <= n / 8; i += 4) a ^= q[i], b ^= q[i + 1], c ^= q[i + 2], d ^= q[i + 3];
    return a ^ b ^ c ^ d;
}

static void rd_fn(void *p, int ith, int nth) {
    rd_job *j = p;
    long lo, hi, chunks = (long)(j->bytes / 4096);
    st_split_range(chunks, ith, nth, &lo, &hi);
    const uint8_t *s = j->buf + (size_t)lo * 4096;
    size_t n = (size_t)(hi - lo) * 4096;
    uint64_t r;
#if defined(__x86_64__)
    if (j->use512)
        r = read512(s, n);
    else if (j->use256)
        r = read256(s, n);
    else
#endif
        r = read_scalar(s, n);
    j->sink[ith % 64] += r;
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

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double measure(st_pool *pool, const uint8_t *buf, size_t bytes, size_t window, int runs, int use512,
                      int use256) {
    double best = 0;
    size_t nwin = bytes / window;
    for (int r = 0; r < runs; r++) {
        rd_job j = {.buf = buf + (size_t)r % nwin * window, .bytes = window, .use512 = use512, .use256 = use256};
        double t0 = now_s();
        st_pool_run(pool, rd_fn, &j);
        double gbps = (double)j.bytes / (now_s() - t0) / 1e9;
        if (gbps > best) best = gbps;
        if (j.sink[0] == 42) fprintf(stderr, "(sink)\n"); /* keep the reads observable */
    }
    return best;
}

static void usage(void) {
    fprintf(stderr, "usage: strata-membw [--size MIB] [--window MIB] [--threads N] [--runs R] [--json]\n");
}

int main(int argc, char **argv) {
    long size_mib = 2048, window_mib = 256;
    int threads = st_cpu_count(), runs = 16, json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--size") && i + 1 < argc) {
            size_mib = strtol(argv[++i], NULL, 10);
        } else if (!strcmp(a, "--window") && i + 1 < argc) {
            window_mib = strtol(argv[++i], NULL, 10);
        } else if (!strcmp(a, "--threads") && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else if (!strcmp(a, "--runs") && i + 1 < argc) {
            runs = atoi(argv[++i]);
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
    size_t bytes = (size_t)size_mib << 20;
    uint8_t *buf = aligned_alloc(4096, bytes);
    if (!buf) {
        fprintf(stderr, "strata-membw: cannot allocate %ld MiB\n", size_mib);
        return 1;
    }
    st_err err = {{0}};
    st_pool *pool = st_pool_new(threads, &err);
    if (!pool) {
        fprintf(stderr, "strata-membw: %s\n", err.msg);
        free(buf);
        return 1;
    }
    fill_job f = {buf, bytes};
    st_pool_run(pool, fill_fn, &f);

    int use512 = 0, use256 = 0;
#if defined(__x86_64__)
    __builtin_cpu_init();
    use512 = __builtin_cpu_supports("avx512f");
    use256 = __builtin_cpu_supports("avx2");
#endif
    const char *kern = use512 ? "avx512" : use256 ? "avx2" : "scalar";
    size_t window = (size_t)window_mib << 20;
    double gb1 = measure(NULL, buf, bytes, window, runs, use512, use256);
    double gbn = threads > 1 ? measure(pool, buf, bytes, window, runs, use512, use256) : gb1;
    if (json) {
        printf("{\"buffer_mib\": %ld, \"window_mib\": %ld, \"runs\": %d, \"kernel\": \"%s\", \"results\": "
               "[{\"threads\": 1, \"read_gbps\": %.2f}, {\"threads\": %d, \"read_gbps\": %.2f}]}\n",
               size_mib, window_mib, runs, kern, gb1, threads, gbn);
    } else {
        printf("memory read bandwidth: %ld MiB buffer, %ld MiB windows, best of %d runs, %s loads\n", size_mib,
               window_mib, runs, kern);
        printf("%8s  %10s\n", "threads", "GB/s");
        printf("%8d  %10.2f\n", 1, gb1);
        if (threads > 1) printf("%8d  %10.2f\n", threads, gbn);
    }
    st_pool_free(pool);
    free(buf);
    return 0;
}
