/* seq_sampling.c — a request's sampling parameters on the wire. See seq_sampling.h. */
#include "coordinator/serve/seq_sampling.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void *dup_array(const void *src, size_t n, size_t size) {
    if (!n) return NULL;
    void *d = malloc(n * size);
    if (d) memcpy(d, src, n * size);
    return d;
}

int seq_sampling_own(coord_request *q, st_err *err) {
    sampler_params *s = &q->sampling;
    int32_t *ids = dup_array(s->bias_ids, (size_t)s->n_bias, sizeof *ids);
    float *vals = dup_array(s->bias_values, (size_t)s->n_bias, sizeof *vals);
    int32_t *mask = dup_array(q->min_tokens_mask, (size_t)q->n_min_tokens_mask, sizeof *mask);
    s->bias_ids = ids;
    s->bias_values = vals;
    q->min_tokens_mask = mask;
    if ((s->n_bias && (!ids || !vals)) || (q->n_min_tokens_mask && !mask)) {
        seq_sampling_release(q);
        return st_errf(err, "out of memory");
    }
    return 0;
}

void seq_sampling_release(coord_request *q) {
    free((void *)q->sampling.bias_ids);
    free((void *)q->sampling.bias_values);
    free((void *)q->min_tokens_mask);
    q->sampling.bias_ids = NULL;
    q->sampling.bias_values = NULL;
    q->sampling.n_bias = 0;
    q->min_tokens_mask = NULL;
    q->n_min_tokens_mask = 0;
}

static bool repetition_on(const coord_request *q) {
    return q->sampling.repeat_penalty > 0.0f && q->sampling.repeat_penalty != 1.0f;
}

static bool presence_on(const coord_request *q) {
    return q->sampling.presence_penalty != 0.0f || q->sampling.frequency_penalty != 0.0f;
}

int seq_sampling_fill(const coord_request *q, uint64_t seed, const int32_t *prompt, int n_prompt,
                      const int32_t *gen, int n_gen, bool sample, frame_sampling *p,
                      frame_seq *s, seq_sampling_buf *buf, st_err *err) {
    memset(buf, 0, sizeof *buf);
    strata__v1__sampling_params__init(p);
    p->temperature = q->sampling.temperature;
    p->top_k = q->sampling.top_k;
    p->top_p = q->sampling.top_p;
    p->min_p = q->sampling.min_p;
    p->seed = seed;
    p->repeat_penalty = repetition_on(q) ? q->sampling.repeat_penalty : 1.0f;
    p->penalty_last_n = repetition_on(q) ? -1 : 0;
    p->presence_penalty = q->sampling.presence_penalty;
    p->frequency_penalty = q->sampling.frequency_penalty;
    p->n_top_logprobs = q->logprobs ? q->sampling.n_top_logprobs : 0;
    s->sampling = p;
    if (!sample) return 0;

    /* History: [prompt] generated, the prompt only for the repetition penalty. */
    if (repetition_on(q)) {
        size_t n = (size_t)n_prompt + (size_t)n_gen;
        if (!(buf->history = malloc(n * sizeof *buf->history))) return st_errf(err, "out of memory");
        memcpy(buf->history, prompt, (size_t)n_prompt * sizeof *prompt);
        if (n_gen) memcpy(buf->history + n_prompt, gen, (size_t)n_gen * sizeof *gen);
        s->history = buf->history;
        s->n_history = n;
        s->history_prompt = n_prompt;
    } else if (presence_on(q) && n_gen > 0) {
        s->history = (int32_t *)gen;
        s->n_history = (size_t)n_gen;
    }

    /* logit_bias, and the min_tokens mask while it holds. */
    int n_mask = n_gen < q->min_tokens ? q->n_min_tokens_mask : 0;
    int n_bias = q->sampling.n_bias + n_mask;
    if (n_bias > 0) {
        buf->bias_ids = malloc((size_t)n_bias * sizeof *buf->bias_ids);
        buf->bias_values = malloc((size_t)n_bias * sizeof *buf->bias_values);
        if (!buf->bias_ids || !buf->bias_values) return st_errf(err, "out of memory");
        int k = 0;
        for (int i = 0; i < q->sampling.n_bias; i++, k++) {
            buf->bias_ids[k] = q->sampling.bias_ids[i];
            buf->bias_values[k] = q->sampling.bias_values[i];
        }
        for (int i = 0; i < n_mask; i++, k++) {
            buf->bias_ids[k] = q->min_tokens_mask[i];
            buf->bias_values[k] = -INFINITY;
        }
        p->bias_ids = buf->bias_ids;
        p->n_bias_ids = (size_t)n_bias;
        p->bias_values = buf->bias_values;
        p->n_bias_values = (size_t)n_bias;
    }
    return 0;
}

void seq_sampling_buf_free(seq_sampling_buf *buf) {
    free(buf->history);
    free(buf->bias_ids);
    free(buf->bias_values);
    memset(buf, 0, sizeof *buf);
}
