/* test_hop_trace.c — common/hop_trace.h: off without STRATA_HOP_TRACE (no
 * file); with it, a child's marks (batch 0 left out) are in PREFIX.<pid> at
 * its exit, in order, with their values; a prefix in a missing directory
 * costs a message, not the process. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/hop_trace.h"
#include "tests/testutil.h"

/* Runs the marks in a child (the switch is read once per process); its pid. */
static pid_t child(const char *prefix)
{
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        if (prefix)
            setenv("STRATA_HOP_TRACE", prefix, 1);
        else
            unsetenv("STRATA_HOP_TRACE");
        st_hop_mark("send", 7, 1000);
        st_hop_mark("recv", 0, 2000); /* control frame: not kept */
        st_hop_mark("wake", 18446744073709551615ull, 18446744073709551615ull);
        exit(st_hop_trace_on() ? 0 : 3);
    }
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st));
    CHECK_EQ_INT(WEXITSTATUS(st), prefix ? 0 : 3);
    return pid;
}

int main(void)
{
    char dir[] = "/tmp/test_hop_trace.XXXXXX";
    REQUIRE(mkdtemp(dir));
    char prefix[256], path[300];
    snprintf(prefix, sizeof prefix, "%s/trace", dir);

    pid_t pid = child(NULL); /* off: nothing written */
    snprintf(path, sizeof path, "%s.%d", prefix, (int)pid);
    CHECK(access(path, F_OK) != 0);

    pid = child(prefix);
    snprintf(path, sizeof path, "%s.%d", prefix, (int)pid);
    FILE *f = fopen(path, "r");
    REQUIRE_MSG(f, "no trace file %s", path);
    char buf[512] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    CHECK_EQ_INT(n, strlen("send 7 1000\nwake 18446744073709551615 18446744073709551615\n"));
    CHECK(strcmp(buf, "send 7 1000\nwake 18446744073709551615 18446744073709551615\n") == 0);
    unlink(path);

    snprintf(prefix, sizeof prefix, "%s/missing/trace", dir); /* cannot be written: still exits 0 */
    child(prefix);
    CHECK(rmdir(dir) == 0);
    return test_summary();
}
