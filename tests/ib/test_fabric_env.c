/* test_fabric_env.c — ib/fabric_env.h on sysfs fixture trees built in a
 * temporary directory (PCI functions with vendor/class/numa_node,
 * /sys/bus/pci/devices links, /sys/class/infiniband/<dev>/ports/<p> with
 * state, link_layer, GID tables and gid_attrs, net/ links): an 8-GPU node
 * with 8 InfiniBand rails behind PCIe switches plus a front-end RoCE NIC, a
 * 4-GPU PCIe box, a 2-socket RoCE box (consistent and inconsistent GID
 * indexes); the device-list path strata-rdma-devices uses; the operator-wins
 * application; bad config values. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ib/fabric_env.h"
#include "tests/testutil.h"

static char g_root[256];

static void mkdir_p(const char *path) {
    char b[1024];
    snprintf(b, sizeof b, "%s", path);
    for (char *p = b + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(b, 0755);
            *p = '/';
        }
    REQUIRE(mkdir(b, 0755) == 0 || errno == EEXIST);
}

static void put(const char *rel, const char *text) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", g_root, rel);
    char d[1024];
    snprintf(d, sizeof d, "%s", p);
    *strrchr(d, '/') = 0;
    mkdir_p(d);
    FILE *f = fopen(p, "w");
    REQUIRE(f);
    fprintf(f, "%s\n", text);
    fclose(f);
}

static void link_to(const char *rel, const char *target_rel) {
    char p[1024], t[1024], d[1024];
    snprintf(p, sizeof p, "%s/%s", g_root, rel);
    snprintf(t, sizeof t, "%s/%s", g_root, target_rel);
    snprintf(d, sizeof d, "%s", p);
    *strrchr(d, '/') = 0;
    mkdir_p(d);
    REQUIRE(symlink(t, p) == 0);
}

static void new_root(void) {
    snprintf(g_root, sizeof g_root, "/tmp/strata-fabric-XXXXXX");
    REQUIRE(mkdtemp(g_root));
}

static void drop_root(void) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
    REQUIRE(system(cmd) == 0);
}

static void pci_fn(const char *path, const char *vendor, const char *cls, int numa) {
    char b[1024], v[32];
    snprintf(b, sizeof b, "sys/devices/%s/vendor", path);
    put(b, vendor);
    snprintf(b, sizeof b, "sys/devices/%s/class", path);
    put(b, cls);
    snprintf(b, sizeof b, "sys/devices/%s/numa_node", path);
    snprintf(v, sizeof v, "%d", numa);
    put(b, v);
    const char *busid = strrchr(path, '/') + 1;
    char l[256], t[1024];
    snprintf(l, sizeof l, "sys/bus/pci/devices/%s", busid);
    snprintf(t, sizeof t, "sys/devices/%s", path);
    link_to(l, t);
}

static void gpu(const char *path, int numa) { pci_fn(path, "0x10de", "0x030200", numa); }

/* An HCA with one port: ib (InfiniBand) or RoCE with a RoCE v2 IPv4 GID at gid. */
static void hca(const char *name, const char *path, int numa, bool active, bool roce, int gid, const char *netdev) {
    pci_fn(path, "0x15b3", "0x020700", numa);
    char l[256], t[1024], b[512];
    snprintf(l, sizeof l, "sys/class/infiniband/%s/device", name);
    snprintf(t, sizeof t, "sys/devices/%s", path);
    link_to(l, t);
    snprintf(b, sizeof b, "sys/class/infiniband/%s/ports/1/state", name);
    put(b, active ? "4: ACTIVE" : "1: DOWN");
    snprintf(b, sizeof b, "sys/class/infiniband/%s/ports/1/link_layer", name);
    put(b, roce ? "Ethernet" : "InfiniBand");
    snprintf(b, sizeof b, "sys/devices/%s/net/%s/dev_port", path, netdev);
    put(b, "0");
    if (!roce) {
        snprintf(b, sizeof b, "sys/class/infiniband/%s/ports/1/gids/0", name);
        put(b, "fe80:0000:0000:0000:0c42:a103:0065:aa10");
        return;
    }
    /* A real RoCE table: link-local v1/v2 at 0/1, IPv6 v1/v2 at 2/3 unless the
     * IPv4 ones are asked for there. */
    for (int i = 0; i <= gid; i++) {
        const char *g = i == gid     ? "0000:0000:0000:0000:0000:ffff:0a00:0a01"
                        : i < 2     ? "fe80:0000:0000:0000:0e42:a1ff:fe65:aa10"
                                    : "fd00:0000:0000:0000:0e42:a1ff:fe65:aa10";
        snprintf(b, sizeof b, "sys/class/infiniband/%s/ports/1/gids/%d", name, i);
        put(b, g);
        snprintf(b, sizeof b, "sys/class/infiniband/%s/ports/1/gid_attrs/types/%d", name, i);
        put(b, i % 2 ? "RoCE v2" : "IB/RoCE v1");
        snprintf(b, sizeof b, "sys/class/infiniband/%s/ports/1/gid_attrs/ndevs/%d", name, i);
        put(b, netdev);
    }
}

