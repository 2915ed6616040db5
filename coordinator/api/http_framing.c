/* http_framing.c — see http_framing.h. */
#include "coordinator/api/http_framing.h"

#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static int digits_only(const char *s) {
    return *s && strspn(s, "0123456789") == strlen(s) && strlen(s) <= 18;
}

int http_check_framing(const struct evkeyvalq *headers, char *msg, size_t n) {
    const char *cl = NULL;
    int n_te = 0;
    const char *te = NULL;
    const struct evkeyval *h;
    for (h = headers->tqh_first; h; h = h->next.tqe_next) {
        if (strcasecmp(h->key, "Content-Length") == 0) {
            if (!digits_only(h->value)) {
                snprintf(msg, n, "invalid Content-Length header '%.40s'", h->value);
                return -1;
            }
            if (cl && strcmp(cl, h->value) != 0) {
                snprintf(msg, n, "conflicting Content-Length headers (%.20s and %.20s)", cl, h->value);
                return -1;
            }
            cl = h->value;
        } else if (strcasecmp(h->key, "Transfer-Encoding") == 0) {
            n_te++;
            te = h->value;
        }
    }
    if (n_te && cl) {
        snprintf(msg, n, "a request may not have both Transfer-Encoding and Content-Length");
        return -1;
    }
    if (n_te > 1 || (te && strcasecmp(te, "chunked") != 0)) {
        snprintf(msg, n, "unsupported Transfer-Encoding; only a single 'chunked' is accepted");
        return -1;
    }
    return 0;
}
