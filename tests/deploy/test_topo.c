/* test_topo.c — ib/topo.h: topology detection on this machine against
 * sched_getaffinity and sysfs (the fabric settings: test_fabric_env.c). */
#define _GNU_SOURCE
#include <dirent.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "ib/topo.h"
#include "tests/testutil.h"

/* NUMA nodes listed in sysfs (node0, node1, ...), or 1 without NUMA support. */
static int sysfs_numa_nodes(void)
{
    DIR *d = opendir("/sys/devices/system/node");
    if (!d) return 1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (!strncmp(e->d_name, "node", 4) && e->d_name[4] >= '0' && e->d_name[4] <= '9') n++;
    closedir(d);
    return n ? n : 1;
}

static void test_detect(void)
{
    topo_info t;
    st_err err = {{0}};
    REQUIRE_MSG(topo_detect(&t, &err) == 0, "%s", err.msg);
    cpu_set_t set;
    REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
    CHECK_EQ_INT(t.n_pus, CPU_COUNT(&set));
    CHECK(t.n_cores >= 1 && t.n_cores <= t.n_pus);
    CHECK(t.n_packages >= 1);
    CHECK_EQ_INT(t.n_numa, sysfs_numa_nodes());
    int pus = 0;
    for (int i = 0; i < t.n_numa; i++) {
        pus += t.numa[i].n_pus;
        CHECK(t.numa[i].memory_bytes > 0);
    }
    CHECK_EQ_INT(pus, t.n_pus);
    /* Every CPU we may use appears in its node's list; with one node that is all. */
    if (t.n_numa == 1) {
        char want[64];
        int first = -1, last = -1, contiguous = 1;
        for (int c = 0; c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &set)) {
                if (first < 0) first = c;
                else if (c != last + 1) contiguous = 0;
                last = c;
            }
        if (contiguous) {
            if (first == last) snprintf(want, sizeof want, "%d", first);
            else snprintf(want, sizeof want, "%d-%d", first, last);
            CHECK_EQ_STR(t.numa[0].cpus, want);
        }
    }
    for (int i = 0; i < t.n_gpus; i++) CHECK_EQ_INT(t.gpus[i].vendor, 0x10de);

    /* The report names the CPU count and the node(s). */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    REQUIRE(f);
    fabric_env fe;
    fabric_node none = {0};
    CHECK_EQ_INT(fabric_derive(&none, NULL, &fe, &err), 0);
    CHECK_EQ_INT(topo_print(f, &t, NULL, 0, &fe, &err), 0);
    fclose(f);
    char want[128];
    snprintf(want, sizeof want, "cpus: %d logical CPUs, %d cores", t.n_pus, t.n_cores);
    CHECK_MSG(strstr(buf, want) != NULL, "report:\n%s", buf);
    snprintf(want, sizeof want, "numa: %d node", t.n_numa);
    CHECK_MSG(strstr(buf, want) != NULL, "report:\n%s", buf);
    CHECK(strstr(buf, "rdma: no RDMA device") != NULL);
    free(buf);
}

int main(void)
{
    test_detect();
    return test_summary();
}
