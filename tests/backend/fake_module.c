/* fake_module.c — a backend module of a future ABI: the registry must refuse
 * it (test_backend_registry badabi) without calling anything in it. */
#include "compute/registry.h"

__attribute__((visibility("default"))) const backend_module *strata_backend_module_init(int abi) {
    return abi == BACKEND_MODULE_ABI + 1 ? (const backend_module *)0 : (const backend_module *)0;
}
