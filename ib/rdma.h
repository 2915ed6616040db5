/* rdma.h — RDMA device discovery (libibverbs). The NCCL/UCX settings derived
 * from the devices are ib/fabric_env.h's.
 *
 * UCX finds RDMA devices by itself (UCX_NET_DEVICES narrows them); this is
 * for diagnostics (`strata-rdma-devices`) and for NCCL's IB transport, which
 * needs its HCA list and, on RoCE, the RoCE v2 GID index.
 */
#ifndef STRATA_IB_RDMA_H
#define STRATA_IB_RDMA_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"

#define RDMA_MAX_PORTS 4

typedef struct rdma_port {
    int num;           /* 1-based port number */
    bool active;       /* IBV_PORT_ACTIVE */
    bool ethernet;     /* link layer Ethernet (RoCE) rather than InfiniBand */
    int roce_v2_gid;   /* index of the first RoCE v2 IPv4-mapped GID, -1 if none */
} rdma_port;

typedef struct rdma_device {
    char name[64];     /* "mlx5_0" */
    int n_ports;
    rdma_port ports[RDMA_MAX_PORTS];
} rdma_device;

/* Fills up to max devices; returns how many (0 = no RDMA device, not an
 * error), or -1 when libibverbs fails to open a listed device. */
int rdma_list_devices(rdma_device *out, int max, st_err *err);

#endif
