/* gpu_links.c — link classes, nvidia-smi matrix parsing, PCI path
 * classification and the TP rule (gpu_links.h). */
#include "ib/gpu_links.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const k_names[] = {"X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS", "?"};

const char *gpu_link_str(gpu_link l, char *buf, size_t cap) {
    if (l.cls == LINK_NV)
        snprintf(buf, cap, "NV%d", l.nv);
    else
        snprintf(buf, cap, "%s", k_names[l.cls <= LINK_UNKNOWN ? l.cls : LINK_UNKNOWN]);
    return buf;
}

int gpu_link_parse(const char *s, gpu_link *out) {
    *out = (gpu_link){LINK_UNKNOWN, 0};
    if (!strncmp(s, "NV", 2) && s[2]) {
        char *end;
        long n = strtol(s + 2, &end, 10);
        if (*end || n < 1 || n > 1024) return -1;
        *out = (gpu_link){LINK_NV, (int)n};
        return 0;
    }
    for (int c = LINK_X; c <= LINK_SYS; c++)
        if (c != LINK_NV && !strcmp(s, k_names[c])) {
            out->cls = (link_class)c;
            return 0;
        }
    return -1;
}

/* ---------------------------------------------------------------- nvidia-smi */

/* Copies `text` without ANSI escapes (nvidia-smi underlines the header on a tty). */
static char *strip_escapes(const char *text) {
    size_t n = strlen(text);
    char *o = malloc(n + 1), *w = o;
    if (!o) return NULL;
    for (const char *p = text; *p; p++) {
        if (*p == '\x1b' && p[1] == '[') {
            p += 2;
            while (*p && !isalpha((unsigned char)*p)) p++;
            if (!*p) break;
            continue;
        }
        *w++ = *p;
    }
    *w = 0;
    return o;
}

/* Splits a line on blanks into at most max tokens (in place). */
static int split(char *line, char **tok, int max) {
    int n = 0;
    for (char *p = strtok(line, " \t\r"); p && n < max; p = strtok(NULL, " \t\r")) tok[n++] = p;
    return n;
}

static int dev_index(const char *tok, const char *prefix) {
    size_t pl = strlen(prefix);
    if (strncmp(tok, prefix, pl) || !isdigit((unsigned char)tok[pl])) return -1;
    char *end;
    long v = strtol(tok + pl, &end, 10);
    return *end || v < 0 || v > 1000 ? -1 : (int)v;
}

