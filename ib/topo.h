/* topo.h — the node's topology as deployment sees it: CPUs and NUMA nodes
 * (hwloc), NVIDIA GPUs and RDMA HCAs with the NUMA node they hang off (hwloc's
 * PCI / OS-device discovery), and the NCCL_IB_* environment derived from the
 * RDMA devices (rdma.h, ib/fabric_env.h). strata-topo (ib/strata_topo.c) prints
 * it; the worker's systemd unit runs `strata-topo --nccl-env --output FILE`
 * and reads FILE as an EnvironmentFile (docs/deployment.md).
 *
 * GPUs are found on the PCI bus (vendor 0x10de, display class 0x03xx), so they
 * are listed whether or not CUDA is installed; sizes are not known this way.
 */
#ifndef STRATA_IB_TOPO_H
#define STRATA_IB_TOPO_H

#include <stdint.h>
#include <stdio.h>

#include "common/err.h"
#include "ib/fabric_env.h"
#include "ib/rdma.h"

#define TOPO_MAX_NUMA 64
#define TOPO_MAX_PCI 64

typedef struct topo_numa {
    unsigned os_index;      /* Linux node number (/sys/devices/system/node/nodeN) */
    uint64_t memory_bytes;  /* local memory, bytes (0 when unknown) */
    int n_pus;              /* logical CPUs (hardware threads) on it */
    char cpus[256];         /* their OS indexes as a list, "0-15,32-47" */
} topo_numa;

typedef struct topo_pci {
    char name[64];          /* GPU: "0000:17:00.0"; HCA: "mlx5_0" */
    char busid[16];         /* "0000:17:00.0" */
    uint16_t vendor, device;
    int numa;               /* OS index of the closest NUMA node, -1 when unknown */
} topo_pci;

typedef struct topo_info {
    int n_packages, n_cores, n_pus;
    int n_numa;             /* >= 1 (a machine without NUMA is one node) */
    topo_numa numa[TOPO_MAX_NUMA];
    int n_gpus;
    topo_pci gpus[TOPO_MAX_PCI];
    int n_hcas;             /* RDMA devices hwloc saw (for their NUMA node) */
    topo_pci hcas[TOPO_MAX_PCI];
} topo_info;

/* Detects the topology of this machine (the CPUs this process may use).
 * 0, or -1 + err when hwloc fails. */
int topo_detect(topo_info *out, st_err *err);

/* The NUMA node of the RDMA device `name` in t, or -1. */
int topo_hca_numa(const topo_info *t, const char *name);

/* Human-readable report: CPUs, NUMA nodes, GPUs, RDMA devices (devs, n from
 * rdma_list_devices) and the fabric settings (fabric_env_print). 0. */
int topo_print(FILE *f, const topo_info *t, const rdma_device *devs, int n, const fabric_env *fabric,
               st_err *err);

#endif
