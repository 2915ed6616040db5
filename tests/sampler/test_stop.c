/* test_stop.c — streaming stop-string matcher: split stops, overlapping
 * prefixes, several stops, flush, limits, and a randomized comparison with a
 * whole-text reference. */
#include <stdint.h>
#include <string.h>

#include "model/stop.h"
#include "tests/testutil.h"

typedef struct run {
    char out[8192];
    size_t n;
    int matched;
} run;

/* Feeds pieces (NULL-terminated list); appends everything emitted; flushes. */
static void feed_all(stop_matcher *m, const char *const *pieces, run *r) {
    st_err err = {{0}};
    r->n = 0;
    r->matched = 0;
    for (int i = 0; pieces[i]; i++) {
        const char *e;
        size_t el;
        int rc = stop_feed(m, pieces[i], strlen(pieces[i]), &e, &el, &err);
        REQUIRE(rc >= 0);
        REQUIRE(r->n + el < sizeof r->out);
        memcpy(r->out + r->n, e, el);
        r->n += el;
        if (rc == 1) r->matched = 1;
    }
    const char *e;
    size_t el;
    stop_flush(m, &e, &el);
    memcpy(r->out + r->n, e, el);
    r->n += el;
    r->out[r->n] = 0;
}

static void expect(const char *const *stops, int n_stops, const char *const *pieces, const char *want,
                   int want_match, int want_which) {
    stop_matcher m;
    st_err err = {{0}};
    REQUIRE(stop_init(&m, stops, n_stops, &err) == 0);
    run r;
    feed_all(&m, pieces, &r);
    CHECK_EQ_STR(r.out, want);
    CHECK_EQ_INT(r.matched, want_match);
    CHECK_EQ_INT(m.which, want_which);
    stop_free(&m);
}

static void test_cases(void) {
    const char *ab[] = {"ab"};
    expect(ab, 1, (const char *[]){"aab", NULL}, "a", 1, 0);
    expect(ab, 1, (const char *[]){"a", "a", "b", "zzz", NULL}, "a", 1, 0);
    expect(ab, 1, (const char *[]){"aa", "a", NULL}, "aaa", 0, -1);

    /* split across pieces */
    const char *eos[] = {"</s>"};
    expect(eos, 1, (const char *[]){"hello <", "/", "s> world", NULL}, "hello ", 1, 0);
    expect(eos, 1, (const char *[]){"a</s", "x>", NULL}, "a</sx>", 0, -1);

    /* several stops: earliest start wins, then list order */
    const char *three[] = {"xyz", "END", "\n\n"};
    expect(three, 3, (const char *[]){"foo\n", "\nbar END", NULL}, "foo", 1, 2);
    expect(three, 3, (const char *[]){"E", "N", "x", "yz", NULL}, "EN", 1, 0);
    expect(three, 3, (const char *[]){"EN", "\n", "D", NULL}, "EN\nD", 0, -1);
    const char *overl[] = {"bc", "abcd"};
    expect(overl, 2, (const char *[]){"ab", "cd", NULL}, "", 1, 1);
    expect(overl, 2, (const char *[]){"xab", "ce", NULL}, "xa", 1, 0);

    /* overlapping self-prefix: "aab" in "aaab" */
    const char *aab[] = {"aab"};
    expect(aab, 1, (const char *[]){"a", "a", "a", "b", NULL}, "a", 1, 0);

    /* no stops: everything passes through */
    expect(NULL, 0, (const char *[]){"abc", "", "def", NULL}, "abcdef", 0, -1);
}

static void test_holdback(void) {
    const char *stop[] = {"STOP"};
    stop_matcher m;
    st_err err = {{0}};
    REQUIRE(stop_init(&m, stop, 1, &err) == 0);
    const char *e;
    size_t el;
    CHECK_EQ_INT(stop_feed(&m, "abS", 3, &e, &el, &err), 0);
    CHECK_EQ_INT(el, 2);
    CHECK(memcmp(e, "ab", 2) == 0);
    CHECK_EQ_INT(stop_feed(&m, "T", 1, &e, &el, &err), 0);
    CHECK_EQ_INT(el, 0);
    CHECK_EQ_INT(stop_feed(&m, "x", 1, &e, &el, &err), 0);
    CHECK_EQ_INT(el, 3);
    CHECK(memcmp(e, "STx", 3) == 0);
    CHECK_EQ_INT(stop_feed(&m, "ST", 2, &e, &el, &err), 0);
    CHECK_EQ_INT(el, 0);
    /* flush: the held-back "ST" is not a stop; it comes out */
    stop_flush(&m, &e, &el);
    CHECK_EQ_INT(el, 2);
    CHECK(memcmp(e, "ST", 2) == 0);
    stop_flush(&m, &e, &el);
    CHECK_EQ_INT(el, 0);
    stop_free(&m);

    /* after a match: nothing more, even on flush */
    REQUIRE(stop_init(&m, stop, 1, &err) == 0);
    CHECK_EQ_INT(stop_feed(&m, "go STOP now", 11, &e, &el, &err), 1);
    CHECK_EQ_INT(el, 3);
    CHECK(memcmp(e, "go ", 3) == 0);
    CHECK_EQ_INT(stop_feed(&m, "more", 4, &e, &el, &err), 1);
    CHECK_EQ_INT(el, 0);
    stop_flush(&m, &e, &el);
    CHECK_EQ_INT(el, 0);
    stop_free(&m);

    /* UTF-8: a stop starting with a multi-byte character */
    const char *u[] = {"\xC3\xA9t\xC3\xA9"}; /* "été" */
    REQUIRE(stop_init(&m, u, 1, &err) == 0);
    CHECK_EQ_INT(stop_feed(&m, "caf\xC3\xA9", 5, &e, &el, &err), 0);
    CHECK_EQ_INT(el, 3); /* "caf", the é is held (whole character) */
    CHECK_EQ_INT(stop_feed(&m, " \xC3\xA9t\xC3\xA9!", 7, &e, &el, &err), 1);
    CHECK_EQ_INT(el, 3); /* "é " */
    stop_free(&m);
}

