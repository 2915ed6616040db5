/* prompt.c — the shapes of "prompt" and prompts to token ids. See prompt.h. */
#include "coordinator/api/prompt.h"

#include <stdlib.h>
#include <string.h>

static int bad(compl_error *e, const char *msg, long i, long j) {
    if (i < 0)
        compl_error_set(e, 400, "invalid_request_error", "prompt", NULL, "'prompt' %s", msg);
    else if (j < 0)
        compl_error_set(e, 400, "invalid_request_error", "prompt", NULL, "prompt[%ld] %s", i, msg);
    else
        compl_error_set(e, 400, "invalid_request_error", "prompt", NULL, "prompt[%ld][%ld] %s", i,
                        j, msg);
    return -1;
}

static int oom(compl_error *e) {
    compl_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    return -1;
}

static int text_prompt(json_t *s, long i, compl_prompt *p, compl_error *e) {
    p->len = json_string_length(s);
    if (memchr(json_string_value(s), '\0', p->len)) return bad(e, "must not contain NUL characters", i, -1);
    if (!(p->text = strndup(json_string_value(s), p->len))) return oom(e);
    return 0;
}

/* A list of token ids; i is its index in a batch (-1: the prompt itself). */
static int id_prompt(json_t *a, long i, const compl_tokenizer *tok, compl_prompt *p,
                     compl_error *e) {
    size_t n = json_array_size(a);
    if (n == 0) return bad(e, "must not be an empty list of token ids", i, -1);
    if (!(p->ids = malloc(n * sizeof *p->ids))) return oom(e);
    p->n_ids = (int)n;
    int32_t nv = tok ? tok->n_vocab : 0;
    for (size_t j = 0; j < n; j++) {
        json_t *x = json_array_get(a, j);
        if (!json_is_integer(x))
            return i < 0 ? bad(e, "must be a string, a list of strings, a list of token ids or "
                                  "a list of lists of token ids (elements may not be mixed)",
                               -1, -1)
                         : bad(e, "must hold only integer token ids", i, (long)j);
        json_int_t v = json_integer_value(x);
        if (v < 0 || (nv > 0 && v >= nv) || v > INT32_MAX) {
            char msg[160];
            snprintf(msg, sizeof msg, "is token id %lld, outside the vocabulary [0, %d)",
                     (long long)v, (int)nv);
            return i < 0 ? bad(e, msg, (long)j, -1) : bad(e, msg, i, (long)j);
        }
        p->ids[j] = (int32_t)v;
    }
    if (tok && tok->decode) {
        st_err err = {{0}};
        if (tok->decode(tok->ctx, p->ids, n, &p->text, &p->len, &err) != 0) {
            compl_error_set(e, 400, "invalid_request_error", "prompt", NULL, "%s", err.msg);
            return -1;
        }
    } else if (!(p->text = strdup(""))) {
        return oom(e);
    }
    return 0;
}

int compl_prompts_parse(json_t *v, const compl_tokenizer *tok, compl_prompt **out, int *n,
                        compl_error *e) {
    *out = NULL;
    *n = 0;
    if (!v || json_is_null(v)) return bad(e, "is required", -1, -1);
    bool batch = json_is_array(v) && json_array_size(v) > 0 &&
                 !json_is_integer(json_array_get(v, 0));
    size_t count = batch ? json_array_size(v) : 1;
    if (json_is_array(v) && json_array_size(v) == 0) return bad(e, "must not be an empty list", -1, -1);
    if (!json_is_string(v) && !json_is_array(v))
        return bad(e, "must be a string, a list of strings, a list of token ids or a list of "
                      "lists of token ids", -1, -1);
    if (count > COMPL_MAX_CHOICES) {
        compl_error_set(e, 400, "invalid_request_error", "prompt", NULL,
                        "'prompt' holds %zu prompts; at most %d are allowed in one request", count,
                        COMPL_MAX_CHOICES);
        return -1;
    }
    compl_prompt *p = calloc(count, sizeof *p);
    if (!p) return oom(e);
    int rc = 0;
    if (json_is_string(v)) {
        rc = text_prompt(v, -1, &p[0], e);
    } else if (!batch) {
        rc = id_prompt(v, -1, tok, &p[0], e);
    } else {
        /* a batch: all strings, or all lists of ids */
        bool texts = json_is_string(json_array_get(v, 0));
        for (size_t i = 0; i < count && rc == 0; i++) {
            json_t *x = json_array_get(v, i);
            if (texts && json_is_string(x))
                rc = text_prompt(x, (long)i, &p[i], e);
            else if (!texts && json_is_array(x))
                rc = id_prompt(x, (long)i, tok, &p[i], e);
            else
                rc = bad(e, "must be a string, a list of strings, a list of token ids or a list "
                            "of lists of token ids (elements may not be mixed)", -1, -1);
        }
    }
    if (rc != 0) {
        compl_prompts_free(p, (int)count);
        return -1;
    }
    *out = p;
    *n = (int)count;
    return 0;
}

