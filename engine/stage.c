/* stage.c — a pipeline stage: opens the model, plans its Megatron shards and
 * runs its t ranks (rank.h: one backend, pool and comm rank each) on a thread
 * each, one phase at a time (load, prepare buffers, forward). The backend
 * comes from compute/registry.h: "cpu" (shared-memory comm group) or "cuda"
 * (rank r on GPU r, NCCL comm; the libstrata-cuda.so module, loaded at run
 * time). See stage.h for the data flow and the collective counts, and
 * README.md for the files a stage is made of. */
#include "engine/stage.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/dtype.h"
#include "common/log.h"
#include "compute/backend.h"
#include "compute/comm.h"
#include "compute/cpu/threadpool.h"
#include "compute/registry.h"
#include "engine/batch_plan.h"
#include "engine/dev_bufs.h"
#include "engine/rank.h"
#include "engine/stage_shape.h"
#include "model/gguf.h"
#include "model/shard.h"

enum phase { PHASE_LOAD, PHASE_PREPARE, PHASE_FORWARD };

/* A rank's thread and the outcome of its last phase. */
typedef struct rank_thread {
    stage *s;
    int rank;
    pthread_t thread;
    int started;
    int rc;
    st_err err;
} rank_thread;

struct stage {
    stage_params p;
    stage_shape sh; /* what the ranks read */
    gguf_file *f;
    const backend_module *bm; /* the backend (compute/registry.h) */
    backend_group *group;     /* its TP group: shared memory ("cpu"), NCCL ("cuda") */
    rank_ctx *ranks;
    rank_thread *threads;
    float *rope_ff; /* host [n_rot/2] or NULL */
    /* rank thread control */
    pthread_mutex_t mu;
    pthread_cond_t cv_go, cv_done;
    uint64_t gen;
    int n_done;
    int quit;
    enum phase phase;
    batch_plan cur; /* the forward's batch (PHASE_PREPARE, PHASE_FORWARD) */
    batch_arrays arrays;
    /* load progress */
    size_t load_total, load_done;
    int load_pct_logged;
    uint64_t opened_ns;
    stage_stats stats;
    dev_bufs dev; /* stage_dev_alloc's buffers (released at close if still live) */
    /* A communicator of the stage was aborted (comm.failed): the stage is lost. */
    bool failed;
    char failed_why[ST_ERR_MSG_MAX];
};

/* Test-only hook (docs/worker.md): once the file $STRATA_TEST_STAGE_FAIL_FILE
 * exists, the stage's next forward fails for good, as when a communicator is
 * aborted (comm.failed), so a CPU test can drive the failure path from the
 * worker to the coordinator's recovery. Inert unless the variable is set. */
static bool test_fail_now(void) {
    const char *f = getenv("STRATA_TEST_STAGE_FAIL_FILE");
    return f && *f && access(f, F_OK) == 0;
}

/* The ranks' load progress (rank_weights_progress): counts a loaded tensor,
 * logs the percentage; -1 when the load was cancelled (stage_params.cancel). */
