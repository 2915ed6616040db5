/* fd_room.c — the live nodes' connections against the open-file limit
 * (fd_room.h). */
#include "coordinator/control/fd_room.h"

#include <inttypes.h>
#include <sys/resource.h>

#include "common/log.h"

void fd_room_init(fd_room *f) {
    struct rlimit rl;
    f->limit = 0;
    f->alarm = 0;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) f->limit = rl.rlim_cur;
}

void fd_room_check(fd_room *f, const registry *reg) {
    if (!f->limit) return;
    uint64_t live = 0;
    for (int i = 0; i < reg->n; i++) live += reg->nodes[i].lease != 0;
    uint64_t room = f->limit > 64 ? f->limit - 64 : 0;
    int level = live >= room ? 2 : live * 10 >= room * 9 ? 1 : 0;
    if (level > f->alarm && level == 2)
        ST_ERROR("control: %" PRIu64 " live nodes, one connection each, are within 64 descriptors of the "
                 "open-file limit %" PRIu64 ": workers past it cannot connect (EMFILE); raise the hard limit "
                 "(LimitNOFILE=, ulimit -Hn) and restart the coordinator",
                 live, f->limit);
    else if (level > f->alarm)
        ST_WARN("control: %" PRIu64 " live nodes: close to the open-file limit %" PRIu64
                " (one connection each; about %" PRIu64 " fit); raise LimitNOFILE= for a bigger fleet",
                live, f->limit, room);
    else if (level < f->alarm && level == 0)
        ST_INFO("control: %" PRIu64 " live nodes, below 90%% of the open-file limit %" PRIu64 " again", live,
                f->limit);
    if (level > f->alarm || level == 0) f->alarm = level;
}
