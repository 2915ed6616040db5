/* strata_topo.c — strata-topo: prints this node's topology (CPUs, NUMA nodes,
 * GPUs, RDMA devices) and the NCCL_IB_* settings derived from it (ib/topo.h).
 *
 *   strata-topo                       the report
 *   strata-topo --nccl-env            only the NCCL_IB_* lines (KEY=VALUE)
 *   strata-topo --nccl-env --output F  the same, written to F atomically
 *                                      (F.tmp + rename), for EnvironmentFile=
 *
 * Exit status: 0; 1 when detection fails or F cannot be written; 2 on a bad
 * flag.
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/version.h"
#include "ib/topo.h"

#define MAX_DEVS 32

static void usage(FILE *f)
{
    fprintf(f,
            "usage: strata-topo [--nccl-env [--output FILE]] | --version\n"
            "  (none)         CPUs, NUMA nodes, GPUs, RDMA devices and the NCCL settings\n"
            "  --nccl-env     only the NCCL_IB_* settings, as KEY=VALUE lines\n"
            "  --output FILE  write them to FILE (atomically) instead of stdout\n");
}

static int write_env_file(const char *path, const rdma_device *devs, int n, st_err *err)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) return st_errf(err, "%s: path too long", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return st_errf(err, "cannot write %s: %m", tmp);
    int rc = topo_print_nccl_env(f, devs, n, err);
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
                                         {"help", no_argument, 0, 'h'},
                                         {"version", no_argument, 0, 'V'},
                                         {0, 0, 0, 0}};
    int nccl_env = 0;
    const char *output = NULL;
    opterr = 0;
    for (int c; (c = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        switch (c) {
        case 'n': nccl_env = 1; break;
        case 'o': output = optarg; break;
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
    if (nccl_env) {
        int rc = output ? write_env_file(output, devs, n, &err) : topo_print_nccl_env(stdout, devs, n, &err);
        if (rc != 0) {
            fprintf(stderr, "strata-topo: %s\n", err.msg);
            return 1;
        }
        return 0;
    }
    topo_info t;
    if (topo_detect(&t, &err) != 0 || topo_print(stdout, &t, devs, n, &err) != 0) {
        fprintf(stderr, "strata-topo: %s\n", err.msg);
        return 1;
    }
    return 0;
}
