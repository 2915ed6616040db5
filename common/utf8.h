/* utf8.h — the one UTF-8 decoder, sanitizer and streaming boundary keeper.
 *
 * Well-formed UTF-8 is Unicode 15's table 3-7 (RFC 3629): no overlong
 * forms, no surrogates, nothing above U+10FFFF.
 *
 * Invalid input becomes U+FFFD, one per *maximal subpart* (the Unicode
 * standard's "U+FFFD substitution of maximal subparts", chapter 3.9, as
 * Python's and WHATWG's decoders do): a maximal subpart is the longest
 * prefix of a well-formed sequence that the next byte does not continue, or
 * else one byte. So "E2 82 20" (a truncated 3-byte character, then a space)
 * is one U+FFFD and a space, while "C0 AF" (overlong), "ED A0 80" (a
 * surrogate) and lone continuation bytes are one U+FFFD per byte.
 *
 * Users: the tokenizer (model/tok*.c, the streaming detokenizer tok_stream),
 * the HTTP API's completion text (coordinator/api/completions.c) and the gRPC
 * Generate stream (coordinator/control/generate.c): the same bytes give the
 * same text everywhere.
 */
#ifndef STRATA_COMMON_UTF8_H
#define STRATA_COMMON_UTF8_H

#include <stddef.h>
#include <stdint.h>

#define UTF8_REPLACEMENT "\xEF\xBF\xBD" /* U+FFFD, 3 bytes */

/* Strict decode of the sequence at s (n bytes available):
 * > 0: a well-formed character of that many bytes (*cp set when cp != NULL);
 *   0: a well-formed but incomplete prefix (all n bytes; also n == 0);
 * < 0: invalid; -k is the length of the maximal subpart to replace. */
int utf8_decode(const uint8_t *s, size_t n, uint32_t *cp);
/* Writes cp (<= U+10FFFF) as UTF-8 to out (1..4 bytes); returns the length. */
size_t utf8_encode(uint32_t cp, char *out);

/* Bytes at the end of s[n] that form a well-formed but incomplete character
 * (it may still be completed by more bytes): 0..3. */
size_t utf8_incomplete_tail(const char *s, size_t n);

/* Writes s[n] as well-formed UTF-8 to out (room for 3 * n bytes), maximal
 * subparts replaced by U+FFFD (an incomplete character at the end too).
 * Returns the bytes written. */
size_t utf8_sanitize_to(const char *s, size_t n, char *out);
/* The same into a malloc'd NUL-terminated string (NULL on out of memory);
 * *out_len (when not NULL) gets its length. */
char *utf8_sanitize(const char *s, size_t n, size_t *out_len);
/* As utf8_sanitize_to but one U+FFFD per byte that starts no well-formed
 * character, as llama.cpp's unicode_cpts_from_utf8 reads a prompt: only the
 * BPE tokenizer's input uses this (to give llama.cpp's token ids). */
size_t utf8_sanitize_bytes_to(const char *s, size_t n, char *out);

/* Streaming: bytes arrive in pieces (token pieces); each push writes the
 * well-formed text that is ready, never splitting a character. A trailing
 * incomplete character is held until the bytes that complete or break it
 * arrive; flush ends the stream (a held character becomes one U+FFFD). The
 * concatenated output equals utf8_sanitize_to of the concatenated input.
 * Zero-initialize (or utf8_stream_reset) before use. */
typedef struct utf8_stream {
    uint8_t held[3];
    size_t n_held; /* bytes held: a prefix of the next character's bytes */
} utf8_stream;

/* Output bytes one push of n bytes (or a flush, n = 0) can write at most. */
#define UTF8_STREAM_MAX_OUT(n) (3 * ((size_t)(n) + 3))

static inline void utf8_stream_reset(utf8_stream *u) { u->n_held = 0; }
/* Pushes in[n]; writes the ready text to out (room for UTF8_STREAM_MAX_OUT(n))
 * and returns its length. */
size_t utf8_stream_push(utf8_stream *u, const char *in, size_t n, char *out);
/* Writes U+FFFD when a character is held (returns 3), else nothing (0). */
size_t utf8_stream_flush(utf8_stream *u, char *out);
/* Where the first byte of the next piece in[n] will land in the output,
 * counted from the end of the text written so far: 0 when nothing is held,
 * 3 (after the held bytes' U+FFFD) when in[0] breaks the held character, else
 * the held bytes' count (in[0] continues the character, or n == 0). For the
 * completions API's logprobs text_offset. */
size_t utf8_stream_offset(const utf8_stream *u, const char *in, size_t n);

#endif
