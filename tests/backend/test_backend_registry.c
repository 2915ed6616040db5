/* test_backend_registry.c — compute/registry.h. Run by ctest in several
 * environments (the cuda module is loaded once per process):
 *   (no argument)  "cpu" by name and by NULL, a working backend and TP group
 *                  from its table, an unknown name refused; "cuda": with the
 *                  module built and no GPU (this machine) the module loads and
 *                  counts 0 devices, so detection reports "cpu"; on a GPU
 *                  machine it reports "cuda" with each GPU's name, memory and
 *                  PCI bus id.
 *   missing        STRATA_BACKEND_PATH names no file: "cuda" is the clean
 *                  "no CUDA device (module ...: <loader's reason>)" error.
 *   badabi         STRATA_BACKEND_PATH names a module that does not speak
 *                  BACKEND_MODULE_ABI: refused with that reason, never called.
 */
#include <stdlib.h>
#include <string.h>

#include "compute/registry.h"
#include "tests/testutil.h"

static void test_cpu(void) {
    st_err err = {{0}};
    const backend_module *m = backend_registry_get("cpu", &err);
    REQUIRE(m);
    CHECK(!m->host_alloc && !m->host_free && !m->p2p); /* plain host memory, no NCCL */
    CHECK(backend_registry_get(NULL, &err) == m);
    CHECK_EQ_STR(m->name, "cpu");
    CHECK_EQ_INT(m->abi, BACKEND_MODULE_ABI);
    CHECK(!m->device_memory);
    CHECK_EQ_INT(m->device_count(), 1);
    backend_device_info di;
    CHECK_EQ_INT(m->device_info(0, &di, &err), 0);
    CHECK_EQ_STR(di.name, "cpu");
    CHECK(di.memory_bytes > 0);
    CHECK_EQ_INT(m->device_info(1, &di, &err), -1);
    backend *b = m->backend_new(0, 1, &err);
    REQUIRE_MSG(b, "%s", err.msg);
    CHECK_EQ_STR(b->ops->name, "cpu");
    /* A real op through the table's backend: y = x + x. */
    float *x = b->ops->alloc(b, 4 * sizeof(float), &err);
    REQUIRE(x);
    const float h[4] = {1, 2, 3, 4};
    float out[4];
    CHECK_EQ_INT(b->ops->upload(b, x, h, sizeof h, &err), 0);
    CHECK_EQ_INT(b->ops->add(b, x, x, 4, &err), 0);
    CHECK_EQ_INT(b->ops->download(b, out, x, sizeof out, &err), 0);
    CHECK(out[0] == 2 && out[3] == 8);
    b->ops->release(b, x);
    backend_free(b);
    backend_group *g = m->group_new(2, NULL, &err);
    REQUIRE_MSG(g, "%s", err.msg);
    CHECK(m->group_rank(g, 0) != NULL);
    CHECK(m->group_rank(g, 1) != NULL);
    m->group_free(g);
    err.msg[0] = 0;
    CHECK(backend_registry_get("tpu", &err) == NULL);
    CHECK_EQ_STR(err.msg, "backend 'tpu' is not available ('cpu' or 'cuda')");
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    st_err err = {{0}};
    if (!strcmp(mode, "missing") || !strcmp(mode, "badabi")) {
        CHECK(backend_registry_get("cuda", &err) == NULL);
        CHECK_MSG(!strncmp(err.msg, "backend cuda: no CUDA device (module libstrata-cuda.so: ", 56), "got: %s", err.msg);
        char abi[64];
        snprintf(abi, sizeof abi, "does not speak module ABI %d", BACKEND_MODULE_ABI);
        const char *want = !strcmp(mode, "missing") ? "cannot open shared object file" : abi;
        CHECK_MSG(strstr(err.msg, want) != NULL, "got: %s", err.msg);
        backend_device_info d[4];
        int n = -1;
        CHECK_EQ_STR(backend_registry_detect(d, 4, &n), "cpu");
        CHECK_EQ_INT(n, 0);
        test_cpu(); /* the built-in backend is unaffected */
        return test_summary();
    }
    test_cpu();
    const backend_module *cuda = backend_registry_get("cuda", &err);
    backend_device_info d[16];
    int n = -1;
    const char *kind = backend_registry_detect(d, 16, &n);
#ifdef STRATA_CUDA_MODULE_BUILT
    REQUIRE_MSG(cuda, "the module is built but did not load: %s", err.msg);
    CHECK_EQ_STR(cuda->name, "cuda");
    CHECK(cuda->device_memory);
    /* ABI 2: the pinned allocator of the activation hand-off and the NCCL
     * point-to-point of a pipeline boundary (128-byte unique ids) */
    CHECK(cuda->host_alloc && cuda->host_free);
    CHECK(cuda->p2p && cuda->p2p->id_bytes == 128 && cuda->p2p->unique_id && cuda->p2p->open && cuda->p2p->send &&
          cuda->p2p->recv && cuda->p2p->close);
    int count = cuda->device_count();
    printf("cuda module loaded: %d device(s)\n", count);
    if (count == 0) {
        CHECK_EQ_STR(kind, "cpu");
        CHECK_EQ_INT(n, 0);
    } else {
        CHECK_EQ_STR(kind, "cuda");
        CHECK_EQ_INT(n, count < 16 ? count : 16);
        for (int i = 0; i < n; i++) {
            printf("gpu %d: %s, %llu bytes, %s\n", i, d[i].name, (unsigned long long)d[i].memory_bytes, d[i].pci_bus_id);
            CHECK(d[i].name[0] != 0);
            CHECK(d[i].memory_bytes > 0);
            CHECK_EQ_INT((int)strlen(d[i].pci_bus_id), 12);
        }
    }
#else
    CHECK(cuda == NULL);
    CHECK_EQ_STR(kind, "cpu");
#endif
    return test_summary();
}