static void test_limits(void) {
    stop_matcher m;
    st_err err = {{0}};
    char big[300];
    memset(big, 'q', sizeof big);
    big[256] = 0;
    const char *one[] = {big};
    REQUIRE(stop_init(&m, one, 1, &err) == 0);
    /* a 256-byte stop fed one byte at a time after some text */
    const char *e;
    size_t el, total = 0;
    CHECK_EQ_INT(stop_feed(&m, "head:", 5, &e, &el, &err), 0);
    total += el;
    int rc = 0;
    for (int i = 0; i < 256 && rc == 0; i++) {
        rc = stop_feed(&m, "q", 1, &e, &el, &err);
        total += el;
    }
    CHECK_EQ_INT(rc, 1);
    CHECK_EQ_INT(total, 5);
    stop_free(&m);

    big[256] = 'q';
    big[257] = 0;
    CHECK_EQ_INT(stop_init(&m, one, 1, &err), -1);
    CHECK(strstr(err.msg, "256") != NULL);
    const char *five[] = {"a", "b", "c", "d", "e"};
    CHECK_EQ_INT(stop_init(&m, five, 5, &err), -1);
    const char *empty[] = {"x", ""};
    CHECK_EQ_INT(stop_init(&m, empty, 2, &err), -1);
    CHECK_EQ_INT(stop_init(&m, five, 4, &err), 0);
    stop_free(&m);
}

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(uint32_t n) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs % n);
}

/* Random text over {a,b,c}, random stops and random piece cuts; the
 * concatenated output equals the text up to the first match (see the
 * reference below), and what is
 * emitted at any time is a prefix of it. */
static void test_random(void) {
    int fails = 0;
    for (int t = 0; t < 3000; t++) {
        char text[200];
        int tl = 1 + (int)rnd(120);
        for (int i = 0; i < tl; i++) text[i] = (char)('a' + rnd(3));
        text[tl] = 0;
        int ns = (int)rnd(5);
        char sbuf[4][8];
        const char *stops[4];
        for (int s = 0; s < ns; s++) {
            int sl = 1 + (int)rnd(6);
            for (int i = 0; i < sl; i++) sbuf[s][i] = (char)('a' + rnd(3));
            sbuf[s][sl] = 0;
            stops[s] = sbuf[s];
        }
        /* piece cuts, then the reference: generation stops after the first
         * piece that completes a stop; the cut is the earliest start of a
         * stop in the text seen so far. */
        int ends[200], np = 0;
        for (int pos = 0; pos < tl;) {
            int pl = 1 + (int)rnd(8);
            pos = pos + pl > tl ? tl : pos + pl;
            ends[np++] = pos;
        }
        int cut = tl, matched = 0;
        for (int k = 0; k < np && !matched; k++) {
            char seen[200];
            memcpy(seen, text, (size_t)ends[k]);
            seen[ends[k]] = 0;
            for (int s = 0; s < ns; s++) {
                const char *hit = strstr(seen, stops[s]);
                if (hit && (!matched || hit - seen < cut)) cut = (int)(hit - seen), matched = 1;
            }
        }
        stop_matcher m;
        st_err err = {{0}};
        REQUIRE(stop_init(&m, stops, ns, &err) == 0);
        char out[256];
        size_t n = 0;
        int pos = 0, got_match = 0;
        for (int k = 0; k < np && !got_match; k++) {
            int pl = ends[k] - pos;
            const char *e;
            size_t el;
            int rc = stop_feed(&m, text + pos, (size_t)pl, &e, &el, &err);
            pos += pl;
            memcpy(out + n, e, el);
            n += el;
            if (n > (size_t)cut || memcmp(out, text, n) != 0) fails++;
            got_match = rc == 1;
        }
        const char *e;
        size_t el;
        stop_flush(&m, &e, &el);
        memcpy(out + n, e, el);
        n += el;
        if (n != (size_t)cut || memcmp(out, text, n) != 0 || got_match != matched) {
            if (fails < 5) fprintf(stderr, "text %s cut %d got %zu matched %d/%d\n", text, cut, n, got_match, matched);
            fails++;
        }
        stop_free(&m);
    }
    CHECK_EQ_INT(fails, 0);
}

int main(void) {
    test_cases();
    test_holdback();
    test_limits();
    test_random();
    return test_summary();
}
