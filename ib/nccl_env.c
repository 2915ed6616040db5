/* nccl_env.c — NCCL_IB_HCA / NCCL_IB_GID_INDEX from detected devices (rdma.h). */
#include "ib/rdma.h"

#include <stdio.h>

int rdma_nccl_env(const rdma_device *devs, int n, char *hca, size_t hca_cap, int *gid_index, st_err *err)
{
    size_t used = 0;
    if (hca_cap == 0) return st_errf(err, "rdma: no room for NCCL_IB_HCA");
    hca[0] = 0;
    *gid_index = -1;
    for (int i = 0; i < n; i++)
        for (int p = 0; p < devs[i].n_ports; p++) {
            const rdma_port *rp = &devs[i].ports[p];
            if (!rp->active) continue;
            int w = snprintf(hca + used, hca_cap - used, "%s%s:%d", used ? "," : "", devs[i].name, rp->num);
            if (w < 0 || (size_t)w >= hca_cap - used) return st_errf(err, "rdma: NCCL_IB_HCA does not fit %zu bytes", hca_cap);
            used += (size_t)w;
            if (rp->ethernet && *gid_index < 0) *gid_index = rp->roce_v2_gid;
        }
    return 0;
}
