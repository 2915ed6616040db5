/* nvml_links.h — the NVLink part of a node's link matrix, read through NVML
 * opened at run time (dlopen of libnvidia-ml.so.1; no nvml.h is needed: the
 * few stable entry points used are declared in nvml_links.c), and the whole
 * matrix of this node: PCIe classes from sysfs (fabric_env.h) with NVLink
 * from NVML on top.
 *
 * GPUs are matched by index: NVML and sysfs both enumerate in PCI bus order
 * (CUDA's default order, CUDA_DEVICE_ORDER=FASTEST_FIRST, may differ; the
 * TP rule only counts how many GPUs are NVLinked, which does not depend on
 * the order).
 */
#ifndef STRATA_IB_NVML_LINKS_H
#define STRATA_IB_NVML_LINKS_H

#include "common/err.h"
#include "ib/gpu_links.h"

/* Marks every GPU pair NVML reports NVLink peer-to-peer for as NV<k>, k the
 * smaller count of active NVLinks of the two. lib: the NVML library to open
 * (NULL: $STRATA_NVML_LIBRARY, else libnvidia-ml.so.1). Returns the number
 * of GPUs NVML saw, or -1 + err when NVML is absent or fails (l unchanged). */
int nvml_overlay_nvlinks(gpu_links *l, const char *lib, st_err *err);

/* This node's matrix: fabric_scan(sysroot) + fabric_links, then NVLink from
 * NVML when it is there. 0, or -1 + err when sysfs cannot be read. */
int node_links_detect(const char *sysroot, gpu_links *out, st_err *err);

#endif
