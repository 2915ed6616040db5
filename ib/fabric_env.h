/* fabric_env.h — the NCCL and UCX fabric settings of one node (DESIGN seed §8),
 * derived from its GPUs and RDMA ports, printed by strata-topo and
 * strata-rdma-devices (one printer: fabric_env_print) and applied by the
 * worker to its own environment before it initialises UCX or NCCL.
 *
 * Derivation (fabric_derive):
 *   rails      every active port of the NICs nearest (gpu_links.h classes,
 *              from the PCI paths) to each GPU; without GPU information every
 *              active port. A NIC farther from every GPU than another NIC
 *              (a storage or front-end NIC) is not a rail.
 *   NCCL_IB_HCA              "=" + "dev:port,..." (the leading '=' makes NCCL
 *                            match exact names: "mlx5_1" would also match mlx5_10..)
 *   NCCL_IB_GID_INDEX        RoCE rails only: the RoCE v2 IPv4-mapped GID index.
 *                            NCCL takes one index for all ports; when the rails
 *                            disagree the first is used and a warning is noted.
 *   NCCL_NET_GDR_LEVEL       the worst GPU-to-nearest-rail class, PIX or PXB;
 *                            beyond a PCIe switch GPUDirect RDMA crosses the
 *                            root complex, so it is capped at PXB (GDR off there).
 *                            Only with GPU information.
 *   NCCL_SOCKET_IFNAME       config, else the netdev of the first RoCE rail
 *                            ("=" exact match); unset for IB-only rails.
 *   NCCL_IB_TC, NCCL_IB_SL   config only (fabric QoS policy), 0..255 / 0..15.
 *   NCCL_IB_QPS_PER_CONNECTION  config, else 4 on RoCE (ECMP spreading), unset on IB.
 *   UCX_NET_DEVICES          the rails, "dev:port,..."
 *   UCX_IB_GID_INDEX         as NCCL_IB_GID_INDEX
 *   UCX_IB_TRAFFIC_CLASS     as NCCL_IB_TC
 */
#ifndef STRATA_IB_FABRIC_ENV_H
#define STRATA_IB_FABRIC_ENV_H

#include <stdbool.h>
#include <stdio.h>

#include "common/err.h"
#include "ib/gpu_links.h"
#include "ib/rdma.h"

#define FABRIC_MAX_PORTS 64
#define FABRIC_MAX_VARS 16
#define FABRIC_MAX_NOTES 8

typedef struct fabric_gpu {
    char busid[16];     /* "0000:17:00.0" */
    char pci_path[512]; /* sysfs realpath, "" when unknown */
    int numa;           /* -1 when unknown */
} fabric_gpu;

typedef struct fabric_port {
    char dev[64];       /* "mlx5_0" */
    int port;           /* 1-based */
    bool active, ethernet;
    int roce_v2_gid;    /* -1: none (or not RoCE) */
    char netdev[32];    /* "ens1f0np0", "ib0", "" when none */
    char pci_path[512];
    int numa;
} fabric_port;

/* What the derivation looks at. */
typedef struct fabric_node {
    int n_gpu;
    fabric_gpu gpu[GPU_LINKS_MAX_GPU];
    int n_port;
    fabric_port port[FABRIC_MAX_PORTS];
} fabric_node;

/* Operator policy (the node's config); -1 / 0 / NULL = not set. */
typedef struct fabric_config {
    int ib_tc;                 /* 0..255 */
    int ib_sl;                 /* 0..15 */
    int qps_per_connection;    /* 1..128; 0 = derived */
    const char *socket_ifname; /* NULL = derived */
} fabric_config;
#define FABRIC_CONFIG_DEFAULT ((fabric_config){-1, -1, 0, NULL})

/* The node-config flags strata-topo and strata-worker share: flag is
 * "--ib-tc" (0..255), "--ib-sl" (0..15), "--qps-per-connection" (1..128) or
 * "--socket-ifname" (an interface name). 0 when set, 1 when flag is not one of
 * them, -1 + err ("--ib-sl '16' is not a number in 0..15") on a bad value.
 * value must outlive cfg (socket_ifname points into it). */
int fabric_config_option(fabric_config *cfg, const char *flag, const char *value, st_err *err);

typedef struct fabric_var {
    char key[40];
    char value[1024];
    bool from_config; /* the node's config (fabric_config), not the topology */
} fabric_var;

typedef struct fabric_env {
    int n;
    fabric_var v[FABRIC_MAX_VARS];
    int n_notes; /* '#' lines: why something is unset, warnings */
    char notes[FABRIC_MAX_NOTES][192];
} fabric_env;

/* Reads GPUs (/sys/bus/pci/devices, vendor 0x10de, class 0x03xxxx) and RDMA
 * ports (/sys/class/infiniband/<dev>/ports/<p>/{state,link_layer,gids,
 * gid_attrs/types,gid_attrs/ndevs}, <dev>/device -> the PCI function) under
 * `sysroot` ("/" on a node, a fixture tree in tests). Missing directories are
 * no devices, not an error. 0, or -1 + err on an unreadable tree. */
int fabric_scan(const char *sysroot, fabric_node *out, st_err *err);

/* This node as every tool derives it (strata-topo, strata-rdma-devices, the
 * worker): fabric_scan(sysroot); on the real root ("/") with no port in
 * /sys/class/infiniband (a container) the verbs device list instead
 * (fabric_node_from_rdma: no PCI paths, every active port a rail). 0, or -1
 * + err. */
int fabric_node_detect(const char *sysroot, fabric_node *out, st_err *err);

/* Ports of rdma_list_devices' devices (no PCI paths, no GPUs). 0, or -1 +
 * err with more than FABRIC_MAX_PORTS ports. */
int fabric_node_from_rdma(const rdma_device *devs, int n, fabric_node *out, st_err *err);

/* The settings for node under cfg. 0, or -1 + err on a bad config value or
 * when a list does not fit. */
int fabric_derive(const fabric_node *node, const fabric_config *cfg, fabric_env *out, st_err *err);

/* The PCIe part of the link matrix from the PCI paths: GPU-GPU and GPU-NIC
 * (one NIC per RDMA device, its first port's path) classes; NVLink is not
 * visible in sysfs (NVML reports it). */
void fabric_links(const fabric_node *node, gpu_links *out);

/* The value of key in e, or NULL. */
const char *fabric_env_get(const fabric_env *e, const char *key);

/* KEY=VALUE lines (after a '#' header line and the notes), readable by a
 * POSIX shell (`set -a; . FILE`) and by systemd's EnvironmentFile=. */
void fabric_env_print(FILE *f, const fabric_env *e);

/* Sets each variable in this process's environment unless the operator set it
 * already (the operator wins, also with an empty value); logs one line per
 * variable saying which won:
 *   fabric: NCCL_IB_HCA==mlx5_0:1 (derived from the topology)
 *   fabric: NCCL_IB_TC=106 (from the node's config)
 *   fabric: NCCL_IB_GID_INDEX=5 from the operator's environment wins (derived: 3)
 *   fabric: NCCL_IB_SL=3 (operator's environment, same as derived)
 * Returns how many were set. Call before UCX or NCCL initialise. */
int fabric_env_apply(const fabric_env *e);

#endif
