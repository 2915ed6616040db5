/* generate.c — the Generate call of strata.v1.Control (generate.h): a
 * server stream of GenerateChunk messages over the serving engine. */
#include "coordinator/control/generate.h"

#include <stdlib.h>
#include <string.h>

#include "common/utf8.h"
#include "proto/control.pb-c.h"

/* Generate's max_tokens when the request leaves it 0 (the OpenAI API's default). */
#define GEN_DEFAULT_MAX_TOKENS 16

/* An open Generate stream. */
struct gen_stream {
    struct gen_stream *prev, *next;
    gen_streams *gs;
    rpc_call *call;
    coord_request req;
    int32_t *prompt;         /* req.prompt's token ids */
    uint64_t id;
    uint32_t n_prompt, n_gen;
    utf8_stream utf8;        /* the chunks' text: whole characters, U+FFFD for invalid bytes */
};

/* ---------------------------------------------------------------- Generate */

static void stream_free(gen_streams *s, gen_stream *g) {
    if (g->prev)
        g->prev->next = g->next;
    else if (s->head == g)
        s->head = g->next;
    if (g->next) g->next->prev = g->prev;
    free(g->prompt);
    free(g);
}

static int send_chunk(gen_stream *g, const int32_t *ids, size_t n_ids, const char *text, size_t len,
                      const char *finish) {
    Strata__V1__GenerateChunk ch = STRATA__V1__GENERATE_CHUNK__INIT;
    uint32_t id = ids && n_ids ? (uint32_t)ids[0] : 0;
    ch.token_ids = n_ids ? &id : NULL;
    ch.n_token_ids = n_ids;
    char *t = malloc(len + 1);
    if (!t) return -1;
    memcpy(t, text, len); /* valid UTF-8 (g->utf8), as protobuf strings must be */
    t[len] = 0;
    ch.text = t;
    if (finish) {
        ch.finish_reason = (char *)finish;
        ch.prompt_tokens = g->n_prompt;
        ch.completion_tokens = g->n_gen;
    }
    size_t plen = strata__v1__generate_chunk__get_packed_size(&ch);
    uint8_t *buf = malloc(plen ? plen : 1);
    int rc = -1;
    if (buf) {
        strata__v1__generate_chunk__pack(&ch, buf);
        rc = rpc_call_send(g->call, buf, plen);
    }
    free(buf);
    free(t);
    return rc;
}

static void g_on_prompt(void *ctx, const int32_t *ids, int n) {
    gen_stream *g = ctx;
    g->n_prompt = (uint32_t)n;
}

static void g_on_token(void *ctx, int32_t id, const char *piece, size_t len, const coord_logprobs *lp) {
    gen_stream *g = ctx;
    gen_streams *s = g->gs;
    g->n_gen++;
    /* The same text as the HTTP API and strata-run give (common/utf8.h). */
    char small[256], *text = small;
    size_t cap = UTF8_STREAM_MAX_OUT(len), n = 0;
    if (cap > sizeof small) text = malloc(cap);
    if (text) n = utf8_stream_push(&g->utf8, piece, len, text);
    int rc = rpc_call_cancelled(g->call) ? -1 : send_chunk(g, &id, 1, text ? text : "", n, NULL);
    if (text != small) free(text);
    if (rc != 0) {
        s->eng.ops->cancel(s->eng.impl, g->id);
        rpc_call_finish(g->call, RPC_CANCELLED, "Generate: cancelled");
        stream_free(s, g);
    }
}

static void g_on_finish(void *ctx, enum coord_finish reason, const char *message) {
    gen_stream *g = ctx;
    gen_streams *s = g->gs;
    if (reason == COORD_FINISH_ERROR) {
        rpc_call_finishf(g->call, RPC_UNAVAILABLE, "Generate: %s", message ? message : "failed");
    } else {
        char rest[UTF8_STREAM_MAX_OUT(0)]; /* an unfinished character: U+FFFD */
        size_t n = utf8_stream_flush(&g->utf8, rest);
        send_chunk(g, NULL, 0, rest, n, reason == COORD_FINISH_STOP ? "stop" : "length");
        rpc_call_finish(g->call, RPC_OK, NULL);
    }
    stream_free(s, g);
}

static const coord_sink gen_sink = {g_on_prompt, g_on_token, g_on_finish, NULL};

void generate_rpc(rpc_call *c, const rpc_request *req, void *ud) {
    gen_streams *s = ud;
    const Strata__V1__GenerateRequest *r = (const void *)req->msg;
    if (!r->prompt[0]) {
        rpc_call_finish(c, RPC_INVALID_ARGUMENT, "Generate: empty prompt");
        return;
    }
    if (r->temperature < 0 || r->temperature > 2) {
        rpc_call_finishf(c, RPC_INVALID_ARGUMENT, "Generate: temperature %g not in [0, 2]", r->temperature);
        return;
    }
    gen_stream *g = calloc(1, sizeof *g);
    if (!g) {
        rpc_call_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    size_t n_ids = 0;
    st_err terr = {{0}};
    if (tok_encode(s->vocab, r->prompt, strlen(r->prompt), true, false, &g->prompt, &n_ids, &terr) != 0 ||
        n_ids == 0) {
        rpc_call_finishf(c, RPC_INVALID_ARGUMENT, "Generate: %s", n_ids ? terr.msg : "the prompt has no tokens");
        free(g->prompt);
        free(g);
        return;
    }
    g->gs = s;
    g->call = c;
    g->req.prompt = g->prompt;
    g->req.n_prompt = (int)n_ids;
    g->req.max_tokens = r->max_tokens ? (int)(r->max_tokens > 100000 ? 100000 : r->max_tokens) : GEN_DEFAULT_MAX_TOKENS;
    g->req.sampling = sampler_default_params();
    g->req.sampling.temperature = r->temperature;
    g->req.sampling.top_k = 0;
    g->req.sampling.top_p = 1.0f;
    g->req.sampling.min_p = 0.0f;
    g->req.sampling.repeat_penalty = 1.0f;
    g->req.sampling.seed = r->seed;
    g->req.has_seed = r->seed != 0;
    g->next = s->head;
    if (s->head) s->head->prev = g;
    s->head = g;
    st_err err = {{0}};
    int rc = s->eng.ops->submit(s->eng.impl, &g->req, &gen_sink, g, &g->id, &err);
    if (rc != COORD_OK) {
        int code = rc == COORD_EUNAVAIL ? RPC_UNAVAILABLE
                   : rc == COORD_EBUSY  ? RPC_RESOURCE_EXHAUSTED
                   : rc == COORD_EINTERNAL ? RPC_INTERNAL
                                           : RPC_INVALID_ARGUMENT;
        rpc_call_finishf(c, code, "Generate: %s", err.msg);
        stream_free(s, g);
    }
}

void generate_close_all(gen_streams *s) {
    while (s->head) {
        gen_stream *g = s->head;
        s->eng.ops->cancel(s->eng.impl, g->id);
        rpc_call_finish(g->call, RPC_UNAVAILABLE, "server stopping");
        stream_free(s, g);
    }
}
