/* static_recovery.h — the static coordinator's recovery from a lost stage
 * (cluster_opts.recover, docs/recovery.md): the same worker is expected
 * back. An explicit state machine; the cluster performs its actions through
 * callbacks, so this file knows nothing of links or requests.
 *
 *   IDLE --lost(stage)--> RECONNECTING           relink(stage); recovery_timeout armed
 *   RECONNECTING --all stages ready--> REASSIGNING   reassign_all(): every stage gets its
 *                                                StageAssign again (survivors answer at once
 *                                                and reconnect their next hop now)
 *   REASSIGNING --all stages ready--> IDLE        resume(seconds since the loss)
 *   REASSIGNING --a stage dropped--> RECONNECTING
 *   any active --a stage failed to load--> RECONNECTING   relink(stage)
 *   any active --recovery_timeout--> (same phase), expired: fail_held(); new requests
 *                                                are refused until the resume
 *
 * Threading: the loop thread of the event base given to init. */
#ifndef STRATA_COORDINATOR_SERVE_STATIC_RECOVERY_H
#define STRATA_COORDINATOR_SERVE_STATIC_RECOVERY_H

#include <stdbool.h>
#include <stdint.h>

struct event_base;
struct event;

enum recovery_phase {
    RECOVERY_IDLE,         /* serving, or never lost */
    RECOVERY_RECONNECTING, /* requests held; the lost stage's worker is being reconnected and loaded */
    RECOVERY_REASSIGNING,  /* every stage was ready and was sent its StageAssign again */
};

typedef struct static_recovery_ops {
    void (*relink)(void *ud, int stage);       /* close the stage's connection (if any) and reconnect */
    void (*reassign_all)(void *ud);            /* every connected stage gets its StageAssign again */
    void (*resume)(void *ud, double since_loss_s); /* every stage is back: the held requests resume */
    void (*expire)(void *ud, double timeout_s);    /* recovery_timeout passed: the held requests end */
    void *ud;
} static_recovery_ops;

typedef struct static_recovery {
    enum recovery_phase phase;
    bool expired;          /* recovery_timeout passed in this recovery */
    double timeout_s;      /* recovery_timeout */
    double lost_at;        /* monotonic seconds of the loss */
    uint64_t n_recoveries; /* losses recovered from or being recovered from */
    struct event *timer;
    static_recovery_ops ops;
} static_recovery;

/* timeout_s <= 0: 60 s. -1 when the timer cannot be made. */
int static_recovery_init(static_recovery *r, struct event_base *base, double timeout_s,
                         const static_recovery_ops *ops);
void static_recovery_free(static_recovery *r);

/* Transitions (see the table above). */
void static_recovery_lost(static_recovery *r, int stage);
void static_recovery_all_ready(static_recovery *r);
void static_recovery_stage_dropped(static_recovery *r);
void static_recovery_load_failed(static_recovery *r, int stage);

/* A recovery is under way (requests held, or expired and waiting). */
bool static_recovery_active(const static_recovery *r);
/* Under way and not expired: requests are held, and new ones accepted. */
bool static_recovery_holding(const static_recovery *r);

#endif
