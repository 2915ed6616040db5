/* testutil.h — a tiny assertion kit for the C tests, and the path to ../shared.
 *
 * CHECK* macros print file:line and the values on failure, count the failure
 * and carry on; a test's main returns test_summary(), which is non-zero when
 * anything failed. REQUIRE* stop the test at once (exit 1).
 */
#ifndef STRATA_TESTS_TESTUTIL_H
#define STRATA_TESTS_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern int test_failures;
extern int test_checks;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        test_checks++;                                                               \
        if (!(cond)) {                                                               \
            test_failures++;                                                         \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                            \
    } while (0)

#define CHECK_MSG(cond, ...)                                                         \
    do {                                                                             \
        test_checks++;                                                               \
        if (!(cond)) {                                                               \
            test_failures++;                                                         \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                            \
            fputc('\n', stderr);                                                     \
        }                                                                            \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                 \
    do {                                                                                   \
        long long _a = (long long)(a), _b = (long long)(b);                                \
        test_checks++;                                                                     \
        if (_a != _b) {                                                                    \
            test_failures++;                                                               \
            fprintf(stderr, "%s:%d: %s == %s failed: %lld != %lld\n", __FILE__, __LINE__, \
                    #a, #b, _a, _b);                                                       \
        }                                                                                  \
    } while (0)

#define CHECK_EQ_STR(a, b)                                                                \
    do {                                                                                  \
        const char *_a = (a), *_b = (b);                                                  \
        test_checks++;                                                                    \
        if (!_a || !_b || strcmp(_a, _b) != 0) {                                          \
            test_failures++;                                                              \
            fprintf(stderr, "%s:%d: %s == %s failed: \"%s\" != \"%s\"\n", __FILE__,      \
                    __LINE__, #a, #b, _a ? _a : "(null)", _b ? _b : "(null)");            \
        }                                                                                 \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                              \
    do {                                                                                   \
        double _a = (double)(a), _b = (double)(b);                                         \
        test_checks++;                                                                     \
        if (!(_a - _b <= (tol) && _b - _a <= (tol))) {                                     \
            test_failures++;                                                               \
            fprintf(stderr, "%s:%d: %s ~= %s failed: %.6g vs %.6g (tol %g)\n", __FILE__, \
                    __LINE__, #a, #b, _a, _b, (double)(tol));                              \
        }                                                                                  \
    } while (0)

#define REQUIRE(cond)                                                                  \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond); \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

#define REQUIRE_MSG(cond, ...)                                                           \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "%s:%d: REQUIRE failed: %s: ", __FILE__, __LINE__, #cond);   \
            fprintf(stderr, __VA_ARGS__);                                                \
            fputc('\n', stderr);                                                         \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

/* Absolute or relative path of a file under the shared data folder
 * ($STRATA_SHARED, else the configured default). Exits with a clear message —
 * never skips — when the folder or the file is missing. Returns a static
 * buffer per call slot (up to 8 live results). */
const char *test_shared_path(const char *rel);

/* Bound on how far quantizing activations to Q8_0 (cpu_quantize_q8, as
 * llama.cpp's matvec does) moves each of the n values of x (n a multiple of
 * 32): e[i] = d/2 + 127 |d - D| + 1e-6 for the 32-block of i, with
 * d = amax/127 and D its f16 rounding (|x - q D| <= |x - q d| + |q| |d - D|;
 * 1e-6 covers the rounding of x * 127/amax). A product with weights w then
 * moves by at most sum_k |w_k| e_k. */
void test_q8_activation_error(const float *x, long n, float *e);

/* Reads a whole file into a malloc'd buffer (NUL-terminated); exits on error. */
char *test_read_file(const char *path, size_t *len_out);

/* Prints "N checks, M failures" and returns the exit code for main. */
int test_summary(void);

#endif
