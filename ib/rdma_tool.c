/* rdma_tool.c — strata-rdma-devices: prints the RDMA devices and the NCCL
 * environment derived from them, or "no RDMA device found". */
#include <stdio.h>
#include <string.h>

#include "common/version.h"
#include "ib/rdma.h"

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--version")) {
        st_version_print(stdout, "strata-rdma-devices");
        return 0;
    }
    if (argc > 1) {
        fprintf(stderr, "usage: strata-rdma-devices [--version]\n");
        return strcmp(argv[1], "--help") && strcmp(argv[1], "-h") ? 2 : 0;
    }
    rdma_device devs[16];
    st_err err;
    int n = rdma_list_devices(devs, 16, &err);
    if (n < 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    if (n == 0) {
        printf("no RDMA device found (UCX will use TCP/shared memory; NCCL_IB_HCA left unset)\n");
        return 0;
    }
    for (int i = 0; i < n; i++)
        for (int p = 0; p < devs[i].n_ports; p++)
            printf("%s port %d: %s, %s, RoCE v2 GID index %d\n", devs[i].name, devs[i].ports[p].num,
                   devs[i].ports[p].active ? "active" : "down", devs[i].ports[p].ethernet ? "Ethernet (RoCE)" : "InfiniBand",
                   devs[i].ports[p].roce_v2_gid);
    char hca[1024];
    int gid;
    if (rdma_nccl_env(devs, n, hca, sizeof hca, &gid, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    printf("NCCL_IB_HCA=%s\n", hca);
    if (gid >= 0) printf("NCCL_IB_GID_INDEX=%d\n", gid);
    return 0;
}
