/* batch_frame.c — a micro-batch as stage 0's ACTIVATIONS frame (batch_frame.h). */
#include "coordinator/serve/batch_frame.h"

#include <stdbool.h>
#include <stdlib.h>

#include "common/clock.h"
#include "coordinator/serve/request_list.h"
#include "coordinator/serve/seq_sampling.h"
#include "ib/frame.h"
#include "proto/stage.pb-c.h"

/* Slice x's SeqRecord into s (samp and sbuf hold its sampling parameters). */
static int fill_record(const sched_slice *x, frame_seq *s, frame_sampling *samp, seq_sampling_buf *sbuf,
                       st_err *err) {
    const creq *r = x->user;
    const coord_request *q = &r->req;
    strata__v1__seq_record__init(s);
    int rc = seq_sampling_fill(q, r->seed, r->prompt, r->n_prompt, r->gen, r->n_gen, x->sample, samp, s, sbuf,
                               err);
    s->seq_id = x->seq_id;
    s->pos = x->pos;
    s->n_tokens = x->n_tokens;
    s->block_table = (int32_t *)x->block_table;
    s->n_block_table = (size_t)x->n_blocks;
    s->wants_logits = x->sample;
    s->step = (uint64_t)r->n_gen;
    if (x->pos == 0 && q->request_id[0]) s->request_id = (char *)q->request_id;
    return rc;
}

int batch_frame_send(xport_peer *stage0, uint64_t epoch, const sched_batch *b, uint64_t *t_launch_ns,
                     st_err *err) {
    frame_seq *seqs = calloc((size_t)b->n_seqs, sizeof *seqs);
    frame_seq **seqp = calloc((size_t)b->n_seqs, sizeof *seqp);
    frame_sampling *samp = calloc((size_t)b->n_seqs, sizeof *samp);
    seq_sampling_buf *sbuf = calloc((size_t)b->n_seqs, sizeof *sbuf);
    int rc = -1;
    *t_launch_ns = 0;
    if (seqs && seqp && samp && sbuf) {
        bool filled = true;
        for (int i = 0; i < b->n_seqs; i++) {
            if (fill_record(&b->seqs[i], &seqs[i], &samp[i], &sbuf[i], err) != 0) filled = false;
            seqp[i] = &seqs[i];
        }
        frame_header h = STRATA__V1__FRAME_HEADER__INIT;
        h.kind = STRATA__V1__FRAME_KIND__FRAME_KIND_ACTIVATIONS;
        h.batch_id = b->id;
        h.epoch = epoch;
        h.stage = 0;
        h.seqs = seqp;
        h.n_seqs = (size_t)b->n_seqs;
        h.token_ids = (int32_t *)b->tokens;
        h.n_token_ids = (size_t)b->n_tokens;
        *t_launch_ns = st_now_ns();
        if (filled) rc = stage0 ? xport_send(stage0, &h, NULL, 0, NULL, NULL, NULL, err) : -1;
    } else {
        st_errf(err, "out of memory");
    }
    for (int i = 0; sbuf && i < b->n_seqs; i++) seq_sampling_buf_free(&sbuf[i]);
    free(sbuf);
    free(seqs);
    free(seqp);
    free(samp);
    return rc;
}
