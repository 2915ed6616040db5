/* chat_template.c — chat template detection and rendering (see chat_template.h).
 *
 * Detection and the rendered strings follow llama.cpp's src/llama-chat.cpp
 * (llm_chat_detect_template / llm_chat_apply_template) for the formats we
 * keep: ChatML, the four Llama 2 variants and Llama 3.
 */
#include "model/chat_template.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "common/strbuf.h"

#include "common/log.h"


/* Where the messages' contents went in the rendered text (chat_apply_spans):
 * one span per non-empty content, in order. NULL spans: not recorded. */
typedef struct content_spans {
    tok_span *v;
    size_t n;
    bool oom;
} content_spans;

static void note_span(st_strbuf *b, content_spans *cs, size_t start) {
    if (!cs || b->len == start) return;
    tok_span *nv = realloc(cs->v, (cs->n + 1) * sizeof *nv);
    if (!nv) {
        cs->oom = true;
        return;
    }
    cs->v = nv;
    cs->v[cs->n++] = (tok_span){start, b->len - start};
}

/* Appends a message's content, recording its span. */
static void sb_put_content(st_strbuf *b, content_spans *cs, const char *s) {
    size_t start = b->len;
    st_strbuf_puts(b, s);
    note_span(b, cs, start);
}

/* Appends content without leading/trailing whitespace (isspace, as llama.cpp's trim). */
static void sb_put_trimmed(st_strbuf *b, content_spans *cs, const char *s) {
    size_t start = 0, end = strlen(s), at = b->len;
    while (start < end && isspace((unsigned char)s[start])) start++;
    while (end > start && isspace((unsigned char)s[end - 1])) end--;
    st_strbuf_putn(b, s + start, end - start);
    note_span(b, cs, at);
}

static const struct {
    const char *name;
    enum chat_format fmt;
} k_names[] = {
    {"plain", CHAT_FORMAT_PLAIN},
    {"chatml", CHAT_FORMAT_CHATML},
    {"llama2", CHAT_FORMAT_LLAMA2},
    {"llama2-sys", CHAT_FORMAT_LLAMA2_SYS},
    {"llama2-sys-bos", CHAT_FORMAT_LLAMA2_SYS_BOS},
    {"llama2-sys-strip", CHAT_FORMAT_LLAMA2_SYS_STRIP},
    {"llama3", CHAT_FORMAT_LLAMA3},
    {"unsupported", CHAT_FORMAT_UNSUPPORTED},
};

const char *chat_format_name(enum chat_format fmt) {
    for (size_t i = 0; i < sizeof k_names / sizeof k_names[0]; i++)
        if (k_names[i].fmt == fmt) return k_names[i].name;
    return "unsupported";
}

int chat_format_from_name(const char *name, enum chat_format *out, st_err *err) {
    if (name) {
        for (size_t i = 0; i < sizeof k_names / sizeof k_names[0]; i++) {
            if (k_names[i].fmt != CHAT_FORMAT_UNSUPPORTED && !strcmp(name, k_names[i].name)) {
                *out = k_names[i].fmt;
                return 0;
            }
        }
    }
    return st_errf(err,
                   "unknown chat format '%s' (expected plain, chatml, llama2, llama2-sys, "
                   "llama2-sys-bos, llama2-sys-strip or llama3)",
                   name ? name : "(null)");
}

