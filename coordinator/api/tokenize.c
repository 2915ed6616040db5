/* tokenize.c — POST /tokenize and /detokenize (see tokenize.h). */
#include "coordinator/api/tokenize.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/api/chat.h"

static char *fail(compl_error *e, const char *param, const char *msg) {
    compl_error_set(e, 400, "invalid_request_error", param, NULL, "%s", msg);
    return NULL;
}

/* The body as an object with only the allowed keys; NULL with e. */
static json_t *load(const char *body, size_t len, const char *const *allowed,
                    const compl_limits *lim, compl_error *e) {
    json_error_t jerr;
    json_t *o = json_loadb(body, len, JSON_DECODE_ANY, &jerr);
    if (!o) {
        compl_error_set(e, 400, "invalid_request_error", NULL, NULL,
                        "the body is not valid JSON: %s (line %d, column %d)", jerr.text,
                        jerr.line, jerr.column);
        return NULL;
    }
    if (!json_is_object(o)) {
        json_decref(o);
        fail(e, NULL, "the body must be a JSON object");
        return NULL;
    }
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        bool ok = false;
        for (const char *const *a = allowed; *a && !ok; a++) ok = !strcmp(*a, k);
        if (!ok) {
            compl_error_set(e, 400, "invalid_request_error", k, "unrecognized_argument",
                            "Unrecognized request argument supplied: %.60s", k);
            json_decref(o);
            return NULL;
        }
    }
    json_t *m = json_object_get(o, "model");
    if (m && !json_is_null(m)) {
        if (!json_is_string(m)) {
            json_decref(o);
            fail(e, "model", "'model' must be a string");
            return NULL;
        }
        if (lim->model_name && strcmp(json_string_value(m), lim->model_name) != 0) {
            compl_error_set(e, 404, "invalid_request_error", "model", "model_not_found",
                            "The model '%.200s' does not exist; this server serves '%.200s'",
                            json_string_value(m), lim->model_name);
            json_decref(o);
            return NULL;
        }
    }
    return o;
}

static int get_flag(json_t *o, const char *key, bool dflt, bool *out, compl_error *e) {
    json_t *v = json_object_get(o, key);
    *out = dflt;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) {
        char msg[96];
        snprintf(msg, sizeof msg, "'%s' must be a boolean", key);
        fail(e, key, msg);
        return -1;
    }
    *out = json_is_true(v);
    return 0;
}

char *api_tokenize(const char *body, size_t len, const compl_limits *lim, compl_error *e) {
    static const char *const allowed[] = {"model", "prompt", "messages", "add_special_tokens",
                                          "add_generation_prompt", "return_token_strs", NULL};
    json_t *o = load(body, len, allowed, lim, e);
    if (!o) return NULL;
    char *out = NULL;
    compl_prompt p = {0};
    int32_t *ids = NULL;
    int n = 0;
    bool add_special, add_gen, strs;
    json_t *prompt = json_object_get(o, "prompt"), *msgs = json_object_get(o, "messages");
    bool chat = msgs && !json_is_null(msgs);
    if (get_flag(o, "add_special_tokens", true, &add_special, e) ||
        get_flag(o, "add_generation_prompt", true, &add_gen, e) ||
        get_flag(o, "return_token_strs", false, &strs, e))
        goto out;
    if (strs && !lim->tok->token_text) {
        compl_error_set(e, 501, "server_error", "return_token_strs", NULL,
                        "this tokenizer has no token strings");
        goto out;
    }
    if (chat == (prompt && !json_is_null(prompt))) {
        fail(e, "prompt", "give exactly one of 'prompt' (a string) and 'messages'");
        goto out;
    }
    if (chat) {
        if (chat_render_messages(msgs, lim->chat_format, add_gen, &p, e) != 0) goto out;
    } else {
        if (!json_is_string(prompt)) {
            fail(e, "prompt", "'prompt' must be a string");
            goto out;
        }
        p.len = json_string_length(prompt);
        if (memchr(json_string_value(prompt), '\0', p.len)) {
            fail(e, "prompt", "'prompt' must not contain NUL characters");
            goto out;
        }
        if (!(p.text = strndup(json_string_value(prompt), p.len))) {
            compl_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
            goto out;
        }
    }
    /* An empty text is 0 tokens here (compl_prompt_ids refuses it for generation). */
    size_t m = 0;
    st_err err = {{0}};
    if (lim->tok->encode(lim->tok->ctx, p.text, p.len, add_special, chat, p.plain, p.n_plain, &ids,
                         &m, &err) != 0) {
        fail(e, chat ? "messages" : "prompt", err.msg);
        goto out;
    }
    n = (int)m;
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    json_t *ts = strs ? json_array() : json_null();
    for (int i = 0; strs && ts && i < n; i++) {
        size_t tl = 0;
        const char *tt = lim->tok->token_text(lim->tok->ctx, ids[i], &tl);
        size_t sl;
        char *clean = utf8_sanitize(tt ? tt : "", tt ? tl : 0, &sl);
        json_array_append_new(ts, clean ? json_stringn(clean, sl) : json_null());
        free(clean);
    }
    json_t *root = json_pack("{s:o,s:i,s:i,s:o}", "tokens", a, "count", n, "max_model_len",
                             lim->n_ctx, "token_strs", ts);
    out = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (!out) compl_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
out:
    free(ids);
    free(p.text);
    free(p.plain);
    json_decref(o);
    return out;
}

char *api_detokenize(const char *body, size_t len, const compl_limits *lim, compl_error *e) {
    static const char *const allowed[] = {"model", "tokens", NULL};
    json_t *o = load(body, len, allowed, lim, e);
    if (!o) return NULL;
    char *out = NULL, *text = NULL;
    int32_t *ids = NULL;
    json_t *t = json_object_get(o, "tokens");
    if (!json_is_array(t)) {
        fail(e, "tokens", "'tokens' must be a list of token ids");
        goto out;
    }
    if (!lim->tok->decode) {
        compl_error_set(e, 501, "server_error", NULL, NULL, "this tokenizer cannot decode");
        goto out;
    }
    size_t n = json_array_size(t);
    ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) {
        compl_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(t, i);
        json_int_t v = json_is_integer(x) ? json_integer_value(x) : -1;
        if (!json_is_integer(x) || v < 0 || v > INT32_MAX ||
            (lim->tok->n_vocab > 0 && v >= lim->tok->n_vocab)) {
            compl_error_set(e, 400, "invalid_request_error", "tokens", NULL,
                            "tokens[%zu] is not a token id in the vocabulary [0, %d)", i,
                            (int)lim->tok->n_vocab);
            goto out;
        }
        ids[i] = (int32_t)v;
    }
    size_t tl = 0;
    st_err err = {{0}};
    if (lim->tok->decode(lim->tok->ctx, ids, n, &text, &tl, &err) != 0) {
        fail(e, "tokens", err.msg);
        goto out;
    }
    /* Raw bytes: a token list may end inside a character; JSON gets U+FFFD. */
    size_t sl;
    char *clean = utf8_sanitize(text, tl, &sl);
    json_t *root = clean ? json_pack("{s:s%}", "prompt", clean, sl) : NULL;
    free(clean);
    out = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (!out) compl_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
out:
    free(text);
    free(ids);
    json_decref(o);
    return out;
}
