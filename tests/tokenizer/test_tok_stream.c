/* test_tok_stream.c — the streaming decoder never splits a UTF-8 character
 * (emoji through byte-fallback pieces), invalid sequences become U+FFFD,
 * pieces, special tokens (BOS/EOS, parse_special), clean_spaces, bad input
 * (invalid UTF-8 text, random bytes, out-of-range ids), the Llama 3
 * pre-tokenizer on a synthetic vocabulary, and load errors.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "tests/testutil.h"

static tok_vocab *load(const char *rel, gguf_file **fo) {
    st_err err = {{0}};
    gguf_file *f = gguf_open(test_shared_path(rel), &err);
    REQUIRE_MSG(f, "%s", err.msg);
    tok_vocab *v = tok_vocab_load(f, &err);
    REQUIRE_MSG(v, "%s", err.msg);
    *fo = f;
    return v;
}

/* Complete, well-formed UTF-8 (no truncated tail, no surrogates/overlongs). */
static bool valid_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) k = 1;
        else if (c >= 0xE0 && c <= 0xEF) { k = 2; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
        else if (c >= 0xF0 && c <= 0xF4) { k = 3; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
        else return false;
        if (i + k >= n) return false; /* truncated */
        for (size_t j = 1; j <= k; j++) {
            unsigned b = s[i + j];
            if (b < (j == 1 ? lo : 0x80) || b > (j == 1 ? hi : 0xBF)) return false;
        }
        i += k + 1;
    }
    return true;
}

static int32_t byte_id(const tok_vocab *v, unsigned b) {
    char hex[8];
    snprintf(hex, sizeof hex, "<0x%02X>", b);
    return tok_lookup(v, hex, 6);
}

/* Pushes ids through a fresh stream one at a time; every chunk must be valid
 * UTF-8. Returns the malloc'd concatenation. */
static char *stream_all(const tok_vocab *v, const int32_t *ids, size_t n, bool strip, size_t *len) {
    tok_stream *ts = tok_stream_new(v, strip);
    REQUIRE(ts);
    size_t cap = tok_stream_max_out(ts), o = 0;
    char *chunk = malloc(cap), *all = malloc((n + 1) * cap + 1);
    REQUIRE(chunk && all);
    for (size_t i = 0; i <= n; i++) {
        int w = i < n ? tok_stream_push(ts, ids[i], chunk, cap) : tok_stream_flush(ts, chunk, cap);
        REQUIRE(w >= 0);
        CHECK_MSG(valid_utf8((unsigned char *)chunk, (size_t)w), "chunk %zu splits a character", i);
        memcpy(all + o, chunk, (size_t)w);
        o += (size_t)w;
    }
    all[o] = 0;
    *len = o;
    free(chunk);
    tok_stream_free(ts);
    return all;
}

