/* test_chat_template.c — chat format detection from real Jinja templates and
 * the exact prompt text of each format (model/chat_template.h).
 *
 * The conversation and the expected strings are those of llama.cpp's
 * tests/test-chat-template.cpp, so Strata renders what llama.cpp renders. */
#include <stdlib.h>
#include <string.h>

#include "model/chat_template.h"
#include "tests/testutil.h"

/* meta-llama/Llama-2-7b-chat-hf tokenizer_config.json */
static const char *k_llama2_official =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
    "system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set "
    "system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] "
    "== 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != "
    "false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + "
    "message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if "
    "message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif "
    "message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% "
    "endfor %}";

/* mistralai/Mistral-7B-Instruct-v0.2 (Llama 2 format, no <<SYS>>) */
static const char *k_mistral_v02 =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] "
    "' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ "
    "message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles "
    "are supported!') }}{% endif %}{% endfor %}";

/* TheBloke/FusionNet_34Bx2_MoE-AWQ (<<SYS>>, BOS before later turns) */
static const char *k_fusionnet =
    "{%- for idx in range(0, messages|length) -%}\n{%- if messages[idx]['role'] == 'user' -%}\n{%- "
    "if idx > 1 -%}\n{{- bos_token + '[INST] ' + messages[idx]['content'] + ' [/INST]' -}}\n{%- "
    "else -%}\n{{- messages[idx]['content'] + ' [/INST]' -}}\n{%- endif -%}\n{% elif "
    "messages[idx]['role'] == 'system' %}\n{{- '[INST] <<SYS>>\\n' + messages[idx]['content'] + "
    "'\\n<</SYS>>\\n\\n' -}}\n{%- elif messages[idx]['role'] == 'assistant' -%}\n{{- ' '  + "
    "messages[idx]['content'] + ' ' + eos_token -}}\n{% endif %}\n{% endfor %}";

/* A <<SYS>> template without strip or in-history BOS (llama2-sys). */
static const char *k_llama2_sys =
    "{% for message in messages %}{% if message['role'] == 'system' %}{{ '<<SYS>>\\n' + "
    "message['content'] + '\\n<</SYS>>\\n\\n' }}{% elif message['role'] == 'user' %}{{ '[INST] ' + "
    "message['content'] + ' [/INST]' }}{% else %}{{ message['content'] + eos_token }}{% endif %}{% "
    "endfor %}";

/* meta-llama/Meta-Llama-3-8B-Instruct */
static const char *k_llama3_official =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ "
    "content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

/* teknium/OpenHermes-2.5-Mistral-7B (ChatML) */
static const char *k_chatml_hermes =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' "
    "}}{% endif %}";

/* Qwen/Qwen2-7B-Instruct (ChatML with a default system message) */
static const char *k_chatml_qwen2 =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\\nYou are a helpful assistant<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + "
    "message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if "
    "add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/* google/gemma-7b-it: a template we do not support. */
static const char *k_gemma =
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% "
    "endif %}{% for message in messages %}{% if (message['role'] == 'assistant') %}{% set role = "
    "'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + "
    "'\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if "
    "add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}";

