/* compute_thread.c — the worker's compute thread: a FIFO of jobs (stage open,
 * micro-batch forward) run one at a time on the stage it owns, finished jobs
 * handed back to the event loop through an eventfd (see compute_thread.h). */
#include "daemon/compute_thread.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "daemon/act_p2p.h"
#include "ib/frame.h"

struct compute {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    cjob *head, *tail;          /* queued */
    cjob *done_head, *done_tail; /* finished, not yet taken */
    bool running;               /* a job is running (on the thread or inline) */
    bool quit;
    int efd;
    compute_stats stats;        /* snapshot, under mu */
    stage *st;                  /* owned by the thread */
    uint64_t st_gen;            /* stages opened (act_p2p: whose device buffer is whose) */
    long delay_us;              /* test hook: $STRATA_TEST_FORWARD_DELAY_MS (below) */
};

static void push(cjob **head, cjob **tail, cjob *j)
{
    j->next = NULL;
    if (*tail)
        (*tail)->next = j;
    else
        *head = j;
    *tail = j;
}

static void notify(compute *c)
{
    uint64_t one = 1;
    ssize_t n = write(c->efd, &one, sizeof one);
    (void)n; /* EAGAIN only when the counter is saturated: still readable */
}

/* Under c->mu: refresh the rank snapshot from the stage. */
static void snapshot_ranks(compute *c)
{
    c->stats.loaded = c->st != NULL;
    c->stats.n_ranks = 0;
    if (!c->st) return;
    int n = stage_tp(c->st);
    if (n > COMPUTE_MAX_RANKS) n = COMPUTE_MAX_RANKS;
    for (int r = 0; r < n; r++) stage_rank_stats_get(c->st, r, &c->stats.ranks[r]);
    c->stats.n_ranks = n;
}

static void run_open(compute *c, cjob *j)
{
    if (c->st) {
        stage_close(c->st);
        c->st = NULL;
    }
    double t0 = st_now_s();
    c->st_gen++;
    c->st = stage_open(&j->params, &j->err);
    if (!c->st) {
        j->status = -1;
        return;
    }
    const llama_config *cfg = stage_config(c->st);
    cjob_stage_info *in = &j->info;
    in->n_embd = cfg->n_embd;
    in->n_vocab = cfg->n_vocab;
    in->n_layer = cfg->n_layer;
    in->kv_blocks = stage_kv_blocks(c->st);
    in->block_size = stage_block_size(c->st);
    in->is_first = stage_is_first(c->st);
    in->is_last = stage_is_last(c->st);
    in->weight_bytes = in->buf_bytes = 0;
    for (int r = 0; r < stage_tp(c->st); r++) {
        stage_rank_stats rs;
        if (stage_rank_stats_get(c->st, r, &rs) == 0) {
            in->weight_bytes += rs.weight_bytes;
            in->buf_bytes += rs.buf_bytes;
        }
    }
    in->load_seconds = st_now_s() - t0;
    j->status = 0;
}

static void run_forward(compute *c, cjob *j)
{
    if (!c->st) {
        j->status = st_errf(&j->err, "worker: no stage loaded");
        return;
    }
    j->start_ns = st_now_ns();
    if (c->delay_us > 0) usleep((useconds_t)c->delay_us);
    if (j->p2p_in || j->p2p_out)
        j->status = act_p2p_forward(c->st, c->st_gen, j);
    else if (j->dev_in || j->dev_rows_out)
        j->status = stage_forward_io(c->st, &j->batch, j->dev_in ? j->dev_in : (const void *)j->hidden_in,
                                     j->dev_in != NULL, j->dev_rows_out ? j->dev_rows_out : (void *)j->hidden_out,
                                     j->dev_rows_out != NULL, j->samples, &j->err);
    else
        j->status = stage_forward(c->st, &j->batch, j->hidden_in, j->hidden_out, j->samples, &j->err);
    j->stage_failed = j->status != 0 && stage_failed(c->st, NULL);
    j->end_ns = st_now_ns();
    j->seconds = (double)(j->end_ns - j->start_ns) * 1e-9;
    if (j->status == 0 && j->out_bf16) frame_f32_to_bf16(j->hidden_out, j->out_bf16, j->n_out);
}

/* Under c->mu: a job finished; count it. */
static void account(compute *c, cjob *j)
{
    if (j->kind == CJOB_FORWARD && j->status == 0) {
        c->stats.forwards++;
        c->stats.tokens += (uint64_t)j->batch.n_tokens;
        c->stats.busy_seconds += j->seconds;
    }
    snapshot_ranks(c);
    c->stats.queued--;
}

