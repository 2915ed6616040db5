/* act_p2p.c — a pipeline boundary's rows over the CUDA module's NCCL
 * point-to-point, run on the stage's compute thread (act_p2p.h). */
#include "daemon/act_p2p.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "compute/cuda/nccl_guard.h"

act_p2p *act_p2p_new(const backend_p2p_ops *ops, const uint8_t *id, int rank, unsigned boundary)
{
    act_p2p *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->ops = ops;
    memcpy(p->id, id, sizeof p->id);
    p->rank = rank;
    p->boundary = boundary;
    static uint64_t serials; /* loop thread only */
    p->serial = ++serials;
    return p;
}

static double transfer_timeout(void) { return nccl_guard_timeout_env("STRATA_NCCL_TIMEOUT_S", NCCL_GUARD_TIMEOUT_S); }

static void close_link(act_p2p *p)
{
    if (p->comm) p->ops->close(p->comm);
    p->comm = NULL;
    free(p);
}

void act_p2p_run(stage *st, uint64_t gen, cjob *j)
{
    act_p2p *p = j->p2p;
    j->status = 0;
    switch (j->kind) {
    case CJOB_P2P_OPEN:
        if (!st) {
            j->status = st_errf(&j->err, "nccl p2p: no stage loaded");
            break;
        }
        p->comm = p->ops->open(p->id, p->rank, stage_device(st),
                               nccl_guard_timeout_env("STRATA_NCCL_INIT_TIMEOUT_S", NCCL_GUARD_INIT_TIMEOUT_S), &j->err);
        if (!p->comm) j->status = -1;
        break;
    case CJOB_P2P_SEND:
        if (j->dev_bytes == 0) /* nothing to send (the frame did not go out): only the buffer goes */
            ;
        else if (!p->comm)
            j->status = st_errf(&j->err, "nccl p2p: the boundary's communicator is not up");
        else if (p->ops->send(p->comm, j->dev_out, j->dev_bytes, transfer_timeout(), &j->err))
            j->status = -1;
        if (st && j->dev_out && gen == j->dev_gen) stage_dev_free(st, j->dev_out);
        j->dev_out = NULL;
        break;
    case CJOB_P2P_CLOSE:
        if (st && p->dev_in && p->dev_in_gen == gen) stage_dev_free(st, p->dev_in);
        close_link(p);
        j->p2p = NULL;
        break;
    default: j->status = st_errf(&j->err, "compute: job kind %d is not a p2p job", (int)j->kind); break;
    }
}

int act_p2p_forward(stage *st, uint64_t gen, cjob *j)
{
    const size_t rows = (size_t)j->batch.n_tokens * (size_t)stage_config(st)->n_embd * sizeof(float);
    const void *in = j->hidden_in;
    void *out = j->hidden_out;
    act_p2p *pi = j->p2p_in;
    if (pi) {
        if (!pi->comm) return st_errf(&j->err, "nccl p2p: the boundary's communicator is not up");
        if (pi->dev_in_cap < rows || pi->dev_in_gen != gen) {
            if (pi->dev_in && pi->dev_in_gen == gen) stage_dev_free(st, pi->dev_in);
            pi->dev_in = NULL;
            pi->dev_in_cap = 0;
            if (!(pi->dev_in = stage_dev_alloc(st, rows, &j->err))) return -1;
            pi->dev_in_cap = rows;
            pi->dev_in_gen = gen;
        }
        if (pi->ops->recv(pi->comm, pi->dev_in, rows, transfer_timeout(), &j->err)) return -1;
        in = pi->dev_in;
    }
    if (j->p2p_out) {
        if (!(j->dev_out = stage_dev_alloc(st, rows, &j->err))) return -1;
        j->dev_bytes = rows;
        j->dev_gen = gen;
        out = j->dev_out;
    }
    int rc = stage_forward_io(st, &j->batch, in, pi != NULL, out, j->p2p_out != NULL, j->samples, &j->err);
    if (rc && j->dev_out) {
        stage_dev_free(st, j->dev_out);
        j->dev_out = NULL;
    }
    return rc;
}

void act_p2p_discard(cjob *j)
{
    if (j->kind == CJOB_P2P_CLOSE && j->p2p) {
        close_link(j->p2p); /* its device buffer went with the stage */
        j->p2p = NULL;
    }
}