/* mistralai/Mistral-7B-Instruct-v0.3 style (v3: [AVAILABLE_TOOLS]) — unsupported. */
static const char *k_mistral_v3 =
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{% if "
    "tools is not none %}{{ '[AVAILABLE_TOOLS] [' }}{% endif %}{{ '[INST] ' + message['content'] + "
    "'[/INST]' }}{% endif %}{% endfor %}";

static const chat_message k_conv[] = {
    {"system", "You are a helpful assistant"},
    {"user", "Hello"},
    {"assistant", "Hi there"},
    {"user", "Who are you"},
    {"assistant", "   I am an assistant   "},
    {"user", "Another question"},
};
#define N_CONV (sizeof k_conv / sizeof k_conv[0])

static void check_render(enum chat_format fmt, const chat_message *m, size_t n, bool gen,
                         const char *expected) {
    st_err err = {{0}};
    size_t len = 0;
    char *s = chat_apply(fmt, m, n, gen, &len, &err);
    CHECK_MSG(s != NULL, "%s: %s", chat_format_name(fmt), err.msg);
    if (!s) return;
    CHECK_EQ_STR(s, expected);
    CHECK_EQ_INT(len, strlen(expected));
    free(s);
}

static void test_detect(void) {
    CHECK_EQ_INT(chat_detect(NULL), CHAT_FORMAT_PLAIN);
    CHECK_EQ_INT(chat_detect(""), CHAT_FORMAT_PLAIN);
    CHECK_EQ_INT(chat_detect(k_llama2_official), CHAT_FORMAT_LLAMA2_SYS_STRIP);
    CHECK_EQ_INT(chat_detect(k_mistral_v02), CHAT_FORMAT_LLAMA2);
    CHECK_EQ_INT(chat_detect(k_fusionnet), CHAT_FORMAT_LLAMA2_SYS_BOS);
    CHECK_EQ_INT(chat_detect(k_llama2_sys), CHAT_FORMAT_LLAMA2_SYS);
    CHECK_EQ_INT(chat_detect(k_llama3_official), CHAT_FORMAT_LLAMA3);
    CHECK_EQ_INT(chat_detect(k_chatml_hermes), CHAT_FORMAT_CHATML);
    CHECK_EQ_INT(chat_detect(k_chatml_qwen2), CHAT_FORMAT_CHATML);
    CHECK_EQ_INT(chat_detect(k_gemma), CHAT_FORMAT_UNSUPPORTED);
    CHECK_EQ_INT(chat_detect(k_mistral_v3), CHAT_FORMAT_UNSUPPORTED);
    CHECK_EQ_INT(chat_detect("<|im_start|>{{ role }}<|im_sep|>"), CHAT_FORMAT_UNSUPPORTED);
    CHECK_EQ_INT(chat_detect("{{ messages }}"), CHAT_FORMAT_UNSUPPORTED);
    /* Names work as templates too (operator overrides). */
    CHECK_EQ_INT(chat_detect("llama3"), CHAT_FORMAT_LLAMA3);
    CHECK_EQ_INT(chat_detect("chatml"), CHAT_FORMAT_CHATML);
    CHECK_EQ_INT(chat_detect("plain"), CHAT_FORMAT_PLAIN);

    /* chat_select falls back to plain for what chat_detect cannot place. */
    CHECK_EQ_INT(chat_select(k_gemma), CHAT_FORMAT_PLAIN);
    CHECK_EQ_INT(chat_select(k_llama3_official), CHAT_FORMAT_LLAMA3);
    CHECK_EQ_INT(chat_select(NULL), CHAT_FORMAT_PLAIN);

    enum chat_format f = CHAT_FORMAT_PLAIN;
    st_err err = {{0}};
    CHECK_EQ_INT(chat_format_from_name("llama2-sys-bos", &f, &err), 0);
    CHECK_EQ_INT(f, CHAT_FORMAT_LLAMA2_SYS_BOS);
    CHECK_EQ_INT(chat_format_from_name("jinja", &f, &err), -1);
    CHECK(strstr(err.msg, "unknown chat format 'jinja'") != NULL);
    CHECK_EQ_INT(chat_format_from_name("unsupported", &f, &err), -1);
    CHECK_EQ_STR(chat_format_name(CHAT_FORMAT_LLAMA3), "llama3");
    CHECK_EQ_STR(chat_format_name(CHAT_FORMAT_LLAMA2_SYS_STRIP), "llama2-sys-strip");
}

static void test_render(void) {
    check_render(CHAT_FORMAT_CHATML, k_conv, N_CONV, true,
                 "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\n"
                 "Hello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\n"
                 "Who are you<|im_end|>\n<|im_start|>assistant\n   I am an assistant   "
                 "<|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n"
                 "<|im_start|>assistant\n");
    check_render(CHAT_FORMAT_CHATML, k_conv + 1, 1, false, "<|im_start|>user\nHello<|im_end|>\n");

    check_render(CHAT_FORMAT_LLAMA3, k_conv, N_CONV, true,
                 "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful "
                 "assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                 "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
                 "<|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|>"
                 "<|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|>"
                 "<|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|>"
                 "<|start_header_id|>assistant<|end_header_id|>\n\n");
    check_render(CHAT_FORMAT_LLAMA3, k_conv + 1, 1, false,
                 "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>");

    check_render(CHAT_FORMAT_LLAMA2, k_conv, N_CONV, true,
                 "[INST] You are a helpful assistant\nHello [/INST]Hi there</s>[INST] Who are you "
                 "[/INST]   I am an assistant   </s>[INST] Another question [/INST]");
    check_render(CHAT_FORMAT_LLAMA2_SYS, k_conv, N_CONV, true,
                 "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi "
                 "there</s>[INST] Who are you [/INST]   I am an assistant   </s>[INST] Another "
                 "question [/INST]");
    check_render(CHAT_FORMAT_LLAMA2_SYS_BOS, k_conv, N_CONV, true,
                 "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi "
                 "there</s><s>[INST] Who are you [/INST]   I am an assistant   </s><s>[INST] "
                 "Another question [/INST]");
    check_render(CHAT_FORMAT_LLAMA2_SYS_STRIP, k_conv, N_CONV, true,
                 "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi "
                 "there</s>[INST] Who are you [/INST]I am an assistant</s>[INST] Another question "
                 "[/INST]");
    /* Llama 2 has no assistant header: add_generation_prompt changes nothing. */
    check_render(CHAT_FORMAT_LLAMA2_SYS_STRIP, k_conv, 2, false,
                 "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]");

    check_render(CHAT_FORMAT_PLAIN, k_conv, N_CONV, true,
                 "System: You are a helpful assistant\nUser: Hello\nAssistant: Hi there\nUser: Who "
                 "are you\nAssistant:    I am an assistant   \nUser: Another question\nAssistant:");
    check_render(CHAT_FORMAT_PLAIN, k_conv + 1, 1, true, "User: Hello\nAssistant:");
    check_render(CHAT_FORMAT_PLAIN, k_conv + 1, 1, false, "User: Hello\n");

    /* Empty contents and UTF-8 pass through untouched. */
    const chat_message utf8[] = {{"user", "h\xc3\xa9llo \xe2\x9c\x93"}, {"assistant", ""}};
    check_render(CHAT_FORMAT_CHATML, utf8, 2, false,
                 "<|im_start|>user\nh\xc3\xa9llo \xe2\x9c\x93<|im_end|>\n<|im_start|>assistant\n"
                 "<|im_end|>\n");

    CHECK_EQ_STR(chat_format_turn_end(CHAT_FORMAT_LLAMA3), "<|eot_id|>");
    CHECK_EQ_STR(chat_format_turn_end(CHAT_FORMAT_CHATML), "<|im_end|>");
    CHECK_EQ_STR(chat_format_turn_end(CHAT_FORMAT_LLAMA2_SYS), "</s>");
    CHECK_EQ_STR(chat_format_turn_end(CHAT_FORMAT_PLAIN), "\nUser:");
    CHECK(chat_format_turn_end(CHAT_FORMAT_UNSUPPORTED) == NULL);
}

static void test_errors(void) {
    st_err err = {{0}};
    enum chat_role r;
    CHECK_EQ_INT(chat_role_parse("user", &r, &err), 0);
    CHECK_EQ_INT(r, CHAT_ROLE_USER);
    CHECK_EQ_INT(chat_role_parse("assistant", &r, &err), 0);
    CHECK_EQ_INT(r, CHAT_ROLE_ASSISTANT);
    static const char *bad_roles[] = {"tool", "function", "User", "", "developer", "system "};
    for (size_t i = 0; i < sizeof bad_roles / sizeof bad_roles[0]; i++) {
        CHECK_EQ_INT(chat_role_parse(bad_roles[i], &r, &err), -1);
        CHECK(strstr(err.msg, "unknown role") != NULL);
    }
    CHECK_EQ_INT(chat_role_parse(NULL, &r, &err), -1);

    const chat_message bad[] = {{"user", "hi"}, {"tool", "42"}};
    for (int f = CHAT_FORMAT_PLAIN; f < CHAT_FORMAT_UNSUPPORTED; f++) {
        err.msg[0] = '\0';
        char *s = chat_apply((enum chat_format)f, bad, 2, true, NULL, &err);
        CHECK(s == NULL);
        free(s);
        CHECK_EQ_STR(err.msg, "messages[1]: unknown role 'tool' (expected system, user or assistant)");
    }
    const chat_message no_content[] = {{"user", NULL}};
    CHECK(chat_apply(CHAT_FORMAT_CHATML, no_content, 1, true, NULL, &err) == NULL);
    CHECK_EQ_STR(err.msg, "messages[0]: message has no content");
    const chat_message no_role[] = {{NULL, "x"}};
    CHECK(chat_apply(CHAT_FORMAT_CHATML, no_role, 1, true, NULL, &err) == NULL);
    CHECK_EQ_STR(err.msg, "messages[0]: message has no role");
    CHECK(chat_apply(CHAT_FORMAT_CHATML, k_conv, 0, true, NULL, &err) == NULL);
    CHECK_EQ_STR(err.msg, "messages must be a non-empty array");
    CHECK(chat_apply(CHAT_FORMAT_UNSUPPORTED, k_conv, 1, true, NULL, &err) == NULL);
    CHECK(strstr(err.msg, "cannot be rendered") != NULL);
    CHECK(chat_apply((enum chat_format)99, k_conv, 1, true, NULL, NULL) == NULL);
}

/* chat_apply_spans: each content's [off, len) in the rendering, trimmed
 * where the format trims, empty contents left out. */
static void test_spans(void) {
    chat_message m[] = {{"system", "S"}, {"user", " <s>hi "}, {"assistant", ""}};
    st_err err = {{0}};
    tok_span *sp = NULL;
    size_t n = 0, len = 0;
    char *s = chat_apply_spans(CHAT_FORMAT_CHATML, m, 3, true, &len, &sp, &n, &err);
    REQUIRE(s);
    CHECK_EQ_INT(n, 2);
    if (n == 2) {
        CHECK(sp[0].len == 1 && !memcmp(s + sp[0].off, "S", 1));
        CHECK(sp[1].len == 7 && !memcmp(s + sp[1].off, " <s>hi ", 7));
    }
    free(s);
    free(sp);
    s = chat_apply_spans(CHAT_FORMAT_LLAMA3, m, 2, false, &len, &sp, &n, &err);
    REQUIRE(s);
    CHECK(n == 2 && sp[1].len == 5 && !memcmp(s + sp[1].off, "<s>hi", 5));
    free(s);
    free(sp);
}

int main(void) {
    test_detect();
    test_render();
    test_errors();
    test_spans();
    return test_summary();
}