static void derive(const fabric_config *cfg, fabric_env *e) {
    fabric_node *n = calloc(1, sizeof *n);
    st_err err = {{0}};
    REQUIRE(n);
    CHECK_EQ_INT(fabric_scan(g_root, n, &err), 0);
    CHECK_EQ_INT(fabric_derive(n, cfg, e, &err), 0);
    free(n);
}

static const char *get(const fabric_env *e, const char *k) {
    const char *v = fabric_env_get(e, k);
    return v ? v : "(unset)";
}

static bool has_note(const fabric_env *e, const char *sub) {
    for (int i = 0; i < e->n_notes; i++)
        if (strstr(e->notes[i], sub)) return true;
    return false;
}

/* DGX-H100-like: GPU i and mlx5_i under one PCIe switch on root complex i
 * (0-3 NUMA 0, 4-7 NUMA 1); a front-end RoCE NIC on a root port of complex 0. */
static void test_nvswitch_node(void) {
    new_root();
    for (int i = 0; i < 8; i++) {
        char g[256], n[256], name[24], nd[24];
        int rc = i * 0x10;
        snprintf(g, sizeof g, "pci0000:%02x/0000:%02x:01.0/0000:%02x:00.0/0000:%02x:00.0/0000:%02x:00.0", rc, rc,
                 rc + 1, rc + 2, rc + 3);
        snprintf(n, sizeof n, "pci0000:%02x/0000:%02x:01.0/0000:%02x:00.0/0000:%02x:01.0/0000:%02x:00.0", rc, rc,
                 rc + 1, rc + 2, rc + 4);
        snprintf(name, sizeof name, "mlx5_%d", i);
        snprintf(nd, sizeof nd, "ibp%ds0", rc + 4);
        gpu(g, i < 4 ? 0 : 1);
        hca(name, n, i < 4 ? 0 : 1, true, false, -1, nd);
    }
    hca("mlx5_8", "pci0000:00/0000:00:03.0/0000:0a:00.0", 0, true, true, 3, "ens8f0np0");
    fabric_node *n = calloc(1, sizeof *n);
    st_err err = {{0}};
    REQUIRE(n);
    CHECK_EQ_INT(fabric_scan(g_root, n, &err), 0);
    CHECK_EQ_INT(n->n_gpu, 8);
    CHECK_EQ_INT(n->n_port, 9);
    CHECK_EQ_STR(n->gpu[0].busid, "0000:03:00.0");
    CHECK_EQ_STR(n->gpu[0].pci_path, "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0");
    CHECK_EQ_INT(n->gpu[7].numa, 1);
    CHECK_EQ_STR(n->port[8].netdev, "ens8f0np0");
    CHECK_EQ_STR(n->port[0].netdev, "ibp4s0");
    CHECK_EQ_INT(n->port[8].roce_v2_gid, 3);
    gpu_links l;
    fabric_links(n, &l);
    CHECK_EQ_INT(l.n_nic, 9);
    CHECK_EQ_STR(l.busid[0], "0000:03:00.0"); /* registration matches CUDA's GPUs by it */
    CHECK_EQ_INT(l.gpu_numa[7], 1);
    CHECK_EQ_INT(l.gn[0][0].cls, LINK_PIX);
    CHECK_EQ_INT(l.gn[0][1].cls, LINK_NODE);
    CHECK_EQ_INT(l.gn[0][5].cls, LINK_SYS);
    CHECK_EQ_INT(l.gn[0][8].cls, LINK_PHB);
    CHECK_EQ_INT(l.gg[0][4].cls, LINK_SYS);
    /* sysfs shows no NVLink: on PCIe alone the rule would give 2. */
    CHECK_EQ_INT(gpu_links_tp_rule(&l, NULL, 0), 2);
    free(n);

    fabric_env e;
    derive(NULL, &e);
    CHECK_EQ_STR(get(&e, "NCCL_IB_HCA"), "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1");
    CHECK_EQ_STR(get(&e, "UCX_NET_DEVICES"), "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1");
    CHECK_EQ_STR(get(&e, "NCCL_NET_GDR_LEVEL"), "PIX");
    CHECK_EQ_STR(get(&e, "NCCL_IB_GID_INDEX"), "(unset)"); /* IB rails; the RoCE NIC is no rail */
    CHECK_EQ_STR(get(&e, "NCCL_SOCKET_IFNAME"), "(unset)");
    CHECK_EQ_STR(get(&e, "NCCL_IB_QPS_PER_CONNECTION"), "(unset)");
    CHECK_EQ_STR(get(&e, "NCCL_IB_TC"), "(unset)");
    fabric_config cfg = FABRIC_CONFIG_DEFAULT;
    cfg.socket_ifname = "bond0";
    cfg.ib_sl = 1;
    derive(&cfg, &e);
    CHECK_EQ_STR(get(&e, "NCCL_SOCKET_IFNAME"), "=bond0");
    CHECK_EQ_STR(get(&e, "NCCL_IB_SL"), "1");
    CHECK_EQ_STR(get(&e, "UCX_IB_TRAFFIC_CLASS"), "(unset)");
    drop_root();
}

