/* simd_level.h — runs a numeric test at the SIMD level ctest forces.
 *
 * strata_test(... SIMD_LEVELS) registers NAME.scalar, NAME.avx2 and
 * NAME.avx512 with STRATA_SIMD set to that level. test_simd_level_or_skip()
 * applies it (cpu_matmul_set_level: matmul, attention and SwiGLU follow) and
 * exits with ctest's skip code 77 when this CPU lacks the level, so every
 * level the machine has is exercised and the others say so. */
#ifndef STRATA_TESTS_SIMD_LEVEL_H
#define STRATA_TESTS_SIMD_LEVEL_H

#include <stdio.h>
#include <stdlib.h>

#include "compute/cpu/matmul.h"

static inline void test_simd_level_or_skip(void) {
    const char *want = getenv("STRATA_SIMD");
    if (want && *want) {
        st_err err = {{0}};
        if (cpu_matmul_set_level(want, &err) != 0) {
            fprintf(stderr, "SKIP: %s\n", err.msg);
            exit(77);
        }
    }
    fprintf(stderr, "SIMD level: %s\n", cpu_simd_level());
}

#endif
