/* assign_token.c — StageAssign tokens (assign_token.h). */
#include "ib/assign_token.h"

#include <stdlib.h>
#include <string.h>

#define LABEL "strata/v1 StageAssign"

struct enc {
    uint8_t *buf;
    size_t len, cap;
    bool oom;
};

static void put(struct enc *e, const void *p, size_t n)
{
    if (e->oom) return;
    if (e->len + n > e->cap) {
        size_t cap = e->cap ? e->cap : 256;
        while (cap < e->len + n) cap *= 2;
        uint8_t *b = realloc(e->buf, cap);
        if (!b) {
            e->oom = true;
            return;
        }
        e->buf = b;
        e->cap = cap;
    }
    memcpy(e->buf + e->len, p, n);
    e->len += n;
}

static void put_u64(struct enc *e, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    put(e, b, 8);
}

static void put_str(struct enc *e, const char *s)
{
    size_t n = s ? strlen(s) : 0;
    put_u64(e, n);
    if (n) put(e, s, n);
}

/* The signed bytes of a (malloc'd into e). */
static int encode(const Strata__V1__StageAssign *a, struct enc *e)
{
    put(e, LABEL, sizeof LABEL); /* with its NUL */
    put_u64(e, a->epoch);
    put_u64(e, a->stage);
    put_u64(e, a->n_stages);
    put_str(e, a->model_path);
    put_u64(e, (uint64_t)(int64_t)a->first_layer);
    put_u64(e, (uint64_t)(int64_t)a->last_layer);
    put_u64(e, (uint64_t)(int64_t)a->tp);
    put_u64(e, (uint64_t)(int64_t)a->kv_blocks);
    put_u64(e, (uint64_t)(int64_t)a->block_size);
    put_u64(e, (uint64_t)a->act_dtype);
    put_str(e, a->next_hop);
    put_u64(e, (uint64_t)(int64_t)a->n_threads);
    put_u64(e, a->keep_loaded ? 1 : 0);
    put_u64(e, a->adopt_epoch);
    put_str(e, a->backend);
    put_u64(e, a->n_devices);
    for (size_t i = 0; i < a->n_devices; i++) put_u64(e, (uint64_t)(int64_t)a->devices[i]);
    return e->oom ? -1 : 0;
}

int assign_token_make(const cluster_key *k, const Strata__V1__StageAssign *a, uint8_t out[CLUSTER_MAC_LEN])
{
    struct enc e = {0};
    int rc = encode(a, &e) ? -1 : cluster_key_mac(k, 0, CLUSTER_KEY_ASSIGN, e.buf, e.len, out);
    free(e.buf);
    return rc;
}

bool assign_token_ok(const cluster_key *k, const Strata__V1__StageAssign *a)
{
    if (!k || a->token.len != CLUSTER_MAC_LEN) return false;
    struct enc e = {0};
    bool ok = encode(a, &e) == 0 &&
              cluster_key_verify(k, CLUSTER_KEY_ASSIGN, e.buf, e.len, a->token.data, a->token.len) >= 0;
    free(e.buf);
    return ok;
}
