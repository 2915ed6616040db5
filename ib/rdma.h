/* rdma.h — RDMA device discovery (libibverbs) and the NCCL environment
 * derived from it (NCCL_IB_HCA, NCCL_IB_GID_INDEX for RoCE).
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

/* NCCL settings for devs: hca = "dev:port,..." over active ports (empty when
 * none); gid_index = the RoCE v2 GID index of the first active RoCE port, or
 * -1 when no port is RoCE (then NCCL_IB_GID_INDEX is left unset). Returns 0,
 * or -1 when hca_cap is too small. */
int rdma_nccl_env(const rdma_device *devs, int n, char *hca, size_t hca_cap, int *gid_index, st_err *err);

#endif
