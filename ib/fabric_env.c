/* fabric_env.c — sysfs scan, derivation, printing and application of the
 * NCCL/UCX fabric settings (fabric_env.h). */
#include "ib/fabric_env.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/log.h"

/* ---------------------------------------------------------------- sysfs */

/* snprintf for paths: a path that does not fit is left empty (it then names
 * no file) instead of naming a truncated one. */
__attribute__((format(printf, 3, 4))) static void pathf(char *out, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, cap, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap) out[0] = 0;
}

/* First line of path into buf (newline stripped); -1 when unreadable. */
static int read_line(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char *ok = fgets(buf, (int)cap, f);
    fclose(f);
    if (!ok) return -1;
    buf[strcspn(buf, "\n")] = 0;
    return 0;
}

static int read_int(const char *path, int dflt) {
    char b[64];
    if (read_line(path, b, sizeof b)) return dflt;
    char *end;
    long v = strtol(b, &end, 0);
    return end == b ? dflt : (int)v;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Sorted entry names of a directory (no dot entries); n = count, NULL when absent. */
static char **list_dir(const char *path, int *n) {
    *n = 0;
    DIR *d = opendir(path);
    if (!d) return NULL;
    char **v = NULL;
    int cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            char **nv = realloc(v, (size_t)cap * sizeof *v);
            if (!nv) break;
            v = nv;
        }
        v[(*n)++] = strdup(e->d_name);
    }
    closedir(d);
    if (v) qsort(v, (size_t)*n, sizeof *v, cmp_str);
    return v;
}

static void free_list(char **v, int n) {
    for (int i = 0; i < n; i++) free(v[i]);
    free(v);
}

/* The realpath of path, relative to the sysroot when it lies inside it. */
static void pci_realpath(const char *sysroot, const char *path, char *out, size_t cap) {
    char rp[PATH_MAX];
    out[0] = 0;
    if (!realpath(path, rp)) return;
    char root[PATH_MAX];
    const char *r = realpath(sysroot, root) ? root : sysroot;
    size_t rl = strcmp(r, "/") ? strlen(r) : 0;
    const char *rel = strncmp(rp, r, rl) ? rp : rp + rl;
    size_t n = strlen(rel);
    if (n >= cap) return; /* longer than any PCI path: treated as unknown, never truncated */
    memcpy(out, rel, n + 1);
}

static int roce_v2_gid_sysfs(const char *portdir) {
    char p[PATH_MAX], t[64], g[64];
    for (int i = 0; i < 256; i++) {
        pathf(p, sizeof p, "%s/gid_attrs/types/%d", portdir, i);
        if (read_line(p, t, sizeof t)) continue;
        if (strcmp(t, "RoCE v2")) continue;
        pathf(p, sizeof p, "%s/gids/%d", portdir, i);
        /* IPv4-mapped: 0000:0000:0000:0000:0000:ffff:xxxx:xxxx */
        if (read_line(p, g, sizeof g) == 0 && !strncmp(g, "0000:0000:0000:0000:0000:ffff:", 30)) return i;
    }
    return -1;
}