void compl_prompts_free(compl_prompt *p, int n) {
    for (int i = 0; p && i < n; i++) {
        free(p[i].text);
        free(p[i].ids);
        free(p[i].plain);
    }
    free(p);
}

int compl_prompt_ids(const compl_prompt *p, const compl_tokenizer *tok, bool chat,
                     bool add_special, int32_t **ids, int *n, compl_error *e) {
    *ids = NULL;
    *n = 0;
    if (p->ids) {
        if (!(*ids = malloc((size_t)p->n_ids * sizeof **ids))) return oom(e);
        memcpy(*ids, p->ids, (size_t)p->n_ids * sizeof **ids);
        *n = p->n_ids;
        return 0;
    }
    size_t m = 0;
    st_err err = {{0}};
    /* Chat prompts hold the template's special-token text; the contents'
     * spans are read as plain text (docs/chat-templates.md). */
    if (tok->encode(tok->ctx, p->text, p->len, add_special, chat, p->plain, p->n_plain, ids, &m,
                    &err) != 0) {
        compl_error_set(e, 400, "invalid_request_error", "prompt", NULL, "%s", err.msg);
        return -1;
    }
    if (m == 0) {
        free(*ids);
        *ids = NULL;
        compl_error_set(e, 400, "invalid_request_error", "prompt", NULL, "the prompt has no tokens");
        return -1;
    }
    *n = (int)m;
    return 0;
}

/* ---- the model's vocabulary ---------------------------------------------------- */

static int vocab_encode(void *ctx, const char *text, size_t len, bool add_special,
                        bool parse_special, const tok_span *plain, size_t n_plain, int32_t **ids,
                        size_t *n, st_err *err) {
    if (parse_special && n_plain > 0)
        return tok_encode_guarded(ctx, text, len, add_special, plain, n_plain, ids, n, err);
    return tok_encode(ctx, text, len, add_special, parse_special, ids, n, err);
}

/* As Hugging Face's decode(ids, skip_special_tokens=True), which vLLM's
 * /detokenize and echo follow: a leading BOS is skipped without keeping the
 * SentencePiece space after it (llama_detokenize keeps it when it drops the
 * BOS itself), so decode(encode(t)) == t. */
static int vocab_decode(void *ctx, const int32_t *ids, size_t n, char **text, size_t *len,
                        st_err *err) {
    if (n > 0 && ids[0] == tok_bos(ctx) && tok_add_bos(ctx)) ids++, n--;
    return tok_detokenize(ctx, ids, n, true, text, len, err);
}

static const char *vocab_special_text(void *ctx, int32_t id, size_t *len) {
    int t = tok_token_type(ctx, id);
    if (t != TOK_TYPE_CONTROL && t != TOK_TYPE_UNKNOWN) return NULL;
    return tok_token_text(ctx, id, len);
}

static bool vocab_is_eog(void *ctx, int32_t id) { return tok_is_eog(ctx, id); }

static const char *vocab_token_text(void *ctx, int32_t id, size_t *len) {
    return tok_token_text(ctx, id, len);
}

compl_tokenizer compl_tokenizer_vocab(const tok_vocab *vocab) {
    compl_tokenizer t = {.encode = vocab_encode,
                         .decode = vocab_decode,
                         .special_text = vocab_special_text,
                         .is_eog = vocab_is_eog,
                         .token_text = vocab_token_text,
                         .n_vocab = vocab ? tok_n_vocab(vocab) : 0,
                         .ctx = (void *)vocab};
    return t;
}