enum chat_format chat_detect(const char *tmpl) {
    if (!tmpl || !*tmpl) return CHAT_FORMAT_PLAIN;
    enum chat_format named;
    if (chat_format_from_name(tmpl, &named, NULL) == 0) return named;
#define HAS(s) (strstr(tmpl, (s)) != NULL)
    if (HAS("<|im_start|>")) {
        /* Phi-4 uses <|im_start|> with <|im_sep|> instead of a newline. */
        return HAS("<|im_sep|>") ? CHAT_FORMAT_UNSUPPORTED : CHAT_FORMAT_CHATML;
    }
    if (!strncmp(tmpl, "mistral", 7) || HAS("[INST]")) {
        /* Mistral v1/v3/v3-tekken/v7 also use [INST] but space it differently. */
        if (HAS("[SYSTEM_PROMPT]") || HAS("' [INST] ' + system_message") || HAS("[AVAILABLE_TOOLS]"))
            return CHAT_FORMAT_UNSUPPORTED;
        if (HAS("content.strip()")) return CHAT_FORMAT_LLAMA2_SYS_STRIP;
        if (HAS("bos_token + '[INST]")) return CHAT_FORMAT_LLAMA2_SYS_BOS;
        if (HAS("<<SYS>>")) return CHAT_FORMAT_LLAMA2_SYS;
        return CHAT_FORMAT_LLAMA2;
    }
    if (HAS("<|start_header_id|>") && HAS("<|end_header_id|>")) return CHAT_FORMAT_LLAMA3;
#undef HAS
    return CHAT_FORMAT_UNSUPPORTED;
}

enum chat_format chat_select(const char *tmpl) {
    enum chat_format f = chat_detect(tmpl);
    if (f != CHAT_FORMAT_UNSUPPORTED) return f;
    ST_WARN("chat template not supported (starts \"%.60s\"); chat completions use the plain "
            "\"User: ...\\nAssistant:\" format, which this model was not trained on",
            tmpl);
    return CHAT_FORMAT_PLAIN;
}

int chat_role_parse(const char *role, enum chat_role *out, st_err *err) {
    if (!role) return st_errf(err, "message has no role");
    if (!strcmp(role, "system")) *out = CHAT_ROLE_SYSTEM;
    else if (!strcmp(role, "user")) *out = CHAT_ROLE_USER;
    else if (!strcmp(role, "assistant")) *out = CHAT_ROLE_ASSISTANT;
    else
        return st_errf(err, "unknown role '%.64s' (expected system, user or assistant)", role);
    return 0;
}

const char *chat_format_turn_end(enum chat_format fmt) {
    switch (fmt) {
    case CHAT_FORMAT_PLAIN: return "\nUser:";
    case CHAT_FORMAT_CHATML: return "<|im_end|>";
    case CHAT_FORMAT_LLAMA2:
    case CHAT_FORMAT_LLAMA2_SYS:
    case CHAT_FORMAT_LLAMA2_SYS_BOS:
    case CHAT_FORMAT_LLAMA2_SYS_STRIP: return "</s>";
    case CHAT_FORMAT_LLAMA3: return "<|eot_id|>";
    default: return NULL;
    }
}

static void render_plain(st_strbuf *b, content_spans *cs, const chat_message *m,
                         const enum chat_role *r, size_t n, bool add_gen) {
    static const char *labels[] = {"System: ", "User: ", "Assistant: "};
    for (size_t i = 0; i < n; i++) {
        st_strbuf_puts(b, labels[r[i]]);
        sb_put_content(b, cs, m[i].content);
        st_strbuf_puts(b, "\n");
    }
    if (add_gen) st_strbuf_puts(b, "Assistant:");
}

static void render_chatml(st_strbuf *b, content_spans *cs, const chat_message *m, size_t n,
                          bool add_gen) {
    for (size_t i = 0; i < n; i++) {
        st_strbuf_puts(b, "<|im_start|>");
        st_strbuf_puts(b, m[i].role);
        st_strbuf_puts(b, "\n");
        sb_put_content(b, cs, m[i].content);
        st_strbuf_puts(b, "<|im_end|>\n");
    }
    if (add_gen) st_strbuf_puts(b, "<|im_start|>assistant\n");
}