static void test_spm(void) {
    gguf_file *f;
    tok_vocab *v = load("tokenizer/ggml-vocab-llama-spm.gguf", &f);
    st_err err = {{0}};
    int32_t *ids;
    size_t n;

    /* emoji through byte fallback, streamed one id at a time */
    const char *text = "Hi \xF0\x9F\x98\x80\xF0\x9F\x8E\x89 na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC \xE2\x9C\x85!";
    REQUIRE(tok_encode(v, text, strlen(text), false, false, &ids, &n, &err) == 0);
    size_t n_byte = 0;
    for (size_t i = 0; i < n; i++) n_byte += tok_token_type(v, ids[i]) == TOK_TYPE_BYTE;
    CHECK(n_byte >= 8); /* both emoji are 4 byte tokens each */
    size_t len;
    char *out = stream_all(v, ids, n, true, &len);
    CHECK_EQ_STR(out, text);
    free(out);
    /* without the strip the SPM space prefix shows */
    out = stream_all(v, ids, n, false, &len);
    CHECK(len == strlen(text) + 1 && out[0] == ' ' && !strcmp(out + 1, text));
    free(out);
    free(ids);

    /* the first 3 bytes of 😀 give nothing, the 4th gives the character */
    tok_stream *ts = tok_stream_new(v, false);
    REQUIRE(ts);
    size_t cap = tok_stream_max_out(ts);
    char *chunk = malloc(cap);
    REQUIRE(chunk);
    CHECK_EQ_INT(tok_stream_push(ts, byte_id(v, 0xF0), chunk, cap), 0);
    CHECK_EQ_INT(tok_stream_push(ts, byte_id(v, 0x9F), chunk, cap), 0);
    CHECK_EQ_INT(tok_stream_push(ts, byte_id(v, 0x98), chunk, cap), 0);
    CHECK_EQ_INT(tok_stream_push(ts, byte_id(v, 0x80), chunk, cap), 4);
    CHECK(!memcmp(chunk, "\xF0\x9F\x98\x80", 4));
    /* a held prefix broken by an ASCII byte: U+FFFD then the byte */
    CHECK_EQ_INT(tok_stream_push(ts, byte_id(v, 0xE2), chunk, cap), 0);
    CHECK_EQ_INT(tok_stream_push(ts, byte_id(v, 0x41), chunk, cap), 4);
    CHECK(!memcmp(chunk, "\xEF\xBF\xBD" "A", 4));
    /* a byte that can never start a character */
    CHECK_EQ_INT(tok_stream_push(ts, byte_id(v, 0xFF), chunk, cap), 3);
    CHECK(!memcmp(chunk, "\xEF\xBF\xBD", 3));
    /* an incomplete character at the end comes out as U+FFFD on flush */
    CHECK_EQ_INT(tok_stream_push(ts, byte_id(v, 0xF0), chunk, cap), 0);
    CHECK_EQ_INT(tok_stream_push(ts, byte_id(v, 0x9F), chunk, cap), 0);
    CHECK_EQ_INT(tok_stream_flush(ts, chunk, cap), 3);
    CHECK(!memcmp(chunk, "\xEF\xBF\xBD", 3));
    CHECK_EQ_INT(tok_stream_flush(ts, chunk, cap), 0);
    /* out-of-range ids: U+FFFD, no crash */
    CHECK_EQ_INT(tok_stream_push(ts, 32000, chunk, cap), 3);
    CHECK_EQ_INT(tok_stream_push(ts, -5, chunk, cap), 3);
    CHECK(!memcmp(chunk, "\xEF\xBF\xBD", 3));
    /* a too-small buffer is refused */
    CHECK_EQ_INT(tok_stream_push(ts, 15043, chunk, 2), -1);
    /* control tokens produce nothing */
    CHECK_EQ_INT(tok_stream_push(ts, 1, chunk, cap), 0);
    CHECK_EQ_INT(tok_stream_push(ts, 2, chunk, cap), 0);
    CHECK_EQ_INT(tok_stream_push(ts, 15043, chunk, cap), 6);
    CHECK(!memcmp(chunk, " Hello", 6));
    free(chunk);
    tok_stream_free(ts);

    /* pieces */
    char buf[64];
    CHECK_EQ_INT(tok_piece(v, 15043, buf, sizeof buf), 6); /* "▁Hello" */
    CHECK(!memcmp(buf, " Hello", 6));
    CHECK_EQ_INT(tok_piece(v, 15043, NULL, 0), 6);
    CHECK_EQ_INT(tok_piece(v, 13, buf, sizeof buf), 1); /* <0x0A> */
    CHECK_EQ_INT(buf[0], '\n');
    CHECK_EQ_INT(tok_piece(v, 1, buf, sizeof buf), 0); /* <s> */
    CHECK_EQ_INT(tok_piece(v, 0, buf, sizeof buf), 0); /* <unk> */
    CHECK_EQ_INT(tok_piece(v, 32000, buf, sizeof buf), -1);
    CHECK_EQ_INT(tok_piece(v, -1, buf, sizeof buf), -1);
    CHECK_EQ_STR(tok_token_text(v, 15043, NULL), "\xE2\x96\x81Hello");
    CHECK(tok_token_text(v, 32000, NULL) == NULL);
    CHECK_EQ_INT(tok_token_type(v, 1), TOK_TYPE_CONTROL);
    CHECK_EQ_INT(tok_token_type(v, 0), TOK_TYPE_UNKNOWN);
    CHECK_EQ_INT(tok_token_type(v, 99999), TOK_TYPE_UNDEFINED);

    /* BOS and special-token parsing */
    REQUIRE(tok_encode(v, "Hello", 5, true, false, &ids, &n, &err) == 0);
    CHECK(n == 2 && ids[0] == 1 && ids[1] == 15043);
    free(ids);
    REQUIRE(tok_encode(v, "", 0, true, false, &ids, &n, &err) == 0);
    CHECK(n == 1 && ids[0] == 1);
    free(ids);
    REQUIRE(tok_encode(v, "", 0, false, false, &ids, &n, &err) == 0);
    CHECK(n == 0 && ids != NULL);
    free(ids);
    REQUIRE(tok_encode(v, "<s>Hello</s>", 12, false, true, &ids, &n, &err) == 0);
    CHECK(n == 3 && ids[0] == 1 && ids[1] == 15043 && ids[2] == 2); /* space prefix after <s> */
    free(ids);
    REQUIRE(tok_encode(v, "<s>Hello</s>", 12, false, false, &ids, &n, &err) == 0);
    bool has_special = false;
    for (size_t i = 0; i < n; i++) has_special |= ids[i] == 1 || ids[i] == 2;
    CHECK(n > 3 && !has_special);
    /* guarded: the same text with its middle "Hello</s><s>x" marked plain
     * keeps the template's <s> at the start and reads the rest as text,
     * exactly as tok_encode without parse_special reads it */
    int32_t *plain_ids;
    size_t n_plain;
    const char *g = "<s>Hello</s><s>x";
    REQUIRE(tok_encode(v, g + 3, strlen(g) - 3, false, false, &plain_ids, &n_plain, &err) == 0);
    free(ids);
    tok_span content = {3, strlen(g) - 3};
    REQUIRE(tok_encode_guarded(v, g, strlen(g), false, &content, 1, &ids, &n, &err) == 0);
    CHECK(n == n_plain + 1 && ids[0] == 1 && !memcmp(ids + 1, plain_ids, n_plain * sizeof *ids));
    free(ids);
    free(plain_ids);
    /* a span that only touches a special token's text also disables it */
    tok_span partial = {10, 2}; /* the "s>" of "</s>" */
    REQUIRE(tok_encode_guarded(v, "<s>Hello</s>", 12, false, &partial, 1, &ids, &n, &err) == 0);
    CHECK(n > 3 && ids[0] == 1 && ids[n - 1] != 2);
    free(ids);
    /* no spans: parse_special everywhere */
    REQUIRE(tok_encode_guarded(v, "<s>Hello</s>", 12, false, NULL, 0, &ids, &n, &err) == 0);
    CHECK(n == 3 && ids[0] == 1 && ids[1] == 15043 && ids[2] == 2);
    free(ids);

    /* invalid UTF-8 text: raw bytes become byte tokens */
    REQUIRE(tok_encode(v, "\xFF", 1, false, false, &ids, &n, &err) == 0);
    CHECK(n == 2 && ids[0] == 29871 && ids[1] == byte_id(v, 0xFF));
    free(ids);
    REQUIRE(tok_encode(v, "a\xE2\x82", 3, false, false, &ids, &n, &err) == 0);
    CHECK(n >= 2 && ids[n - 2] == byte_id(v, 0xE2) && ids[n - 1] == byte_id(v, 0x82));
    out = stream_all(v, ids, n, true, &len); /* truncated character → U+FFFD */
    CHECK_EQ_STR(out, "a\xEF\xBF\xBD");
    free(out);
    free(ids);

    /* whole-sequence decode */
    int32_t seq[] = {1, 15043, 29892, 3186, 29991, 2};
    char *d;
    size_t dl;
    REQUIRE(tok_detokenize(v, seq, 6, true, &d, &dl, &err) == 0);
    CHECK_EQ_STR(d, " Hello, world!"); /* llama_detokenize keeps the space after a removed BOS */
    free(d);
    REQUIRE(tok_detokenize(v, seq + 1, 4, false, &d, &dl, &err) == 0);
    CHECK_EQ_STR(d, "Hello, world!");
    free(d);
    int32_t bad[] = {15043, 40000};
    CHECK(tok_detokenize(v, bad, 2, false, &d, &dl, &err) == -1);
    CHECK(strstr(err.msg, "40000") != NULL);

    tok_vocab_free(v);
    gguf_close(f);
}

