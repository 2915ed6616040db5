/* bench_allreduce.c — strata-bench-allreduce: latency and bus bandwidth of the
 * CPU shared-memory all-reduce (compute/cpu/comm_shm.c), f32, for message
 * sizes 4 KiB..16 MiB and 2 and 4 ranks (one thread each).
 *
 * Bus bandwidth follows nccl-tests: busbw = bytes * 2 * (n - 1) / n / time.
 * Usage: strata-bench-allreduce [--ranks a,b,...] [--max-bytes N] [--bf16]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "compute/comm.h"

typedef struct {
    comm *c;
    size_t bytes;
    int iters;
    enum comm_dtype dt;
    double seconds;
    int rc;
} bench_arg;

static void *rank_main(void *p) {
    bench_arg *a = p;
    size_t elem = a->dt == COMM_F32 ? 4 : 2, count = a->bytes / elem;
    void *buf = calloc(count ? count : 1, elem);
    st_err err;
    if (!buf) {
        a->rc = -1;
        return NULL;
    }
    for (int i = 0; i < 3 && a->rc == 0; i++) a->rc = comm_all_reduce_sum(a->c, buf, count, a->dt, &err); /* warm */
    if (a->rc == 0) a->rc = comm_barrier(a->c, &err);
    double t0 = st_now_s();
    for (int i = 0; i < a->iters && a->rc == 0; i++) a->rc = comm_all_reduce_sum(a->c, buf, count, a->dt, &err);
    a->seconds = st_now_s() - t0;
    if (a->rc) fprintf(stderr, "rank %d: %s\n", a->c->rank, err.msg);
    free(buf);
    return NULL;
}

/* Mean seconds per all-reduce (the slowest rank's mean). */
static double run(int n, size_t bytes, int iters, enum comm_dtype dt) {
    st_err err;
    comm_cpu_group *g = comm_cpu_group_new(n, &err);
    if (!g) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    pthread_t th[64];
    bench_arg args[64];
    for (int r = 0; r < n; r++) {
        args[r] = (bench_arg){.c = comm_cpu_rank(g, r), .bytes = bytes, .iters = iters, .dt = dt};
        pthread_create(&th[r], NULL, rank_main, &args[r]);
    }
    double worst = 0;
    for (int r = 0; r < n; r++) {
        pthread_join(th[r], NULL);
        if (args[r].rc) exit(1);
        if (args[r].seconds > worst) worst = args[r].seconds;
    }
    comm_cpu_group_free(g);
    return worst / iters;
}

int main(int argc, char **argv) {
    int ranks[16] = {2, 4}, n_ranks = 2;
    size_t max_bytes = (size_t)16 << 20;
    enum comm_dtype dt = COMM_F32;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ranks") && i + 1 < argc) {
            n_ranks = 0;
            for (char *s = strtok(argv[++i], ","); s && n_ranks < 16; s = strtok(NULL, ",")) {
                ranks[n_ranks] = atoi(s);
                if (ranks[n_ranks] < 1 || ranks[n_ranks] > 64) {
                    fprintf(stderr, "--ranks: %s out of 1..64\n", s);
                    return 2;
                }
                n_ranks++;
            }
        } else if (!strcmp(argv[i], "--max-bytes") && i + 1 < argc) {
            max_bytes = strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--bf16")) {
            dt = COMM_BF16;
        } else {
            fprintf(stderr, "usage: %s [--ranks a,b,...] [--max-bytes N] [--bf16]\n", argv[0]);
            return 2;
        }
    }
    printf("# CPU shared-memory all-reduce, %s; busbw = bytes*2(n-1)/n/time\n", dt == COMM_F32 ? "f32" : "bf16");
    printf("%6s %10s %8s %12s %12s\n", "ranks", "bytes", "iters", "latency_us", "busbw_GB/s");
    for (int a = 0; a < n_ranks; a++) {
        int n = ranks[a];
        for (size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
            /* About 0.2 s of work per point (estimated from one short run). */
            double est = run(n, bytes, 5, dt);
            int iters = est > 0 ? (int)(0.2 / est) : 1000;
            if (iters < 5) iters = 5;
            if (iters > 100000) iters = 100000;
            double t = run(n, bytes, iters, dt);
            double busbw = (double)bytes * 2.0 * (n - 1) / n / t / 1e9;
            printf("%6d %10zu %8d %12.2f %12.2f\n", n, bytes, iters, t * 1e6, busbw);
            fflush(stdout);
        }
    }
    return 0;
}
