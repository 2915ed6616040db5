/* test_completions.c — request validation defaults, stop-string holdback,
 * UTF-8 handling and chunk shapes, without HTTP. */
#include "common/utf8.h"
#include "coordinator/api/completions.h"
#include "tests/testutil.h"

#include <jansson.h>

int main(void) {
    compl_request r;
    compl_error e;
    compl_limits lim = {128, "m", 0, NULL};
    const char *b = "{\"prompt\":\"Hello\",\"stop\":[\"\\n\\n\",\"END\"],\"top_k\":-1,\"seed\":-5}";
    REQUIRE_MSG(compl_parse(b, strlen(b), &lim, &r, &e) == 0, "%s", e.message);
    CHECK_EQ_STR(r.prompts[0].text, "Hello");
    CHECK_EQ_INT(r.prompts[0].len, 5);
    CHECK_EQ_INT(r.max_tokens, 16);
    CHECK_NEAR(r.temperature, 1.0, 0);
    CHECK_NEAR(r.top_p, 1.0, 0);
    CHECK_EQ_INT(r.top_k, 0);
    CHECK(r.has_seed);
    CHECK_EQ_INT(r.seed, -5);
    CHECK_EQ_INT(r.n_stop, 2);
    CHECK_EQ_STR(r.stop[0], "\n\n");
    CHECK_EQ_INT(r.logprobs, -1);
    CHECK(!r.stream && !r.echo && !r.return_token_ids);

    /* Streaming with the stop string "END": "xEN" is held until it resolves. */
    r.stream = true;
    compl_output o;
    REQUIRE(compl_output_init(&o, &r) == 0);
    int32_t pids[2] = {1, 2};
    compl_output_prompt(&o, pids, 2);
    compl_meta m = {"cmpl-test", 1700000000, "m"};
    bool none;
    CHECK_EQ_INT(compl_output_token(&o, 5, "abc", 3, NULL), 0);
    char *c = compl_output_chunk(&o, &m, NULL, &none);
    REQUIRE(c);
    CHECK(strstr(c, "\"text\":\"abc\"") != NULL);
    CHECK(strstr(c, "\"finish_reason\":null") != NULL);
    CHECK(strstr(c, "\"id\":\"cmpl-test\"") != NULL);
    CHECK(strstr(c, "\"created\":1700000000") != NULL);
    free(c);
    CHECK_EQ_INT(compl_output_token(&o, 6, "xEN", 3, NULL), 0);
    c = compl_output_chunk(&o, &m, NULL, &none);
    REQUIRE(c);
    CHECK(strstr(c, "\"text\":\"x\"") != NULL); /* "EN" held back */
    free(c);
    CHECK_EQ_INT(compl_output_token(&o, 7, "D!", 2, NULL), 1); /* "END" matched */
    c = compl_output_chunk(&o, &m, "stop", &none);
    REQUIRE(c);
    CHECK(strstr(c, "\"text\":\"\"") != NULL);
    CHECK(strstr(c, "\"finish_reason\":\"stop\"") != NULL);
    free(c);
    CHECK_EQ_INT(o.n_ids, 3);
    char *resp = compl_output_response(&o, 1, &m, (const char *[]){"stop"});
    CHECK(strstr(resp, "\"text\":\"abcx\"") != NULL);
    CHECK(strstr(resp, "\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":3,\"total_tokens\":5}") != NULL);
    free(resp);
    compl_output_free(&o);

    /* A held-back prefix that does not become the stop string is flushed. */
    REQUIRE(compl_output_init(&o, &r) == 0);
    compl_output_token(&o, 1, "E", 1, NULL);
    c = compl_output_chunk(&o, &m, NULL, &none);
    CHECK(c == NULL && none);
    compl_output_token(&o, 2, "Nx", 2, NULL);
    c = compl_output_chunk(&o, &m, NULL, &none);
    REQUIRE(c);
    CHECK(strstr(c, "\"text\":\"ENx\"") != NULL);
    free(c);
    /* Incomplete UTF-8 is held; at the end, a lone lead byte becomes U+FFFD. */
    compl_output_token(&o, 3, "\xE2\x82", 2, NULL);
    c = compl_output_chunk(&o, &m, NULL, &none);
    CHECK(c == NULL && none);
    c = compl_output_chunk(&o, &m, "length", &none);
    REQUIRE(c);
    CHECK(strstr(c, "\"text\":\"\xEF\xBF\xBD\"") != NULL);
    CHECK(strstr(c, "\"finish_reason\":\"length\"") != NULL);
    free(c);
    compl_output_free(&o);
    compl_request_free(&r);

    /* UTF-8 helpers. */
    CHECK_EQ_INT(utf8_incomplete_tail("a\xC3", 2), 1);
    CHECK_EQ_INT(utf8_incomplete_tail("a\xF0\x9F\x98", 4), 3);
    CHECK_EQ_INT(utf8_incomplete_tail("a\xF0\x9F\x98\x80", 5), 0);
    CHECK_EQ_INT(utf8_incomplete_tail("abc", 3), 0);
    size_t n;
    char *s = utf8_sanitize("a\xC0\xAFz\xED\xA0\x80", 7, &n); /* overlong, surrogate */
    CHECK_EQ_STR(s, "a\xEF\xBF\xBD\xEF\xBF\xBDz\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
    free(s);

    /* Error JSON shape. */
    compl_error_set(&e, 400, "invalid_request_error", "max_tokens", NULL, "bad %d", 3);
    char *j = compl_error_json(&e);
    CHECK_EQ_STR(j, "{\"error\":{\"message\":\"bad 3\",\"type\":\"invalid_request_error\","
                    "\"param\":\"max_tokens\",\"code\":null}}");
    free(j);

    /* Limits: max_tokens beyond the context; model mismatch is 404. */
    b = "{\"prompt\":\"a\",\"max_tokens\":129}";
    CHECK(compl_parse(b, strlen(b), &lim, &r, &e) == -1);
    CHECK_EQ_INT(e.status, 400);
    CHECK_EQ_STR(e.param, "max_tokens");
    b = "{\"prompt\":\"a\",\"model\":\"other\"}";
    CHECK(compl_parse(b, strlen(b), &lim, &r, &e) == -1);
    CHECK_EQ_INT(e.status, 404);
    CHECK_EQ_STR(e.code, "model_not_found");
    b = "{\"prompt\":[\"one\"],\"max_tokens\":null,\"echo\":true,\"logprobs\":null}";
    REQUIRE(compl_parse(b, strlen(b), &lim, &r, &e) == 0);
    CHECK_EQ_STR(r.prompts[0].text, "one");
    CHECK_EQ_INT(r.max_tokens, 16);
    compl_request_free(&r);
    b = "{\"prompt\":\"a\",\"echo\":true,\"logprobs\":1}";
    CHECK(compl_parse(b, strlen(b), &lim, &r, &e) == -1);
    return test_summary();
}
