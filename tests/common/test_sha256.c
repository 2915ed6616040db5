/* test_sha256.c — st_file_sha256 and st_sha256_parts (common/sha256.h): FIPS 180-4 vectors, a
 * file longer than the 1 MiB read block, and the errors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/sha256.h"
#include "tests/testutil.h"

/* Writes n bytes to a new temporary file; returns its path (static buffer). */
static const char *temp_file(const unsigned char *data, size_t n)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/test_sha256.XXXXXX");
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    REQUIRE(n == 0 || write(fd, data, n) == (ssize_t)n);
    close(fd);
    return path;
}

static void check_digest(const unsigned char *data, size_t n, const char *want)
{
    const char *path = temp_file(data, n);
    char hex[65] = {0};
    st_err err = {{0}};
    CHECK_EQ_INT(st_file_sha256(path, hex, &err), 0);
    CHECK_EQ_STR(hex, want);
    unlink(path);
}

/* st_sha256_parts: "abc" as one part and as "a" + "" + "bc" give the FIPS digest. */
static void check_parts(void)
{
    static const unsigned char want[32] = {
        0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea, 0x41, 0x41, 0x40, 0xde, 0x5d, 0xae, 0x22, 0x23,
        0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17, 0x7a, 0x9c, 0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad};
    unsigned char out[32];
    const void *one[] = {"abc"};
    size_t one_len[] = {3};
    CHECK_EQ_INT(st_sha256_parts(one, one_len, 1, out), 0);
    CHECK(memcmp(out, want, 32) == 0);
    const void *three[] = {"a", NULL, "bc"};
    size_t three_len[] = {1, 0, 2};
    memset(out, 0, sizeof out);
    CHECK_EQ_INT(st_sha256_parts(three, three_len, 3, out), 0);
    CHECK(memcmp(out, want, 32) == 0);
}

int main(void)
{
    check_parts();
    check_digest((const unsigned char *)"", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    check_digest((const unsigned char *)"abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");

    /* 2 MiB + 12345 bytes: three reads, the last one short. */
    size_t n = (2u << 20) + 12345;
    unsigned char *big = malloc(n);
    REQUIRE(big);
    for (size_t i = 0; i < n; i++) big[i] = (unsigned char)((i * 31 + 7) & 255);
    check_digest(big, n, "8a7235b1459d77c512e367b38b2a4170a6d5bdb240b5d577b56726bc6f1a8b48");
    free(big);

    char hex[65];
    st_err err = {{0}};
    CHECK_EQ_INT(st_file_sha256("/nonexistent/model.gguf", hex, &err), -1);
    CHECK_EQ_STR(err.msg, "/nonexistent/model.gguf: No such file or directory");
    err.msg[0] = 0;
    CHECK_EQ_INT(st_file_sha256("/tmp", hex, &err), -1); /* a directory opens, but does not read */
    CHECK_EQ_STR(err.msg, "/tmp: cannot hash the file");
    return test_summary();
}
