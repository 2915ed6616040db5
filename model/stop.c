/* stop.c — owns the streaming stop-string matcher (semantics in stop.h):
 * pending-text buffer, earliest-match search, and the held-back suffix. */
#define _GNU_SOURCE /* memmem */
#include "model/stop.h"

#include <stdlib.h>
#include <string.h>

/* Appends stop string number n_stops (room checked by the caller). */
static int add(stop_matcher *m, const char *stop, st_err *err) {
    int i = m->n_stops;
    if (!stop) return st_errf(err, "stop: stop string %d is NULL", i);
    size_t len = strlen(stop);
    if (len == 0) return st_errf(err, "stop: stop string %d is empty", i);
    if (len > STOP_MAX_LEN)
        return st_errf(err, "stop: stop string %d is %zu bytes (max %d)", i, len, STOP_MAX_LEN);
    memcpy(m->stops[i], stop, len);
    m->stop_len[i] = len;
    m->n_stops++;
    return 0;
}

int stop_init(stop_matcher *m, const char *const *stops, int n_stops, st_err *err) {
    if (!m) return st_errf(err, "stop: NULL matcher");
    memset(m, 0, sizeof *m);
    m->which = -1;
    if (n_stops < 0 || n_stops > STOP_MAX_STRINGS)
        return st_errf(err, "stop: at most %d stop strings, got %d", STOP_MAX_STRINGS, n_stops);
    if (n_stops > 0 && !stops) return st_errf(err, "stop: NULL stop list");
    for (int i = 0; i < n_stops; i++)
        if (add(m, stops[i], err)) return -1;
    return 0;
}

int stop_add(stop_matcher *m, const char *stop, st_err *err) {
    if (m->n_stops >= STOP_MAX_STRINGS + STOP_MAX_EXTRA)
        return st_errf(err, "stop: at most %d stop strings", STOP_MAX_STRINGS + STOP_MAX_EXTRA);
    return add(m, stop, err);
}

void stop_free(stop_matcher *m) {
    if (!m) return;
    free(m->buf);
    m->buf = NULL;
    m->len = m->cap = m->emitted = 0;
}

/* Longest suffix of buf[0..len) that is a proper prefix of some stop string. */
static size_t held_suffix(const stop_matcher *m) {
    size_t hold = 0;
    for (int s = 0; s < m->n_stops; s++) {
        size_t k = m->stop_len[s] - 1;
        if (k > m->len) k = m->len;
        for (; k > hold; k--)
            if (memcmp(m->buf + m->len - k, m->stops[s], k) == 0) {
                hold = k;
                break;
            }
    }
    return hold;
}

int stop_feed(stop_matcher *m, const char *piece, size_t len, const char **emit, size_t *emit_len,
              st_err *err) {
    *emit = "";
    *emit_len = 0;
    if (m->matched) return 1;
    if (len > 0 && !piece) return st_errf(err, "stop: NULL piece");
    /* Drop what was handed out last time. */
    if (m->emitted > 0) {
        memmove(m->buf, m->buf + m->emitted, m->len - m->emitted);
        m->len -= m->emitted;
        m->emitted = 0;
    }
    if (m->len + len > m->cap) {
        size_t cap = m->cap ? m->cap : 512;
        while (cap < m->len + len) cap *= 2;
        char *b = realloc(m->buf, cap);
        if (!b) return st_errf(err, "stop: out of memory (%zu bytes)", cap);
        m->buf = b;
        m->cap = cap;
    }
    if (len > 0) memcpy(m->buf + m->len, piece, len);
    m->len += len;
    m->fed += len;
    if (m->len == 0) return 0;

    /* Earliest match of any stop string. A match cannot start inside text
     * already handed out: that text was never a prefix of a stop string. */
    size_t best = (size_t)-1;
    for (int s = 0; s < m->n_stops; s++) {
        const char *hit = memmem(m->buf, m->len, m->stops[s], m->stop_len[s]);
        if (hit && (size_t)(hit - m->buf) < best) {
            best = (size_t)(hit - m->buf);
            m->which = s;
        }
    }
    if (best != (size_t)-1) {
        m->matched = 1;
        *emit = m->buf;
        *emit_len = best;
        m->len = best;
        m->emitted = best;
        return 1;
    }
    size_t out = m->len - held_suffix(m);
    *emit = m->buf;
    *emit_len = out;
    m->emitted = out;
    return 0;
}

void stop_flush(stop_matcher *m, const char **emit, size_t *emit_len) {
    *emit = "";
    *emit_len = 0;
    if (m->matched || m->emitted >= m->len) return;
    *emit = m->buf + m->emitted;
    *emit_len = m->len - m->emitted;
    m->emitted = m->len;
}
