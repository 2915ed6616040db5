/* log_limit.c — see log_limit.h. */
#include "common/log_limit.h"

bool st_log_limit_allow(st_log_limit *l, double now_s, unsigned long *suppressed) {
    if (l->last_s >= 0 && now_s - l->last_s < l->interval_s) {
        l->suppressed++;
        return false;
    }
    if (suppressed) *suppressed = l->suppressed;
    l->suppressed = 0;
    l->last_s = now_s;
    return true;
}
