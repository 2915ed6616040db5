/* gpu_links.h — the GPU↔GPU and GPU↔NIC link matrix of one node, in the
 * classes of `nvidia-smi topo -m`, and the seed's TP rule on top of it.
 *
 * Classes, best first (the order of enum link_class):
 *   X     the device itself
 *   NV#   # bonded NVLinks (through NVSwitch or direct)
 *   PIX   at most one PCIe switch between the two
 *   PXB   several PCIe switches, without the host bridge
 *   PHB   through a PCIe host bridge (the CPU's root complex)
 *   NODE  between host bridges of one NUMA node
 *   SYS   across the SMP interconnect between NUMA nodes (QPI/UPI/xGMI)
 * Sources: nvidia-smi's text (gpu_links_parse_smi) or sysfs PCI paths
 * (pci_path_class; NVLink is not visible there: NVML supplies NV#).
 *
 * TP rule (DESIGN.md, seeds): TP covers GPUs joined by NVLink; where GPUs are
 * joined only over PCIe (PIX..SYS) TP is at most 2. gpu_links_tp_rule gives
 * the largest TP that rule allows (a power of two, the shard plans need it).
 */
#ifndef STRATA_IB_GPU_LINKS_H
#define STRATA_IB_GPU_LINKS_H

#include <stddef.h>

#include "common/err.h"

#define GPU_LINKS_MAX_GPU 16
#define GPU_LINKS_MAX_NIC 32

typedef enum link_class {
    LINK_X = 0,
    LINK_NV,
    LINK_PIX,
    LINK_PXB,
    LINK_PHB,
    LINK_NODE,
    LINK_SYS,
    LINK_UNKNOWN
} link_class;

typedef struct gpu_link {
    link_class cls;
    int nv; /* NVLinks when cls == LINK_NV */
} gpu_link;

typedef struct gpu_links {
    int n_gpu, n_nic;
    gpu_link gg[GPU_LINKS_MAX_GPU][GPU_LINKS_MAX_GPU];
    gpu_link gn[GPU_LINKS_MAX_GPU][GPU_LINKS_MAX_NIC];
    char nic[GPU_LINKS_MAX_NIC][64]; /* "mlx5_0" (nvidia-smi's NIC legend), or "NIC3" */
    int gpu_numa[GPU_LINKS_MAX_GPU]; /* NUMA node, -1 when unknown */
    char busid[GPU_LINKS_MAX_GPU][16]; /* PCI bus id ("0000:17:00.0"), "" when unknown */
} gpu_links;

/* "X", "NV18", "PIX", ... ("?" for LINK_UNKNOWN). buf >= 8 bytes. */
const char *gpu_link_str(gpu_link l, char *buf, size_t cap);
/* Parses one cell of the matrix ("NV12", "PXB", ...). 0, or -1 when unknown. */
int gpu_link_parse(const char *s, gpu_link *out);

/* Parses the text of `nvidia-smi topo -m` (terminal escapes allowed): the
 * header row names GPU<i> and NIC<j> columns, one row per GPU and NIC, then
 * the legend, whose "NIC<j>: <name>" lines name the NICs. GPU rows' "NUMA
 * Affinity" column fills gpu_numa. 0, or -1 + err on a malformed matrix
 * (unknown class, missing cells, a non-symmetric GPU block, too many devices). */
int gpu_links_parse_smi(const char *text, gpu_links *out, st_err *err);

/* The class between two PCI devices from their sysfs paths (realpath of
 * /sys/bus/pci/devices/<busid>, "/sys/devices/pci0000:00/0000:00:01.0/...")
 * and NUMA nodes (-1 = unknown: then different root complexes count as NODE).
 * Same path: LINK_X. Different root complex: NODE (same NUMA) or SYS. Same
 * root complex: PHB when they part at the root port, PIX when each side has
 * at most one bridge below the switch where they part, else PXB. */
link_class pci_path_class(const char *a, const char *b, int numa_a, int numa_b);

/* The largest TP the rule allows on this node: the largest power of two not
 * above the biggest set of GPUs that are pairwise NVLinked, and at most 2
 * when no two GPUs are NVLinked (1 GPU: 1, none: 0). When `why` is given it
 * gets a one-line reason ("8 GPUs NVLinked (NV18)", "no NVLink: PCIe (SYS) caps TP at 2"). */
int gpu_links_tp_rule(const gpu_links *l, char *why, size_t why_cap);

/* The TP to run given an operator's request (`want` 0 = the rule's value):
 * want, when the rule allows it; above the rule it is still honoured (the
 * operator overrides) and *overridden is set so the caller warns. */
int gpu_links_tp_pick(const gpu_links *l, int want, int *overridden);

/* l with its GPUs in the order of busids[n] (CUDA's device order, as
 * registration reports the GPUs): GPU i of out is the GPU of l whose PCI bus
 * id is busids[i] (the domain's width and the case do not matter:
 * "00000000:17:00.0" is "0000:17:00.0"); NICs unchanged. 0, or -1 + err
 * when a bus id is malformed or not one of l's GPUs. */
int gpu_links_reorder(const gpu_links *l, const char *const *busids, int n, gpu_links *out, st_err *err);

/* One-line link summary for `stratactl nodes`: "8 GPU: NV18 x28; 8 NIC: PIX/PXB". */
void gpu_links_summary(const gpu_links *l, char *buf, size_t cap);

#endif
