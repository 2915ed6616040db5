/* test_exposure.c — st_addr_is_loopback and st_exposure_check (common/exposure.h). */
#include <string.h>

#include "common/exposure.h"
#include "tests/testutil.h"

int main(void)
{
    const char *loopback[] = {"127.0.0.1", "127.0.0.1:8000", "127.9.8.7:1", "localhost", "LOCALHOST:7070",
                              "::1", "[::1]", "[::1]:7001"};
    for (size_t i = 0; i < sizeof loopback / sizeof *loopback; i++)
        CHECK(st_addr_is_loopback(loopback[i]));
    const char *exposed[] = {"0.0.0.0", "0.0.0.0:8000", ":8000", "", "::", "[::]:7070", "10.0.0.1:7001",
                             "128.0.0.1", "node-a:7001", "127.0.0.1.evil.example:80", "[::1", NULL};
    for (size_t i = 0; i < sizeof exposed / sizeof *exposed; i++)
        CHECK(!st_addr_is_loopback(exposed[i]));

    char err[256] = "";
    CHECK_EQ_INT(st_exposure_check("HTTP API", "127.0.0.1:8000", false, false, err, sizeof err), 0);
    CHECK_EQ_INT(st_exposure_check("HTTP API", "0.0.0.0:8000", true, false, err, sizeof err), 0);
    CHECK_EQ_INT(st_exposure_check("HTTP API", "0.0.0.0:8000", false, true, err, sizeof err), 0);
    CHECK_EQ_INT(st_exposure_check("gRPC control", "0.0.0.0:7070", false, false, err, sizeof err), -1);
    CHECK(strstr(err, "gRPC control") != NULL);
    CHECK(strstr(err, "0.0.0.0:7070") != NULL);
    CHECK(strstr(err, "--insecure") != NULL);
    return test_summary();
}
