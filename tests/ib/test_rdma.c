/* test_rdma.c — RDMA device listing (this machine has none). The settings
 * derived from devices: tests/ib/test_fabric_env.c. */
#include "ib/rdma.h"
#include "tests/testutil.h"

int main(void)
{
    rdma_device devs[8];
    st_err err;
    int n = rdma_list_devices(devs, 8, &err);
    CHECK(n >= 0);
    fprintf(stderr, "%d RDMA device(s) on this machine\n", n);

    return test_summary();
}
