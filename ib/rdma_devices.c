/* rdma_devices.c — lists RDMA devices and ports with libibverbs (rdma.h). */
#include "ib/rdma.h"

#include <infiniband/verbs.h>
#include <stdio.h>
#include <string.h>

static int roce_v2_gid(struct ibv_context *ctx, int port)
{
    struct ibv_gid_entry ent[256];
    ssize_t n = ibv_query_gid_table(ctx, ent, 256, 0);
    for (ssize_t i = 0; i < n; i++) {
        const uint8_t *g = ent[i].gid.raw;
        static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if ((int)ent[i].port_num == port && ent[i].gid_type == IBV_GID_TYPE_ROCE_V2 && memcmp(g, v4mapped, 12) == 0)
            return (int)ent[i].gid_index;
    }
    return -1;
}

int rdma_list_devices(rdma_device *out, int max, st_err *err)
{
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list) return 0; /* no verbs support at all: no device */
    int k = 0;
    for (int i = 0; i < n && k < max; i++) {
        struct ibv_context *ctx = ibv_open_device(list[i]);
        if (!ctx) {
            st_errf(err, "rdma: cannot open %s", ibv_get_device_name(list[i]));
            ibv_free_device_list(list);
            return -1;
        }
        rdma_device *d = &out[k++];
        memset(d, 0, sizeof *d);
        snprintf(d->name, sizeof d->name, "%s", ibv_get_device_name(list[i]));
        struct ibv_device_attr da;
        int nports = ibv_query_device(ctx, &da) == 0 ? da.phys_port_cnt : 0;
        for (int p = 1; p <= nports && d->n_ports < RDMA_MAX_PORTS; p++) {
            struct ibv_port_attr pa;
            if (ibv_query_port(ctx, (uint8_t)p, &pa)) continue;
            rdma_port *rp = &d->ports[d->n_ports++];
            rp->num = p;
            rp->active = pa.state == IBV_PORT_ACTIVE;
            rp->ethernet = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
            rp->roce_v2_gid = rp->ethernet ? roce_v2_gid(ctx, p) : -1;
        }
        ibv_close_device(ctx);
    }
    ibv_free_device_list(list);
    return k;
}
