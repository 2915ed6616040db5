/* frame.c — FrameHeader pack/unpack/validation and bf16 payload conversion
 * (see frame.h and docs/protocol.md). */
#include "ib/frame.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"

size_t frame_dtype_size(int dtype)
{
    switch (dtype) {
    case STRATA__V1__DTYPE__DTYPE_F32: return 4;
    case STRATA__V1__DTYPE__DTYPE_BF16: return 2;
    default: return 0;
    }
}

int64_t frame_total_tokens(const frame_header *h)
{
    int64_t t = 0;
    for (size_t i = 0; i < h->n_seqs; i++)
        if (h->seqs[i]) t += h->seqs[i]->n_tokens;
    return t;
}

static int check_sampling(const frame_sampling *s, size_t i, st_err *err)
{
    if (!s) return 0; /* absent = defaults (greedy) */
    if (!(s->temperature >= 0.0f) || !isfinite(s->temperature))
        return st_errf(err, "frame: seq %zu: temperature %g out of range", i, (double)s->temperature);
    if (s->top_k < 0) return st_errf(err, "frame: seq %zu: top_k %d < 0", i, (int)s->top_k);
    if (!(s->top_p >= 0.0f && s->top_p <= 1.0f))
        return st_errf(err, "frame: seq %zu: top_p %g not in [0,1]", i, (double)s->top_p);
    if (!(s->min_p >= 0.0f && s->min_p <= 1.0f))
        return st_errf(err, "frame: seq %zu: min_p %g not in [0,1]", i, (double)s->min_p);
    if (!(s->repeat_penalty >= 0.0f) || !isfinite(s->repeat_penalty))
        return st_errf(err, "frame: seq %zu: repeat_penalty %g out of range", i, (double)s->repeat_penalty);
    if (!isfinite(s->presence_penalty) || !isfinite(s->frequency_penalty))
        return st_errf(err, "frame: seq %zu: penalties must be finite", i);
    if (s->penalty_last_n < -1) return st_errf(err, "frame: seq %zu: penalty_last_n < -1", i);
    if (s->n_bias_ids != s->n_bias_values)
        return st_errf(err, "frame: seq %zu: %zu bias ids, %zu bias values", i, s->n_bias_ids,
                       s->n_bias_values);
    for (size_t k = 0; k < s->n_bias_ids; k++)
        if (s->bias_ids[k] < 0 || isnan(s->bias_values[k]) || s->bias_values[k] == INFINITY)
            return st_errf(err, "frame: seq %zu: logit bias %zu (token %d, %g) invalid", i, k,
                           (int)s->bias_ids[k], (double)s->bias_values[k]);
    if (s->n_top_logprobs < 0 || s->n_top_logprobs > FRAME_MAX_TOP_LOGPROBS)
        return st_errf(err, "frame: seq %zu: n_top_logprobs %d not in [0,%d]", i,
                       (int)s->n_top_logprobs, FRAME_MAX_TOP_LOGPROBS);
    return 0;
}

