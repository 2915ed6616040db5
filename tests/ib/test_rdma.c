/* test_rdma.c — RDMA device listing (this machine has none) and the NCCL
 * environment derived from a device list. */
#include "ib/rdma.h"
#include "tests/testutil.h"

int main(void)
{
    rdma_device devs[8];
    st_err err;
    int n = rdma_list_devices(devs, 8, &err);
    CHECK(n >= 0);
    fprintf(stderr, "%d RDMA device(s) on this machine\n", n);

    rdma_device d[2] = {{.name = "mlx5_0", .n_ports = 2,
                         .ports = {{.num = 1, .active = true, .ethernet = true, .roce_v2_gid = 3},
                                   {.num = 2, .active = false, .ethernet = true, .roce_v2_gid = 5}}},
                        {.name = "mlx5_1", .n_ports = 1, .ports = {{.num = 1, .active = true, .roce_v2_gid = -1}}}};
    char hca[64];
    int gid = 0;
    CHECK_EQ_INT(rdma_nccl_env(d, 2, hca, sizeof hca, &gid, &err), 0);
    CHECK_EQ_STR(hca, "mlx5_0:1,mlx5_1:1");
    CHECK_EQ_INT(gid, 3);
    CHECK_EQ_INT(rdma_nccl_env(d + 1, 1, hca, sizeof hca, &gid, &err), 0); /* InfiniBand only */
    CHECK_EQ_STR(hca, "mlx5_1:1");
    CHECK_EQ_INT(gid, -1);
    CHECK_EQ_INT(rdma_nccl_env(d, 0, hca, sizeof hca, &gid, &err), 0);
    CHECK_EQ_STR(hca, "");
    CHECK_EQ_INT(rdma_nccl_env(d, 2, hca, 8, &gid, &err), -1); /* does not fit */
    return test_summary();
}
