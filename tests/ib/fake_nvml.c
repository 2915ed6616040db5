/* fake_nvml.c — an NVML of 8 GPUs for test_gpu_links: GPUs 0-5 have 18
 * active NVLinks through an NVSwitch (NVLink peer-to-peer between each pair),
 * GPUs 6-7 have none. Only the entry points nvml_links.c uses. */
#include <stdint.h>

int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned *n) { *n = 8; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **d) {
    if (i >= 8) return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    *d = (void *)(uintptr_t)(i + 1);
    return 0;
}
int nvmlDeviceGetNvLinkState(void *d, unsigned link, int *on) {
    unsigned i = (unsigned)(uintptr_t)d - 1;
    if (link >= 18) return 2;
    *on = i < 6;
    return 0;
}
int nvmlDeviceGetP2PStatus(void *a, void *b, int cap, int *status) {
    unsigned i = (unsigned)(uintptr_t)a - 1, j = (unsigned)(uintptr_t)b - 1;
    *status = cap == 2 && i < 6 && j < 6 ? 0 : 4; /* NVML_P2P_STATUS_NOT_SUPPORTED */
    return 0;
}
