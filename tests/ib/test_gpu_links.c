/* test_gpu_links.c — ib/gpu_links.h: `nvidia-smi topo -m` parsing on fixtures
 * of three real layouts (tests/ib/fixtures: an 8-GPU NVSwitch node with 8
 * NICs behind PCIe switches, a 4-GPU PCIe-only box, a 2-socket box), PCI path
 * classification, the TP rule with its operator override, and bad input. */
#include <stdlib.h>
#include <string.h>

#include "ib/gpu_links.h"
#include "ib/nvml_links.h"
#include "tests/testutil.h"

#ifndef FIXTURES
#error "FIXTURES must name tests/ib/fixtures"
#endif

static char *slurp(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", FIXTURES, name);
    FILE *f = fopen(path, "r");
    REQUIRE(f);
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

static const char *cls(gpu_link l) {
    static char b[4][16];
    static int i;
    i = (i + 1) % 4;
    return gpu_link_str(l, b[i], sizeof b[i]);
}

static void test_dgx(void) {
    gpu_links l;
    st_err err = {{0}};
    CHECK_EQ_INT(gpu_links_parse_smi(slurp("dgx-h100-8gpu.txt"), &l, &err), 0);
    CHECK_EQ_INT(l.n_gpu, 8);
    CHECK_EQ_INT(l.n_nic, 8);
    CHECK_EQ_STR(cls(l.gg[0][0]), "X");
    CHECK_EQ_STR(cls(l.gg[0][7]), "NV18");
    CHECK_EQ_STR(cls(l.gg[5][2]), "NV18");
    CHECK_EQ_STR(cls(l.gn[3][3]), "PIX");
    CHECK_EQ_STR(cls(l.gn[0][1]), "NODE");
    CHECK_EQ_STR(cls(l.gn[0][4]), "SYS");
    CHECK_EQ_STR(l.nic[0], "mlx5_0");
    CHECK_EQ_STR(l.nic[7], "mlx5_7");
    CHECK_EQ_INT(l.gpu_numa[0], 0);
    CHECK_EQ_INT(l.gpu_numa[7], 1);
    char why[160];
    CHECK_EQ_INT(gpu_links_tp_rule(&l, why, sizeof why), 8);
    CHECK_EQ_STR(why, "8 of 8 GPUs NVLinked (NV18 or more)");
    int ov = -1;
    CHECK_EQ_INT(gpu_links_tp_pick(&l, 0, &ov), 8);
    CHECK_EQ_INT(ov, 0);
    CHECK_EQ_INT(gpu_links_tp_pick(&l, 4, &ov), 4);
    CHECK_EQ_INT(ov, 0);
    char sum[256];
    gpu_links_summary(&l, sum, sizeof sum);
    CHECK_EQ_STR(sum, "8 GPU, TP<=8 (8 of 8 GPUs NVLinked (NV18 or more)); 8 NIC, nearest PIX..PIX");
}

static void test_pcie_box(void) {
    gpu_links l;
    st_err err = {{0}};
    CHECK_EQ_INT(gpu_links_parse_smi(slurp("pcie-4gpu.txt"), &l, &err), 0);
    CHECK_EQ_INT(l.n_gpu, 4);
    CHECK_EQ_INT(l.n_nic, 1);
    CHECK_EQ_STR(cls(l.gg[0][1]), "PIX");
    CHECK_EQ_STR(cls(l.gg[1][2]), "PHB");
    CHECK_EQ_STR(cls(l.gn[2][0]), "PHB");
    char why[160];
    /* The seed's rule: no NVLink, so at most TP 2 (not the 4 devices). */
    CHECK_EQ_INT(gpu_links_tp_rule(&l, why, sizeof why), 2);
    CHECK_EQ_STR(why, "no NVLink between 4 GPUs (PCIe up to PHB): TP at most 2");
    int ov = 0;
    CHECK_EQ_INT(gpu_links_tp_pick(&l, 4, &ov), 4); /* the operator overrides ... */
    CHECK_EQ_INT(ov, 1);                             /* ... and is warned */
    CHECK_EQ_INT(gpu_links_tp_pick(&l, 2, &ov), 2);
    CHECK_EQ_INT(ov, 0);
}

static void test_two_socket(void) {
    gpu_links l;
    st_err err = {{0}};
    CHECK_EQ_INT(gpu_links_parse_smi(slurp("2socket-4gpu.txt"), &l, &err), 0);
    CHECK_EQ_INT(l.n_gpu, 4);
    CHECK_EQ_INT(l.n_nic, 2);
    CHECK_EQ_STR(cls(l.gg[0][1]), "NODE");
    CHECK_EQ_STR(cls(l.gg[0][2]), "SYS");
    CHECK_EQ_STR(cls(l.gn[3][1]), "NODE");
    CHECK_EQ_INT(l.gpu_numa[1], 0);
    CHECK_EQ_INT(l.gpu_numa[2], 1);
    char why[160];
    CHECK_EQ_INT(gpu_links_tp_rule(&l, why, sizeof why), 2);
    CHECK_EQ_STR(why, "no NVLink between 4 GPUs (PCIe up to SYS): TP at most 2");
}

/* Hand-made matrices: NVLink pairs, a 6-GPU NVLink set, one GPU. */
static void test_rule_shapes(void) {
    gpu_links l;
    memset(&l, 0, sizeof l);
    l.n_gpu = 4;
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++)
            l.gg[a][b] = a == b ? (gpu_link){LINK_X, 0}
                       : a / 2 == b / 2 ? (gpu_link){LINK_NV, 4}
                                        : (gpu_link){LINK_SYS, 0};
    char why[160];
    CHECK_EQ_INT(gpu_links_tp_rule(&l, why, sizeof why), 2);
    CHECK_EQ_STR(why, "2 of 4 GPUs NVLinked (NV4 or more)");
    l.n_gpu = 8;
    for (int a = 0; a < 8; a++)
        for (int b = 0; b < 8; b++)
            l.gg[a][b] = a == b ? (gpu_link){LINK_X, 0}
                       : a < 6 && b < 6 ? (gpu_link){LINK_NV, a + b}
                                        : (gpu_link){LINK_PHB, 0};
    CHECK_EQ_INT(gpu_links_tp_rule(&l, why, sizeof why), 4); /* 6 NVLinked -> a power of two */
    CHECK_EQ_STR(why, "6 of 8 GPUs NVLinked (NV1 or more)");
    l.n_gpu = 1;
    CHECK_EQ_INT(gpu_links_tp_rule(&l, why, sizeof why), 1);
    l.n_gpu = 0;
    CHECK_EQ_INT(gpu_links_tp_rule(&l, why, sizeof why), 0);
}

