/* test_topo.c — ib/topo.h: topology detection on this machine against
 * sched_getaffinity and sysfs, and the exact NCCL_IB_* text strata-topo
 * prints for faked RDMA device lists (derived with ib/nccl_env.c). */
#define _GNU_SOURCE
#include <dirent.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "ib/topo.h"
#include "tests/testutil.h"

/* Text of topo_print_nccl_env(devs, n), or NULL when it fails. Caller frees. */
static char *nccl_text(const rdma_device *devs, int n, st_err *err)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    REQUIRE(f);
    int rc = topo_print_nccl_env(f, devs, n, err);
    fclose(f);
    if (rc != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

static rdma_device dev(const char *name, int n_ports, const rdma_port *ports)
{
    rdma_device d;
    memset(&d, 0, sizeof d);
    snprintf(d.name, sizeof d.name, "%s", name);
    d.n_ports = n_ports;
    for (int i = 0; i < n_ports; i++) d.ports[i] = ports[i];
    return d;
}

#define HDR "# NCCL_IB_* from strata-topo --nccl-env (ib/topo.h)\n"

static void test_nccl_env_faked(void)
{
    st_err err = {{0}};
    char *s = nccl_text(NULL, 0, &err);
    CHECK_EQ_STR(s, HDR "# no RDMA device: NCCL_IB_* left unset (NCCL uses its socket transport)\n");
    free(s);

    /* InfiniBand: two HCAs, the second with port 1 down and port 2 up. */
    rdma_port ib1[] = {{.num = 1, .active = true, .ethernet = false, .roce_v2_gid = -1}};
    rdma_port ib2[] = {{.num = 1, .active = false, .roce_v2_gid = -1}, {.num = 2, .active = true, .roce_v2_gid = -1}};
    rdma_device ib[] = {dev("mlx5_0", 1, ib1), dev("mlx5_1", 2, ib2)};
    s = nccl_text(ib, 2, &err);
    CHECK_EQ_STR(s, HDR "NCCL_IB_HCA==mlx5_0:1,mlx5_1:2\n");
    free(s);

    /* RoCE: the GID index of the first active RoCE port (3), not the down one (5). */
    rdma_port r0[] = {{.num = 1, .active = false, .ethernet = true, .roce_v2_gid = 5}};
    rdma_port r1[] = {{.num = 1, .active = true, .ethernet = true, .roce_v2_gid = 3}};
    rdma_port r2[] = {{.num = 1, .active = true, .ethernet = true, .roce_v2_gid = 1}};
    rdma_device roce[] = {dev("mlx5_0", 1, r0), dev("mlx5_2", 1, r1), dev("mlx5_3", 1, r2)};
    s = nccl_text(roce, 3, &err);
    CHECK_EQ_STR(s, HDR "NCCL_IB_HCA==mlx5_2:1,mlx5_3:1\nNCCL_IB_GID_INDEX=3\n");
    free(s);

    /* Devices but every port down. */
    s = nccl_text(roce, 1, &err);
    CHECK_EQ_STR(s, HDR "# no active RDMA port: NCCL_IB_* left unset (NCCL uses its socket transport)\n");
    free(s);

    /* An HCA list longer than 4 KiB is an error, not a truncated list. */
    enum { N = 500 }; /* 500 x "mlx5_NNN:1," = 5500 bytes */
    rdma_device *many = calloc(N, sizeof *many);
    REQUIRE(many);
    for (int i = 0; i < N; i++) {
        char name[32];
        snprintf(name, sizeof name, "mlx5_%d", 100 + i);
        many[i] = dev(name, 1, ib1);
    }
    s = nccl_text(many, N, &err);
    CHECK(s == NULL);
    CHECK_MSG(strstr(err.msg, "NCCL_IB_HCA does not fit") != NULL, "err: %s", err.msg);
    free(s);
    free(many);
}

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
    CHECK_EQ_INT(topo_print(f, &t, NULL, 0, &err), 0);
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
    test_nccl_env_faked();
    test_detect();
    return test_summary();
}
