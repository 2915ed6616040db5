/* shard.c — the Megatron-LM shard plan of one TP rank. See shard.h. */
#include "model/shard.h"

shard_range shard_split(int64_t n, int t, int r) {
    int64_t q = n / t, rem = n % t;
    shard_range s;
    s.lo = r * q + (r < rem ? r : rem);
    s.hi = s.lo + q + (r < rem ? 1 : 0);
    return s;
}

int shard_plan_make(const llama_config *c, int tp, int rank, shard_plan *p, st_err *err) {
    if (tp < 1) return st_errf(err, "shard: TP degree %d must be >= 1", tp);
    if (rank < 0 || rank >= tp) return st_errf(err, "shard: rank %d outside [0, %d)", rank, tp);
    if (c->n_head % tp != 0)
        return st_errf(err, "shard: n_head %d is not divisible by the TP degree %d (query heads cannot be split evenly)",
                       c->n_head, tp);
    p->tp = tp;
    p->rank = rank;
    p->q_heads = shard_split(c->n_head, tp, rank);
    if (tp <= c->n_head_kv) {
        if (c->n_head_kv % tp != 0)
            return st_errf(err, "shard: n_head_kv %d is not divisible by the TP degree %d", c->n_head_kv, tp);
        p->kv_heads = shard_split(c->n_head_kv, tp, rank);
        p->kv_replicated = 0;
    } else {
        if (tp % c->n_head_kv != 0)
            return st_errf(err, "shard: TP degree %d > n_head_kv %d needs to be a multiple of it to replicate KV heads",
                           tp, c->n_head_kv);
        int64_t h = (int64_t)rank * c->n_head_kv / tp;
        p->kv_heads.lo = h;
        p->kv_heads.hi = h + 1;
        p->kv_replicated = 1;
    }
    if (c->n_ff < tp || c->n_vocab < tp)
        return st_errf(err, "shard: n_ff %d or n_vocab %d smaller than the TP degree %d", c->n_ff,
                       c->n_vocab, tp);
    p->ff = shard_split(c->n_ff, tp, rank);
    p->vocab = shard_split(c->n_vocab, tp, rank);
    p->n_head_local = (int)(p->q_heads.hi - p->q_heads.lo);
    p->n_head_kv_local = (int)(p->kv_heads.hi - p->kv_heads.lo);
    p->n_ff_local = (int)(p->ff.hi - p->ff.lo);
    p->n_vocab_local = (int)(p->vocab.hi - p->vocab.lo);
    return 0;
}