int fabric_scan(const char *sysroot, fabric_node *out, st_err *err) {
    memset(out, 0, sizeof *out);
    char dir[PATH_MAX], p[PATH_MAX], b[128];
    /* GPUs */
    pathf(dir, sizeof dir, "%s/sys/bus/pci/devices", sysroot);
    int n;
    char **ents = list_dir(dir, &n);
    for (int i = 0; i < n && out->n_gpu < GPU_LINKS_MAX_GPU; i++) {
        pathf(p, sizeof p, "%s/%s/vendor", dir, ents[i]);
        if (read_line(p, b, sizeof b) || strcmp(b, "0x10de")) continue;
        pathf(p, sizeof p, "%s/%s/class", dir, ents[i]);
        if (read_line(p, b, sizeof b) || strncmp(b, "0x03", 4)) continue;
        fabric_gpu *g = &out->gpu[out->n_gpu++];
        snprintf(g->busid, sizeof g->busid, "%s", ents[i]);
        pathf(p, sizeof p, "%s/%s", dir, ents[i]);
        pci_realpath(sysroot, p, g->pci_path, sizeof g->pci_path);
        pathf(p, sizeof p, "%s/%s/numa_node", dir, ents[i]);
        g->numa = read_int(p, -1);
    }
    free_list(ents, n);
    /* RDMA ports */
    pathf(dir, sizeof dir, "%s/sys/class/infiniband", sysroot);
    ents = list_dir(dir, &n);
    for (int i = 0; i < n; i++) {
        char ports_dir[PATH_MAX];
        pathf(ports_dir, sizeof ports_dir, "%s/%s/ports", dir, ents[i]);
        int np;
        char **ports = list_dir(ports_dir, &np);
        char pci[512], netdir[PATH_MAX];
        pathf(p, sizeof p, "%s/%s/device", dir, ents[i]);
        pci_realpath(sysroot, p, pci, sizeof pci);
        pathf(p, sizeof p, "%s/%s/device/numa_node", dir, ents[i]);
        int numa = read_int(p, -1);
        pathf(netdir, sizeof netdir, "%s/%s/device/net", dir, ents[i]);
        int nn;
        char **nets = list_dir(netdir, &nn);
        for (int j = 0; j < np; j++) {
            if (out->n_port == FABRIC_MAX_PORTS) {
                free_list(ports, np);
                free_list(nets, nn);
                free_list(ents, n);
                return st_errf(err, "fabric: more than %d RDMA ports", FABRIC_MAX_PORTS);
            }
            char portdir[PATH_MAX];
            pathf(portdir, sizeof portdir, "%s/%s", ports_dir, ports[j]);
            fabric_port *fp = &out->port[out->n_port++];
            snprintf(fp->dev, sizeof fp->dev, "%s", ents[i]);
            fp->port = atoi(ports[j]);
            pathf(p, sizeof p, "%s/state", portdir);
            fp->active = read_line(p, b, sizeof b) == 0 && strstr(b, "ACTIVE") != NULL;
            pathf(p, sizeof p, "%s/link_layer", portdir);
            fp->ethernet = read_line(p, b, sizeof b) == 0 && !strcmp(b, "Ethernet");
            fp->roce_v2_gid = fp->ethernet ? roce_v2_gid_sysfs(portdir) : -1;
            /* The port's netdev: gid_attrs/ndevs/0 names it on RoCE; else the
             * PCI function's net/ entry (port p is the p-th, dev_port p-1). */
            pathf(p, sizeof p, "%s/gid_attrs/ndevs/0", portdir);
            if (read_line(p, fp->netdev, sizeof fp->netdev) || !fp->netdev[0]) {
                fp->netdev[0] = 0;
                for (int k = 0; k < nn; k++) {
                    pathf(p, sizeof p, "%s/%s/dev_port", netdir, nets[k]);
                    if (read_int(p, 0) == fp->port - 1) {
                        snprintf(fp->netdev, sizeof fp->netdev, "%s", nets[k]);
                        break;
                    }
                }
            }
            snprintf(fp->pci_path, sizeof fp->pci_path, "%s", pci);
            fp->numa = numa;
        }
        free_list(ports, np);
        free_list(nets, nn);
    }
    free_list(ents, n);
    return 0;
}

int fabric_node_from_rdma(const rdma_device *devs, int n, fabric_node *out, st_err *err) {
    memset(out, 0, sizeof *out);
    for (int i = 0; i < n; i++)
        for (int p = 0; p < devs[i].n_ports; p++) {
            if (out->n_port == FABRIC_MAX_PORTS) return st_errf(err, "fabric: more than %d RDMA ports", FABRIC_MAX_PORTS);
            const rdma_port *rp = &devs[i].ports[p];
            fabric_port *fp = &out->port[out->n_port++];
            snprintf(fp->dev, sizeof fp->dev, "%s", devs[i].name);
            fp->port = rp->num;
            fp->active = rp->active;
            fp->ethernet = rp->ethernet;
            fp->roce_v2_gid = rp->ethernet ? rp->roce_v2_gid : -1;
            fp->numa = -1;
        }
    return 0;
}

