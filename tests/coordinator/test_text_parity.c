/* test_text_parity.c — the same token ids give the same text over the HTTP
 * API and from strata-run (issue 11), invalid UTF-8 included.
 *
 * The ids are stories260K tokens, with byte-fallback tokens <0x..> making
 * lone continuation bytes, truncated and overlong sequences, surrogates and
 * bytes that never start a character. Each sequence goes, under several stop
 * lists, through
 *   - the HTTP path: each id's raw piece (tok_piece, as coordinator/serve/cluster.c
 *     delivers it) into compl_output_token, SSE chunks after every token and
 *     a final chunk (their texts concatenated), and the non-streaming
 *     response (coordinator/api/completions.c);
 *   - strata-run's path: tok_stream_push, the stop matcher, tok_stream_flush
 *     and stop_flush, as cli/strata_run.c's on_token / finish_text do;
 * and must give the same text, the same number of tokens consumed, the same
 * finish reason, and logprobs text_offsets that point at each token's own
 * bytes in that text.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/strbuf.h"
#include "common/utf8.h"
#include "coordinator/api/completions.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/stop.h"
#include "model/tokenizer.h"
#include "tests/testutil.h"

#define FFFD UTF8_REPLACEMENT
#define MAX_IDS 16

static const tok_vocab *V;

/* Ids of token texts ("▁" is the SentencePiece space; "<0xE2>" a byte). */
static int ids_of(const char *const *toks, int32_t *ids) {
    int n = 0;
    for (; toks[n]; n++) {
        ids[n] = tok_lookup(V, toks[n], strlen(toks[n]));
        REQUIRE_MSG(ids[n] >= 0, "no token %s in stories260K", toks[n]);
    }
    return n;
}

/* ---- strata-run's path (cli/strata_run.c: on_token, feed_text, finish_text) ---- */

typedef struct run_text {
    st_strbuf text;
    int n_used;                 /* tokens consumed until the stop matched */
    bool stopped;
    size_t before[MAX_IDS];     /* tok_stream bytes before token i */
    size_t own[MAX_IDS];        /* tok_stream bytes of token i */
} run_text;

static void run_feed(run_text *r, stop_matcher *m, const char *s, size_t n) {
    const char *out;
    size_t out_len;
    st_err err;
    int rc = stop_feed(m, s, n, &out, &out_len, &err);
    REQUIRE(rc >= 0);
    st_strbuf_putn(&r->text, out, out_len);
    if (rc == 1) r->stopped = true;
}

static void run_path(const int32_t *ids, int n, const char *const *stops, int ns, run_text *r) {
    memset(r, 0, sizeof *r);
    st_strbuf_putn(&r->text, "", 0);
    stop_matcher m;
    st_err err;
    REQUIRE(stop_init(&m, stops, ns, &err) == 0);
    tok_stream *ts = tok_stream_new(V, false);
    REQUIRE(ts);
    size_t cap = tok_stream_max_out(ts), total = 0;
    char *piece = malloc(cap);
    REQUIRE(piece);
    for (int i = 0; i < n && !r->stopped; i++) {
        int k = tok_stream_push(ts, ids[i], piece, cap);
        REQUIRE(k >= 0);
        r->before[i] = total;
        r->own[i] = (size_t)k;
        total += (size_t)k;
        r->n_used = i + 1;
        if (k > 0) run_feed(r, &m, piece, (size_t)k);
    }
    int k = tok_stream_flush(ts, piece, cap);
    if (k > 0 && !r->stopped) run_feed(r, &m, piece, (size_t)k);
    if (!r->stopped) {
        const char *out;
        size_t out_len;
        stop_flush(&m, &out, &out_len);
        st_strbuf_putn(&r->text, out, out_len);
    }
    free(piece);
    tok_stream_free(ts);
    stop_free(&m);
    REQUIRE(!r->text.oom);
}

/* ---- the HTTP path (coordinator/api/completions.c) ---- */

typedef struct http_text {
    char *text;        /* the non-streaming response's */
    char *streamed;    /* the chunks' texts concatenated */
    char *finish, *stream_finish;
    json_t *offsets;   /* the response's logprobs.text_offset */
    json_t *stream_offsets;
    int n_used;
} http_text;

static json_t *choice0(const char *json) {
    json_t *j = json_loads(json, 0, NULL);
    REQUIRE_MSG(j, "bad JSON %s", json);
    json_t *c = json_incref(json_array_get(json_object_get(j, "choices"), 0));
    json_decref(j);
    REQUIRE(c);
    return c;
}

