/* fd_room.h — room for the live nodes' connections under the open-file
 * limit: each live node holds one gRPC connection (one descriptor), and past
 * the limit (less 64 descriptors for the rest) new workers' connections fail
 * with EMFILE. Logged once per crossing of 90% and of the limit, and once
 * when back below 90%. Loop thread. */
#ifndef STRATA_COORDINATOR_CONTROL_FD_ROOM_H
#define STRATA_COORDINATOR_CONTROL_FD_ROOM_H

#include <stdint.h>

#include "coordinator/control/registry.h"

typedef struct fd_room {
    uint64_t limit;          /* RLIMIT_NOFILE at fd_room_init; 0 = unlimited */
    int alarm;               /* 0, 1 = near the limit logged, 2 = at it logged */
} fd_room;

/* Reads the limit (after the coordinator raised it: main.c). */
void fd_room_init(fd_room *f);
/* Every tick: counts the live nodes (a lease each) and logs a crossing. */
void fd_room_check(fd_room *f, const registry *reg);

#endif