int fabric_node_detect(const char *sysroot, fabric_node *out, st_err *err) {
    if (fabric_scan(sysroot, out, err) != 0) return -1;
    if (out->n_port > 0 || strcmp(sysroot, "/")) return 0;
    rdma_device devs[16];
    int n = rdma_list_devices(devs, 16, err);
    if (n <= 0) return n < 0 ? -1 : 0;
    return fabric_node_from_rdma(devs, n, out, err); /* no PCI paths: no GPU distances either */
}

/* ---------------------------------------------------------------- derivation */

static int put(fabric_env *e, const char *key, const char *value, st_err *err) {
    if (e->n == FABRIC_MAX_VARS) return st_errf(err, "fabric: too many settings");
    fabric_var *v = &e->v[e->n++];
    snprintf(v->key, sizeof v->key, "%s", key);
    if (snprintf(v->value, sizeof v->value, "%s", value) >= (int)sizeof v->value)
        return st_errf(err, "fabric: %s does not fit %zu bytes", key, sizeof v->value);
    return 0;
}

static int putf(fabric_env *e, const char *key, int v, st_err *err) {
    char b[16];
    snprintf(b, sizeof b, "%d", v);
    return put(e, key, b, err);
}

/* The variable just put came from the node's config. */
static void from_config(fabric_env *e) { e->v[e->n - 1].from_config = true; }

int fabric_config_option(fabric_config *cfg, const char *flag, const char *value, st_err *err) {
    if (!strcmp(flag, "--socket-ifname")) {
        if (!value[0] || strlen(value) > 64 || strpbrk(value, " \t\n'\"$\\="))
            return st_errf(err, "--socket-ifname '%s' is not an interface name", value);
        cfg->socket_ifname = value;
        return 0;
    }
    long lo, hi;
    int *dst;
    if (!strcmp(flag, "--ib-tc")) lo = 0, hi = 255, dst = &cfg->ib_tc;
    else if (!strcmp(flag, "--ib-sl")) lo = 0, hi = 15, dst = &cfg->ib_sl;
    else if (!strcmp(flag, "--qps-per-connection")) lo = 1, hi = 128, dst = &cfg->qps_per_connection;
    else return 1;
    char *end;
    errno = 0;
    long v = strtol(value, &end, 10);
    if (!*value || *end || errno || v < lo || v > hi)
        return st_errf(err, "%s '%s' is not a number in %ld..%ld", flag, value, lo, hi);
    *dst = (int)v;
    return 0;
}

static void note(fabric_env *e, const char *msg) {
    if (e->n_notes < FABRIC_MAX_NOTES) snprintf(e->notes[e->n_notes++], sizeof e->notes[0], "%s", msg);
}

