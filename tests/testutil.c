/* testutil.c — see testutil.h. */
#include "tests/testutil.h"

#include <math.h>

#include "common/dtype.h"

#include <sys/stat.h>

int test_failures = 0;
int test_checks = 0;

#ifndef STRATA_SHARED_DEFAULT
#define STRATA_SHARED_DEFAULT "../shared"
#endif

const char *test_shared_path(const char *rel) {
    static char bufs[8][4096];
    static int slot = 0;
    const char *root = getenv("STRATA_SHARED");
    if (!root || !*root) root = STRATA_SHARED_DEFAULT;
    struct stat st;
    if (stat(root, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr,
                "FATAL: shared test data folder '%s' not found. Put the shared/ folder beside the "
                "repository (../shared) or set STRATA_SHARED.\n",
                root);
        exit(2);
    }
    char *b = bufs[slot++ % 8];
    snprintf(b, 4096, "%s/%s", root, rel);
    if (stat(b, &st) != 0) {
        fprintf(stderr, "FATAL: shared test file '%s' not found (STRATA_SHARED=%s).\n", b, root);
        exit(2);
    }
    return b;
}

char *test_read_file(const char *path, size_t *len_out) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "FATAL: cannot open %s\n", path);
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "FATAL: cannot read %s\n", path);
        exit(2);
    }
    buf[n] = 0;
    fclose(f);
    if (len_out) *len_out = (size_t)n;
    return buf;
}

int test_summary(void) {
    fprintf(stderr, "%d checks, %d failures\n", test_checks, test_failures);
    return test_failures ? 1 : 0;
}

void test_q8_activation_error(const float *x, long n, float *e) {
    for (long b = 0; b < n / 32; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b * 32 + j]));
        const float d = amax / 127.0f, D = st_fp16_to_f32(st_f32_to_fp16(d));
        for (int j = 0; j < 32; j++) e[b * 32 + j] = d / 2 + 127 * fabsf(d - D) + 1e-6f;
    }
}
