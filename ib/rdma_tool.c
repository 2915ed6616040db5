/* rdma_tool.c — strata-rdma-devices: prints the RDMA devices and the NCCL
 * and UCX settings derived from them (the printer strata-topo uses), or "no RDMA device found". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/version.h"
#include "ib/fabric_env.h"
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
    /* The same settings and printer as strata-topo --nccl-env (ib/fabric_env.h). */
    fabric_node *node = calloc(1, sizeof *node);
    fabric_env fe;
    if (!node || fabric_node_from_rdma(devs, n, node, &err) || fabric_derive(node, NULL, &fe, &err)) {
        fprintf(stderr, "%s\n", node ? err.msg : "out of memory");
        free(node);
        return 1;
    }
    free(node);
    fabric_env_print(stdout, &fe);
    return 0;
}