static void *thread_main(void *arg)
{
    compute *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->head && !c->quit) pthread_cond_wait(&c->cv, &c->mu);
        if (c->quit) break;
        cjob *j = c->head;
        c->head = j->next;
        if (!c->head) c->tail = NULL;
        c->running = true;
        pthread_mutex_unlock(&c->mu);

        if (j->kind == CJOB_OPEN)
            run_open(c, j);
        else if (j->kind == CJOB_FORWARD)
            run_forward(c, j);
        else
            act_p2p_run(c->st, c->st_gen, j);

        pthread_mutex_lock(&c->mu);
        account(c, j);
        c->running = false;
        push(&c->done_head, &c->done_tail, j);
        notify(c);
    }
    /* quit: drop what is queued, close the stage */
    while (c->head) {
        cjob *j = c->head;
        c->head = j->next;
        j->status = st_errf(&j->err, "worker: shutting down");
        c->stats.queued--;
        push(&c->done_head, &c->done_tail, j);
    }
    c->tail = NULL;
    stage *st = c->st;
    c->st = NULL;
    snapshot_ranks(c);
    pthread_mutex_unlock(&c->mu);
    if (st) stage_close(st);
    return NULL;
}

compute *compute_create(st_err *err)
{
    compute *c = calloc(1, sizeof *c);
    if (!c) {
        st_errf(err, "worker: out of memory");
        return NULL;
    }
    c->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->efd < 0) {
        st_errf(err, "worker: eventfd: %s", strerror(errno));
        free(c);
        return NULL;
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    /* Test-only hook (docs/worker.md): every forward takes N ms longer, so
     * that the shutdown tests can hold streams open for seconds with a tiny
     * model. Inert unless the variable is set. */
    const char *delay = getenv("STRATA_TEST_FORWARD_DELAY_MS");
    if (delay && *delay) {
        c->delay_us = strtol(delay, NULL, 10) * 1000;
        if (c->delay_us > 0) ST_WARN("STRATA_TEST_FORWARD_DELAY_MS: every forward is %ld ms slower (test hook)",
                                     c->delay_us / 1000);
    }
    int rc = pthread_create(&c->thread, NULL, thread_main, c);
    if (rc) {
        st_errf(err, "worker: cannot start the compute thread: %s", strerror(rc));
        close(c->efd);
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->cv);
        free(c);
        return NULL;
    }
    return c;
}

void compute_stop(compute *c)
{
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->quit = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thread, NULL);
}

void compute_free(compute *c)
{
    if (!c) return;
    close(c->efd);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

int compute_fd(const compute *c) { return c->efd; }

void compute_submit(compute *c, cjob *job)
{
    pthread_mutex_lock(&c->mu);
    job->status = 0;
    job->err.msg[0] = 0;
    push(&c->head, &c->tail, job);
    c->stats.queued++;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

bool compute_run_inline(compute *c, cjob *job)
{
    if (job->kind != CJOB_FORWARD || job->p2p_in || job->p2p_out) return false; /* a transfer waits on a peer */
    pthread_mutex_lock(&c->mu);
    /* Idle: nothing queued, running or waiting to be taken (results leave in
     * submission order), and a stage loaded. The thread itself then waits on
     * the condition variable and only the caller submits, so the stage is the
     * caller's until it clears running. */
    bool idle = !c->head && !c->running && !c->done_head && !c->quit && c->st;
    if (idle) {
        c->running = true;
        c->stats.queued++;
        job->status = 0;
        job->err.msg[0] = 0;
    }
    pthread_mutex_unlock(&c->mu);
    if (!idle) return false;
    run_forward(c, job);
    pthread_mutex_lock(&c->mu);
    account(c, job);
    c->running = false;
    pthread_mutex_unlock(&c->mu);
    return true;
}

cjob *compute_take_done(compute *c)
{
    uint64_t v;
    ssize_t n = read(c->efd, &v, sizeof v); /* reset readiness (EAGAIN when already 0) */
    (void)n;
    pthread_mutex_lock(&c->mu);
    cjob *list = c->done_head;
    c->done_head = c->done_tail = NULL;
    pthread_mutex_unlock(&c->mu);
    return list;
}

void compute_get_stats(compute *c, compute_stats *out)
{
    pthread_mutex_lock(&c->mu);
    *out = c->stats;
    pthread_mutex_unlock(&c->mu);
}
