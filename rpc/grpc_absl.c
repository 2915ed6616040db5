/* grpc_absl.c — abseil's mutex deadlock detector off (grpc_absl.h). */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include "rpc/grpc_absl.h"

#include <dlfcn.h>
#include <pthread.h>

static void off_once(void) {
    void (*set)(int) = (void (*)(int))dlsym(RTLD_DEFAULT,
                                            "_ZN4absl7debian329SetMutexDeadlockDetectionModeENS0_15OnDeadlockCycleE");
    if (set) set(0); /* absl::OnDeadlockCycle::kIgnore */
}

void rpc_absl_debug_off(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, off_once);
}
