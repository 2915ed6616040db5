/* test_api_inputs.c — issue 16's request surface under mutated input: the
 * completions and chat parsers (prompt shapes, n, logit_bias, stop ids, ...),
 * the engine requests built from them and /tokenize, /detokenize, with the
 * real stories260K vocabulary. Every mutation of a set of valid bodies must
 * give either a valid request or an OpenAI error with a 4xx status; ASan and
 * UBSan watch for the rest. Deterministic (fixed xorshift seed). Also checks
 * the exact values of a few requests: choice -> prompt and seed mapping,
 * token-id prompts, min_tokens mask, guarded chat encoding. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/api/completions.h"
#include "coordinator/api/tokenize.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "tests/testutil.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static const char *const seeds[] = {
    "{\"prompt\":\"Once upon a time\",\"max_tokens\":4,\"n\":3,\"seed\":7}",
    "{\"prompt\":[1,403,407,261,378],\"max_tokens\":4,\"temperature\":0}",
    "{\"prompt\":[[1,403],[1,407,261]],\"n\":2,\"echo\":true}",
    "{\"prompt\":[\"a\",\"b\",\"c\"],\"top_p\":0,\"stop_token_ids\":[2,13]}",
    "{\"prompt\":\"x\",\"logit_bias\":{\"2\":-100,\"300\":5.5},\"min_tokens\":2,\"max_tokens\":8}",
    "{\"prompt\":\"x\",\"repetition_penalty\":1.3,\"skip_special_tokens\":false,\"ignore_eos\":true}",
    "{\"prompt\":\"x\",\"best_of\":2,\"n\":2,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"<s></s>hi\"}],\"n\":2,\"max_tokens\":3}",
    "{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"</s>\"}]}]}",
    "{\"tokens\":[1,403,407,261,378]}",
    "{\"prompt\":\"Once upon\",\"add_special_tokens\":false}",
};

/* Mutations: flip a byte, drop a span, duplicate a span, or splice in a
 * token that changes JSON types. */
static size_t mutate(const char *in, size_t n, char *out, size_t cap) {
    static const char *const frags[] = {"-1", "1e9", "null", "[]", "{}", "[[", "\"\"", "0.5",
                                        "2147483648", "\"2\"", "true", "[1,2]", "[-5]", ",", ":"};
    size_t m = n < cap ? n : cap;
    memcpy(out, in, m);
    int k = 1 + (int)(next() % 3);
    for (int r = 0; r < k && m > 0; r++) {
        size_t at = next() % m;
        switch (next() % 4) {
        case 0: out[at] = (char)(next() & 0xff); break;
        case 1: {
            size_t len = 1 + next() % 8;
            if (at + len > m) len = m - at;
            memmove(out + at, out + at + len, m - at - len);
            m -= len;
            break;
        }
        case 2: {
            size_t len = 1 + next() % 8;
            if (at + len > m) len = m - at;
            if (m + len <= cap) {
                memmove(out + at + len, out + at, m - at);
                m += len;
            }
            break;
        }
        default: {
            const char *f = frags[next() % (sizeof frags / sizeof *frags)];
            size_t fl = strlen(f);
            if (m + fl <= cap) {
                memmove(out + at + fl, out + at, m - at);
                memcpy(out + at, f, fl);
                m += fl;
            }
        }
        }
    }
    return m;
}

static void check_error(const compl_error *e, const char *body, size_t n) {
    bool ok = e->status >= 400 && e->status < 500 && e->type && e->message[0];
    CHECK_MSG(ok, "bad error %d for %.*s", e->status, (int)n, body);
}

static void run_body(const char *body, size_t n, const compl_limits *lim, const compl_tokenizer *tok) {
    compl_error e;
    for (int chat = 0; chat < 2; chat++) {
        compl_request r;
        int rc = chat ? compl_parse_chat(body, n, lim, &r, &e) : compl_parse(body, n, lim, &r, &e);
        if (rc != 0) {
            check_error(&e, body, n);
            continue;
        }
        CHECK(r.n_prompts >= 1 && r.n >= 1 && compl_n_choices(&r) <= COMPL_MAX_CHOICES);
        for (int c = 0; c < compl_n_choices(&r); c++) {
            coord_request q;
            int32_t *ids = NULL;
            if (compl_engine_request(&r, c, tok, &q, &ids, &e) == 0) {
                for (int i = 0; i < q.n_prompt; i++) CHECK(q.prompt[i] >= 0 && q.prompt[i] < tok->n_vocab);
                for (int i = 0; i < q.sampling.n_bias; i++)
                    CHECK(q.sampling.bias_ids[i] >= 0 && q.sampling.bias_ids[i] < tok->n_vocab);
            } else {
                check_error(&e, body, n);
            }
            free(ids);
        }
        compl_request_free(&r);
    }
    char *t = api_tokenize(body, n, lim, &e);
    if (!t) check_error(&e, body, n);
    free(t);
    t = api_detokenize(body, n, lim, &e);
    if (!t) check_error(&e, body, n);
    free(t);
}