static void test_pci_paths(void) {
    const char *g0 = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0";
    const char *g1 = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0";
    const char *g2 = "/sys/devices/pci0000:00/0000:00:02.0/0000:05:00.0/0000:06:00.0/0000:07:00.0";
    /* Two switch levels: an upper switch, then a lower one. */
    const char *deep = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:02.0/0000:08:00.0/0000:09:00.0/0000:0a:00.0";
    const char *other = "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0";
    CHECK_EQ_INT(pci_path_class(g0, g0, 0, 0), LINK_X);
    CHECK_EQ_INT(pci_path_class(g0, g1, 0, 0), LINK_PIX);
    CHECK_EQ_INT(pci_path_class(g0, g2, 0, 0), LINK_PHB);
    CHECK_EQ_INT(pci_path_class(g0, deep, 0, 0), LINK_PXB);
    CHECK_EQ_INT(pci_path_class(g0, other, 0, 0), LINK_NODE);
    CHECK_EQ_INT(pci_path_class(g0, other, 0, 1), LINK_SYS);
    CHECK_EQ_INT(pci_path_class(g0, other, -1, 1), LINK_NODE);
    CHECK_EQ_INT(pci_path_class(g0, "", 0, 0), LINK_UNKNOWN);
    CHECK_EQ_INT(pci_path_class("/sys/devices/platform/x", g0, 0, 0), LINK_UNKNOWN);
}