static void test_bpe(void) {
    gguf_file *f;
    tok_vocab *v = load("tokenizer/ggml-vocab-gpt-2.gguf", &f);
    st_err err = {{0}};
    int32_t *ids;
    size_t n;
    CHECK_EQ_INT(tok_model_kind(v), TOK_MODEL_BPE);
    CHECK_EQ_INT(tok_eos(v), 50256);
    CHECK(tok_is_eog(v, 50256));
    CHECK(!tok_add_bos(v));
    CHECK(!tok_add_space_prefix(v));

    REQUIRE(tok_encode(v, "Hello", 5, true, false, &ids, &n, &err) == 0);
    CHECK(n == 1 && ids[0] == 15496);
    free(ids);
    REQUIRE(tok_encode(v, "a<|endoftext|>b", 15, false, true, &ids, &n, &err) == 0);
    CHECK(n == 3 && ids[1] == 50256);
    free(ids);
    REQUIRE(tok_encode(v, "a<|endoftext|>b", 15, false, false, &ids, &n, &err) == 0);
    CHECK(n > 3);
    for (size_t i = 0; i < n; i++) CHECK(ids[i] != 50256);
    free(ids);

    char buf[64];
    CHECK_EQ_INT(tok_piece(v, 18435, buf, sizeof buf), 6); /* "ĠHello" */
    CHECK(!memcmp(buf, " Hello", 6));
    CHECK_EQ_INT(tok_piece(v, 198, buf, sizeof buf), 1); /* "Ċ" */
    CHECK_EQ_INT(buf[0], '\n');
    CHECK_EQ_INT(tok_piece(v, 50256, buf, sizeof buf), 0); /* control */

    /* invalid UTF-8 is read as U+FFFD per bad byte, as llama.cpp does */
    int32_t *ref;
    size_t nref;
    REQUIRE(tok_encode(v, "x\xFF" "y", 3, false, false, &ids, &n, &err) == 0);
    REQUIRE(tok_encode(v, "x\xEF\xBF\xBD" "y", 5, false, false, &ref, &nref, &err) == 0);
    CHECK(n == nref && !memcmp(ids, ref, n * sizeof *ids));
    free(ids);
    free(ref);
    /* a split character streams whole: U+20AC as its byte pieces */
    REQUIRE(tok_encode(v, "\xE2\x82\xAC", 3, false, false, &ids, &n, &err) == 0);
    size_t len;
    char *out = stream_all(v, ids, n, false, &len);
    CHECK_EQ_STR(out, "\xE2\x82\xAC");
    free(out);
    free(ids);

    /* llama_detokenize's clean_spaces */
    REQUIRE(tok_encode(v, "Hello , world ! It 's", 21, false, false, &ids, &n, &err) == 0);
    char *d;
    size_t dl;
    REQUIRE(tok_detokenize(v, ids, n, false, &d, &dl, &err) == 0);
    CHECK_EQ_STR(d, "Hello, world! It's");
    free(d);
    free(ids);

    tok_vocab_free(v);
    gguf_close(f);
}