/* Exact values on the real vocabulary. */
static void test_values(const compl_limits *lim, const compl_tokenizer *tok) {
    compl_request r;
    compl_error e;
    const char *b = "{\"prompt\":[[1,403],[1,407,261]],\"n\":2,\"seed\":10,\"echo\":true,"
                    "\"stop_token_ids\":[13],\"min_tokens\":2}";
    REQUIRE_MSG(compl_parse(b, strlen(b), lim, &r, &e) == 0, "%s", e.message);
    CHECK_EQ_INT(compl_n_choices(&r), 4);
    /* choice 3: prompt 1, sample 1 -> seed 11 */
    coord_request q;
    int32_t *ids;
    REQUIRE(compl_engine_request(&r, 3, tok, &q, &ids, &e) == 0);
    CHECK(q.n_prompt == 3 && q.prompt[0] == 1 && q.prompt[1] == 407 && q.prompt[2] == 261);
    CHECK(q.sampling.seed == 11 && q.has_seed && q.min_tokens == 2);
    /* the mask: the vocabulary's EOS (2) and the stop id 13 */
    CHECK(q.n_min_tokens_mask == 2 && q.min_tokens_mask[0] == 2 && q.min_tokens_mask[1] == 13);
    free(ids);
    REQUIRE(compl_engine_request(&r, 2, tok, &q, &ids, &e) == 0);
    CHECK(q.sampling.seed == 10);
    free(ids);
    /* echo text of a token-id prompt: decoded, BOS and space prefix gone */
    CHECK_EQ_STR(r.prompts[0].text, "Once");
    compl_request_free(&r);

    /* chat: the content's "<s></s>" stays text */
    b = "{\"messages\":[{\"role\":\"user\",\"content\":\"<s></s>hi\"}]}";
    REQUIRE(compl_parse_chat(b, strlen(b), lim, &r, &e) == 0);
    REQUIRE(compl_engine_request(&r, 0, tok, &q, &ids, &e) == 0);
    CHECK(q.prompt[0] == 1);
    for (int i = 1; i < q.n_prompt; i++) CHECK(q.prompt[i] != 1 && q.prompt[i] != 2);
    free(ids);
    compl_request_free(&r);

    /* /tokenize of the same messages gives the same ids; /detokenize inverts */
    char *t = api_tokenize(b, strlen(b), lim, &e);
    REQUIRE(t);
    json_t *j = json_loads(t, 0, NULL);
    CHECK(json_integer_value(json_object_get(j, "count")) > 3 &&
          json_integer_value(json_array_get(json_object_get(j, "tokens"), 0)) == 1);
    json_decref(j);
    free(t);
    b = "{\"tokens\":[1,403,407,261,378]}";
    t = api_detokenize(b, strlen(b), lim, &e);
    CHECK_EQ_STR(t, "{\"prompt\":\"Once upon a time\"}");
    free(t);
}

int main(void) {
    st_err err = {{0}};
    gguf_file *f = gguf_open(test_shared_path("models/stories260K.gguf"), &err);
    REQUIRE_MSG(f, "%s", err.msg);
    tok_vocab *v = tok_vocab_load(f, &err);
    REQUIRE_MSG(v, "%s", err.msg);
    compl_tokenizer tok = compl_tokenizer_vocab(v);
    compl_limits lim = {512, NULL, CHAT_FORMAT_PLAIN, &tok};
    test_values(&lim, &tok);

    char buf[1024];
    int n_iter = 20000;
    for (int i = 0; i < n_iter; i++) {
        const char *s = seeds[next() % (sizeof seeds / sizeof *seeds)];
        size_t n = mutate(s, strlen(s), buf, sizeof buf);
        run_body(buf, n, &lim, &tok);
    }
    for (size_t i = 0; i < sizeof seeds / sizeof *seeds; i++) run_body(seeds[i], strlen(seeds[i]), &lim, &tok);
    tok_vocab_free(v);
    gguf_close(f);
    return test_summary();
}