/* 4 GPUs behind two PCIe switches, one IB HCA (port 1 up) on the first switch,
 * a second HCA whose port is down. */
static void test_pcie_box(void) {
    new_root();
    gpu("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0", 0);
    gpu("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0", 0);
    gpu("pci0000:00/0000:00:02.0/0000:05:00.0/0000:06:00.0/0000:07:00.0", 0);
    gpu("pci0000:00/0000:00:02.0/0000:05:00.0/0000:06:01.0/0000:08:00.0", 0);
    hca("mlx5_0", "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:02.0/0000:09:00.0", 0, true, false, -1, "ib0");
    hca("mlx5_1", "pci0000:00/0000:00:02.0/0000:05:00.0/0000:06:02.0/0000:0a:00.0", 0, false, false, -1, "ib1");
    fabric_env e;
    derive(NULL, &e);
    CHECK_EQ_STR(get(&e, "NCCL_IB_HCA"), "=mlx5_0:1");
    /* GPUs 2 and 3 reach it over the host bridge: GDR capped at PXB, noted. */
    CHECK_EQ_STR(get(&e, "NCCL_NET_GDR_LEVEL"), "PXB");
    CHECK(has_note(&e, "GPUDirect RDMA off"));
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    REQUIRE(f);
    fabric_env_print(f, &e);
    fclose(f);
    CHECK_EQ_STR(buf, "# NCCL/UCX fabric settings from strata-topo --nccl-env (ib/fabric_env.h)\n"
                      "# a GPU's nearest rail is beyond a PCIe switch: GPUDirect RDMA off for it\n"
                      "NCCL_IB_HCA==mlx5_0:1\n"
                      "NCCL_NET_GDR_LEVEL=PXB\n"
                      "UCX_NET_DEVICES=mlx5_0:1\n");
    free(buf);
    drop_root();
}

/* 2 sockets, 2 GPUs each on their own root complexes, one RoCE NIC per socket. */
static void build_two_socket(int gid1) {
    new_root();
    gpu("pci0000:00/0000:00:01.0/0000:01:00.0", 0);
    gpu("pci0000:20/0000:20:01.0/0000:21:00.0", 0);
    gpu("pci0000:80/0000:80:01.0/0000:81:00.0", 1);
    gpu("pci0000:a0/0000:a0:01.0/0000:a1:00.0", 1);
    hca("mlx5_0", "pci0000:40/0000:40:01.0/0000:41:00.0", 0, true, true, 3, "ens1f0np0");
    hca("mlx5_1", "pci0000:c0/0000:c0:01.0/0000:c1:00.0", 1, true, true, gid1, "ens2f0np0");
}

