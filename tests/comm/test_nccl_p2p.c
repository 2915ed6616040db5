/* test_nccl_p2p.c — the CUDA module's NCCL point-to-point (compute/registry.h
 * backend_p2p_ops), the activation transport "nccl" of a pipeline boundary,
 * reached through the registry as the worker reaches it. Skipped (77) without
 * the module or a GPU.
 *   1 GPU:  a rank whose peer never comes: open fails "timed out" within its
 *           deadline (aborted, not hung); a fresh unique id each call.
 *   2 GPUs: rank 0 on GPU 0 sends 3 MiB + 1 float to rank 1 on GPU 1, which
 *           gets them byte-exact; then a recv with nothing sent times out and
 *           aborts, and a send on the aborted communicator fails at once.
 * (NCCL refuses two ranks of one communicator on one GPU.) */
#include <pthread.h>
#include <stdint.h>

#include "common/clock.h"
#include "compute/registry.h"
#include "tests/testutil.h"

#define BIG (3u << 20)

static const backend_module *m;
static uint8_t id[128];

struct rank_run {
    int rank;
    backend *b;
    uint8_t *host;
    int status;
    st_err err;
};

static void *run_rank(void *arg)
{
    struct rank_run *r = arg;
    const backend_p2p_ops *p = m->p2p;
    backend_p2p *c = p->open(id, r->rank, r->rank, 60, &r->err);
    if (!c) {
        r->status = -1;
        return NULL;
    }
    void *d = r->b->ops->alloc(r->b, BIG, &r->err);
    r->status = -1;
    if (!d) goto out;
    if (r->rank == 0) {
        if (r->b->ops->upload(r->b, d, r->host, BIG, &r->err) || p->send(c, d, BIG, 30, &r->err) ||
            p->send(c, d, sizeof(float), 30, &r->err))
            goto out;
        /* rank 1 now waits for a message that never comes; then our
         * communicator may be aborted too: closing it must not hang */
        r->status = 0;
    } else {
        if (p->recv(c, d, BIG, 30, &r->err) || r->b->ops->download(r->b, r->host, d, BIG, &r->err)) goto out;
        float one = 0;
        if (p->recv(c, d, sizeof one, 30, &r->err) || r->b->ops->download(r->b, &one, d, sizeof one, &r->err))
            goto out;
        double t0 = st_now_s();
        st_err e = {{0}};
        int rc = p->recv(c, d, 64, 2.0, &e);
        double dt = st_now_s() - t0;
        CHECK_MSG(rc == -1 && strstr(e.msg, "timed out") && strstr(e.msg, "communicator aborted"), "recv of nothing: %s",
                  e.msg);
        CHECK_MSG(dt >= 1.9 && dt < 15, "the recv gave up after %.1f s (deadline 2 s)", dt);
        rc = p->send(c, d, 64, 2.0, &e);
        CHECK_MSG(rc == -1 && strstr(e.msg, "was aborted earlier"), "send after the abort: %s", e.msg);
        r->status = 0;
    }
out:
    if (d) r->b->ops->release(r->b, d);
    p->close(c);
    return NULL;
}

int main(void)
{
    st_err err = {{0}};
    m = backend_registry_get("cuda", &err);
    if (!m) {
        printf("test_nccl_p2p: skipped: %s\n", err.msg);
        return 77;
    }
    int n = m->device_count();
    if (n < 1 || !m->p2p) {
        printf("test_nccl_p2p: skipped: %d CUDA device(s)\n", n);
        return 77;
    }
    const backend_p2p_ops *p = m->p2p;
    CHECK_EQ_INT(p->id_bytes, 128);
    uint8_t other[128];
    REQUIRE_MSG(p->unique_id(id, &err) == 0, "%s", err.msg);
    REQUIRE_MSG(p->unique_id(other, &err) == 0, "%s", err.msg);
    CHECK_MSG(memcmp(id, other, sizeof id) != 0, "two unique ids are equal");

    /* A peer that never comes: the init is abandoned at its deadline. */
    double t0 = st_now_s();
    backend_p2p *c = p->open(other, 0, 0, 3.0, &err);
    double dt = st_now_s() - t0;
    CHECK_MSG(c == NULL && strstr(err.msg, "timed out"), "open without a peer: %s", c ? "opened" : err.msg);
    CHECK_MSG(dt >= 2.9 && dt < 20, "open gave up after %.1f s (deadline 3 s)", dt);
    if (c) p->close(c);
    CHECK(p->open(id, 2, 0, 1.0, &err) == NULL && strstr(err.msg, "rank 2 (want 0 or 1)"));

    if (n < 2) {
        printf("test_nccl_p2p: 1 GPU: the timeout checked; the transfer needs 2 GPUs\n");
        return test_summary();
    }
    struct rank_run r[2] = {{.rank = 0}, {.rank = 1}};
    for (int i = 0; i < 2; i++) {
        REQUIRE_MSG((r[i].b = m->backend_new(i, 1, &err)), "%s", err.msg);
        REQUIRE((r[i].host = calloc(1, BIG)));
    }
    for (uint32_t i = 0; i < BIG; i++) r[0].host[i] = (uint8_t)(i * 2654435761u >> 24);
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, run_rank, &r[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 2; i++) CHECK_MSG(r[i].status == 0, "rank %d: %s", i, r[i].err.msg);
    CHECK_MSG(memcmp(r[0].host, r[1].host, BIG) == 0, "rank 1 did not receive rank 0's 3 MiB byte-exact");
    for (int i = 0; i < 2; i++) {
        backend_free(r[i].b);
        free(r[i].host);
    }
    printf("test_nccl_p2p: 3 MiB GPU 0 -> GPU 1 byte-exact; timeouts abort\n");
    return test_summary();
}
