/* rdma_tool.c — strata-rdma-devices [--sysroot DIR]: prints this node's RDMA
 * ports and the NCCL/UCX settings derived from them, with the same detection
 * (fabric_node_detect), derivation and printer as strata-topo --nccl-env and
 * the worker (ib/fabric_env.h), or "no RDMA device found". --sysroot reads a
 * sysfs tree elsewhere (a fixture, a host's /sys in a container). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/version.h"
#include "ib/fabric_env.h"

int main(int argc, char **argv)
{
    const char *sysroot = "/";
    if (argc == 2 && !strcmp(argv[1], "--version")) {
        st_version_print(stdout, "strata-rdma-devices");
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "--sysroot")) {
        sysroot = argv[2];
    } else if (argc > 1) {
        bool help = argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"));
        fprintf(help ? stdout : stderr, "usage: strata-rdma-devices [--sysroot DIR] [--version]\n");
        return help ? 0 : 2;
    }
    st_err err = {{0}};
    fabric_node *node = calloc(1, sizeof *node);
    fabric_env fe;
    if (!node) {
        fprintf(stderr, "strata-rdma-devices: out of memory\n");
        return 1;
    }
    if (fabric_node_detect(sysroot, node, &err) != 0) {
        fprintf(stderr, "strata-rdma-devices: %s\n", err.msg);
        free(node);
        return 1;
    }
    if (node->n_port == 0) {
        printf("no RDMA device found (UCX will use TCP/shared memory; NCCL_IB_HCA left unset)\n");
        free(node);
        return 0;
    }
    for (int i = 0; i < node->n_port; i++) {
        const fabric_port *p = &node->port[i];
        printf("%s port %d: %s, %s, RoCE v2 GID index %d%s%s\n", p->dev, p->port, p->active ? "active" : "down",
               p->ethernet ? "Ethernet (RoCE)" : "InfiniBand", p->roce_v2_gid, p->netdev[0] ? ", netdev " : "",
               p->netdev);
    }
    int rc = fabric_derive(node, NULL, &fe, &err);
    free(node);
    if (rc != 0) {
        fprintf(stderr, "strata-rdma-devices: %s\n", err.msg);
        return 1;
    }
    fabric_env_print(stdout, &fe);
    return 0;
}
