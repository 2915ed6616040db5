/* registry.c — backends by name: "cpu" built in, "cuda" from libstrata-cuda.so
 * through dlopen (registry.h). */
#define _GNU_SOURCE
#include "compute/registry.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"

#define CUDA_MODULE_FILE "libstrata-cuda.so"

/* ---------------------------------------------------------------- cpu */

static int cpu_device_count(void) { return 1; }

static int cpu_device_info(int device, backend_device_info *out, st_err *err) {
    if (device != 0) return st_errf(err, "backend cpu: no device %d", device);
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "cpu");
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    out->memory_bytes = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    return 0;
}

static backend *cpu_backend_new(int device, int n_threads, st_err *err) {
    (void)device;
    return backend_cpu_new(n_threads, err);
}

static backend_group *cpu_group_new(int n, const int *devices, st_err *err) {
    (void)devices; /* threads of this process */
    return (backend_group *)comm_cpu_group_new(n, err);
}
static comm *cpu_group_rank(backend_group *g, int r) { return comm_cpu_rank((comm_cpu_group *)g, r); }
static void cpu_group_free(backend_group *g) { comm_cpu_group_free((comm_cpu_group *)g); }

static const backend_module k_cpu = {
    .abi = BACKEND_MODULE_ABI,
    .name = "cpu",
    .device_memory = false,
    .device_count = cpu_device_count,
    .device_info = cpu_device_info,
    .backend_new = cpu_backend_new,
    .group_new = cpu_group_new,
    .group_rank = cpu_group_rank,
    .group_free = cpu_group_free,
};

/* ---------------------------------------------------------------- modules */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static const backend_module *g_cuda;
static char g_cuda_why[512];
static int g_cuda_tried;
static char g_cuda_path[PATH_MAX + 64]; /* the module file opened (for the log) */

/* dlopen of path; on failure appends the loader's reason to why. */
static void *try_open(const char *path, char *why, size_t cap) {
    snprintf(g_cuda_path, sizeof g_cuda_path, "%s", path);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        size_t used = strlen(why);
        const char *e = dlerror();
        if (used < cap) snprintf(why + used, cap - used, "%s%s", used ? "; " : "", e ? e : path);
    }
    return h;
}

static void *open_cuda_module(char *why, size_t cap) {
    char path[PATH_MAX + 64];
    const char *env = getenv("STRATA_BACKEND_PATH");
    if (env && *env) {
        size_t l = strlen(env);
        if (l > 3 && !strcmp(env + l - 3, ".so"))
            snprintf(path, sizeof path, "%s", env);
        else
            snprintf(path, sizeof path, "%s/%s", env, CUDA_MODULE_FILE);
        /* An explicit path is the only one tried: the operator asked for it. */
        return try_open(path, why, cap);
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        static const char *const rel[] = {"", "/../lib", "/../lib/strata"};
        for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
            snprintf(path, sizeof path, "%s%s/%s", exe, rel[i], CUDA_MODULE_FILE);
            char real[PATH_MAX];
            if (access(path, R_OK) == 0) return try_open(realpath(path, real) ? real : path, why, cap);
        }
    }
#ifdef STRATA_MODULE_DIR
    snprintf(path, sizeof path, "%s/%s", STRATA_MODULE_DIR, CUDA_MODULE_FILE);
    if (access(path, R_OK) == 0) return try_open(path, why, cap);
#endif
    return try_open(CUDA_MODULE_FILE, why, cap);
}

static const backend_module *load_cuda(st_err *err) {
    pthread_mutex_lock(&g_mu);
    if (!g_cuda_tried) {
        g_cuda_tried = 1;
        g_cuda_why[0] = 0;
        void *h = open_cuda_module(g_cuda_why, sizeof g_cuda_why);
        if (h) {
            backend_module_init_fn init = (backend_module_init_fn)(uintptr_t)dlsym(h, BACKEND_MODULE_SYMBOL);
            const backend_module *m = init ? init(BACKEND_MODULE_ABI) : NULL;
            if (!init)
                snprintf(g_cuda_why, sizeof g_cuda_why, "%s has no %s", CUDA_MODULE_FILE, BACKEND_MODULE_SYMBOL);
            else if (!m || m->abi != BACKEND_MODULE_ABI)
                snprintf(g_cuda_why, sizeof g_cuda_why, "%s does not speak module ABI %d", CUDA_MODULE_FILE,
                         BACKEND_MODULE_ABI);
            else
                g_cuda = m;
            /* The handle stays open for the process: its table is referenced. */
            if (!g_cuda) dlclose(h);
        }
        if (g_cuda) ST_INFO("backend: cuda module %s loaded (%d device(s))", g_cuda_path, g_cuda->device_count());
        else ST_INFO("backend: cuda module not loaded: %s", g_cuda_why);
    }
    const backend_module *m = g_cuda;
    if (!m) st_errf(err, "backend cuda: no CUDA device (module %s: %s)", CUDA_MODULE_FILE, g_cuda_why);
    pthread_mutex_unlock(&g_mu);
    return m;
}

const backend_module *backend_registry_get(const char *name, st_err *err) {
    if (!name || !strcmp(name, "cpu")) return &k_cpu;
    if (!strcmp(name, "cuda")) return load_cuda(err);
    st_errf(err, "backend '%s' is not available ('cpu' or 'cuda')", name);
    return NULL;
}

const char *backend_registry_detect(backend_device_info *out, int max, int *n) {
    *n = 0;
    st_err err;
    const backend_module *m = load_cuda(&err);
    int count = m ? m->device_count() : 0;
    if (count <= 0) return "cpu";
    for (int i = 0; i < count && *n < max; i++)
        if (m->device_info(i, &out[*n], &err) == 0) (*n)++;
    return *n ? "cuda" : "cpu";
}
