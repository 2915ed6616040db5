/* strbuf.c — growing text buffer (see strbuf.h). */
#include "common/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void st_strbuf_putn(st_strbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void st_strbuf_puts(st_strbuf *b, const char *s) { st_strbuf_putn(b, s, strlen(s)); }

void st_strbuf_printf(st_strbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        st_strbuf_putn(b, tmp, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    st_strbuf_putn(b, big, (size_t)n);
    free(big);
}

char *st_strbuf_take(st_strbuf *b) {
    char *p = b->oom ? NULL : (b->p ? b->p : strdup(""));
    if (b->oom) free(b->p);
    *b = (st_strbuf){0};
    return p;
}

void st_strbuf_free(st_strbuf *b) {
    free(b->p);
    *b = (st_strbuf){0};
}
