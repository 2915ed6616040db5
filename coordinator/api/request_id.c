/* request_id.c — X-Request-Id validation (request_id.h). The character set
 * keeps ids safe in key=value log lines, journald fields and headers. */
#include "coordinator/api/request_id.h"

#include <string.h>

bool request_id_valid(const char *v) {
    if (!v) return false;
    size_t n = strlen(v);
    if (n == 0 || n > REQUEST_ID_MAX) return false;
    for (size_t i = 0; i < n; i++) {
        char ch = v[i];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                  (ch && strchr("-_.:/+=@", ch));
        if (!ok) return false;
    }
    return true;
}
