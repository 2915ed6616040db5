/* nvml_links.c — NVLink from NVML opened with dlopen (nvml_links.h). */
#include "ib/nvml_links.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ib/fabric_env.h"

/* The NVML ABI used (stable since NVML 5 / driver 418): return code 0 is
 * NVML_SUCCESS; NVML_P2P_CAPS_INDEX_NVLINK = 2; NVML_P2P_STATUS_OK = 0;
 * NVML_FEATURE_ENABLED = 1; at most NVML_NVLINK_MAX_LINKS = 18 links. */
typedef void *nvml_device;
enum { NVML_OK = 0, P2P_CAPS_NVLINK = 2, P2P_STATUS_OK = 0, FEATURE_ENABLED = 1, NVLINK_MAX_LINKS = 18 };

typedef struct nvml_api {
    int (*init)(void);
    int (*shutdown)(void);
    int (*count)(unsigned *);
    int (*handle)(unsigned, nvml_device *);
    int (*p2p)(nvml_device, nvml_device, int, int *);
    int (*link_state)(nvml_device, unsigned, int *);
} nvml_api;

static void *sym(void *h, const char *name, int *missing) {
    void *p = dlsym(h, name);
    if (!p) *missing = 1;
    return p;
}

int nvml_overlay_nvlinks(gpu_links *l, const char *lib, st_err *err) {
    if (!lib) lib = getenv("STRATA_NVML_LIBRARY");
    if (!lib || !*lib) lib = "libnvidia-ml.so.1";
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        return st_errf(err, "nvml: %s", e ? e : lib);
    }
    int missing = 0;
    nvml_api a;
    *(void **)&a.init = sym(h, "nvmlInit_v2", &missing);
    *(void **)&a.shutdown = sym(h, "nvmlShutdown", &missing);
    *(void **)&a.count = sym(h, "nvmlDeviceGetCount_v2", &missing);
    *(void **)&a.handle = sym(h, "nvmlDeviceGetHandleByIndex_v2", &missing);
    *(void **)&a.p2p = sym(h, "nvmlDeviceGetP2PStatus", &missing);
    *(void **)&a.link_state = sym(h, "nvmlDeviceGetNvLinkState", &missing);
    if (missing) {
        dlclose(h);
        return st_errf(err, "nvml: %s lacks an entry point this build uses", lib);
    }
    if (a.init() != NVML_OK) {
        dlclose(h);
        return st_errf(err, "nvml: nvmlInit_v2 failed (no driver?)");
    }
    unsigned n = 0;
    int rc = -1;
    nvml_device dev[GPU_LINKS_MAX_GPU];
    int links[GPU_LINKS_MAX_GPU] = {0};
    if (a.count(&n) != NVML_OK) {
        st_errf(err, "nvml: nvmlDeviceGetCount_v2 failed");
        goto out;
    }
    if (n > GPU_LINKS_MAX_GPU) n = GPU_LINKS_MAX_GPU;
    for (unsigned i = 0; i < n; i++) {
        if (a.handle(i, &dev[i]) != NVML_OK) {
            st_errf(err, "nvml: no handle for GPU %u", i);
            goto out;
        }
        for (unsigned k = 0; k < NVLINK_MAX_LINKS; k++) {
            int on = 0;
            if (a.link_state(dev[i], k, &on) == NVML_OK && on == FEATURE_ENABLED) links[i]++;
        }
    }
    if ((int)n > l->n_gpu) { /* sysfs saw fewer (a container): NVML's count wins */
        for (unsigned i = (unsigned)l->n_gpu; i < n; i++) {
            l->gpu_numa[i] = -1;
            for (unsigned j = 0; j < n; j++) l->gg[i][j] = l->gg[j][i] = (gpu_link){LINK_UNKNOWN, 0};
        }
        l->n_gpu = (int)n;
    }
    for (unsigned i = 0; i < n; i++) {
        l->gg[i][i] = (gpu_link){LINK_X, 0};
        for (unsigned j = i + 1; j < n; j++) {
            int st = -1;
            if (a.p2p(dev[i], dev[j], P2P_CAPS_NVLINK, &st) == NVML_OK && st == P2P_STATUS_OK) {
                int k = links[i] < links[j] ? links[i] : links[j];
                l->gg[i][j] = l->gg[j][i] = (gpu_link){LINK_NV, k > 0 ? k : 1};
            }
        }
    }
    rc = (int)n;
out:
    a.shutdown();
    dlclose(h);
    return rc;
}

int node_links_detect(const char *sysroot, gpu_links *out, st_err *err) {
    fabric_node *n = calloc(1, sizeof *n);
    if (!n) return st_errf(err, "links: out of memory");
    int rc = fabric_scan(sysroot, n, err);
    if (rc == 0) fabric_links(n, out);
    free(n);
    if (rc) return -1;
    st_err e2;
    (void)nvml_overlay_nvlinks(out, NULL, &e2); /* no NVML: PCIe classes only */
    return 0;
}
