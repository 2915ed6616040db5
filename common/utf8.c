/* utf8.c — owns UTF-8 decoding, U+FFFD substitution of maximal subparts and
 * the streaming character boundary (semantics in utf8.h). */
#include "common/utf8.h"

#include <stdlib.h>
#include <string.h>

/* Unicode 15, table 3-7 (well-formed UTF-8 byte sequences). */
int utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
    if (n == 0) return 0;
    uint8_t b0 = s[0];
    if (b0 < 0x80) {
        if (cp) *cp = b0;
        return 1;
    }
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    uint32_t c;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        need = 2;
        c = b0 & 0x1F;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        need = 3;
        c = b0 & 0x0F;
        if (b0 == 0xE0) lo = 0xA0;
        if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        need = 4;
        c = b0 & 0x07;
        if (b0 == 0xF0) lo = 0x90;
        if (b0 == 0xF4) hi = 0x8F;
    } else {
        return -1;
    }
    for (size_t i = 1; i < need; i++) {
        if (i >= n) return 0; /* valid so far, incomplete */
        uint8_t b = s[i];
        uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (b < l || b > h) return -(int)i;
        c = (c << 6) | (b & 0x3F);
    }
    if (cp) *cp = c;
    return (int)need;
}

size_t utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t utf8_incomplete_tail(const char *s, size_t n) {
    /* The last byte that is not a continuation byte starts the only
     * character that can be incomplete; an incomplete one has <= 3 bytes. */
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        const uint8_t *p = (const uint8_t *)s + n - k;
        if ((*p & 0xC0) == 0x80) continue;
        return utf8_decode(p, k, NULL) == 0 ? k : 0;
    }
    return 0;
}

/* One U+FFFD per maximal subpart, or per bad byte. */
static size_t sanitize(const char *s, size_t n, char *out, int per_byte) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        int r = utf8_decode((const uint8_t *)s + i, n - i, NULL);
        if (r > 0) {
            memcpy(out + o, s + i, (size_t)r);
            o += (size_t)r;
            i += (size_t)r;
            continue;
        }
        memcpy(out + o, UTF8_REPLACEMENT, 3);
        o += 3;
        if (per_byte)
            i++;
        else
            i = r == 0 ? n : i + (size_t)-r; /* 0: an incomplete character ends s */
    }
    return o;
}

size_t utf8_sanitize_to(const char *s, size_t n, char *out) { return sanitize(s, n, out, 0); }

size_t utf8_sanitize_bytes_to(const char *s, size_t n, char *out) { return sanitize(s, n, out, 1); }

char *utf8_sanitize(const char *s, size_t n, size_t *out_len) {
    char *o = malloc(3 * n + 1);
    if (!o) return NULL;
    size_t m = utf8_sanitize_to(s, n, o);
    o[m] = '\0';
    if (out_len) *out_len = m;
    return o;
}

size_t utf8_stream_push(utf8_stream *u, const char *in, size_t n, char *out) {
    const uint8_t *s = (const uint8_t *)in;
    size_t o = 0, i = 0;
    /* First complete (or break) the held character, one byte at a time. */
    while (u->n_held > 0 && i < n) {
        uint8_t w[4];
        memcpy(w, u->held, u->n_held);
        w[u->n_held] = s[i];
        int r = utf8_decode(w, u->n_held + 1, NULL);
        if (r == 0) { /* still incomplete (at most 3 bytes) */
            u->held[u->n_held++] = s[i++];
            continue;
        }
        if (r > 0) {
            memcpy(out, w, (size_t)r);
            o = (size_t)r;
            i++;
        } else { /* the held bytes are one maximal subpart; s[i] starts afresh */
            memcpy(out, UTF8_REPLACEMENT, 3);
            o = 3;
        }
        u->n_held = 0;
    }
    if (u->n_held > 0) return o; /* the whole piece went into the held character */
    size_t tail = utf8_incomplete_tail(in + i, n - i);
    o += utf8_sanitize_to(in + i, n - i - tail, out + o);
    memcpy(u->held, in + n - tail, tail);
    u->n_held = tail;
    return o;
}

size_t utf8_stream_flush(utf8_stream *u, char *out) {
    if (u->n_held == 0) return 0;
    u->n_held = 0; /* a well-formed but unfinished prefix is one maximal subpart */
    memcpy(out, UTF8_REPLACEMENT, 3);
    return 3;
}

size_t utf8_stream_offset(const utf8_stream *u, const char *in, size_t n) {
    if (u->n_held == 0 || n == 0) return u->n_held;
    uint8_t w[4];
    memcpy(w, u->held, u->n_held);
    w[u->n_held] = (uint8_t)in[0];
    return utf8_decode(w, u->n_held + 1, NULL) < 0 ? 3 : u->n_held;
}
