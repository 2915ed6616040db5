/* completions.c — OpenAI completions: request validation, the completion
 * text (common/utf8.h + model/stop.h, as strata-run), and response / chunk
 * JSON. See completions.h. */
#include "coordinator/api/completions.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/api/chat.h"
#include "model/chat_template.h"

/* ---- JSON strings ------------------------------------------------------------ */

/* A JSON string of s[n] (invalid UTF-8 becomes U+FFFD). */
static json_t *jstr(const char *s, size_t n) {
    size_t m;
    char *t = utf8_sanitize(s, n, &m);
    if (!t) return NULL;
    json_t *j = json_stringn_nocheck(t, m);
    free(t);
    return j;
}

/* ---- request parsing ---------------------------------------------------------- */

static int bad(compl_error *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(compl_error *e, const char *param, const char *fmt, ...) {
    char msg[ST_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    compl_error_set(e, 400, "invalid_request_error", param, NULL, "%s", msg);
    return -1;
}

static json_t *field(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return (v && !json_is_null(v)) ? v : NULL;
}

static int get_num(json_t *o, const char *key, double lo, double hi, bool lo_open, double *out,
                   compl_error *e) {
    json_t *v = field(o, key);
    if (!v) return 0;
    if (!json_is_number(v)) return bad(e, key, "'%s' must be a number", key);
    double x = json_number_value(v);
    if (!isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo))
        return bad(e, key, "'%s' must be in %s%g, %g]; got %g", key, lo_open ? "(" : "[", lo, hi,
                   x);
    *out = x;
    return 0;
}

static int get_int(json_t *o, const char *key, long long lo, long long hi, long long *out,
                   compl_error *e) {
    json_t *v = field(o, key);
    if (!v) return 0;
    if (!json_is_integer(v)) return bad(e, key, "'%s' must be an integer", key);
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return bad(e, key, "'%s' must be in [%lld, %lld]; got %lld", key, lo, hi, x);
    *out = x;
    return 0;
}

static int get_bool(json_t *o, const char *key, bool *out, compl_error *e) {
    json_t *v = field(o, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) return bad(e, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

static int get_str(json_t *o, const char *key, char **out, compl_error *e) {
    json_t *v = field(o, key);
    if (!v) return 0;
    if (!json_is_string(v)) return bad(e, key, "'%s' must be a string", key);
    *out = strndup(json_string_value(v), json_string_length(v));
    if (!*out) return bad(e, key, "out of memory");
    return 0;
}

/* The fields each route knows. Anything else is refused (docs/api.md),
 * as OpenAI refuses an unknown argument; the vendor fields are vLLM's. */
static const char *const k_common_fields[] = {
    "model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stream",
    "stream_options", "n", "best_of", "logprobs", "user", "presence_penalty",
    "frequency_penalty", "logit_bias", "return_token_ids", "ignore_eos", "repetition_penalty",
    "min_tokens", "stop_token_ids", "skip_special_tokens",
    /* OpenAI fields with nothing to do here: accepted and ignored */
    "store", "metadata", "service_tier", NULL};
static const char *const k_completion_fields[] = {"prompt", "echo", "suffix",
                                                  "add_special_tokens", NULL};
static const char *const k_chat_fields[] = {"messages", "max_completion_tokens", "top_logprobs",
                                            "tools", "tool_choice", "parallel_tool_calls",
                                            "response_format", NULL};

static bool in_list(const char *const *l, const char *k) {
    for (; *l; l++)
        if (!strcmp(*l, k)) return true;
    return false;
}

static int check_known_fields(json_t *o, bool chat, compl_error *e) {
    char names[400] = "", *p = names;
    const char *first = NULL;
    int n = 0;
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        if (in_list(k_common_fields, k) || in_list(chat ? k_chat_fields : k_completion_fields, k))
            continue;
        if (!first) first = k;
        int w = snprintf(p, (size_t)(names + sizeof names - p), "%s%.60s", n ? ", " : "", k);
        if (w > 0 && p + w < names + sizeof names) p += w;
        n++;
    }
    if (!n) return 0;
    compl_error_set(e, 400, "invalid_request_error", first, "unrecognized_argument",
                    "Unrecognized request argument%s supplied: %s", n > 1 ? "s" : "", names);
    return -1;
}

/* logit_bias: {"<token id>": bias in [-100, 100], ...} (OpenAI). */
static int parse_logit_bias(json_t *o, const compl_limits *lim, compl_request *r, compl_error *e) {
    json_t *lb = field(o, "logit_bias");
    if (!lb) return 0;
    if (!json_is_object(lb))
        return bad(e, "logit_bias", "'logit_bias' must be an object of token id -> bias");
    size_t n = json_object_size(lb);
    if (n > COMPL_MAX_LOGIT_BIAS)
        return bad(e, "logit_bias", "'logit_bias' has %zu entries; at most %d are allowed", n,
                   COMPL_MAX_LOGIT_BIAS);
    if (n == 0) return 0;
    r->bias_ids = malloc(n * sizeof *r->bias_ids);
    r->bias_values = malloc(n * sizeof *r->bias_values);
    if (!r->bias_ids || !r->bias_values) return bad(e, "logit_bias", "out of memory");
    int32_t nv = lim && lim->tok ? lim->tok->n_vocab : 0;
    const char *k;
    json_t *v;
    json_object_foreach(lb, k, v) {
        char *end = NULL;
        long long id = strtoll(k, &end, 10);
        if (!*k || *end || id < 0 || id > INT32_MAX || (nv > 0 && id >= nv))
            return bad(e, "logit_bias",
                       "'logit_bias' key '%.40s' is not a token id in the vocabulary [0, %d)", k,
                       (int)nv);
        if (!json_is_number(v) || json_number_value(v) < -100 || json_number_value(v) > 100)
            return bad(e, "logit_bias", "'logit_bias' values must be numbers in [-100, 100]");
        r->bias_ids[r->n_bias] = (int32_t)id;
        r->bias_values[r->n_bias++] = (float)json_number_value(v);
    }
    return 0;
}

static int parse_stop_token_ids(json_t *o, const compl_limits *lim, compl_request *r,
                                compl_error *e) {
    json_t *a = field(o, "stop_token_ids");
    if (!a) return 0;
    if (!json_is_array(a))
        return bad(e, "stop_token_ids", "'stop_token_ids' must be a list of token ids");
    if (json_array_size(a) > COMPL_MAX_STOP_TOKEN_IDS)
        return bad(e, "stop_token_ids", "'stop_token_ids' has %zu entries; at most %d are allowed",
                   json_array_size(a), COMPL_MAX_STOP_TOKEN_IDS);
    int32_t nv = lim && lim->tok ? lim->tok->n_vocab : 0;
    size_t i;
    json_t *x;
    json_array_foreach(a, i, x) {
        json_int_t id = json_is_integer(x) ? json_integer_value(x) : -1;
        if (id < 0 || id > INT32_MAX || (nv > 0 && id >= nv))
            return bad(e, "stop_token_ids",
                       "'stop_token_ids'[%zu] is not a token id in the vocabulary [0, %d)", i,
                       (int)nv);
        r->stop_token_ids[r->n_stop_token_ids++] = (int32_t)id;
    }
    return 0;
}

/* vLLM's min_tokens: the end-of-generation ids (unless ignore_eos) and the
 * stop_token_ids cannot be sampled before min_tokens tokens. */
static int min_tokens_mask(const compl_limits *lim, compl_request *r) {
    const compl_tokenizer *tok = lim ? lim->tok : NULL;
    int32_t nv = tok && tok->is_eog && !r->ignore_eos ? tok->n_vocab : 0;
    int cap = r->n_stop_token_ids, n = 0;
    for (int32_t id = 0; id < nv; id++) cap += tok->is_eog(tok->ctx, id);
    if (!(r->min_tokens_mask = malloc((size_t)(cap ? cap : 1) * sizeof *r->min_tokens_mask))) return -1;
    for (int32_t id = 0; id < nv; id++)
        if (tok->is_eog(tok->ctx, id)) r->min_tokens_mask[n++] = id;
    for (int i = 0; i < r->n_stop_token_ids; i++) r->min_tokens_mask[n++] = r->stop_token_ids[i];
    r->n_min_tokens_mask = n;
    return 0;
}

static int parse_fields(json_t *o, const compl_limits *lim, compl_request *r, compl_error *e,
                        bool chat) {
    if (check_known_fields(o, chat, e)) return -1;
    if (chat) {
        r->chat = true;
        if (!(r->prompts = calloc(1, sizeof *r->prompts))) return bad(e, NULL, "out of memory");
        r->n_prompts = 1;
        if (chat_render_messages(json_object_get(o, "messages"), lim ? lim->chat_format : 0, true,
                                 &r->prompts[0], e) != 0)
            return -1;
    } else if (compl_prompts_parse(json_object_get(o, "prompt"), lim ? lim->tok : NULL,
                                   &r->prompts, &r->n_prompts, e) != 0) {
        return -1;
    }

    if (get_str(o, "model", &r->model, e)) return -1;
    if (r->model && lim && lim->model_name && strcmp(r->model, lim->model_name) != 0) {
        compl_error_set(e, 404, "invalid_request_error", "model", "model_not_found",
                        "The model '%.200s' does not exist; this server serves '%.200s'", r->model,
                        lim->model_name);
        return -1;
    }
    long long x = COMPL_DEFAULT_MAX_TOKENS;
    const char *mt = "max_tokens";
    if (chat && !field(o, mt) && field(o, "max_completion_tokens")) mt = "max_completion_tokens";
    if (chat && !field(o, mt)) {
        /* OpenAI's chat default: as long as the context allows. */
        r->max_tokens_auto = true;
        x = lim && lim->n_ctx > 0 ? lim->n_ctx : 256;
    }
    if (get_int(o, mt, 1, INT32_MAX, &x, e)) return -1;
    if (lim && lim->n_ctx > 0 && x > lim->n_ctx)
        return bad(e, "max_tokens",
                   "'%s' is %lld but this model's maximum context length is %d tokens", mt, x,
                   lim->n_ctx);
    r->max_tokens = (int)x;
    if (get_num(o, "temperature", 0, 2, false, &r->temperature, e)) return -1;
    if (get_num(o, "top_p", 0, 1, false, &r->top_p, e)) return -1;
    x = 0;
    if (get_int(o, "top_k", -1, INT32_MAX, &x, e)) return -1;
    r->top_k = x < 0 ? 0 : (int)x;
    if (get_num(o, "min_p", 0, 1, false, &r->min_p, e)) return -1;
    json_t *sv = field(o, "seed");
    if (sv) {
        if (!json_is_integer(sv)) return bad(e, "seed", "'seed' must be an integer");
        r->has_seed = true;
        r->seed = json_integer_value(sv);
    }
    if (get_num(o, "presence_penalty", -2, 2, false, &r->presence_penalty, e)) return -1;
    if (get_num(o, "frequency_penalty", -2, 2, false, &r->frequency_penalty, e)) return -1;
    if (get_num(o, "repetition_penalty", 0, 100, true, &r->repetition_penalty, e)) return -1;
    if (r->repetition_penalty < 0.01)
        return bad(e, "repetition_penalty", "'repetition_penalty' must be in [0.01, 100]; got %g",
                   r->repetition_penalty);
    x = 0;
    if (get_int(o, "min_tokens", 0, INT32_MAX, &x, e)) return -1;
    if (x > r->max_tokens && !r->max_tokens_auto)
        return bad(e, "min_tokens", "'min_tokens' (%lld) must not exceed 'max_tokens' (%d)", x,
                   r->max_tokens);
    r->min_tokens = (int)x;
    if (parse_stop_token_ids(o, lim, r, e)) return -1;
    if (parse_logit_bias(o, lim, r, e)) return -1;
    if (get_bool(o, "skip_special_tokens", &r->skip_special_tokens, e)) return -1;
    if (!chat && get_bool(o, "add_special_tokens", &r->add_special_tokens, e)) return -1;

    json_t *st = field(o, "stop");
    if (st) {
        if (json_is_string(st)) {
            if (json_string_length(st) == 0) return bad(e, "stop", "'stop' must not be empty");
            r->stop[r->n_stop++] = strndup(json_string_value(st), json_string_length(st));
        } else if (json_is_array(st)) {
            if (json_array_size(st) > COMPL_MAX_STOP)
                return bad(e, "stop", "'stop' has %zu sequences; at most %d are allowed",
                           json_array_size(st), COMPL_MAX_STOP);
            size_t i;
            json_t *s;
            json_array_foreach(st, i, s) {
                if (!json_is_string(s) || json_string_length(s) == 0)
                    return bad(e, "stop", "'stop' must hold non-empty strings");
                r->stop[r->n_stop] = strndup(json_string_value(s), json_string_length(s));
                if (!r->stop[r->n_stop]) return bad(e, "stop", "out of memory");
                r->n_stop++;
            }
        } else {
            return bad(e, "stop", "'stop' must be a string or a list of strings");
        }
        for (int i = 0; i < r->n_stop; i++) {
            if (!r->stop[i]) return bad(e, "stop", "out of memory");
            if (strlen(r->stop[i]) > COMPL_MAX_STOP_LEN)
                return bad(e, "stop", "a stop sequence is longer than %d bytes", COMPL_MAX_STOP_LEN);
        }
    }
    if (get_bool(o, "stream", &r->stream, e)) return -1;
    if (get_bool(o, "return_token_ids", &r->return_token_ids, e)) return -1;
    if (!chat && get_bool(o, "echo", &r->echo, e)) return -1;
    if (get_bool(o, "ignore_eos", &r->ignore_eos, e)) return -1;
    if (r->min_tokens > 0 && min_tokens_mask(lim, r) != 0) return bad(e, NULL, "out of memory");
    json_t *so = field(o, "stream_options");
    if (so) {
        if (!json_is_object(so)) return bad(e, "stream_options", "'stream_options' must be an object");
        if (!r->stream)
            return bad(e, "stream_options", "'stream_options' is only allowed when 'stream' is true");
        if (get_bool(so, "include_usage", &r->include_usage, e)) return -1;
        /* include_obfuscation pads chunks against length side channels: ours
         * are not encrypted by us, so it is accepted and ignored. */
        const char *k;
        json_t *v;
        json_object_foreach(so, k, v) {
            if (strcmp(k, "include_usage") && strcmp(k, "include_obfuscation"))
                return bad(e, "stream_options",
                           "Unrecognized request argument supplied: stream_options.%.60s", k);
        }
    }
    x = 1;
    if (get_int(o, "n", 1, COMPL_MAX_N, &x, e)) return -1;
    r->n = (int)x;
    if ((long long)r->n * r->n_prompts > COMPL_MAX_CHOICES)
        return bad(e, "n", "%d prompts x 'n' %d is %d choices; at most %d are allowed in one request",
                   r->n_prompts, r->n, r->n_prompts * r->n, COMPL_MAX_CHOICES);
    /* best_of: every sample is returned (vLLM V1 has no best_of either), so
     * only best_of == n means what the client asked for. */
    x = r->n;
    if (get_int(o, "best_of", LLONG_MIN, LLONG_MAX, &x, e)) return -1;
    if (x != r->n)
        return bad(e, "best_of",
                   "'best_of' must equal 'n' (%d; got %lld): Strata returns every sample it draws",
                   r->n, x);
    json_t *lp = field(o, "logprobs");
    if (chat) {
        bool want = false;
        if (get_bool(o, "logprobs", &want, e)) return -1;
        long long k = 0;
        bool has_top = field(o, "top_logprobs") != NULL;
        if (get_int(o, "top_logprobs", 0, COMPL_MAX_TOP_LOGPROBS, &k, e)) return -1;
        if (has_top && !want)
            return bad(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        if (want) r->logprobs = (int)k;
    } else if (lp) {
        if (!json_is_integer(lp))
            return bad(e, "logprobs", "'logprobs' must be an integer in [0, %d]", COMPL_MAX_LOGPROBS);
        long long k = json_integer_value(lp);
        if (k < 0 || k > COMPL_MAX_LOGPROBS)
            return bad(e, "logprobs", "'logprobs' must be in [0, %d]; got %lld", COMPL_MAX_LOGPROBS, k);
        r->logprobs = (int)k;
    }
    if (r->echo && r->logprobs >= 0)
        return bad(e, "echo", "'echo' together with 'logprobs' is not supported (no prompt logprobs)");
    if (get_str(o, "user", &r->user, e)) return -1;
    json_t *sfx = field(o, "suffix");
    if (sfx && (!json_is_string(sfx) || json_string_length(sfx) > 0))
        return bad(e, "suffix", "'suffix' is not supported");
    if (chat) {
        json_t *tools = field(o, "tools");
        if (tools && (!json_is_array(tools) || json_array_size(tools) > 0))
            return bad(e, "tools", "'tools' (function calling) is not supported");
        json_t *tc = field(o, "tool_choice");
        if (tc && !(json_is_string(tc) && (!strcmp(json_string_value(tc), "none") ||
                                           !strcmp(json_string_value(tc), "auto"))))
            return bad(e, "tool_choice", "'tool_choice' must be \"none\" or \"auto\" (no tools)");
        json_t *rf = field(o, "response_format");
        json_t *rft = rf ? json_object_get(rf, "type") : NULL;
        if (rf && !(json_is_string(rft) && strcmp(json_string_value(rft), "text") == 0))
            return bad(e, "response_format", "only 'response_format' {\"type\": \"text\"} is supported");
        /* The template's end of turn ends the answer (docs/chat-templates.md). */
        const char *te = chat_format_turn_end((enum chat_format)(lim ? lim->chat_format : 0));
        if (te && *te) {
            bool dup = false;
            for (int i = 0; i < r->n_stop; i++) dup |= strcmp(r->stop[i], te) == 0;
            if (!dup && !(r->stop[r->n_stop] = strdup(te))) return bad(e, "stop", "out of memory");
            if (!dup) r->n_stop++;
        }
    }
    return 0;
}

static int parse_any(const char *body, size_t len, const compl_limits *lim, compl_request *r,
                     compl_error *e, bool chat) {
    memset(r, 0, sizeof *r);
    r->max_tokens = COMPL_DEFAULT_MAX_TOKENS;
    r->temperature = 1.0;
    r->top_p = 1.0;
    r->logprobs = -1;
    r->n = 1;
    r->repetition_penalty = 1.0;
    r->skip_special_tokens = true;
    r->add_special_tokens = true;
    json_error_t jerr;
    json_t *o = json_loadb(body, len, JSON_DECODE_ANY, &jerr);
    if (!o) {
        compl_error_set(e, 400, "invalid_request_error", NULL, NULL,
                        "the body is not valid JSON: %s (line %d, column %d)", jerr.text, jerr.line,
                        jerr.column);
        return -1;
    }
    int rc;
    if (!json_is_object(o))
        rc = bad(e, NULL, "the body must be a JSON object");
    else
        rc = parse_fields(o, lim, r, e, chat);
    json_decref(o);
    if (rc != 0) compl_request_free(r);
    return rc;
}

int compl_parse(const char *body, size_t len, const compl_limits *lim, compl_request *r,
                compl_error *e) {
    return parse_any(body, len, lim, r, e, false);
}

int compl_parse_chat(const char *body, size_t len, const compl_limits *lim, compl_request *r,
                     compl_error *e) {
    return parse_any(body, len, lim, r, e, true);
}

void compl_request_free(compl_request *r) {
    if (!r) return;
    compl_prompts_free(r->prompts, r->n_prompts);
    free(r->model);
    free(r->user);
    free(r->bias_ids);
    free(r->bias_values);
    free(r->min_tokens_mask);
    for (int i = 0; i < COMPL_MAX_STOP + 1; i++) free(r->stop[i]);
    memset(r, 0, sizeof *r);
    r->logprobs = -1;
}

int compl_engine_request(const compl_request *q, int choice, const compl_tokenizer *tok,
                         coord_request *out, int32_t **ids, compl_error *e) {
    memset(out, 0, sizeof *out);
    *ids = NULL;
    int n = 0;
    const compl_prompt *p = &q->prompts[choice / q->n];
    int sample = choice % q->n;
    if (compl_prompt_ids(p, tok, q->chat, q->chat || q->add_special_tokens, ids, &n, e) != 0)
        return -1;
    out->prompt = *ids;
    out->n_prompt = n;
    out->max_tokens = q->max_tokens;
    out->max_tokens_auto = q->max_tokens_auto;
    out->sampling = sampler_default_params();
    /* top_p 0 keeps only the argmax (vLLM): greedy. */
    bool greedy = q->temperature == 0.0 || q->top_p == 0.0;
    out->sampling.temperature = greedy ? 0.0f : (float)q->temperature;
    out->sampling.top_k = q->top_k;
    out->sampling.top_p = greedy ? 1.0f : (float)q->top_p;
    out->sampling.min_p = (float)q->min_p;
    out->sampling.repeat_penalty = (float)q->repetition_penalty; /* vLLM's (engine_api.h) */
    out->sampling.repeat_last_n = -1;
    out->sampling.presence_penalty = (float)q->presence_penalty;
    out->sampling.frequency_penalty = (float)q->frequency_penalty;
    /* Sample i of a prompt draws with seed + i (vLLM's per-child seed). */
    out->sampling.seed = (uint64_t)q->seed + (uint64_t)sample;
    out->sampling.n_top_logprobs = q->logprobs > 0 ? q->logprobs : 0;
    out->sampling.bias_ids = q->bias_ids;
    out->sampling.bias_values = q->bias_values;
    out->sampling.n_bias = q->n_bias;
    out->min_tokens = q->min_tokens;
    out->min_tokens_mask = q->min_tokens_mask;
    out->n_min_tokens_mask = q->n_min_tokens_mask;
    out->has_seed = q->has_seed;
    out->ignore_eos = q->ignore_eos;
    out->logprobs = q->logprobs >= 0;
    snprintf(out->request_id, sizeof out->request_id, "%s", q->request_id);
    return 0;
}

/* ---- output ------------------------------------------------------------------ */

/* Logprobs arrays of the tokens not yet emitted (streaming) or of all (not). */
typedef struct lp_arrays {
    json_t *tokens, *token_logprobs, *top_logprobs, *text_offset;
    json_t *content; /* chat: [{token, logprob, bytes, top_logprobs}] */
} lp_arrays;

static lp_arrays *lp_new(void) {
    lp_arrays *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->tokens = json_array();
    a->token_logprobs = json_array();
    a->top_logprobs = json_array();
    a->text_offset = json_array();
    a->content = json_array();
    return a;
}

static void lp_free(lp_arrays *a) {
    if (!a) return;
    json_decref(a->tokens);
    json_decref(a->token_logprobs);
    json_decref(a->top_logprobs);
    json_decref(a->text_offset);
    json_decref(a->content);
    free(a);
}

/* Moves the arrays into a logprobs object and starts new ones. */
static json_t *lp_take(compl_output *o) {
    lp_arrays *a = o->lp;
    if (o->req->chat) {
        json_t *obj = json_pack("{s:o}", "content", a->content);
        a->content = json_array();
        return obj;
    }
    json_t *obj = json_pack("{s:o,s:o,s:o,s:o}", "tokens", a->tokens, "token_logprobs",
                            a->token_logprobs, "top_logprobs", a->top_logprobs, "text_offset",
                            a->text_offset);
    a->tokens = json_array();
    a->token_logprobs = json_array();
    a->top_logprobs = json_array();
    a->text_offset = json_array();
    return obj;
}

/* Chat logprobs' "bytes": the UTF-8 bytes of a token as integers. */
static json_t *bytes_json(const char *s, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer((unsigned char)s[i]));
    return a;
}

int compl_output_init(compl_output *o, const compl_request *req) {
    return compl_output_init_choice(o, req, 0);
}

int compl_output_init_choice(compl_output *o, const compl_request *req, int choice) {
    memset(o, 0, sizeof *o);
    o->req = req;
    o->index = choice;
    o->prompt = &req->prompts[choice / (req->n > 0 ? req->n : 1)];
    o->counts_prompt = choice % (req->n > 0 ? req->n : 1) == 0;
    /* The client's stop strings, then the chat template's end of turn. */
    int n = req->n_stop < STOP_MAX_STRINGS ? req->n_stop : STOP_MAX_STRINGS;
    st_err err;
    if (stop_init(&o->stop, (const char *const *)req->stop, n, &err) != 0) return -1;
    for (int i = n; i < req->n_stop; i++)
        if (stop_add(&o->stop, req->stop[i], &err) != 0) goto fail;
    if (req->logprobs >= 0) {
        o->lp = lp_new();
        if (!o->lp) goto fail;
    }
    return 0;
fail:
    stop_free(&o->stop);
    return -1;
}

void compl_output_free(compl_output *o) {
    stop_free(&o->stop);
    free(o->text);
    free(o->ids);
    free(o->prompt_ids);
    lp_free(o->lp);
    memset(o, 0, sizeof *o);
}

int compl_output_prompt(compl_output *o, const int32_t *ids, int n) {
    free(o->prompt_ids);
    o->prompt_ids = NULL;
    o->n_prompt = 0;
    if (n > 0) {
        o->prompt_ids = malloc(sizeof(int32_t) * (size_t)n);
        if (!o->prompt_ids) return -1;
        memcpy(o->prompt_ids, ids, sizeof(int32_t) * (size_t)n);
    }
    o->n_prompt = n;
    return 0;
}

/* Appends released text. */
static int text_append(compl_output *o, const char *s, size_t n) {
    if (o->len + n + 1 > o->cap) {
        size_t cap = o->cap ? o->cap : 256;
        while (cap < o->len + n + 1) cap *= 2;
        char *t = realloc(o->text, cap);
        if (!t) return -1;
        o->text = t;
        o->cap = cap;
    }
    if (n) memcpy(o->text + o->len, s, n);
    o->len += n;
    o->text[o->len] = '\0';
    return 0;
}

/* Feeds valid UTF-8 to the stop matcher and keeps what it releases: 1 when
 * a stop string matched, 0 when not, -1 on out of memory. */
static int feed(compl_output *o, const char *s, size_t n) {
    const char *out;
    size_t out_len;
    st_err err;
    int r = stop_feed(&o->stop, s, n, &out, &out_len, &err);
    if (r < 0 || text_append(o, out, out_len) != 0) return -1;
    if (r == 1) o->stopped = true;
    return r;
}

/* The end of the text: a held incomplete character (U+FFFD, which may still
 * complete a stop string) and the matcher's held-back suffix. Once. */
static int finish_text(compl_output *o) {
    if (o->flushed) return 0;
    o->flushed = true;
    char rep[UTF8_STREAM_MAX_OUT(0)];
    size_t n = utf8_stream_flush(&o->utf8, rep);
    if (o->stopped) return 0;
    int r = feed(o, rep, n);
    if (r != 0) return r < 0 ? -1 : 0; /* 1: the U+FFFD completed a stop string */
    const char *out;
    size_t out_len;
    stop_flush(&o->stop, &out, &out_len);
    return text_append(o, out, out_len);
}

int compl_output_token(compl_output *o, int32_t id, const char *piece, size_t len,
                       const coord_logprobs *lp) {
    if (o->n_ids == o->cap_ids) {
        int cap = o->cap_ids ? o->cap_ids * 2 : 64;
        int32_t *n = realloc(o->ids, sizeof *n * (size_t)cap);
        if (!n) return -1;
        o->ids = n;
        o->cap_ids = cap;
    }
    o->ids[o->n_ids++] = id;
    if (o->stopped) return 1;
    for (int i = 0; i < o->req->n_stop_token_ids; i++)
        if (o->req->stop_token_ids[i] == id) {
            o->stopped = true; /* its text is left out (vLLM) */
            return 1;
        }
    /* Where this piece starts in the text: after the bytes fed to the
     * matcher so far and a held character's bytes (or its U+FFFD). */
    size_t offset = o->stop.fed + utf8_stream_offset(&o->utf8, piece, len);
    char small[256], *dec = small;
    size_t cap = UTF8_STREAM_MAX_OUT(len);
    if (cap > sizeof small && !(dec = malloc(cap))) return -1;
    size_t n = utf8_stream_push(&o->utf8, piece, len, dec);
    int r = feed(o, dec, n);
    if (dec != small) free(dec);
    if (r < 0) return -1;
    if (o->lp && o->req->chat) {
        lp_arrays *a = o->lp;
        json_t *top = json_array();
        for (int i = 0; lp && i < lp->n_top && i < o->req->logprobs; i++) {
            const char *tp = lp->top_pieces[i];
            json_array_append_new(top, json_pack("{s:o,s:f,s:o}", "token", jstr(tp, strlen(tp)),
                                                 "logprob", (double)lp->top_logprobs[i], "bytes",
                                                 bytes_json(tp, strlen(tp))));
        }
        json_array_append_new(a->content,
                              json_pack("{s:o,s:f,s:o,s:o}", "token", jstr(piece, len), "logprob",
                                        lp ? (double)lp->logprob : 0.0, "bytes",
                                        bytes_json(piece, len), "top_logprobs", top));
    } else if (o->lp) {
        lp_arrays *a = o->lp;
        json_array_append_new(a->tokens, jstr(piece, len));
        json_array_append_new(a->token_logprobs, json_real(lp ? lp->logprob : 0.0));
        json_t *top = json_object();
        for (int i = 0; lp && i < lp->n_top && i < o->req->logprobs; i++) {
            size_t m;
            char *k = utf8_sanitize(lp->top_pieces[i], strlen(lp->top_pieces[i]), &m);
            if (k && !json_object_get(top, k))
                json_object_set_new_nocheck(top, k, json_real(lp->top_logprobs[i]));
            free(k);
        }
        json_array_append_new(a->top_logprobs, top);
        size_t echo = o->req->echo ? o->prompt->len : 0;
        json_array_append_new(a->text_offset, json_integer((json_int_t)(echo + offset)));
    }
    return r; /* the token's logprobs are kept even when it completed a stop string */
}

static json_t *ids_json(const int32_t *ids, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    return a;
}

static json_t *envelope(const compl_meta *m, const char *object, json_t *choices) {
    return json_pack("{s:s,s:s,s:I,s:s,s:o}", "id", m->id, "object", object, "created",
                     (json_int_t)m->created, "model", m->model ? m->model : "", "choices",
                     choices);
}

static const char *chunk_object(const compl_output *o) {
    return o->req->chat ? "chat.completion.chunk" : "text_completion";
}

/* Each prompt counts once (its sample 0), every choice's tokens count. */
static json_t *usage_json(const compl_output *o, int n) {
    long long p = 0, c = 0;
    for (int i = 0; i < n; i++) {
        if (o[i].counts_prompt) p += o[i].n_prompt;
        c += o[i].n_ids;
    }
    return json_pack("{s:I,s:I,s:I}", "prompt_tokens", (json_int_t)p, "completion_tokens",
                     (json_int_t)c, "total_tokens", (json_int_t)(p + c));
}

static char *dump(json_t *root) {
    char *s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return s;
}

char *compl_output_chunk(compl_output *o, const compl_meta *m, const char *finish, bool *none) {
    bool final = finish != NULL;
    if (final && finish_text(o) != 0) return NULL;
    if (final && o->stopped) finish = "stop"; /* a stop string completed by the end */
    size_t r = o->len;
    bool echo = o->req->echo && !o->echo_sent;
    *none = false;
    if (!final && r == o->sent && !echo) {
        *none = true;
        return NULL;
    }
    /* The text: the echoed prompt first, then the new completion bytes. */
    size_t pl = echo ? o->prompt->len : 0;
    char *buf = malloc(pl + (r - o->sent) + 1);
    if (!buf) return NULL;
    if (pl) memcpy(buf, o->prompt->text, pl);
    memcpy(buf + pl, o->text ? o->text + o->sent : "", r - o->sent);
    json_t *text = jstr(buf, pl + (r - o->sent));
    free(buf);
    if (o->req->chat) {
        /* delta: the new text; the last chunk's delta is {} when nothing is left. */
        json_t *delta = json_object();
        if (!final || r > o->sent)
            json_object_set_new(delta, "content", text);
        else
            json_decref(text);
        text = delta;
    }
    json_t *choice = json_pack("{s:i,s:o,s:o,s:o}", "index", o->index, o->req->chat ? "delta" : "text",
                               text, "logprobs", o->lp ? lp_take(o) : json_null(), "finish_reason",
                               final ? json_string(finish) : json_null());
    if (!choice) return NULL;
    if (o->req->return_token_ids) {
        if (!o->prompt_ids_sent)
            json_object_set_new(choice, "prompt_token_ids", ids_json(o->prompt_ids, o->n_prompt));
        json_object_set_new(choice, "token_ids", ids_json(o->ids + o->ids_sent, o->n_ids - o->ids_sent));
    }
    json_t *root = envelope(m, chunk_object(o), json_pack("[o]", choice));
    if (root && o->req->include_usage) json_object_set_new(root, "usage", json_null());
    o->sent = r;
    o->ids_sent = o->n_ids;
    o->echo_sent = true;
    o->prompt_ids_sent = true;
    return dump(root);
}

char *compl_output_role_chunk(compl_output *o, const compl_meta *m) {
    o->role_sent = true;
    json_t *choice = json_pack("{s:i,s:{s:s,s:s},s:n,s:n}", "index", o->index, "delta", "role",
                               "assistant", "content", "", "logprobs", "finish_reason");
    if (!choice) return NULL;
    json_t *root = envelope(m, "chat.completion.chunk", json_pack("[o]", choice));
    if (root && o->req->include_usage) json_object_set_new(root, "usage", json_null());
    return dump(root);
}

char *compl_output_usage_chunk(compl_output *o, int n, const compl_meta *m) {
    json_t *root = envelope(m, chunk_object(o), json_array());
    if (root) json_object_set_new(root, "usage", usage_json(o, n));
    return dump(root);
}

/* One choice of the non-streaming response. */
static json_t *choice_json(compl_output *o, const char *finish) {
    if (finish_text(o) != 0) return NULL;
    if (o->stopped) finish = "stop";
    size_t pl = o->req->echo ? o->prompt->len : 0;
    char *buf = malloc(pl + o->len + 1);
    if (!buf) return NULL;
    if (pl) memcpy(buf, o->prompt->text, pl);
    if (o->len) memcpy(buf + pl, o->text, o->len);
    json_t *text = jstr(buf, pl + o->len);
    free(buf);
    if (o->req->chat) text = json_pack("{s:s,s:o}", "role", "assistant", "content", text);
    json_t *choice = json_pack("{s:i,s:o,s:o,s:s}", "index", o->index,
                               o->req->chat ? "message" : "text", text, "logprobs",
                               o->lp ? lp_take(o) : json_null(), "finish_reason", finish);
    if (choice && o->req->return_token_ids) {
        json_object_set_new(choice, "prompt_token_ids", ids_json(o->prompt_ids, o->n_prompt));
        json_object_set_new(choice, "token_ids", ids_json(o->ids, o->n_ids));
    }
    return choice;
}

char *compl_output_response(compl_output *o, int n, const compl_meta *m,
                            const char *const *finish) {
    json_t *choices = json_array();
    for (int i = 0; choices && i < n; i++) {
        json_t *c = choice_json(&o[i], finish[i]);
        if (!c || json_array_append_new(choices, c) != 0) {
            json_decref(choices);
            return NULL;
        }
    }
    json_t *root = envelope(m, o->req->chat ? "chat.completion" : "text_completion", choices);
    if (root) json_object_set_new(root, "usage", usage_json(o, n));
    return dump(root);
}