static void bad(const char *text, const char *want) {
    gpu_links l;
    st_err err = {{0}};
    CHECK_EQ_INT(gpu_links_parse_smi(text, &l, &err), -1);
    CHECK_MSG(strstr(err.msg, want) != NULL, "err '%s', want '%s'", err.msg, want);
}

static void test_bad_input(void) {
    bad("", "no GPU0 header row");
    bad(NULL, "no GPU0 header row");
    bad("garbage\nmore garbage\n", "no GPU0 header row");
    bad("\tGPU0\tGPU1\nGPU0\t X \tNVX\nGPU1\tNV4\t X \n", "unknown link class 'NVX'");
    bad("\tGPU0\tGPU1\nGPU0\t X \tNV0\nGPU1\tNV4\t X \n", "unknown link class 'NV0'");
    bad("\tGPU0\tGPU1\nGPU0\t X \nGPU1\tPIX\t X \n", "row GPU0 has 1 cells, the header 2");
    bad("\tGPU0\tGPU1\nGPU0\t X \tPIX\nGPU1\tSYS\t X \n", "GPU0-GPU1 differs from GPU1-GPU0");
    bad("\tGPU0\tGPU1\nGPU0\tPIX\tPIX\nGPU1\tPIX\t X \n", "GPU0's own cell is not X");
    bad("\tGPU0\tGPU1\nGPU0\t X \tPIX\n", "1 GPU rows for 2 GPU columns");
    bad("\tGPU0\tGPU17\nGPU0\t X \tPIX\n", "beyond the 16 GPUs");
    bad("\tGPU0\tNIC0\nGPU0\t X \tPIX\nNIC0\tSYS\t X \n", "NIC0-GPU0 is SYS but GPU0-NIC0 is not");
    bad("\tGPU0\nGPU0\t X \nGPU3\t X \n", "row GPU3 has no column");
}

/* NVLink through a fake NVML (tests/ib/fake_nvml.c: GPUs 0-5 NVSwitched with
 * 18 links, 6-7 none) over a PCIe-only matrix; a missing NVML is an error
 * that leaves the matrix alone. */
static void test_nvml(void) {
    gpu_links l;
    st_err err = {{0}};
    CHECK_EQ_INT(gpu_links_parse_smi(slurp("2socket-4gpu.txt"), &l, &err), 0);
    gpu_links before = l;
    CHECK_EQ_INT(nvml_overlay_nvlinks(&l, "/nonexistent/libnvidia-ml.so.1", &err), -1);
    CHECK(strstr(err.msg, "nvml: ") != NULL);
    CHECK(memcmp(&l, &before, sizeof l) == 0);
    CHECK_EQ_INT(nvml_overlay_nvlinks(&l, FAKE_NVML, &err), 8);
    CHECK_EQ_INT(l.n_gpu, 8); /* NVML saw more GPUs than the matrix had */
    CHECK_EQ_STR(cls(l.gg[0][5]), "NV18");
    CHECK_EQ_STR(cls(l.gg[1][0]), "NV18");
    CHECK_EQ_STR(cls(l.gg[0][2]), "NV18"); /* was SYS on PCIe: NVLink wins */
    CHECK_EQ_STR(cls(l.gg[6][7]), "?");   /* unknown PCIe class, no NVLink */
    CHECK_EQ_STR(cls(l.gg[7][7]), "X");
    char why[160];
    CHECK_EQ_INT(gpu_links_tp_rule(&l, why, sizeof why), 4); /* 6 NVLinked -> 4 */
    CHECK_EQ_STR(why, "6 of 8 GPUs NVLinked (NV18 or more)");
    /* This machine (no GPU in sysfs and no NVML where the tests run). */
    gpu_links here;
    CHECK_EQ_INT(node_links_detect("/", &here, &err), 0);
    if (here.n_gpu == 0) CHECK_EQ_INT(gpu_links_tp_rule(&here, NULL, 0), 0);
    else CHECK(gpu_links_tp_rule(&here, NULL, 0) >= 1);
}

