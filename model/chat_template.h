/* chat_template.h — turns an OpenAI-style message list into the prompt text a
 * chat model was trained on.
 *
 * Strata does not run Jinja. Like llama.cpp's llm_chat_detect_template(), it
 * recognises the model's `tokenizer.chat_template` by substrings and renders
 * the matching built-in format (same output as llama.cpp's
 * llm_chat_apply_template(), src/llama-chat.cpp):
 *
 *   ChatML   "<|im_start|>"                       "<|im_start|>user\nHi<|im_end|>\n"
 *   Llama 2  "[INST]" (not a Mistral v1/v3/v7)    "[INST] <<SYS>>\nS\n<</SYS>>\n\nHi [/INST]"
 *            four variants, by "<<SYS>>", "bos_token + '[INST]", "content.strip()"
 *   Llama 3  "<|start_header_id|>" and "<|end_header_id|>"
 *                                                 "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
 *   plain    no template                          "System: S\nUser: Hi\nAssistant:"
 *
 * A template that is present but matches none of these is UNSUPPORTED;
 * chat_select() then logs one warning and falls back to the plain format (see
 * docs/chat-templates.md for why this is not a per-request error).
 *
 * The rendered text never starts with BOS (the tokenizer adds it) and holds
 * special-token text such as "<|eot_id|>". Tokenize it with
 * tok_encode_guarded over the content spans of chat_apply_spans: the
 * template's text yields special tokens, the messages' contents never do.
 * Roles are "system", "user" and "assistant"; anything else is an error.
 */
#ifndef STRATA_MODEL_CHAT_TEMPLATE_H
#define STRATA_MODEL_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"
#include "model/tokenizer.h"

enum chat_format {
    CHAT_FORMAT_PLAIN = 0,        /* no template: "Role: content\n" lines */
    CHAT_FORMAT_CHATML,           /* <|im_start|>role\n...<|im_end|>\n */
    CHAT_FORMAT_LLAMA2,           /* [INST] ... [/INST], system text inlined (no <<SYS>>) */
    CHAT_FORMAT_LLAMA2_SYS,       /* [INST] <<SYS>>\n...\n<</SYS>>\n\n ... [/INST] */
    CHAT_FORMAT_LLAMA2_SYS_BOS,   /* as LLAMA2_SYS, "<s>" before each later [INST] */
    CHAT_FORMAT_LLAMA2_SYS_STRIP, /* as LLAMA2_SYS, contents trimmed of whitespace */
    CHAT_FORMAT_LLAMA3,           /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
    CHAT_FORMAT_UNSUPPORTED,      /* a template we do not recognise */
};

enum chat_role { CHAT_ROLE_SYSTEM = 0, CHAT_ROLE_USER, CHAT_ROLE_ASSISTANT };

/* One message; both strings are NUL-terminated UTF-8, borrowed. */
typedef struct chat_message {
    const char *role;
    const char *content;
} chat_message;

/* The format for a `tokenizer.chat_template` value. NULL or "" -> PLAIN; a
 * format name (see chat_format_name(), e.g. "chatml", "llama3") -> that
 * format; otherwise the substring heuristics above, and UNSUPPORTED when none
 * matches. Never fails. */
enum chat_format chat_detect(const char *tmpl);

/* chat_detect(), but UNSUPPORTED becomes PLAIN with one ST_WARN naming the
 * first bytes of the template. Call once per model load. */
enum chat_format chat_select(const char *tmpl);

/* Short stable name: "plain", "chatml", "llama2", "llama2-sys",
 * "llama2-sys-bos", "llama2-sys-strip", "llama3", "unsupported". */
const char *chat_format_name(enum chat_format fmt);

/* Parses a format name (for an operator override such as
 * chat_template=chatml). Returns 0, or -1 with err for an unknown name. */
int chat_format_from_name(const char *name, enum chat_format *out, st_err *err);

/* Parses an OpenAI role. Returns 0, or -1 with err ("unknown role 'tool'..."). */
int chat_role_parse(const char *role, enum chat_role *out, st_err *err);

/* Renders msgs[0..n) in fmt. add_generation_prompt appends the assistant
 * header ("<|im_start|>assistant\n", "<|start_header_id|>assistant
 * <|end_header_id|>\n\n", "Assistant:"); Llama 2 has none (the user turn's
 * " [/INST]" is where the answer starts), so there it is a no-op.
 * Returns a malloc'd NUL-terminated string (caller frees; *len_out gets its
 * length when non-NULL), or NULL with err when n == 0, a role or content is
 * NULL, a role is unknown, or fmt is UNSUPPORTED / out of range. Every such
 * error is the client's (HTTP 400) except the format one. */
char *chat_apply(enum chat_format fmt, const chat_message *msgs, size_t n,
                 bool add_generation_prompt, size_t *len_out, st_err *err);

/* chat_apply, and where each message's content landed: *spans_out
 * (malloc'd, caller frees; NULL when none) gets one [off, len) per non-empty
 * content in rendering order (trimmed formats: the trimmed text). These are
 * the ranges tok_encode_guarded must not read special tokens from. */
char *chat_apply_spans(enum chat_format fmt, const chat_message *msgs, size_t n,
                       bool add_generation_prompt, size_t *len_out, tok_span **spans_out,
                       size_t *n_spans_out, st_err *err);

/* The text that ends an assistant turn in fmt ("<|im_end|>", "<|eot_id|>",
 * "</s>" for the Llama 2 variants, "\nUser:" for plain). The coordinator
 * adds it as a stop string when the tokenizer does not already treat the
 * matching token as end-of-generation. NULL for UNSUPPORTED. */
const char *chat_format_turn_end(enum chat_format fmt);

#endif
