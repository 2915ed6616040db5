/* grpc_log.c — gRPC's log lines through common/log.h, rate-limited per
 * source line (grpc_log.h). */
#include "rpc/grpc_log.h"

#include <grpc/support/log.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/log_limit.h"

#define SLOTS 64 /* source lines tracked; two lines sharing a slot share its limit */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static st_log_limit limits[SLOTS];

static unsigned slot_of(const char *file, int line)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const char *p = file ? file : ""; *p; p++) h = (h ^ (uint8_t)*p) * 16777619u;
    h = (h ^ (uint32_t)line) * 16777619u;
    return h % SLOTS;
}

static void on_log(gpr_log_func_args *a)
{
    unsigned long dropped = 0;
    pthread_mutex_lock(&mu);
    bool ok = st_log_limit_allow(&limits[slot_of(a->file, a->line)], st_now_s(), &dropped);
    pthread_mutex_unlock(&mu);
    if (!ok) return;
    const char *f = a->file ? strrchr(a->file, '/') : NULL;
    enum st_log_level lv = a->severity == GPR_LOG_SEVERITY_ERROR ? ST_LOG_WARN
                           : a->severity == GPR_LOG_SEVERITY_INFO ? ST_LOG_INFO
                                                                  : ST_LOG_DEBUG;
    if (dropped)
        st_log(lv, "grpc: %s (%s:%d; %lu more like it in the last %.0f s)", a->message, f ? f + 1 : a->file,
               a->line, dropped, GRPC_LOG_INTERVAL_S);
    else
        st_log(lv, "grpc: %s (%s:%d)", a->message, f ? f + 1 : a->file, a->line);
}

static void install(void)
{
    for (int i = 0; i < SLOTS; i++) limits[i] = (st_log_limit)ST_LOG_LIMIT_INIT(GRPC_LOG_INTERVAL_S);
    gpr_set_log_function(on_log);
}

void rpc_log_install(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, install);
}