static int load_progress(void *ctx, size_t bytes) {
    stage *s = ctx;
    if (s->p.cancel && atomic_load(s->p.cancel)) return -1;
    pthread_mutex_lock(&s->mu);
    s->load_done += bytes;
    int pct = s->load_total ? (int)(100.0 * (double)s->load_done / (double)s->load_total) : 100;
    /* Every 10% for models of 64 MiB and more; small ones only log the end. */
    int step = s->load_total >= (64u << 20) ? 10 : 100;
    if (pct / step > s->load_pct_logged / step) {
        s->load_pct_logged = pct;
        ST_INFO("stage [%d,%d) tp %d: loaded %d%% (%.1f / %.1f MiB)", s->sh.first, s->sh.last, s->sh.tp,
                pct, (double)s->load_done / 1048576.0, (double)s->load_total / 1048576.0);
    }
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* ------------------------------------------------------------ rank threads */

/* One phase on one rank. */
static void rank_phase(stage *s, rank_thread *t, enum phase phase) {
    rank_ctx *rc = &s->ranks[t->rank];
    double t0 = st_now_s();
    t->rc = 0;
    if (phase == PHASE_LOAD) {
        int device = s->p.n_devices ? s->p.devices[t->rank] : t->rank;
        t->rc = rank_open(rc, device, s->p.max_batch_tokens, load_progress, s, &t->err);
    } else if (phase == PHASE_PREPARE) {
        t->rc = rank_prepare(rc, &s->cur, &t->err);
    } else {
        t->rc = rank_forward(rc, &s->cur, &t->err);
        rc->busy += st_now_s() - t0;
    }
}

static void *rank_main(void *arg) {
    rank_thread *t = arg;
    stage *s = t->s;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (s->gen == seen && !s->quit) pthread_cond_wait(&s->cv_go, &s->mu);
        if (s->quit) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        seen = s->gen;
        enum phase phase = s->phase;
        pthread_mutex_unlock(&s->mu);

        rank_phase(s, t, phase);

        pthread_mutex_lock(&s->mu);
        s->n_done++;
        if (s->n_done == s->sh.tp) pthread_cond_signal(&s->cv_done);
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

/* Runs one phase on every rank and waits. Returns the first rank's error.
 * A single CPU rank (TP 1) runs the per-forward phases inline on the caller's
 * thread: the rank thread then only loads, and a forward costs no thread
 * hand-offs. (The CPU backend keeps no thread-affine state; a CUDA rank stays
 * on its thread, which owns the device context.) */
static int run_phase(stage *s, enum phase phase, st_err *err) {
    if (s->sh.tp == 1 && !s->sh.device_memory && phase != PHASE_LOAD) {
        rank_phase(s, &s->threads[0], phase);
    } else {
        pthread_mutex_lock(&s->mu);
        s->phase = phase;
        s->n_done = 0;
        s->gen++;
        pthread_cond_broadcast(&s->cv_go);
        while (s->n_done < s->sh.tp) pthread_cond_wait(&s->cv_done, &s->mu);
        pthread_mutex_unlock(&s->mu);
    }
    for (int r = 0; r < s->sh.tp; r++) {
        if (s->threads[r].rc != 0) {
            if (err) *err = s->threads[r].err;
            return st_err_prefix(err, "stage rank %d", r);
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- open/close */

void stage_close(stage *s) {
    if (!s) return;
    if (s->threads) {
        pthread_mutex_lock(&s->mu);
        s->quit = 1;
        pthread_cond_broadcast(&s->cv_go);
        pthread_mutex_unlock(&s->mu);
        for (int r = 0; r < s->sh.tp; r++)
            if (s->threads[r].started) pthread_join(s->threads[r].thread, NULL);
    }
    if (s->ranks) {
        dev_bufs_release(&s->dev, s->ranks[0].be);
        for (int r = 0; r < s->sh.tp; r++) rank_release(&s->ranks[r]);
        free(s->ranks);
    }
    free(s->threads);
    if (s->group) s->bm->group_free(s->group);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv_go);
    pthread_cond_destroy(&s->cv_done);
    free(s->rope_ff);
    batch_arrays_free(&s->arrays);
    gguf_close(s->f);
    free(s);
}

/* The backend module named in p, checked against the devices p asks for. */
static const backend_module *open_backend(const stage_params *pin, st_err *err) {
    st_err be_err;
    const backend_module *bm = backend_registry_get(pin->backend && *pin->backend ? pin->backend : NULL, &be_err);
    if (!bm) return st_errf(err, "stage: %s", be_err.msg), NULL;
    if (bm->device_memory) {
        int n_dev = bm->device_count();
        if (n_dev == 0) return st_errf(err, "stage: backend %s: no CUDA device", bm->name), NULL;
        if (pin->tp > n_dev)
            return st_errf(err, "stage: backend %s: TP %d needs one device per rank, %d visible", bm->name,
                           pin->tp, n_dev), NULL;
    }
    if (pin->n_devices) {
        if (!bm->device_memory) return st_errf(err, "stage: backend %s takes no device list", bm->name), NULL;
        if (pin->n_devices != pin->tp || pin->n_devices > STAGE_MAX_DEVICES)
            return st_errf(err, "stage: %d devices listed for TP %d (one per rank)", pin->n_devices, pin->tp),
                   NULL;
        for (int i = 0; i < pin->n_devices; i++) {
            bool dup = false;
            for (int j = 0; j < i; j++) dup |= pin->devices[j] == pin->devices[i];
            if (pin->devices[i] < 0 || pin->devices[i] >= bm->device_count() || dup)
                return st_errf(err, "stage: device %d is %s", pin->devices[i], dup ? "listed twice" : "not visible"),
                       NULL;
        }
    }
    return bm;
}

/* Opens the model and fills s->sh: the layer range, the rope factors. */
static int open_model(stage *s, st_err *err) {
    s->f = s->p.use_model_fd ? gguf_open_fd(s->p.model_fd, s->p.model_path, err) : gguf_open(s->p.model_path, err);
    if (!s->f) return -1;
    s->sh.f = s->f;
    llama_config *cfg = &s->sh.cfg;
    if (llama_config_from_gguf(s->f, cfg, err)) return -1;
    s->sh.first = s->p.first_layer;
    s->sh.last = s->p.last_layer < 0 ? cfg->n_layer : s->p.last_layer;
    if (s->sh.first < 0 || s->sh.last > cfg->n_layer || s->sh.first >= s->sh.last)
        return st_errf(err, "stage: layer range [%d, %d) is not inside the model's %d layers", s->sh.first,
                       s->sh.last, cfg->n_layer);
    if (cfg->has_rope_freqs && s->sh.first < s->sh.last) {
        const gguf_tensor *t = gguf_find_tensor(s->f, "rope_freqs.weight");
        s->rope_ff = malloc((size_t)t->ne[0] * sizeof(float));
        if (!s->rope_ff) return st_errf(err, "stage: out of memory");
        if (gguf_tensor_rows_f32(t, 0, 1, s->rope_ff, err)) return -1;
        s->sh.rope_ff = s->rope_ff;
    }
    return 0;
}

/* Plans every rank's shard and thread count; starts the TP group and the
 * rank threads. */
static int start_ranks(stage *s, int n_threads, st_err *err) {
    const int tp = s->sh.tp;
    s->ranks = calloc((size_t)tp, sizeof *s->ranks);
    s->threads = calloc((size_t)tp, sizeof *s->threads);
    if (!s->ranks || !s->threads) return st_errf(err, "stage: out of memory");
    for (int r = 0; r < tp; r++) {
        rank_ctx *rc = &s->ranks[r];
        rc->sh = &s->sh;
        rc->rank = r;
        if (shard_plan_make(&s->sh.cfg, tp, r, &rc->plan, err)) return -1;
        rc->n_threads = n_threads / tp + (r < n_threads % tp ? 1 : 0);
        if (rc->n_threads < 1) rc->n_threads = 1;
        s->load_total += rank_weights_bytes(&s->sh, &rc->plan);
        s->threads[r] = (rank_thread){.s = s, .rank = r};
    }
    s->group = s->bm->group_new(tp, s->p.n_devices ? s->p.devices : NULL, err);
    if (!s->group) return -1;
    for (int r = 0; r < tp; r++) s->ranks[r].c = s->bm->group_rank(s->group, r);
    for (int r = 0; r < tp; r++) {
        if (pthread_create(&s->threads[r].thread, NULL, rank_main, &s->threads[r]) != 0)
            return st_errf(err, "stage: cannot start rank thread %d", r);
        s->threads[r].started = 1;
    }
    return 0;
}

stage *stage_open(const stage_params *pin, st_err *err) {
    if (!pin || !pin->model_path) {
        st_errf(err, "stage: no model path");
        return NULL;
    }
    const backend_module *bm = open_backend(pin, err);
    if (!bm) return NULL;
    stage *s = calloc(1, sizeof *s);
    if (!s) {
        st_errf(err, "stage: out of memory");
        return NULL;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv_go, NULL);
    pthread_cond_init(&s->cv_done, NULL);
    s->p = *pin;
    s->bm = bm;
    s->sh.bm = bm;
    s->sh.device_memory = bm->device_memory;
    if (s->p.block_size == 0) s->p.block_size = 16;
    s->sh.kv_blocks = s->p.kv_blocks;
    s->sh.block_size = s->p.block_size;
    s->sh.kv_type = s->p.kv_type;
    if (s->p.kv_type != GGML_TYPE_F32 && s->p.kv_type != GGML_TYPE_F16) {
        st_errf(err, "stage: KV cache type %s is not supported (f32 or f16)", ggml_type_name(s->p.kv_type));
        goto fail;
    }
    if (s->p.tp < 1 || s->p.tp > 64) {
        st_errf(err, "stage: TP degree %d must be in [1, 64]", s->p.tp);
        goto fail;
    }
    s->sh.tp = s->p.tp;
    if (s->p.kv_blocks < 1 || s->p.block_size < 1) {
        st_errf(err, "stage: kv_blocks (%d) and block_size (%d) must be >= 1", s->p.kv_blocks,
                s->p.block_size);
        goto fail;
    }
    if (s->p.cancel && atomic_load(s->p.cancel)) {
        st_errf(err, "stage: load cancelled");
        goto fail;
    }
    if (open_model(s, err)) goto fail;
    int n_threads = s->p.n_threads > 0 ? s->p.n_threads : st_cpu_count();
    if (start_ranks(s, n_threads, err)) goto fail;
    ST_INFO("stage [%d,%d) of %d layers, tp %d, %d threads: loading %s (%.1f MiB)", s->sh.first,
            s->sh.last, s->sh.cfg.n_layer, s->sh.tp, n_threads, s->p.model_path,
            (double)s->load_total / 1048576.0);
    if (run_phase(s, PHASE_LOAD, err)) goto fail;
    /* The ranks hold their copies now; drop what is left of the mapping from RSS. */
    for (int64_t i = 0; i < gguf_n_tensors(s->f); i++) {
        const gguf_tensor *t = gguf_tensor_at(s->f, i);
        gguf_release_pages(s->f, t->data, t->nbytes);
    }
    s->opened_ns = st_now_ns();
    return s;
fail:
    stage_close(s);
    return NULL;
}

/* ---------------------------------------------------------------- accessors */

const llama_config *stage_config(const stage *s) { return &s->sh.cfg; }
int stage_first_layer(const stage *s) { return s->sh.first; }
int stage_last_layer(const stage *s) { return s->sh.last; }
bool stage_failed(const stage *s, st_err *why) {
    if (s->failed && why) snprintf(why->msg, sizeof why->msg, "%s", s->failed_why);
    return s->failed;
}

bool stage_is_first(const stage *s) { return s->sh.first == 0; }
bool stage_is_last(const stage *s) { return s->sh.last == s->sh.cfg.n_layer; }
int stage_tp(const stage *s) { return s->sh.tp; }
int stage_kv_blocks(const stage *s) { return s->p.kv_blocks; }
int stage_block_size(const stage *s) { return s->p.block_size; }
int stage_device(const stage *s) { return s->p.n_devices ? s->p.devices[0] : 0; }

int stage_rank_stats_get(const stage *s, int rank, stage_rank_stats *out) {
    if (rank < 0 || rank >= s->sh.tp) return -1;
    const rank_ctx *rc = &s->ranks[rank];
    memset(out, 0, sizeof *out);
    out->weight_bytes = backend_weight_bytes(rc->be);
    out->buf_bytes = rc->be->ops->buf_bytes(rc->be);
    out->all_reduce_calls = rc->c->stats.all_reduce_calls;
    out->all_gather_calls = rc->c->stats.all_gather_calls;
    out->comm_seconds = rc->c->stats.seconds;
    out->busy_seconds = rc->busy;
    return 0;
}

void stage_stats_get(const stage *s, stage_stats *out) {
    *out = s->stats;
    out->open_seconds = (double)(st_now_ns() - s->opened_ns) * 1e-9;
}

/* ------------------------------------------------------------ device hand-off */

void *stage_dev_alloc(stage *s, size_t bytes, st_err *err) {
    if (!s->sh.device_memory) return st_errf(err, "stage: backend %s has no device memory", s->bm->name), NULL;
    return dev_bufs_get(&s->dev, s->ranks[0].be, bytes, err);
}

void stage_dev_free(stage *s, void *p) { dev_bufs_put(&s->dev, s->ranks[0].be, p); }

/* ---------------------------------------------------------------- forward */

static int forward_impl(stage *s, const stage_batch *b, const void *hidden_in, bool in_dev, void *hidden_out,
                        bool out_dev, stage_sample_out *samples, st_err *err) {
    const double t0 = st_now_s();
    const bool first = stage_is_first(s), last = stage_is_last(s);
    if (s->failed) return st_errf(err, "stage: failed earlier, it cannot run again (%s)", s->failed_why);
    if (test_fail_now()) {
        s->failed = true;
        snprintf(s->failed_why, sizeof s->failed_why,
                 "comm nccl all_reduce (rank 0): communicator aborted (test: STRATA_TEST_STAGE_FAIL_FILE)");
        return st_errf(err, "stage: %s", s->failed_why);
    }
    if (!b || b->n_seqs < 1 || !b->seqs || b->n_tokens < 1)
        return st_errf(err, "stage: empty batch");
    if (first && !b->tokens) return st_errf(err, "stage: the first stage needs token ids");
    if (!first && !hidden_in) return st_errf(err, "stage: hidden_in is required after the first stage");
    if (!last && !hidden_out) return st_errf(err, "stage: hidden_out is required before the last stage");
    if (last && !samples) return st_errf(err, "stage: samples is required on the last stage");
    int32_t vmax = (int32_t)s->ranks[0].plan.n_vocab_local; /* rank 0 has the largest slice */
    if (batch_plan_make(&s->cur, &s->arrays, &s->sh, b, samples, vmax, err)) return -1;
    s->cur.hin = hidden_in;
    s->cur.in_dev = in_dev;
    s->cur.hout = hidden_out;
    s->cur.out_dev = out_dev;
    if (run_phase(s, PHASE_PREPARE, err) || run_phase(s, PHASE_FORWARD, err)) {
        /* A rank whose communicator was aborted (an NCCL error or a missed
         * deadline) leaves the stage unusable: say so for good. */
        for (int r = 0; r < s->sh.tp; r++)
            if (s->ranks[r].c && s->ranks[r].c->failed && !s->failed) {
                s->failed = true;
                snprintf(s->failed_why, sizeof s->failed_why, "%s", err ? err->msg : "communicator aborted");
                ST_ERROR("stage [%d,%d) tp %d failed: rank %d's communicator was aborted: %s", s->sh.first,
                         s->sh.last, s->sh.tp, r, s->failed_why);
            }
        return -1;
    }
    s->stats.forwards++;
    s->stats.tokens += (uint64_t)b->n_tokens;
    s->stats.busy_seconds += st_now_s() - t0;
    return 0;
}

int stage_forward(stage *s, const stage_batch *b, const float *hidden_in, float *hidden_out,
                  stage_sample_out *samples, st_err *err) {
    return forward_impl(s, b, hidden_in, false, hidden_out, false, samples, err);
}

int stage_forward_io(stage *s, const stage_batch *b, const void *in, bool in_dev, void *out, bool out_dev,
                     stage_sample_out *samples, st_err *err) {
    if ((in_dev || out_dev) && !s->sh.device_memory)
        return st_errf(err, "stage: backend %s has no device memory for a device hand-off", s->bm->name);
    return forward_impl(s, b, in, in_dev, out, out_dev, samples, err);
}
