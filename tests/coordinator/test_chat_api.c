/* test_chat_api.c — POST /v1/chat/completions without I/O: messages to the
 * plain and ChatML prompts, parameter mapping (logprobs/top_logprobs,
 * max_completion_tokens, the turn-end stop), errors, and the
 * chat.completion / chat.completion.chunk JSON shapes. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/api/completions.h"
#include "model/chat_template.h"
#include "tests/testutil.h"

static int parse(const char *body, int fmt, compl_request *r, compl_error *e) {
    compl_limits lim = {512, "m", fmt, NULL};
    return compl_parse_chat(body, strlen(body), &lim, r, e);
}

static void test_prompts(void) {
    compl_request r;
    compl_error e;
    REQUIRE(parse("{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\","
                  "\"content\":[{\"type\":\"text\",\"text\":\"H\"},{\"type\":\"text\",\"text\":\"i\"}]}],"
                  "\"logprobs\":true,\"top_logprobs\":7,\"max_completion_tokens\":9}",
                  CHAT_FORMAT_PLAIN, &r, &e) == 0);
    CHECK(r.chat);
    CHECK(strcmp(r.prompts[0].text, "System: S\nUser: Hi\nAssistant:") == 0);
    CHECK_EQ_INT(r.prompts[0].len, strlen(r.prompts[0].text));
    CHECK_EQ_INT(r.max_tokens, 9);
    CHECK(!r.max_tokens_auto);
    CHECK_EQ_INT(r.logprobs, 7);
    CHECK_EQ_INT(r.n_stop, 1);
    CHECK(strcmp(r.stop[0], "\nUser:") == 0);
    compl_request_free(&r);

    REQUIRE(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"stop\":[\"a\",\"b\",\"c\",\"d\"]}",
                  CHAT_FORMAT_CHATML, &r, &e) == 0);
    CHECK(strcmp(r.prompts[0].text, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n") == 0);
    CHECK(r.max_tokens_auto);
    CHECK_EQ_INT(r.max_tokens, 512);
    CHECK_EQ_INT(r.logprobs, -1);
    CHECK_EQ_INT(r.n_stop, 5); /* four of the client's + <|im_end|> */
    CHECK(strcmp(r.stop[4], "<|im_end|>") == 0);
    compl_request_free(&r);
}

static void test_errors(void) {
    const char *bad[][2] = {
        {"{}", "messages"},
        {"{\"messages\":[]}", "messages"},
        {"{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "messages"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":2}", "logprobs"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", "top_logprobs"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":21}",
         "top_logprobs"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":513}", "max_tokens"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        compl_request r;
        compl_error e;
        CHECK_MSG(parse(bad[i][0], CHAT_FORMAT_PLAIN, &r, &e) == -1, "%s", bad[i][0]);
        CHECK_EQ_INT(e.status, 400);
        CHECK_MSG(strcmp(e.param, bad[i][1]) == 0, "%s: param %s", bad[i][0], e.param);
    }
}

static void test_shapes(void) {
    compl_request r;
    compl_error e;
    REQUIRE(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"logprobs\":true,"
                  "\"top_logprobs\":1,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
                  CHAT_FORMAT_PLAIN, &r, &e) == 0);
    compl_output o;
    REQUIRE(compl_output_init(&o, &r) == 0);
    compl_meta m = {"chatcmpl-1", 7, "m"};
    int32_t p[] = {1, 2, 3};
    compl_output_prompt(&o, p, 3);
    char *s = compl_output_role_chunk(&o, &m);
    json_t *j = json_loads(s, 0, NULL);
    CHECK(strcmp(json_string_value(json_object_get(j, "object")), "chat.completion.chunk") == 0);
    json_t *d = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta");
    CHECK(strcmp(json_string_value(json_object_get(d, "role")), "assistant") == 0);
    json_decref(j);
    free(s);
    const char *tp[] = {" A"};
    float tl[] = {-0.5f};
    coord_logprobs lp = {-0.5f, 1, tp, tl};
    CHECK_EQ_INT(compl_output_token(&o, 9, " A", 2, &lp), 0);
    bool none;
    s = compl_output_chunk(&o, &m, NULL, &none);
    j = json_loads(s, 0, NULL);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    CHECK(strcmp(json_string_value(json_object_get(json_object_get(ch, "delta"), "content")), " A") == 0);
    json_t *c0 = json_array_get(json_object_get(json_object_get(ch, "logprobs"), "content"), 0);
    CHECK(strcmp(json_string_value(json_object_get(c0, "token")), " A") == 0);
    CHECK_EQ_INT(json_array_size(json_object_get(c0, "bytes")), 2);
    CHECK_EQ_INT(json_array_size(json_object_get(c0, "top_logprobs")), 1);
    CHECK(json_is_null(json_object_get(j, "usage")));
    json_decref(j);
    free(s);
    s = compl_output_chunk(&o, &m, "stop", &none);
    j = json_loads(s, 0, NULL);
    ch = json_array_get(json_object_get(j, "choices"), 0);
    CHECK_EQ_INT(json_object_size(json_object_get(ch, "delta")), 0);
    CHECK(strcmp(json_string_value(json_object_get(ch, "finish_reason")), "stop") == 0);
    json_decref(j);
    free(s);
    s = compl_output_response(&o, 1, &m, (const char *[]){"stop"});
    j = json_loads(s, 0, NULL);
    CHECK(strcmp(json_string_value(json_object_get(j, "object")), "chat.completion") == 0);
    ch = json_array_get(json_object_get(j, "choices"), 0);
    json_t *msg = json_object_get(ch, "message");
    CHECK(strcmp(json_string_value(json_object_get(msg, "role")), "assistant") == 0);
    CHECK(strcmp(json_string_value(json_object_get(msg, "content")), " A") == 0);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "usage"), "total_tokens")), 4);
    json_decref(j);
    free(s);
    compl_output_free(&o);
    compl_request_free(&r);
}

int main(void) {
    test_prompts();
    test_errors();
    test_shapes();
    return test_summary();
}