/* Adds a chunk's text and offsets; returns its finish_reason (NULL: none). */
static char *take_chunk(char *chunk, st_strbuf *text, json_t *offsets) {
    json_t *c = choice0(chunk);
    const char *t = json_string_value(json_object_get(c, "text"));
    REQUIRE(t);
    st_strbuf_putn(text, t, json_string_length(json_object_get(c, "text")));
    json_array_extend(offsets, json_object_get(json_object_get(c, "logprobs"), "text_offset"));
    json_t *f = json_object_get(c, "finish_reason");
    char *finish = json_is_string(f) ? strdup(json_string_value(f)) : NULL;
    json_decref(c);
    free(chunk);
    return finish;
}

static void http_path(const int32_t *ids, int n, const char *const *stops, int ns, http_text *h) {
    memset(h, 0, sizeof *h);
    json_t *body = json_pack("{s:s,s:i,s:i}", "prompt", "x", "max_tokens", n, "logprobs", 0);
    json_t *sl = json_array();
    for (int i = 0; i < ns; i++) json_array_append_new(sl, json_string(stops[i]));
    json_object_set_new(body, "stop", sl);
    char *b = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    compl_request req;
    compl_error e;
    REQUIRE_MSG(compl_parse(b, strlen(b), NULL, &req, &e) == 0, "%s", e.message);
    free(b);
    compl_output whole, stream;
    REQUIRE(compl_output_init(&whole, &req) == 0 && compl_output_init(&stream, &req) == 0);
    compl_meta m = {"cmpl-parity", 1700000000, "stories260K"};
    st_strbuf st = {0};
    st_strbuf_putn(&st, "", 0);
    h->stream_offsets = json_array();
    char piece[64];
    coord_logprobs lp = {-1.0f, 0, NULL, NULL};
    bool stopped = false;
    for (int i = 0; i < n && !stopped; i++) {
        int k = tok_piece(V, ids[i], piece, sizeof piece); /* cluster.c's piece_of */
        size_t pl = k < 0 ? 0 : (size_t)k;
        int r = compl_output_token(&whole, ids[i], piece, pl, &lp);
        CHECK_EQ_INT(compl_output_token(&stream, ids[i], piece, pl, &lp), r);
        REQUIRE(r >= 0);
        stopped = r == 1;
        h->n_used = i + 1;
        bool none;
        char *c = compl_output_chunk(&stream, &m, NULL, &none);
        if (c) CHECK(take_chunk(c, &st, h->stream_offsets) == NULL);
    }
    const char *finish = stopped ? "stop" : "length"; /* as coordinator/api/http_api.c */
    bool none;
    char *c = compl_output_chunk(&stream, &m, finish, &none);
    REQUIRE(c);
    h->stream_finish = take_chunk(c, &st, h->stream_offsets);
    h->streamed = st_strbuf_take(&st);
    json_t *resp = choice0(c = compl_output_response(&whole, 1, &m, (const char *[]){finish}));
    free(c);
    h->text = strdup(json_string_value(json_object_get(resp, "text")));
    h->finish = strdup(json_string_value(json_object_get(resp, "finish_reason")));
    h->offsets = json_incref(json_object_get(json_object_get(resp, "logprobs"), "text_offset"));
    json_decref(resp);
    REQUIRE(h->text && h->finish && h->streamed && h->offsets);
    compl_output_free(&whole);
    compl_output_free(&stream);
    compl_request_free(&req);
}

static void http_free(http_text *h) {
    free(h->text);
    free(h->streamed);
    free(h->finish);
    free(h->stream_finish);
    json_decref(h->offsets);
    json_decref(h->stream_offsets);
}

/* ---- the comparison ---- */