/* Registration's order: the matrix by CUDA's device order, matched by PCI
 * bus id (the 2-socket box: GPUs 0-1 on NUMA 0, 2-3 on NUMA 1). */
static void test_reorder(void) {
    gpu_links l, o;
    st_err err = {{0}};
    CHECK_EQ_INT(gpu_links_parse_smi(slurp("2socket-4gpu.txt"), &l, &err), 0);
    static const char *const bus[4] = {"0000:17:00.0", "0000:31:00.0", "0000:b1:00.0", "0000:ca:00.0"};
    for (int i = 0; i < 4; i++) snprintf(l.busid[i], sizeof l.busid[i], "%s", bus[i]);
    /* CUDA lists the second socket's GPUs first, with NVML's 8-digit domain */
    const char *cuda[4] = {"00000000:CA:00.0", "00000000:B1:00.0", "0000:17:00.0", "0000:31:00.0"};
    CHECK_EQ_INT(gpu_links_reorder(&l, cuda, 4, &o, &err), 0);
    CHECK_EQ_INT(o.n_gpu, 4);
    CHECK_EQ_STR(o.busid[0], "0000:ca:00.0");
    CHECK_EQ_INT(o.gpu_numa[0], 1);
    CHECK_EQ_INT(o.gpu_numa[2], 0);
    CHECK_EQ_STR(cls(o.gg[0][0]), "X");
    CHECK_EQ_STR(cls(o.gg[0][1]), "NODE"); /* both on socket 1 */
    CHECK_EQ_STR(cls(o.gg[0][2]), "SYS");
    CHECK_EQ_STR(cls(o.gg[2][3]), "NODE");
    CHECK_EQ_STR(cls(o.gn[0][1]), cls(l.gn[3][1])); /* NIC columns unchanged */
    CHECK_EQ_STR(cls(o.gn[2][0]), cls(l.gn[0][0]));
    CHECK_EQ_INT(o.n_nic, 2);
    /* a subset (CUDA_VISIBLE_DEVICES=2,0) */
    const char *two[2] = {"0000:b1:00.0", "0000:17:00.0"};
    CHECK_EQ_INT(gpu_links_reorder(&l, two, 2, &o, &err), 0);
    CHECK_EQ_INT(o.n_gpu, 2);
    CHECK_EQ_STR(cls(o.gg[0][1]), "SYS");
    CHECK_EQ_INT(gpu_links_tp_rule(&o, NULL, 0), 2);
    const char *gone[1] = {"0000:99:00.0"};
    CHECK_EQ_INT(gpu_links_reorder(&l, gone, 1, &o, &err), -1);
    CHECK_MSG(strstr(err.msg, "GPU 0 (0000:99:00.0) is not among the 4 GPUs") != NULL, "%s", err.msg);
    const char *junk[1] = {"17:00"};
    CHECK_EQ_INT(gpu_links_reorder(&l, junk, 1, &o, &err), -1);
    CHECK_MSG(strstr(err.msg, "'17:00' is not a PCI bus id") != NULL, "%s", err.msg);
    const char *trailing[1] = {"0000:17:00.0x"};
    CHECK_EQ_INT(gpu_links_reorder(&l, trailing, 1, &o, &err), -1);
}

int main(void) {
    test_reorder();
    test_nvml();
    test_dgx();
    test_pcie_box();
    test_two_socket();
    test_rule_shapes();
    test_pci_paths();
    test_bad_input();
    return test_summary();
}