int gpu_links_parse_smi(const char *text, gpu_links *out, st_err *err) {
    memset(out, 0, sizeof *out);
    for (int i = 0; i < GPU_LINKS_MAX_GPU; i++) out->gpu_numa[i] = -1;
    char *buf = strip_escapes(text ? text : "");
    if (!buf) return st_errf(err, "topo matrix: out of memory");
    int rc = -1, ncol = 0, col_gpu[64], col_nic[64], rows_gpu = 0, rows_nic = 0, numa_col = -1;
    char *save = NULL;
    for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char copy[4096];
        snprintf(copy, sizeof copy, "%s", line);
        char *tok[96];
        int n = split(copy, tok, 96);
        if (n == 0) continue;
        if (ncol == 0) { /* the header: GPU0 GPU1 ... NIC0 ... CPU Affinity NUMA Affinity ... */
            if (dev_index(tok[0], "GPU") != 0) continue;
            for (int i = 0; i < n; i++) {
                int g = dev_index(tok[i], "GPU"), k = dev_index(tok[i], "NIC");
                if (g < 0 && k < 0) {
                    /* "CPU Affinity NUMA Affinity GPU NUMA ID": NUMA is the 2nd word pair. */
                    for (int j = i; j + 1 < n; j++)
                        if (!strcmp(tok[j], "NUMA") && !strcmp(tok[j + 1], "Affinity")) {
                            numa_col = ncol + 1; /* after the CPU Affinity cell */
                            break;
                        }
                    break;
                }
                if (ncol >= 64) {
                    st_errf(err, "topo matrix: more than 64 columns");
                    goto out;
                }
                col_gpu[ncol] = g;
                col_nic[ncol] = k;
                if (g >= GPU_LINKS_MAX_GPU || k >= GPU_LINKS_MAX_NIC) {
                    st_errf(err, "topo matrix: %s is beyond the %d GPUs / %d NICs supported", tok[i],
                            GPU_LINKS_MAX_GPU, GPU_LINKS_MAX_NIC);
                    goto out;
                }
                if (g >= 0 && g + 1 > out->n_gpu) out->n_gpu = g + 1;
                if (k >= 0 && k + 1 > out->n_nic) out->n_nic = k + 1;
                ncol++;
            }
            for (int k = 0; k < out->n_nic; k++) snprintf(out->nic[k], sizeof out->nic[k], "NIC%d", k);
            continue;
        }
        int g = dev_index(tok[0], "GPU"), k = dev_index(tok[0], "NIC");
        if (!strncmp(tok[0], "NIC", 3) && tok[0][strlen(tok[0]) - 1] == ':' && n >= 2) {
            /* legend "NIC0: mlx5_0" */
            char idx[16];
            snprintf(idx, sizeof idx, "%.*s", (int)strlen(tok[0]) - 1, tok[0]);
            int j = dev_index(idx, "NIC");
            if (j >= 0 && j < out->n_nic) snprintf(out->nic[j], sizeof out->nic[j], "%s", tok[1]);
            continue;
        }
        if (g < 0 && k < 0) continue; /* legend text */
        if (n < 1 + ncol) {
            st_errf(err, "topo matrix: row %s has %d cells, the header %d", tok[0], n - 1, ncol);
            goto out;
        }
        if ((g >= 0 && g >= out->n_gpu) || (k >= 0 && k >= out->n_nic)) {
            st_errf(err, "topo matrix: row %s has no column", tok[0]);
            goto out;
        }
        for (int c = 0; c < ncol; c++) {
            gpu_link l;
            if (gpu_link_parse(tok[1 + c], &l)) {
                st_errf(err, "topo matrix: row %s: unknown link class '%s'", tok[0], tok[1 + c]);
                goto out;
            }
            if (g >= 0 && col_gpu[c] >= 0) out->gg[g][col_gpu[c]] = l;
            if (g >= 0 && col_nic[c] >= 0) out->gn[g][col_nic[c]] = l;
            if (k >= 0 && col_gpu[c] >= 0 && l.cls != out->gn[col_gpu[c]][k].cls && rows_gpu > col_gpu[c]) {
                st_errf(err, "topo matrix: NIC%d-GPU%d is %s but GPU%d-NIC%d is not", k, col_gpu[c],
                        tok[1 + c], col_gpu[c], k);
                goto out;
            }
        }
        if (g >= 0) {
            if (numa_col >= 0 && n > 1 + numa_col) {
                char *end;
                long v = strtol(tok[1 + numa_col], &end, 10);
                if (!*end && v >= 0 && v < 1024) out->gpu_numa[g] = (int)v;
            }
            rows_gpu++;
        } else {
            rows_nic++;
        }
    }
    if (ncol == 0 || out->n_gpu == 0) {
        st_errf(err, "topo matrix: no GPU0 header row");
        goto out;
    }
    if (rows_gpu != out->n_gpu) {
        st_errf(err, "topo matrix: %d GPU rows for %d GPU columns", rows_gpu, out->n_gpu);
        goto out;
    }
    for (int a = 0; a < out->n_gpu; a++) {
        if (out->gg[a][a].cls != LINK_X) {
            st_errf(err, "topo matrix: GPU%d's own cell is not X", a);
            goto out;
        }
        for (int b = 0; b < out->n_gpu; b++)
            if (out->gg[a][b].cls != out->gg[b][a].cls || out->gg[a][b].nv != out->gg[b][a].nv) {
                st_errf(err, "topo matrix: GPU%d-GPU%d differs from GPU%d-GPU%d", a, b, b, a);
                goto out;
            }
    }
    rc = 0;
out:
    free(buf);
    return rc;
}

/* ---------------------------------------------------------------- sysfs paths */

/* Splits "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0" into its root
 * ("pci0000:00") and the PCI components after it. Returns the component count. */
static int pci_chain(const char *path, char *root, size_t rcap, char comp[][16], int max) {
    const char *p = strstr(path, "/pci");
    root[0] = 0;
    if (!p) return -1;
    p++;
    const char *e = strchr(p, '/');
    size_t rl = e ? (size_t)(e - p) : strlen(p);
    snprintf(root, rcap, "%.*s", (int)rl, p);
    int n = 0;
    while (e && n < max) {
        p = e + 1;
        e = strchr(p, '/');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == 0) continue;
        if (l >= 16) break; /* not a PCI address (e.g. "net"): the chain ends */
        snprintf(comp[n++], 16, "%.*s", (int)l, p);
    }
    return n;
}

link_class pci_path_class(const char *a, const char *b, int numa_a, int numa_b) {
    char ra[64], rb[64], ca[32][16], cb[32][16];
    int na = pci_chain(a, ra, sizeof ra, ca, 32), nb = pci_chain(b, rb, sizeof rb, cb, 32);
    if (na < 1 || nb < 1) return LINK_UNKNOWN;
    if (strcmp(ra, rb)) {
        if (numa_a >= 0 && numa_b >= 0 && numa_a != numa_b) return LINK_SYS;
        return LINK_NODE;
    }
    int c = 0;
    while (c < na && c < nb && !strcmp(ca[c], cb[c])) c++;
    if (c == na && c == nb) return LINK_X;
    if (c == 0) return LINK_PHB; /* different root ports: through the host bridge */
    /* Bridges below the parting point on each side (the devices themselves excluded). */
    int below_a = na - c - 1, below_b = nb - c - 1;
    if (below_a < 0) below_a = 0;
    if (below_b < 0) below_b = 0;
    return below_a <= 1 && below_b <= 1 ? LINK_PIX : LINK_PXB;
}

/* ---------------------------------------------------------------- the TP rule */

static int pow2_floor(int v) {
    int p = 1;
    while (p * 2 <= v) p *= 2;
    return v < 1 ? 0 : p;
}

