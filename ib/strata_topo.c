/* strata_topo.c — strata-topo: prints this node's topology (CPUs, NUMA nodes,
 * GPUs, RDMA devices) and the NCCL/UCX fabric settings derived from it (ib/fabric_env.h).
 *
 *   strata-topo                       the report
 *   strata-topo --nccl-env            only the NCCL/UCX fabric lines (KEY=VALUE,
 *                                      ib/fabric_env.h), from sysfs; policy from
 *                                      --ib-tc N --ib-sl N --qps-per-connection N
 *                                      --socket-ifname IF; --sysroot DIR reads a
 *                                      fixture tree instead of /
 *   strata-topo --nccl-env --output F  the same, written to F atomically
 *                                      (F.tmp + rename), for EnvironmentFile=
 *
 * Exit status: 0; 1 when detection fails or F cannot be written; 2 on a bad
 * flag.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/version.h"
#include "ib/topo.h"

#define MAX_DEVS 32

static void usage(FILE *f)
{
    fprintf(f,
            "usage: strata-topo [--nccl-env [--output FILE]] [POLICY] | --version\n"
            "  (none)         CPUs, NUMA nodes, GPUs, RDMA devices and the fabric settings\n"
            "  --nccl-env     only the NCCL_*/UCX_* settings, as KEY=VALUE lines\n"
            "  --output FILE  write them to FILE (atomically) instead of stdout\n"
            "  POLICY: --ib-tc N (0-255)  --ib-sl N (0-15)  --qps-per-connection N  --socket-ifname IF\n"
            "  --sysroot DIR  read sysfs under DIR (tests)\n");
}

static int write_env_file(const char *path, const fabric_env *fe, st_err *err)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) return st_errf(err, "%s: path too long", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return st_errf(err, "cannot write %s: %m", tmp);
    fabric_env_print(f, fe);
    int rc = 0;
    if (fflush(f) != 0 || ferror(f)) rc = rc ? rc : st_errf(err, "cannot write %s: %m", tmp);
    if (fclose(f) != 0) rc = rc ? rc : st_errf(err, "cannot write %s: %m", tmp);
    if (rc == 0 && rename(tmp, path) != 0) rc = st_errf(err, "cannot rename %s to %s: %m", tmp, path);
    if (rc != 0) unlink(tmp);
    return rc;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"nccl-env", no_argument, 0, 'n'},
                                         {"output", required_argument, 0, 'o'},
                                         {"ib-tc", required_argument, 0, 't'},
                                         {"ib-sl", required_argument, 0, 's'},
                                         {"qps-per-connection", required_argument, 0, 'q'},
                                         {"socket-ifname", required_argument, 0, 'i'},
                                         {"sysroot", required_argument, 0, 'r'},
                                         {"help", no_argument, 0, 'h'},
                                         {"version", no_argument, 0, 'V'},
                                         {0, 0, 0, 0}};
    int nccl_env = 0;
    const char *output = NULL, *sysroot = "/";
    fabric_config cfg = FABRIC_CONFIG_DEFAULT;
    opterr = 0;
    for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        switch (c) {
        case 'n': nccl_env = 1; break;
        case 'o': output = optarg; break;
        case 't':
        case 's':
        case 'q':
        case 'i': {
            st_err ferr;
            const char *flag = c == 't' ? "--ib-tc" : c == 's' ? "--ib-sl" : c == 'q' ? "--qps-per-connection"
                                                                                        : "--socket-ifname";
            if (fabric_config_option(&cfg, flag, optarg, &ferr) != 0) {
                fprintf(stderr, "strata-topo: error: %s\n", ferr.msg);
                return 2;
            }
            break;
        }
        case 'r': sysroot = optarg; break;
        case 'h': usage(stdout); return 0;
        case 'V': st_version_print(stdout, "strata-topo"); return 0;
        default:
            fprintf(stderr, "strata-topo: error: unknown or incomplete option '%s' (see --help)\n", argv[optind - 1]);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "strata-topo: error: unexpected argument '%s' (see --help)\n", argv[optind]);
        return 2;
    }
    if (output && !nccl_env) {
        fprintf(stderr, "strata-topo: error: --output needs --nccl-env (see --help)\n");
        return 2;
    }
    st_err err = {{0}};
    rdma_device devs[MAX_DEVS];
    int n = rdma_list_devices(devs, MAX_DEVS, &err);
    if (n < 0) {
        fprintf(stderr, "strata-topo: %s\n", err.msg);
        return 1;
    }
    /* The fabric settings come from sysfs (PCI paths give the rails); without
     * /sys/class/infiniband (a container) from the verbs device list. */
    fabric_node *node = calloc(1, sizeof *node);
    fabric_env fe;
    if (!node) {
        fprintf(stderr, "strata-topo: out of memory\n");
        return 1;
    }
    int frc = fabric_node_detect(sysroot, node, &err);
    if (frc == 0) frc = fabric_derive(node, &cfg, &fe, &err);
    free(node);
    if (frc != 0) {
        fprintf(stderr, "strata-topo: %s\n", err.msg);
        return 1;
    }
    for (int i = 0; i < fe.n_notes; i++)
        if (!strncmp(fe.notes[i], "warning", 7)) fprintf(stderr, "strata-topo: %s\n", fe.notes[i]);
    if (nccl_env) {
        int rc = output ? write_env_file(output, &fe, &err) : (fabric_env_print(stdout, &fe), 0);
        if (rc != 0) {
            fprintf(stderr, "strata-topo: %s\n", err.msg);
            return 1;
        }
        return 0;
    }
    topo_info t;
    if (topo_detect(&t, &err) != 0 || topo_print(stdout, &t, devs, n, &fe, &err) != 0) {
        fprintf(stderr, "strata-topo: %s\n", err.msg);
        return 1;
    }
    return 0;
}