int fabric_derive(const fabric_node *node, const fabric_config *cfg_in, fabric_env *out, st_err *err) {
    fabric_config cfg = cfg_in ? *cfg_in : FABRIC_CONFIG_DEFAULT;
    memset(out, 0, sizeof *out);
    if (cfg.ib_tc > 255 || cfg.ib_tc < -1) return st_errf(err, "fabric: ib_tc %d is not in 0..255", cfg.ib_tc);
    if (cfg.ib_sl > 15 || cfg.ib_sl < -1) return st_errf(err, "fabric: ib_sl %d is not in 0..15", cfg.ib_sl);
    if (cfg.qps_per_connection < 0 || cfg.qps_per_connection > 128)
        return st_errf(err, "fabric: qps_per_connection %d is not in 1..128", cfg.qps_per_connection);
    if (cfg.socket_ifname && (!cfg.socket_ifname[0] || strlen(cfg.socket_ifname) > 64 ||
                              strpbrk(cfg.socket_ifname, " \t\n'\"$\\")))
        return st_errf(err, "fabric: socket_ifname '%s' is not an interface name", cfg.socket_ifname);

    /* Rails: per GPU the active ports of the nearest NICs (every active port without GPUs). */
    bool rail[FABRIC_MAX_PORTS] = {0};
    int n_active = 0;
    link_class worst_gdr = LINK_X;
    bool have_paths = node->n_gpu > 0;
    for (int j = 0; j < node->n_port; j++) {
        if (!node->port[j].active) continue;
        n_active++;
        if (!node->port[j].pci_path[0]) have_paths = false;
    }
    if (node->n_port == 0) note(out, "no RDMA device: NCCL_IB_* left unset (NCCL uses its socket transport)");
    else if (n_active == 0) note(out, "no active RDMA port: NCCL_IB_* left unset (NCCL uses its socket transport)");
    for (int j = 0; j < node->n_port; j++) rail[j] = node->port[j].active && !have_paths;
    if (have_paths && n_active) {
        for (int g = 0; g < node->n_gpu; g++) {
            link_class best = LINK_UNKNOWN;
            link_class cls[FABRIC_MAX_PORTS];
            for (int j = 0; j < node->n_port; j++) {
                const fabric_port *p = &node->port[j];
                cls[j] = p->active ? pci_path_class(node->gpu[g].pci_path, p->pci_path, node->gpu[g].numa, p->numa)
                                   : LINK_UNKNOWN;
                if (cls[j] < best) best = cls[j];
            }
            for (int j = 0; j < node->n_port; j++)
                if (cls[j] == best && best != LINK_UNKNOWN) rail[j] = true;
            if (best > worst_gdr) worst_gdr = best;
        }
    }
    char hca[1024] = "=", ucx[1024] = "";
    int gid = -1, n_rail = 0;
    const char *roce_netdev = NULL;
    bool roce = false, ib = false, gid_mixed = false;
    for (int j = 0; j < node->n_port; j++) {
        if (!rail[j]) continue;
        const fabric_port *p = &node->port[j];
        char one[96];
        snprintf(one, sizeof one, "%s%s:%d", n_rail ? "," : "", p->dev, p->port);
        if (strlen(hca) + strlen(one) >= sizeof hca) return st_errf(err, "fabric: NCCL_IB_HCA does not fit %zu bytes", sizeof hca);
        strcat(hca, one);
        strcat(ucx, one);
        n_rail++;
        if (p->ethernet) {
            roce = true;
            if (!roce_netdev && p->netdev[0]) roce_netdev = p->netdev;
            if (p->roce_v2_gid < 0) {
                char m[192];
                snprintf(m, sizeof m, "warning: %s:%d is RoCE without a RoCE v2 IPv4 GID (no IPv4 address?)", p->dev, p->port);
                note(out, m);
            } else if (gid < 0) {
                gid = p->roce_v2_gid;
            } else if (p->roce_v2_gid != gid && !gid_mixed) {
                char m[192];
                snprintf(m, sizeof m, "warning: RoCE v2 GID index differs across rails (%s:%d has %d, the first %d); NCCL uses one index",
                         p->dev, p->port, p->roce_v2_gid, gid);
                note(out, m);
                gid_mixed = true;
            }
        } else {
            ib = true;
        }
    }
    if (n_rail) {
        if (put(out, "NCCL_IB_HCA", hca, err)) return -1;
        if (gid >= 0 && putf(out, "NCCL_IB_GID_INDEX", gid, err)) return -1;
        if (have_paths) {
            link_class lvl = worst_gdr <= LINK_PIX ? LINK_PIX : LINK_PXB;
            if (worst_gdr > LINK_PXB) note(out, "a GPU's nearest rail is beyond a PCIe switch: GPUDirect RDMA off for it");
            if (put(out, "NCCL_NET_GDR_LEVEL", lvl == LINK_PIX ? "PIX" : "PXB", err)) return -1;
        }
    }
    if (cfg.socket_ifname) {
        char v[80];
        snprintf(v, sizeof v, "=%s", cfg.socket_ifname);
        if (put(out, "NCCL_SOCKET_IFNAME", v, err)) return -1;
        from_config(out);
    } else if (roce_netdev) {
        char v[80];
        snprintf(v, sizeof v, "=%s", roce_netdev);
        if (put(out, "NCCL_SOCKET_IFNAME", v, err)) return -1;
    }
    if (n_rail && cfg.ib_tc >= 0) {
        if (putf(out, "NCCL_IB_TC", cfg.ib_tc, err)) return -1;
        from_config(out);
    }
    if (n_rail && cfg.ib_sl >= 0) {
        if (putf(out, "NCCL_IB_SL", cfg.ib_sl, err)) return -1;
        from_config(out);
    }
    int qps = cfg.qps_per_connection ? cfg.qps_per_connection : (roce ? 4 : 0);
    if (n_rail && qps) {
        if (putf(out, "NCCL_IB_QPS_PER_CONNECTION", qps, err)) return -1;
        if (cfg.qps_per_connection) from_config(out);
    }
    if (n_rail) {
        if (put(out, "UCX_NET_DEVICES", ucx, err)) return -1;
        if (gid >= 0 && putf(out, "UCX_IB_GID_INDEX", gid, err)) return -1;
        if (cfg.ib_tc >= 0) {
            if (putf(out, "UCX_IB_TRAFFIC_CLASS", cfg.ib_tc, err)) return -1;
            from_config(out);
        }
    }
    if (roce && ib) note(out, "rails mix InfiniBand and RoCE ports");
    return 0;
}