int gpu_links_tp_rule(const gpu_links *l, char *why, size_t why_cap) {
    int n = l->n_gpu, best = n > 0 ? 1 : 0, min_nv = 0;
    unsigned best_mask = 0;
    /* The largest pairwise-NVLinked set (n <= 16: all subsets). */
    for (unsigned m = 1; n > 1 && m < (1u << n); m++) {
        int k = __builtin_popcount(m);
        if (k <= best) continue;
        int ok = 1;
        for (int a = 0; a < n && ok; a++)
            for (int b = a + 1; b < n && ok; b++)
                if ((m >> a & 1) && (m >> b & 1) && l->gg[a][b].cls != LINK_NV) ok = 0;
        if (ok) {
            best = k;
            best_mask = m;
        }
    }
    if (best >= 2) {
        for (int a = 0; a < n; a++)
            for (int b = a + 1; b < n; b++)
                if ((best_mask >> a & 1) && (best_mask >> b & 1) && (!min_nv || l->gg[a][b].nv < min_nv))
                    min_nv = l->gg[a][b].nv;
        if (why) snprintf(why, why_cap, "%d of %d GPUs NVLinked (NV%d or more)", best, n, min_nv);
        return pow2_floor(best);
    }
    if (n < 2) {
        if (why) snprintf(why, why_cap, n ? "one GPU" : "no GPU");
        return n;
    }
    link_class worst = LINK_X;
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++)
            if (l->gg[a][b].cls > worst) worst = l->gg[a][b].cls;
    if (why) snprintf(why, why_cap, "no NVLink between %d GPUs (PCIe up to %s): TP at most 2", n, k_names[worst]);
    return 2;
}

int gpu_links_tp_pick(const gpu_links *l, int want, int *overridden) {
    int rule = gpu_links_tp_rule(l, NULL, 0);
    if (overridden) *overridden = 0;
    if (want <= 0) return rule;
    if (want > rule && overridden) *overridden = 1;
    return want;
}

void gpu_links_summary(const gpu_links *l, char *buf, size_t cap) {
    char why[160], b1[16];
    int tp = gpu_links_tp_rule(l, why, sizeof why);
    link_class nic_best = LINK_UNKNOWN, nic_worst = LINK_X;
    gpu_link nic_best_l = {LINK_UNKNOWN, 0};
    for (int g = 0; g < l->n_gpu; g++) {
        link_class near = LINK_UNKNOWN;
        for (int k = 0; k < l->n_nic; k++)
            if (l->gn[g][k].cls < near) near = l->gn[g][k].cls;
        if (near < nic_best) nic_best = near;
        if (near > nic_worst) nic_worst = near;
    }
    nic_best_l.cls = nic_best;
    if (l->n_nic)
        snprintf(buf, cap, "%d GPU, TP<=%d (%s); %d NIC, nearest %s..%s", l->n_gpu, tp, why, l->n_nic,
                 gpu_link_str(nic_best_l, b1, sizeof b1), k_names[nic_worst]);
    else
        snprintf(buf, cap, "%d GPU, TP<=%d (%s); no NIC", l->n_gpu, tp, why);
}

/* "0000:17:00.0" -> its four numbers; -1 when it is not a PCI address. */
static int bus_parse(const char *s, unsigned v[4]) {
    int used = 0;
    if (!s || strspn(s, "0123456789abcdefABCDEF:.") != strlen(s) || sscanf(s, "%x:%x:%x.%x%n", &v[0], &v[1], &v[2], &v[3], &used) != 4 || s[used]) return -1;
    return 0;
}

int gpu_links_reorder(const gpu_links *l, const char *const *busids, int n, gpu_links *out, st_err *err) {
    int map[GPU_LINKS_MAX_GPU];
    if (n < 0 || n > GPU_LINKS_MAX_GPU) return st_errf(err, "links: %d GPUs (at most %d)", n, GPU_LINKS_MAX_GPU);
    for (int i = 0; i < n; i++) {
        unsigned want[4], have[4];
        if (bus_parse(busids[i], want)) return st_errf(err, "links: GPU %d: '%s' is not a PCI bus id", i, busids[i]);
        map[i] = -1;
        for (int g = 0; g < l->n_gpu && map[i] < 0; g++)
            if (!bus_parse(l->busid[g], have) && !memcmp(want, have, sizeof want)) map[i] = g;
        if (map[i] < 0) return st_errf(err, "links: GPU %d (%s) is not among the %d GPUs on the PCI bus", i, busids[i], l->n_gpu);
    }
    gpu_links o = *l;
    o.n_gpu = n;
    for (int i = 0; i < n; i++) {
        o.gpu_numa[i] = l->gpu_numa[map[i]];
        memcpy(o.busid[i], l->busid[map[i]], sizeof o.busid[i]);
        for (int j = 0; j < n; j++) o.gg[i][j] = l->gg[map[i]][map[j]];
        for (int k = 0; k < l->n_nic; k++) o.gn[i][k] = l->gn[map[i]][k];
    }
    *out = o;
    return 0;
}