static void test_two_socket_roce(void) {
    build_two_socket(3);
    fabric_config cfg = FABRIC_CONFIG_DEFAULT;
    cfg.ib_tc = 106;
    cfg.ib_sl = 3;
    fabric_env e;
    derive(&cfg, &e);
    CHECK_EQ_STR(get(&e, "NCCL_IB_HCA"), "=mlx5_0:1,mlx5_1:1");
    CHECK_EQ_STR(get(&e, "NCCL_IB_GID_INDEX"), "3");
    CHECK_EQ_STR(get(&e, "UCX_IB_GID_INDEX"), "3");
    CHECK_EQ_STR(get(&e, "NCCL_NET_GDR_LEVEL"), "PXB"); /* NODE to the nearest NIC */
    CHECK_EQ_STR(get(&e, "NCCL_SOCKET_IFNAME"), "=ens1f0np0");
    CHECK_EQ_STR(get(&e, "NCCL_IB_TC"), "106");
    CHECK_EQ_STR(get(&e, "UCX_IB_TRAFFIC_CLASS"), "106");
    CHECK_EQ_STR(get(&e, "NCCL_IB_SL"), "3");
    CHECK_EQ_STR(get(&e, "NCCL_IB_QPS_PER_CONNECTION"), "4");
    CHECK(!has_note(&e, "differs"));
    cfg.qps_per_connection = 2;
    derive(&cfg, &e);
    CHECK_EQ_STR(get(&e, "NCCL_IB_QPS_PER_CONNECTION"), "2");
    drop_root();

    /* The second NIC's RoCE v2 IPv4 GID sits at index 5: the check warns. */
    build_two_socket(5);
    derive(NULL, &e);
    CHECK_EQ_STR(get(&e, "NCCL_IB_GID_INDEX"), "3");
    CHECK(has_note(&e, "warning: RoCE v2 GID index differs across rails (mlx5_1:1 has 5, the first 3)"));
    drop_root();
}

static void test_empty_and_bad(void) {
    new_root(); /* no sys/ at all: no devices, not an error */
    fabric_env e;
    derive(NULL, &e);
    CHECK_EQ_INT(e.n, 0);
    CHECK(has_note(&e, "no RDMA device"));
    drop_root();
    fabric_node n = {0};
    st_err err = {{0}};
    fabric_config cfg = FABRIC_CONFIG_DEFAULT;
    cfg.ib_tc = 256;
    CHECK_EQ_INT(fabric_derive(&n, &cfg, &e, &err), -1);
    CHECK(strstr(err.msg, "ib_tc 256") != NULL);
    cfg = FABRIC_CONFIG_DEFAULT;
    cfg.ib_sl = 16;
    CHECK_EQ_INT(fabric_derive(&n, &cfg, &e, &err), -1);
    cfg = FABRIC_CONFIG_DEFAULT;
    cfg.socket_ifname = "eth0; rm -rf /";
    CHECK_EQ_INT(fabric_derive(&n, &cfg, &e, &err), -1);
    CHECK(strstr(err.msg, "not an interface name") != NULL);
}

/* strata-rdma-devices' path: a verbs device list, no PCI paths. */
static void test_from_rdma(void) {
    rdma_device d[2] = {{.name = "mlx5_0", .n_ports = 2,
                         .ports = {{.num = 1, .active = true, .ethernet = true, .roce_v2_gid = 3},
                                   {.num = 2, .active = false, .ethernet = true, .roce_v2_gid = 5}}},
                        {.name = "mlx5_1", .n_ports = 1, .ports = {{.num = 1, .active = true, .roce_v2_gid = -1}}}};
    fabric_node *n = calloc(1, sizeof *n);
    REQUIRE(n);
    st_err err = {{0}};
    fabric_env e;
    CHECK_EQ_INT(fabric_node_from_rdma(d, 2, n, &err), 0);
    CHECK_EQ_INT(fabric_derive(n, NULL, &e, &err), 0);
    CHECK_EQ_STR(get(&e, "NCCL_IB_HCA"), "=mlx5_0:1,mlx5_1:1");
    CHECK_EQ_STR(get(&e, "NCCL_IB_GID_INDEX"), "3");
    CHECK_EQ_STR(get(&e, "NCCL_NET_GDR_LEVEL"), "(unset)");
    CHECK(has_note(&e, "rails mix InfiniBand and RoCE"));
    CHECK_EQ_INT(fabric_node_from_rdma(d, 1, n, &err), 0);
    d[0].ports[0].active = false;
    CHECK_EQ_INT(fabric_derive(n, NULL, &e, &err), 0);
    CHECK_EQ_STR(get(&e, "NCCL_IB_HCA"), "=mlx5_0:1"); /* n was filled before the port went down */
    CHECK_EQ_INT(fabric_node_from_rdma(d, 1, n, &err), 0);
    CHECK_EQ_INT(fabric_derive(n, NULL, &e, &err), 0);
    CHECK_EQ_INT(e.n, 0);
    CHECK(has_note(&e, "no active RDMA port"));
    enum { N = 40 };
    rdma_device *many = calloc(N, sizeof *many);
    REQUIRE(many);
    for (int i = 0; i < N; i++) many[i] = d[0];
    CHECK_EQ_INT(fabric_node_from_rdma(many, N, n, &err), -1); /* 80 ports */
    CHECK(strstr(err.msg, "more than 64 RDMA ports") != NULL);
    free(many);
    free(n);
}