/* Both paths over ids with stops; returns the common text (malloc'd). */
static char *both(const char *name, const int32_t *ids, int n, const char *const *stops, int ns) {
    run_text r;
    http_text h;
    run_path(ids, n, stops, ns, &r);
    http_path(ids, n, stops, ns, &h);
    CHECK_MSG(strcmp(h.text, r.text.p) == 0, "%s (%d stops): HTTP '%s' != strata-run '%s'", name, ns,
              h.text, r.text.p);
    CHECK_MSG(strcmp(h.streamed, r.text.p) == 0, "%s (%d stops): chunks '%s' != strata-run '%s'",
              name, ns, h.streamed, r.text.p);
    CHECK_MSG(h.n_used == r.n_used, "%s (%d stops): HTTP used %d tokens, strata-run %d", name, ns,
              h.n_used, r.n_used);
    const char *rf = r.stopped ? "stop" : "length";
    CHECK_MSG(!strcmp(h.finish, rf) && h.stream_finish && !strcmp(h.stream_finish, rf),
              "%s (%d stops): finish %s/%s, strata-run %s", name, ns, h.finish,
              h.stream_finish ? h.stream_finish : "(none)", rf);
    /* text_offset: one per consumed token (its logprobs kept up to the stop),
     * the same in chunks as in the response; a token that starts a character
     * points at its own bytes, after what tok_stream gave before it. */
    CHECK_EQ_INT(json_array_size(h.offsets), h.n_used);
    CHECK(json_equal(h.offsets, h.stream_offsets));
    char piece[64];
    for (int i = 0; i < h.n_used && i < r.n_used && i < (int)json_array_size(h.offsets); i++) {
        size_t off = (size_t)json_integer_value(json_array_get(h.offsets, (size_t)i));
        int k = tok_piece(V, ids[i], piece, sizeof piece);
        /* a piece that is whole valid UTF-8 ends tok_stream's output for it */
        char clean[3 * sizeof piece];
        bool whole = k > 0 && ((unsigned char)piece[0] & 0xC0) != 0x80 && r.own[i] >= (size_t)k &&
                     utf8_sanitize_to(piece, (size_t)k, clean) == (size_t)k && !memcmp(clean, piece, (size_t)k);
        if (whole) {
            size_t want = r.before[i] + r.own[i] - (size_t)k; /* after a held character's U+FFFD */
            CHECK_MSG(off == want, "%s: token %d text_offset %zu, want %zu", name, i, off, want);
        } else {
            size_t hi = r.before[i] + (r.own[i] > 3 ? r.own[i] : 3);
            CHECK_MSG(off >= r.before[i] && off <= hi, "%s: token %d text_offset %zu not in [%zu, %zu]",
                      name, i, off, r.before[i], hi);
        }
    }
    char *text = strdup(r.text.p);
    st_strbuf_free(&r.text);
    http_free(&h);
    return text;
}

typedef struct tcase {
    const char *name;
    const char *toks[MAX_IDS];
    const char *want; /* the text without stops */
} tcase;

static const tcase cases[] = {
    /* the example: a truncated 3-byte character, then a space (one
     * maximal invalid subpart; the HTTP API wrote one U+FFFD per byte) */
    {"truncated 3-byte", {"at", "<0xE2>", "<0x82>", "\xE2\x96\x81s", "e", "a", "r", NULL},
     "at" FFFD " sear"},
    {"lone continuation", {"\xE2\x96\x81The", "<0x80>", "\xE2\x96\x81" "day", "<0xBF>", "<0xBF>", NULL},
     " The" FFFD " day" FFFD FFFD},
    {"truncated at the end", {"\xE2\x96\x81Once", "<0xE2>", "<0x82>", NULL}, " Once" FFFD},
    {"overlong", {"a", "<0xC0>", "<0xAF>", "<0xE0>", "<0x80>", "<0xAF>", "t", NULL},
     "a" FFFD FFFD FFFD FFFD FFFD "t"},
    {"surrogate, above U+10FFFF",
     {"<0xED>", "<0xA0>", "<0x80>", "<0xF4>", "<0x90>", "<0x80>", "<0x80>", "\xE2\x96\x81", NULL},
     FFFD FFFD FFFD FFFD FFFD FFFD FFFD " "},
    {"truncated 4- and 2-byte, bad leads",
     {"<0xF0>", "<0x9F>", "<0x98>", "<0xC3>", "<0xFF>", "<0xF5>", "x", NULL},
     FFFD FFFD FFFD FFFD "x"},
    {"broken then whole", {"<0xE2>", "<0xE2>", "<0x82>", "<0xAC>", "\xE2\x96\x81sa", NULL},
     FFFD "\xE2\x82\xAC sa"},
    {"valid split characters",
     {"\xE2\x96\x81happy", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>", "\xC3\xA9", "<0xC3>", "<0xA9>", NULL},
     " happy\xF0\x9F\x98\x80\xC3\xA9\xC3\xA9"},
};

static const char *const stop_lists[][4] = {
    {NULL},
    {" sea", NULL},
    {FFFD, NULL},
    {FFFD " ", "ay", NULL},
    {"\xC3\xA9", "x", NULL},
    {"\xF0\x9F\x98\x80", "\xE2\x82\xAC", NULL},
    {"zz", "r", "day", FFFD "t"},
};

static void test_cases(void) {
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int32_t ids[MAX_IDS];
        int n = ids_of(cases[c].toks, ids);
        for (size_t s = 0; s < sizeof stop_lists / sizeof stop_lists[0]; s++) {
            int ns = 0;
            while (ns < 4 && stop_lists[s][ns]) ns++;
            char *text = both(cases[c].name, ids, n, stop_lists[s], ns);
            if (ns == 0)
                CHECK_MSG(!strcmp(text, cases[c].want), "%s: '%s', want '%s'", cases[c].name, text,
                          cases[c].want);
            free(text);
        }
    }
}