/* Random bytes through both vocabularies: no crash, no leak, and streamed
 * output is always valid UTF-8. */
static void test_fuzz(void) {
    gguf_file *f1, *f2;
    tok_vocab *vs[2] = {load("tokenizer/ggml-vocab-llama-spm.gguf", &f1),
                        load("tokenizer/ggml-vocab-gpt-2.gguf", &f2)};
    uint64_t s = 0x9E3779B97F4A7C15ull;
    char text[96];
    st_err err = {{0}};
    for (int it = 0; it < 300; it++) {
        size_t len = 0, want = (size_t)(it % 90);
        while (len < want) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            int kind = (int)(s % 5);
            /* mix ASCII, spaces, high bytes and special-token text */
            if (kind == 0) text[len++] = ' ';
            else if (kind == 1) text[len++] = (char)(0x80 + (s >> 8) % 128);
            else if (kind == 2 && len + 3 < want) { memcpy(text + len, "<s>", 3); len += 3; }
            else text[len++] = (char)((s >> 16) % 256);
        }
        for (int k = 0; k < 2; k++) {
            int32_t *ids;
            size_t n;
            int rc = tok_encode(vs[k], text, len, it & 1, it & 2, &ids, &n, &err);
            CHECK_MSG(rc == 0, "%s", err.msg);
            if (rc) continue;
            size_t ol;
            free(stream_all(vs[k], ids, n, true, &ol));
            char *d;
            size_t dl;
            CHECK(tok_detokenize(vs[k], ids, n, true, &d, &dl, &err) == 0);
            free(d);
            free(ids);
        }
    }
    tok_vocab_free(vs[0]);
    tok_vocab_free(vs[1]);
    gguf_close(f1);
    gguf_close(f2);
}