/* The operator's variable wins; the others are set. */
static void test_apply(void) {
    fabric_env e = {0};
    e.n = 2;
    snprintf(e.v[0].key, sizeof e.v[0].key, "NCCL_IB_HCA");
    snprintf(e.v[0].value, sizeof e.v[0].value, "=mlx5_0:1");
    snprintf(e.v[1].key, sizeof e.v[1].key, "NCCL_IB_GID_INDEX");
    snprintf(e.v[1].value, sizeof e.v[1].value, "3");
    unsetenv("NCCL_IB_HCA");
    setenv("NCCL_IB_GID_INDEX", "7", 1);
    CHECK_EQ_INT(fabric_env_apply(&e), 1);
    CHECK_EQ_STR(getenv("NCCL_IB_HCA"), "=mlx5_0:1");
    CHECK_EQ_STR(getenv("NCCL_IB_GID_INDEX"), "7");
}

/* The policy flags strata-topo and strata-worker share; which settings came
 * from the node's config. */
static void test_config_option(void) {
    fabric_config cfg = FABRIC_CONFIG_DEFAULT;
    st_err err = {{0}};
    CHECK_EQ_INT(fabric_config_option(&cfg, "--ib-tc", "106", &err), 0);
    CHECK_EQ_INT(fabric_config_option(&cfg, "--ib-sl", "3", &err), 0);
    CHECK_EQ_INT(fabric_config_option(&cfg, "--qps-per-connection", "2", &err), 0);
    CHECK_EQ_INT(fabric_config_option(&cfg, "--socket-ifname", "bond0", &err), 0);
    CHECK_EQ_INT(cfg.ib_tc, 106);
    CHECK_EQ_INT(cfg.ib_sl, 3);
    CHECK_EQ_INT(cfg.qps_per_connection, 2);
    CHECK_EQ_STR(cfg.socket_ifname, "bond0");
    CHECK_EQ_INT(fabric_config_option(&cfg, "--listen", "x", &err), 1);
    CHECK_EQ_INT(fabric_config_option(&cfg, "--ib-sl", "16", &err), -1);
    CHECK_EQ_STR(err.msg, "--ib-sl '16' is not a number in 0..15");
    CHECK_EQ_INT(fabric_config_option(&cfg, "--ib-tc", "", &err), -1);
    CHECK_EQ_INT(fabric_config_option(&cfg, "--ib-tc", "1e2", &err), -1);
    CHECK_EQ_INT(fabric_config_option(&cfg, "--qps-per-connection", "0", &err), -1);
    CHECK_EQ_INT(fabric_config_option(&cfg, "--socket-ifname", "eth0 eth1", &err), -1);
    CHECK_EQ_STR(err.msg, "--socket-ifname 'eth0 eth1' is not an interface name");
    CHECK_EQ_INT(cfg.ib_sl, 3); /* a bad value leaves the setting alone */
    /* the 2-socket RoCE box: TC/SL/QPS/ifname from the config, the rest derived */
    build_two_socket(3);
    fabric_env e;
    derive(&cfg, &e);
    int from_cfg = 0;
    for (int i = 0; i < e.n; i++) {
        bool want = !strcmp(e.v[i].key, "NCCL_IB_TC") || !strcmp(e.v[i].key, "NCCL_IB_SL") ||
                    !strcmp(e.v[i].key, "NCCL_IB_QPS_PER_CONNECTION") || !strcmp(e.v[i].key, "NCCL_SOCKET_IFNAME") ||
                    !strcmp(e.v[i].key, "UCX_IB_TRAFFIC_CLASS");
        CHECK_MSG(e.v[i].from_config == want, "%s from_config %d", e.v[i].key, e.v[i].from_config);
        from_cfg += e.v[i].from_config;
    }
    CHECK_EQ_INT(from_cfg, 5);
    drop_root();
}

int main(void) {
    test_config_option();
    test_nvswitch_node();
    test_pcie_box();
    test_two_socket_roce();
    test_empty_and_bad();
    test_from_rdma();
    test_apply();
    return test_summary();
}