int frame_validate(const frame_header *h, size_t payload_bytes, st_err *err)
{
    if (!h) return st_errf(err, "frame: no header");
    int kind = h->kind;
    if (kind != STRATA__V1__FRAME_KIND__FRAME_KIND_ACTIVATIONS &&
        kind != STRATA__V1__FRAME_KIND__FRAME_KIND_TOKENS &&
        kind != STRATA__V1__FRAME_KIND__FRAME_KIND_CONTROL)
        return st_errf(err, "frame: unknown kind %d", kind);
    if (payload_bytes > FRAME_MAX_PAYLOAD)
        return st_errf(err, "frame: payload %zu bytes exceeds %llu", payload_bytes,
                       (unsigned long long)FRAME_MAX_PAYLOAD);
    if (h->n_seqs > FRAME_MAX_SEQS) return st_errf(err, "frame: %zu seqs exceeds %d", h->n_seqs, FRAME_MAX_SEQS);
    if (h->n_results > FRAME_MAX_SEQS)
        return st_errf(err, "frame: %zu results exceeds %d", h->n_results, FRAME_MAX_SEQS);
    if (h->control.len > FRAME_MAX_CONTROL) return st_errf(err, "frame: control %zu bytes too long", h->control.len);

    int64_t total = 0;
    for (size_t i = 0; i < h->n_seqs; i++) {
        const frame_seq *s = h->seqs[i];
        if (!s) return st_errf(err, "frame: seq %zu missing", i);
        if (s->n_tokens < 1) return st_errf(err, "frame: seq %zu: n_tokens %d < 1", i, (int)s->n_tokens);
        if (s->pos < 0) return st_errf(err, "frame: seq %zu: pos %d < 0", i, (int)s->pos);
        if (s->request_id && strlen(s->request_id) > FRAME_MAX_REQUEST_ID)
            return st_errf(err, "frame: seq %zu: request_id longer than %d bytes", i, FRAME_MAX_REQUEST_ID);
        if (s->n_block_table == 0) return st_errf(err, "frame: seq %zu: empty block table", i);
        if (s->n_block_table > FRAME_MAX_BLOCKS)
            return st_errf(err, "frame: seq %zu: %zu blocks exceeds %d", i, s->n_block_table, FRAME_MAX_BLOCKS);
        for (size_t b = 0; b < s->n_block_table; b++)
            if (s->block_table[b] < 0)
                return st_errf(err, "frame: seq %zu: block id %d < 0", i, (int)s->block_table[b]);
        if (check_sampling(s->sampling, i, err)) return -1;
        if (s->history_prompt < 0 || (size_t)s->history_prompt > s->n_history)
            return st_errf(err, "frame: seq %zu: history_prompt %d of %zu history tokens", i,
                           (int)s->history_prompt, s->n_history);
        total += s->n_tokens;
        if (total > FRAME_MAX_TOKENS)
            return st_errf(err, "frame: more than %d tokens", FRAME_MAX_TOKENS);
    }

    if (h->n_token_ids) {
        if ((int64_t)h->n_token_ids != total)
            return st_errf(err, "frame: %zu token ids for %lld tokens", h->n_token_ids, (long long)total);
        for (size_t i = 0; i < h->n_token_ids; i++)
            if (h->token_ids[i] < 0) return st_errf(err, "frame: token id %d < 0 at %zu", (int)h->token_ids[i], i);
    }

    if (payload_bytes && kind == STRATA__V1__FRAME_KIND__FRAME_KIND_TOKENS)
        return st_errf(err, "frame: TOKENS with a payload");
    if (payload_bytes && kind == STRATA__V1__FRAME_KIND__FRAME_KIND_CONTROL)
        return st_errf(err, "frame: CONTROL with a payload");

    if (h->payload_p2p) {
        if (kind != STRATA__V1__FRAME_KIND__FRAME_KIND_ACTIVATIONS)
            return st_errf(err, "frame: payload_p2p on a frame that is not ACTIVATIONS");
        if (payload_bytes) return st_errf(err, "frame: payload_p2p with %zu payload bytes in the frame", payload_bytes);
        if (h->dtype != STRATA__V1__DTYPE__DTYPE_F32) return st_errf(err, "frame: payload_p2p rows must be f32");
        if (h->n_shape != 2) return st_errf(err, "frame: payload_p2p needs the rows' shape");
    }
    if (payload_bytes > 0 || h->n_shape > 0) {
        if (h->n_shape != 2) return st_errf(err, "frame: shape has %zu dims, want 2", h->n_shape);
        size_t es = frame_dtype_size(h->dtype);
        if (!es) return st_errf(err, "frame: payload dtype %d is not f32 or bf16", (int)h->dtype);
        uint64_t rows = h->shape[0], cols = h->shape[1];
        if (rows < 1 || cols < 1) return st_errf(err, "frame: empty shape [%llu, %llu]",
                                                 (unsigned long long)rows, (unsigned long long)cols);
        if (cols > FRAME_MAX_EMBD) return st_errf(err, "frame: n_embd %llu exceeds %d", (unsigned long long)cols, FRAME_MAX_EMBD);
        if ((int64_t)rows != total)
            return st_errf(err, "frame: shape[0] %llu != sum of n_tokens %lld", (unsigned long long)rows, (long long)total);
        if (!h->payload_p2p && rows * cols * es != payload_bytes)
            return st_errf(err, "frame: shape [%llu, %llu] x %zu B != payload %zu B", (unsigned long long)rows,
                           (unsigned long long)cols, es, payload_bytes);
    } else if (h->dtype != STRATA__V1__DTYPE__DTYPE_UNSPECIFIED && frame_dtype_size(h->dtype) == 0) {
        return st_errf(err, "frame: unknown dtype %d", (int)h->dtype);
    }

    switch (kind) {
    case STRATA__V1__FRAME_KIND__FRAME_KIND_ACTIVATIONS:
        if (h->n_seqs == 0) return st_errf(err, "frame: ACTIVATIONS without sequences");
        if (payload_bytes == 0 && h->n_token_ids == 0 && !h->payload_p2p)
            return st_errf(err, "frame: ACTIVATIONS with neither token ids nor payload");
        if (h->n_results) return st_errf(err, "frame: ACTIVATIONS carrying results");
        break;
    case STRATA__V1__FRAME_KIND__FRAME_KIND_TOKENS:
        if (h->n_results == 0) return st_errf(err, "frame: TOKENS without results");
        for (size_t i = 0; i < h->n_results; i++) {
            const frame_result *r = h->results[i];
            if (!r) return st_errf(err, "frame: result %zu missing", i);
            if (r->token < 0) return st_errf(err, "frame: result %zu: token %d < 0", i, (int)r->token);
            if (r->n_top > FRAME_MAX_TOP_LOGPROBS)
                return st_errf(err, "frame: result %zu: %zu top logprobs exceeds %d", i, r->n_top, FRAME_MAX_TOP_LOGPROBS);
            for (size_t k = 0; k < r->n_top; k++)
                if (!r->top[k] || r->top[k]->token < 0)
                    return st_errf(err, "frame: result %zu: bad top logprob %zu", i, k);
            for (size_t j = 0; j < i; j++)
                if (h->results[j]->seq_id == r->seq_id)
                    return st_errf(err, "frame: result %zu: duplicate seq id %llu", i, (unsigned long long)r->seq_id);
        }
        break;
    case STRATA__V1__FRAME_KIND__FRAME_KIND_CONTROL:
        break;
    }
    return 0;
}