/* A tiny BPE vocabulary written to a temporary GGUF. */
static tok_vocab *synth_bpe(const char *model, const char *pre, st_err *err) {
    static const char *toks[] = {"1", "2", "3", "4", "5", "12", "34", "123", "45", "a", "Ġ"};
    static const char *merges[] = {"3 4", "1 2", "12 3", "4 5"};
    gguf_str ts[11], ms[4];
    for (int i = 0; i < 11; i++) ts[i] = (gguf_str){strlen(toks[i]), toks[i]};
    for (int i = 0; i < 4; i++) ms[i] = (gguf_str){strlen(merges[i]), merges[i]};
    gguf_writer *w = gguf_writer_new();
    REQUIRE(w);
    st_err werr;
    REQUIRE(gguf_writer_set_str(w, "tokenizer.ggml.model", model, &werr) == 0);
    if (pre) REQUIRE(gguf_writer_set_str(w, "tokenizer.ggml.pre", pre, &werr) == 0);
    REQUIRE(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", ts, 11, &werr) == 0);
    REQUIRE(gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", ms, 4, &werr) == 0);
    char path[] = "/tmp/strata-tok-XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    close(fd);
    REQUIRE_MSG(gguf_writer_write(w, path, &werr) == 0, "%s", werr.msg);
    gguf_writer_free(w);
    gguf_file *f = gguf_open(path, &werr);
    REQUIRE_MSG(f, "%s", werr.msg);
    tok_vocab *v = tok_vocab_load(f, err);
    gguf_close(f);
    unlink(path);
    return v;
}

static void test_synthetic(void) {
    st_err err = {{0}};
    int32_t *ids;
    size_t n;
    /* GPT-2 keeps "12345" one word: merges give 12 34 5 */
    tok_vocab *v = synth_bpe("gpt2", "gpt2", &err);
    REQUIRE_MSG(v, "%s", err.msg);
    REQUIRE(tok_encode(v, "12345", 5, false, false, &ids, &n, &err) == 0);
    CHECK(n == 3 && ids[0] == 5 && ids[1] == 6 && ids[2] == 4);
    free(ids);
    tok_vocab_free(v);
    /* Llama 3 splits digits in threes: 123 45 */
    v = synth_bpe("gpt2", "llama-bpe", &err);
    REQUIRE_MSG(v, "%s", err.msg);
    CHECK(tok_add_bos(v)); /* llama3 pre-tokenizers add BOS by default... */
    CHECK_EQ_INT(tok_bos(v), -1);
    CHECK(tok_encode(v, "1", 1, true, false, &ids, &n, &err) == -1); /* ...but there is none */
    CHECK(strstr(err.msg, "BOS") != NULL);
    REQUIRE(tok_encode(v, "12345", 5, false, false, &ids, &n, &err) == 0);
    CHECK(n == 2 && ids[0] == 7 && ids[1] == 8);
    free(ids);
    tok_vocab_free(v);
    /* an unknown pre-tokenizer falls back to GPT-2's (with a warning) */
    v = synth_bpe("gpt2", "no-such-pre", &err);
    REQUIRE_MSG(v, "%s", err.msg);
    REQUIRE(tok_encode(v, "12345", 5, false, false, &ids, &n, &err) == 0);
    CHECK(n == 3 && ids[0] == 5 && ids[1] == 6 && ids[2] == 4);
    free(ids);
    tok_vocab_free(v);
    /* unsupported model: a clear error */
    v = synth_bpe("bert", NULL, &err);
    CHECK(v == NULL);
    CHECK_MSG(strstr(err.msg, "unsupported") && strstr(err.msg, "bert"), "%s", err.msg);
}

int main(void) {
    test_spm();
    test_bpe();
    test_fuzz();
    test_synthetic();
    return test_summary();
}