void fabric_links(const fabric_node *node, gpu_links *out) {
    memset(out, 0, sizeof *out);
    out->n_gpu = node->n_gpu;
    for (int j = 0; j < node->n_port && out->n_nic < GPU_LINKS_MAX_NIC; j++) {
        if (j > 0 && !strcmp(node->port[j].dev, node->port[j - 1].dev)) continue;
        int k = out->n_nic++;
        snprintf(out->nic[k], sizeof out->nic[k], "%s", node->port[j].dev);
        for (int g = 0; g < node->n_gpu; g++)
            out->gn[g][k].cls = pci_path_class(node->gpu[g].pci_path, node->port[j].pci_path, node->gpu[g].numa,
                                               node->port[j].numa);
    }
    for (int a = 0; a < node->n_gpu; a++) {
        out->gpu_numa[a] = node->gpu[a].numa;
        snprintf(out->busid[a], sizeof out->busid[a], "%s", node->gpu[a].busid);
        for (int b = 0; b < node->n_gpu; b++)
            out->gg[a][b].cls = pci_path_class(node->gpu[a].pci_path, node->gpu[b].pci_path, node->gpu[a].numa,
                                               node->gpu[b].numa);
    }
}

const char *fabric_env_get(const fabric_env *e, const char *key) {
    for (int i = 0; i < e->n; i++)
        if (!strcmp(e->v[i].key, key)) return e->v[i].value;
    return NULL;
}

void fabric_env_print(FILE *f, const fabric_env *e) {
    fprintf(f, "# NCCL/UCX fabric settings from strata-topo --nccl-env (ib/fabric_env.h)\n");
    for (int i = 0; i < e->n_notes; i++) fprintf(f, "# %s\n", e->notes[i]);
    for (int i = 0; i < e->n; i++) fprintf(f, "%s=%s\n", e->v[i].key, e->v[i].value);
}

int fabric_env_apply(const fabric_env *e) {
    int set = 0;
    for (int i = 0; i < e->n_notes; i++) ST_INFO("fabric: %s", e->notes[i]);
    for (int i = 0; i < e->n; i++) {
        const char *have = getenv(e->v[i].key);
        if (have) {
            if (strcmp(have, e->v[i].value))
                ST_INFO("fabric: %s=%s from the operator's environment wins (derived: %s)", e->v[i].key, have,
                        e->v[i].value);
            else
                ST_INFO("fabric: %s=%s (operator's environment, same as derived)", e->v[i].key, have);
            continue;
        }
        if (setenv(e->v[i].key, e->v[i].value, 0) == 0) {
            ST_INFO("fabric: %s=%s (%s)", e->v[i].key, e->v[i].value,
                    e->v[i].from_config ? "from the node's config" : "derived from the topology");
            set++;
        }
    }
    return set;
}