/* Exact cuts, and text_offset for valid UTF-8 split over byte tokens: the raw
 * byte offsets, as before the merge. */
static void test_cuts_and_offsets(void) {
    int32_t ids[MAX_IDS];
    int n = ids_of(cases[0].toks, ids);
    char *t = both("cut", ids, n, (const char *const[]){" sea"}, 1);
    CHECK_EQ_STR(t, "at" FFFD);
    free(t);
    t = both("cut", ids, n, (const char *const[]){FFFD}, 1);
    CHECK_EQ_STR(t, "at");
    free(t);
    n = ids_of(cases[2].toks, ids); /* the U+FFFD of the flush completes the stop */
    t = both("flush", ids, n, (const char *const[]){"e" FFFD}, 1);
    CHECK_EQ_STR(t, " Onc");
    free(t);

    n = ids_of(cases[7].toks, ids);
    http_text h;
    http_path(ids, n, NULL, 0, &h);
    const int want[] = {0, 6, 7, 8, 9, 10, 12, 13};
    CHECK_EQ_INT(json_array_size(h.offsets), 8);
    for (int i = 0; i < 8; i++) CHECK_EQ_INT(json_integer_value(json_array_get(h.offsets, i)), want[i]);
    http_free(&h);
    /* after a truncated character: the next token starts after its U+FFFD */
    n = ids_of(cases[0].toks, ids);
    http_path(ids, n, NULL, 0, &h);
    const int want0[] = {0, 2, 3, 5, 7, 8, 9};
    CHECK_EQ_INT(json_array_size(h.offsets), 7);
    for (int i = 0; i < 7; i++) CHECK_EQ_INT(json_integer_value(json_array_get(h.offsets, i)), want0[i]);
    http_free(&h);
}

/* A chat request: four client stops and the template's end of turn (the
 * matcher's fifth, stop_add) over the same pipeline. */
static void test_chat_turn_end(void) {
    compl_limits lim = {0, NULL, CHAT_FORMAT_PLAIN, NULL};
    const char *b = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                    "\"stop\":[\"q1\",\"q2\",\"q3\",\"q4\"]}";
    compl_request req;
    compl_error e;
    REQUIRE_MSG(compl_parse_chat(b, strlen(b), &lim, &req, &e) == 0, "%s", e.message);
    CHECK_EQ_INT(req.n_stop, 5);
    compl_output o;
    REQUIRE(compl_output_init(&o, &req) == 0);
    const char *toks[] = {"at", "<0xE2>", "<0x0A>", "U", "s", "e", "r", ":", "a", NULL};
    int32_t ids[MAX_IDS];
    int n = ids_of(toks, ids), r = 0, i;
    char piece[64];
    for (i = 0; i < n && r == 0; i++) {
        int k = tok_piece(V, ids[i], piece, sizeof piece);
        r = compl_output_token(&o, ids[i], piece, (size_t)k, NULL);
    }
    CHECK_EQ_INT(r, 1);
    CHECK_EQ_INT(i, 8); /* ":" completed "\nUser:" */
    compl_meta m = {"chatcmpl-parity", 1700000000, "stories260K"};
    char *resp = compl_output_response(&o, 1, &m, (const char *[]){"stop"});
    CHECK(resp && strstr(resp, "\"content\":\"at\xEF\xBF\xBD\"") != NULL);
    free(resp);
    compl_output_free(&o);
    compl_request_free(&req);
}

int main(void) {
    st_err err = {{0}};
    gguf_file *f = gguf_open(test_shared_path("models/stories260K.gguf"), &err);
    REQUIRE_MSG(f, "%s", err.msg);
    tok_vocab *v = tok_vocab_load(f, &err);
    REQUIRE_MSG(v, "%s", err.msg);
    V = v;
    test_cases();
    test_cuts_and_offsets();
    test_chat_turn_end();
    tok_vocab_free(v);
    gguf_close(f);
    return test_summary();
}