static void render_llama3(st_strbuf *b, content_spans *cs, const chat_message *m, size_t n,
                          bool add_gen) {
    for (size_t i = 0; i < n; i++) {
        st_strbuf_puts(b, "<|start_header_id|>");
        st_strbuf_puts(b, m[i].role);
        st_strbuf_puts(b, "<|end_header_id|>\n\n");
        sb_put_trimmed(b, cs, m[i].content);
        st_strbuf_puts(b, "<|eot_id|>");
    }
    if (add_gen) st_strbuf_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* https://huggingface.co/blog/llama2#how-to-prompt-llama-2, as llama.cpp renders it. */
static void render_llama2(st_strbuf *b, content_spans *cs, enum chat_format fmt,
                          const chat_message *m, const enum chat_role *r, size_t n) {
    bool sys_block = fmt != CHAT_FORMAT_LLAMA2;
    bool bos_inside = fmt == CHAT_FORMAT_LLAMA2_SYS_BOS;
    bool strip = fmt == CHAT_FORMAT_LLAMA2_SYS_STRIP;
    bool inside_turn = true; /* the first "[INST] " is written up front (BOS is the tokenizer's) */
    st_strbuf_puts(b, "[INST] ");
    for (size_t i = 0; i < n; i++) {
        if (!inside_turn) {
            inside_turn = true;
            st_strbuf_puts(b, bos_inside ? "<s>[INST] " : "[INST] ");
        }
        if (r[i] == CHAT_ROLE_SYSTEM && sys_block) st_strbuf_puts(b, "<<SYS>>\n");
        if (strip) sb_put_trimmed(b, cs, m[i].content);
        else sb_put_content(b, cs, m[i].content);
        switch (r[i]) {
        case CHAT_ROLE_SYSTEM: st_strbuf_puts(b, sys_block ? "\n<</SYS>>\n\n" : "\n"); break;
        case CHAT_ROLE_USER: st_strbuf_puts(b, " [/INST]"); break;
        case CHAT_ROLE_ASSISTANT:
            st_strbuf_puts(b, "</s>");
            inside_turn = false;
            break;
        }
    }
}

char *chat_apply(enum chat_format fmt, const chat_message *msgs, size_t n,
                 bool add_generation_prompt, size_t *len_out, st_err *err) {
    return chat_apply_spans(fmt, msgs, n, add_generation_prompt, len_out, NULL, NULL, err);
}

char *chat_apply_spans(enum chat_format fmt, const chat_message *msgs, size_t n,
                       bool add_generation_prompt, size_t *len_out, tok_span **spans_out,
                       size_t *n_spans_out, st_err *err) {
    content_spans cs = {0}, *csp = spans_out ? &cs : NULL;
    if (spans_out) *spans_out = NULL;
    if (n_spans_out) *n_spans_out = 0;
    if (fmt < CHAT_FORMAT_PLAIN || fmt >= CHAT_FORMAT_UNSUPPORTED) {
        st_errf(err, "chat format '%s' cannot be rendered", chat_format_name(fmt));
        return NULL;
    }
    if (n == 0 || !msgs) {
        st_errf(err, "messages must be a non-empty array");
        return NULL;
    }
    enum chat_role *roles = malloc(n * sizeof *roles);
    if (!roles) {
        st_errf(err, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        if (chat_role_parse(msgs[i].role, &roles[i], err) != 0 ||
            (!msgs[i].content && st_errf(err, "message has no content") < 0)) {
            st_err_prefix(err, "messages[%zu]", i);
            free(roles);
            return NULL;
        }
    }
    st_strbuf b = {0};
    st_strbuf_puts(&b, ""); /* an empty rendering is still a valid string */
    switch (fmt) {
    case CHAT_FORMAT_PLAIN: render_plain(&b, csp, msgs, roles, n, add_generation_prompt); break;
    case CHAT_FORMAT_CHATML: render_chatml(&b, csp, msgs, n, add_generation_prompt); break;
    case CHAT_FORMAT_LLAMA3: render_llama3(&b, csp, msgs, n, add_generation_prompt); break;
    default: render_llama2(&b, csp, fmt, msgs, roles, n); break;
    }
    free(roles);
    if (b.oom || cs.oom) {
        free(b.p);
        free(cs.v);
        st_errf(err, "out of memory");
        return NULL;
    }
    if (len_out) *len_out = b.len;
    if (spans_out) *spans_out = cs.v;
    if (n_spans_out) *n_spans_out = cs.n;
    return b.p;
}