uint8_t *frame_header_pack(const frame_header *h, size_t *len, st_err *err)
{
    size_t n = strata__v1__frame_header__get_packed_size(h);
    if (n > FRAME_MAX_HEADER) {
        st_errf(err, "frame: header %zu bytes exceeds %u", n, FRAME_MAX_HEADER);
        return NULL;
    }
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) {
        st_errf(err, "frame: out of memory (%zu bytes)", n);
        return NULL;
    }
    size_t w = strata__v1__frame_header__pack(h, buf);
    if (w != n) {
        free(buf);
        st_errf(err, "frame: packed %zu bytes, expected %zu", w, n);
        return NULL;
    }
    *len = n;
    return buf;
}

frame_header *frame_header_unpack(const void *buf, size_t len, st_err *err)
{
    if (len > FRAME_MAX_HEADER) {
        st_errf(err, "frame: header %zu bytes exceeds %u", len, FRAME_MAX_HEADER);
        return NULL;
    }
    frame_header *h = strata__v1__frame_header__unpack(NULL, len, buf);
    if (!h) st_errf(err, "frame: undecodable header (%zu bytes)", len);
    return h;
}

void frame_header_free(frame_header *h)
{
    if (h) strata__v1__frame_header__free_unpacked(h, NULL);
}

void frame_f32_to_bf16(const float *src, uint16_t *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = st_f32_to_bf16(src[i]);
}

void frame_bf16_to_f32(const uint16_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = st_bf16_to_f32(src[i]);
}
