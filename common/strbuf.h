/* strbuf.h — a growing, NUL-terminated byte buffer for building text.
 *
 * Appends never fail loudly: on an allocation failure `oom` is set, later
 * appends do nothing, and the caller checks `oom` once at the end. The buffer
 * owns `p` (malloc'd; free it, or take it with st_strbuf_take).
 */
#ifndef STRATA_COMMON_STRBUF_H
#define STRATA_COMMON_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct st_strbuf {
    char *p;    /* NULL until the first append; always NUL-terminated after it */
    size_t len; /* bytes, without the NUL */
    size_t cap;
    bool oom;
} st_strbuf;

void st_strbuf_putn(st_strbuf *b, const char *s, size_t n);
void st_strbuf_puts(st_strbuf *b, const char *s);
void st_strbuf_printf(st_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Hands the text to the caller (malloc'd, "" when empty; NULL after oom) and resets b. */
char *st_strbuf_take(st_strbuf *b);
void st_strbuf_free(st_strbuf *b);

#endif
