/* leader.c — leader election and fenced writes on etcd (leader.h). */
#include "coordinator/control/leader.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/log_limit.h"
#include "coordinator/control/etcd_client.h"

#define TXN_OPS_MAX 100     /* etcd's --max-txn-ops default is 128 */
#define QUEUE_SCAN 1024     /* queued changes coalesced per transaction, at most */
#define RETRY_S 0.5         /* after a failed etcd call */
#define WATCH_S 2.0         /* a watch is renewed this often (it also re-reads the key) */

typedef struct wop {
    struct wop *next;
    char *key;   /* full key */
    char *value; /* NULL: delete */
    double queued; /* when leader_write queued it */
} wop;

/* A key whose change etcd refused even alone (dropped from the queue): etcd
 * misses it until a later change of the key is written. */
typedef struct refused_key {
    struct refused_key *next;
    char *key;
    double since; /* when the refused change was queued */
} refused_key;

struct leader {
    leader_opts o;
    char *prefix, *name, *http, *grpc;
    char key[ETCD_KEY_MAX];     /* PREFIX/leader */
    char *record;               /* our leader record */
    etcd_client *etcd;
    struct event_base *base;
    struct event *ev;           /* the pipe's read end: "elected" on the loop thread */
    int pipe_fd[2];
    leader_elected_fn fn;
    void *ud;
    pthread_t thread, fence;
    bool started, fenced;       /* fence: runs while we lead (fence_main) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop, is_leader;
    char cur_http[256], cur_grpc[256];
    wop *head, *tail;
    size_t queued;              /* changes in the queue */
    refused_key *refused;       /* keys etcd misses after a refusal */
    leader_write_stats ws;      /* counters and the latest refusal (leader_stats) */
    double refusal_at;          /* when etcd last refused a txn */
    char seq_key[ETCD_KEY_MAX]; /* PREFIX/seq: the write sequence (flush) */
    char *seq;                  /* its value as we last wrote or saw it (NULL: absent) */
    uint64_t seq_n;             /* our writes' counter, for the next value */
    etcd_kvs loaded;            /* handed to the loop thread with the election */
    int64_t lease, my_rev;
    double renewed_sent;        /* when the last renewal that etcd confirmed was sent */
    st_log_limit warn_lim;      /* the election thread's failures */
};

/* ---------------------------------------------------------------- helpers */

static bool stopping(leader *l) {
    pthread_mutex_lock(&l->mu);
    bool s = l->stop;
    pthread_mutex_unlock(&l->mu);
    return s;
}

/* Sleeps s seconds unless stopped or (wake_on_write) a write is queued. */
static void nap(leader *l, double s, bool wake_on_write) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double t = (double)ts.tv_nsec / 1e9 + s;
    ts.tv_sec += (time_t)t;
    ts.tv_nsec = (long)((t - (double)(time_t)t) * 1e9);
    pthread_mutex_lock(&l->mu);
    while (!l->stop && !(wake_on_write && l->head))
        if (pthread_cond_timedwait(&l->cv, &l->mu, &ts) == ETIMEDOUT) break;
    pthread_mutex_unlock(&l->mu);
}

static void set_current(leader *l, const char *record, size_t len) {
    const char *http = "", *grpc = "";
    json_t *o = record ? json_loadb(record, len, 0, NULL) : NULL;
    if (o) json_unpack(o, "{s?s,s?s}", "http", &http, "grpc", &grpc);
    pthread_mutex_lock(&l->mu);
    snprintf(l->cur_http, sizeof l->cur_http, "%s", http);
    snprintf(l->cur_grpc, sizeof l->cur_grpc, "%s", grpc);
    pthread_mutex_unlock(&l->mu);
    json_decref(o);
}

/* The oldest change etcd misses, queued or refused (0: none). Under mu. */
static double unwritten_since(const leader *l) {
    double t = l->head ? l->head->queued : 0;
    for (const refused_key *r = l->refused; r; r = r->next)
        if (!t || r->since < t) t = r->since;
    return t;
}

/* Fencing: this process may no longer act as the leader. */
static void step_down(leader *l, const char *why) {
    ST_ERROR("leader: %s lost the leadership: %s; exiting (status %d) so that nothing more is served or written "
             "by this process; its supervisor starts it again as a standby",
             l->name, why, LEADER_EXIT_STATUS);
    _exit(LEADER_EXIT_STATUS);
}

static void set_renewed(leader *l, double sent) {
    pthread_mutex_lock(&l->mu);
    l->renewed_sent = sent;
    pthread_mutex_unlock(&l->mu);
}

/* The fence: a thread of its own, so that an etcd call that blocks (up to its
 * timeout) cannot delay the step-down past the lease's expiry. */
static void *fence_main(void *arg) {
    leader *l = arg;
    double margin = l->o.ttl_s / 3.0 < 1.0 ? l->o.ttl_s / 3.0 : 1.0;
    while (!stopping(l)) {
        pthread_mutex_lock(&l->mu);
        double now = st_now_s(), since = now - l->renewed_sent, oldest = unwritten_since(l);
        size_t queued = l->queued;
        bool refused = l->refused != NULL;
        pthread_mutex_unlock(&l->mu);
        char why[256];
        if (since > l->o.ttl_s - margin) {
            snprintf(why, sizeof why, "the lease could not be renewed for %.1f s (TTL %.0f s)", since, l->o.ttl_s);
            step_down(l, why);
        }
        /* The state this leader serves is not in etcd: a successor would take
         * over without it (an older epoch the workers refuse). */
        if (oldest && now - oldest > l->o.ttl_s) {
            snprintf(why, sizeof why,
                     "its changes have not reached etcd for %.1f s (more than the TTL, %.0f s; %zu queued%s)",
                     now - oldest, l->o.ttl_s, queued, refused ? ", some refused by etcd" : "");
            step_down(l, why);
        }
        nap(l, 0.05, false);
    }
    return NULL;
}

/* ---------------------------------------------------------------- standby */

/* Renews l->lease: true when it lives on (renewed_sent updated). */
static bool alive(leader *l, st_err *err) {
    int64_t ttl = 0;
    double sent = st_now_s();
    if (etcd_lease_keepalive(l->etcd, l->lease, &ttl, err) != 0 || ttl <= 0) return false;
    set_renewed(l, sent);
    return true;
}

/* One round as a standby: read the leader key, campaign when it is absent,
 * else watch it. Returns 1 once we are the leader, 0 to go round again. */
static int standby_round(leader *l, bool *logged) {
    st_err err = {{0}};
    etcd_kvs k;
    if (etcd_range(l->etcd, l->key, false, &k, &err) != 0) goto fail;
    if (k.n == 1 && l->lease && k.kv[0].lease == l->lease) {
        /* our campaign's txn went through, its answer was lost: we lead if the lease still lives */
        l->my_rev = k.kv[0].create_rev;
        etcd_kvs_free(&k);
        return alive(l, &err) ? 1 : (l->lease = 0, 0);
    }
    if (k.n == 1) {
        set_current(l, k.kv[0].value, k.kv[0].value_len);
        if (!*logged) ST_INFO("leader: standby; the leader is %s", k.kv[0].value);
        *logged = true;
        int64_t rev = k.revision;
        etcd_kvs_free(&k);
        etcd_watch_msg m;
        int w = etcd_watch(l->etcd, l->key, rev + 1, WATCH_S, &m, &err);
        if (w < 0) goto fail;
        if (w == 1 && m.deleted) ST_INFO("leader: the leader's key is gone (lease expired or revoked); campaigning");
        if (w == 1 && m.put) *logged = false; /* a new leader: log it */
        return 0;
    }
    etcd_kvs_free(&k);
    set_current(l, NULL, 0);
    if (l->lease && !alive(l, &err)) l->lease = 0; /* kept from a failed campaign: it may have expired */
    if (!l->lease && etcd_lease_grant(l->etcd, (int64_t)l->o.ttl_s, &l->lease, &err) != 0) goto fail;
    etcd_cmp cmp = {l->key, ETCD_CMP_CREATE, 0, NULL};
    etcd_op put = {l->key, l->record, strlen(l->record), l->lease};
    bool won = false;
    int64_t rev = 0;
    double sent = st_now_s();
    if (etcd_txn(l->etcd, &cmp, 1, &put, 1, NULL, 0, &won, &rev, NULL, &err) != 0) goto fail;
    if (!won) { /* maybe our own txn, retried after a lost answer: then the key holds our lease */
        if (etcd_range(l->etcd, l->key, false, &k, &err) != 0) goto fail;
        if (k.n == 1 && k.kv[0].lease == l->lease) won = true, rev = k.kv[0].create_rev;
        if (k.n == 1) set_current(l, k.kv[0].value, k.kv[0].value_len);
        etcd_kvs_free(&k);
    }
    if (!won) {
        ST_INFO("leader: another coordinator won the election");
        if (etcd_lease_revoke(l->etcd, l->lease, &err) != 0) ST_WARN("leader: %s", err.msg);
        l->lease = 0;
        *logged = false;
        return 0;
    }
    l->my_rev = rev;
    set_renewed(l, sent);
    return 1;
fail:;
    /* etcd down: one line every 10 s, not one per retry */
    unsigned long more;
    if (st_log_limit_allow(&l->warn_lim, st_now_s(), &more))
        ST_WARN("leader: %s (etcd %s); retrying every %.1f s (%lu more failure(s) since the last line)", err.msg,
                etcd_client_endpoint(l->etcd), RETRY_S, more);
    nap(l, RETRY_S, false);
    return 0;
}

/* ---------------------------------------------------------------- leader */

static void keepalive(leader *l) {
    st_err err = {{0}};
    int64_t ttl = 0;
    double sent = st_now_s();
    if (etcd_lease_keepalive(l->etcd, l->lease, &ttl, &err) != 0) {
        ST_WARN("leader: lease keep-alive: %s", err.msg);
        return;
    }
    if (ttl <= 0) step_down(l, "etcd says our lease is gone (expired)");
    set_renewed(l, sent);
    /* The key itself: deleted by hand, or replaced, we are not the leader
     * whatever the lease says. */
    etcd_kvs k;
    if (etcd_range(l->etcd, l->key, false, &k, &err) != 0) {
        ST_WARN("leader: reading %s: %s", l->key, err.msg);
        return;
    }
    bool ours = k.n == 1 && k.kv[0].create_rev == l->my_rev;
    etcd_kvs_free(&k);
    if (!ours) step_down(l, "the leader key was deleted or replaced");
}

/* ---------------------------------------------------------------- writes */

size_t leader_coalesce(const etcd_op *q, size_t n, etcd_op *out, size_t cap, size_t *used) {
    size_t k = 0, i = 0;
    for (; i < n; i++) {
        size_t j = 0;
        while (j < k && strcmp(out[j].key, q[i].key)) j++;
        if (j == k) {
            if (k == cap) break; /* a new key past the cap: the rest waits for the next txn */
            k++;
        }
        out[j] = q[i]; /* the last change of a key wins: put + delete = delete, delete + put = put */
    }
    *used = i;
    return k;
}

bool leader_refusal(const char *msg) {
    /* etcd_client.c: "URL/v3/kv/txn: HTTP 400: etcd: MESSAGE (code N)" is etcd's own answer. No answer,
     * a 5xx on every endpoint, or etcd's passing states are worth the same call again. */
    static const char *const passing[] = {"not leader", "no leader", "leader changed", "timed out",
                                          "too many requests", "HTTP 408", "HTTP 429"};
    if (!strstr(msg, ": HTTP 4")) return false;
    for (size_t i = 0; i < sizeof passing / sizeof *passing; i++)
        if (strstr(msg, passing[i])) return false;
    return true;
}

/* Written: key is in etcd again. Under mu. */
static void refused_clear(leader *l, const char *key) {
    for (refused_key **p = &l->refused; *p; p = &(*p)->next)
        if (!strcmp((*p)->key, key)) {
            refused_key *r = *p;
            *p = r->next;
            free(r->key), free(r);
            return;
        }
}

/* etcd refused key's change even alone: it is dropped from the queue (the same
 * change would be refused again), and remembered as missing from etcd. */
static void drop_refused(leader *l, const char *key, double since, const char *why) {
    ST_ERROR("leader: etcd refused the change of %s on its own: %s; dropped (etcd misses it: this leader steps down "
             "%.0f s after it was queued unless a later change of the key is written)",
             key, why, l->o.ttl_s);
    refused_key *r = calloc(1, sizeof *r);
    pthread_mutex_lock(&l->mu);
    l->ws.dropped_changes++;
    snprintf(l->ws.last_refusal, sizeof l->ws.last_refusal, "%.100s: %.200s", key, why);
    l->refusal_at = st_now_s();
    bool known = false;
    for (refused_key *k = l->refused; k; k = k->next) known |= !strcmp(k->key, key);
    if (!known && r && (r->key = strdup(key))) {
        r->since = since;
        r->next = l->refused;
        l->refused = r;
        r = NULL;
    }
    pthread_mutex_unlock(&l->mu);
    if (r) free(r->key), free(r);
}

static void note_refusal(leader *l, const char *what, const char *why) {
    pthread_mutex_lock(&l->mu);
    l->ws.refused_batches++;
    snprintf(l->ws.last_refusal, sizeof l->ws.last_refusal, "%.100s: %.200s", what, why);
    l->refusal_at = st_now_s();
    pthread_mutex_unlock(&l->mu);
}

/* The write sequence did not match: a write of ours whose answer was lost (a
 * timeout) landed after all, or the key was edited by hand. Adopts its value;
 * the changes of that write are still queued and go out again. Steps down when
 * the leader key is not ours. */
static int resync(leader *l, st_err *err) {
    etcd_kvs k;
    if (etcd_range(l->etcd, l->key, false, &k, err) != 0) return -1;
    bool ours = k.n == 1 && k.kv[0].create_rev == l->my_rev;
    etcd_kvs_free(&k);
    if (!ours) step_down(l, "a write was refused: the leader key is no longer ours");
    if (etcd_range(l->etcd, l->seq_key, false, &k, err) != 0) return -1;
    char mine[32];
    snprintf(mine, sizeof mine, "%" PRId64 ".", l->my_rev);
    if (k.n == 1 && strncmp(k.kv[0].value, mine, strlen(mine)))
        ST_WARN("leader: %s = %s was not written by this leader; taken as it is", l->seq_key, k.kv[0].value);
    free(l->seq);
    l->seq = k.n == 1 ? strdup(k.kv[0].value) : NULL;
    etcd_kvs_free(&k);
    return 0;
}

/* One fenced txn of ops[0..n) (n < TXN_OPS_MAX), chained on PREFIX/seq so that
 * a write that timed out here but reaches etcd later cannot overwrite a newer
 * one: every write compares the sequence value of the write before it and
 * puts a new one. 1: written; 0: no answer or a passing error (err; the
 * outcome is unknown, write again); -1: etcd refused it (err). */
static int write_txn(leader *l, const etcd_op *ops, size_t n, st_err *err) {
    for (int tries = 0; tries < 3; tries++) {
        char next[48];
        snprintf(next, sizeof next, "%" PRId64 ".%" PRIu64, l->my_rev, ++l->seq_n);
        etcd_op all[TXN_OPS_MAX];
        memcpy(all, ops, n * sizeof *ops);
        all[n] = (etcd_op){l->seq_key, next, strlen(next), 0};
        etcd_cmp cmp[2] = {{l->key, ETCD_CMP_CREATE, l->my_rev, NULL},
                           {l->seq_key, l->seq ? ETCD_CMP_VALUE : ETCD_CMP_CREATE, 0, l->seq}};
        bool ok = false;
        int64_t rev;
        if (etcd_txn(l->etcd, cmp, 2, all, n + 1, NULL, 0, &ok, &rev, NULL, err) != 0)
            return leader_refusal(err->msg) ? -1 : 0;
        if (ok) {
            free(l->seq);
            l->seq = strdup(next); /* NULL (out of memory): the next write resyncs */
            return 1;
        }
        if (resync(l, err) != 0) return 0;
    }
    st_errf(err, "%s kept changing under our writes", l->seq_key);
    return 0;
}

/* When the oldest queued change of key among q[0..n) was queued. */
static double first_queued(const etcd_op *q, const double *at, size_t n, const char *key) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(q[i].key, key)) return at[i];
    return st_now_s();
}

/* Writes the queued changes: the longest prefix of the queue with at most
 * TXN_OPS_MAX - 1 keys, coalesced per key (etcd refuses a txn that writes a
 * key twice), one fenced txn at a time. A txn etcd refuses (other than a
 * passing state: not leader, timeouts) is counted and written again one key
 * per txn; a key refused on its own is logged, counted and dropped
 * (drop_refused). false: etcd did not answer; what is left stays queued. */
static bool flush(leader *l) {
    etcd_op q[QUEUE_SCAN]; /* 40 KB of the election thread's stack */
    double at[QUEUE_SCAN];
    for (;;) {
        size_t n = 0;
        pthread_mutex_lock(&l->mu);
        for (wop *w = l->head; w && n < QUEUE_SCAN; w = w->next, n++) {
            q[n] = (etcd_op){w->key, w->value, w->value ? strlen(w->value) : 0, 0};
            at[n] = w->queued;
        }
        pthread_mutex_unlock(&l->mu);
        if (!n) return true;
        etcd_op ops[TXN_OPS_MAX];
        size_t used;
        size_t k = leader_coalesce(q, n, ops, TXN_OPS_MAX - 1, &used);
        st_err err = {{0}};
        int r = write_txn(l, ops, k, &err);
        if (r == 0) {
            ST_WARN("leader: writing %zu change(s) (%zu queued): %s; kept for the next try", k, n, err.msg);
            return false;
        }
        if (r < 0) {
            note_refusal(l, k == 1 ? ops[0].key : "a txn", err.msg);
            if (k > 1)
                ST_WARN("leader: etcd refused a txn of %zu change(s): %s; writing them one key per txn", k, err.msg);
        }
        for (size_t i = 0; i < k; i++) {
            int ri = r > 0 ? 1 : k > 1 ? write_txn(l, &ops[i], 1, &err) : -1;
            if (ri == 0) {
                ST_WARN("leader: writing %s: %s; kept for the next try", ops[i].key, err.msg);
                return false;
            }
            if (ri < 0) {
                drop_refused(l, ops[i].key, first_queued(q, at, used, ops[i].key), err.msg);
            } else {
                pthread_mutex_lock(&l->mu);
                refused_clear(l, ops[i].key);
                pthread_mutex_unlock(&l->mu);
            }
        }
        pthread_mutex_lock(&l->mu);
        for (size_t i = 0; i < used; i++) {
            wop *d = l->head;
            l->head = d->next;
            free(d->key);
            free(d->value);
            free(d);
        }
        l->queued -= used;
        if (!l->head) l->tail = NULL;
        pthread_mutex_unlock(&l->mu);
    }
}

static void lead(leader *l) {
    double period = l->o.ttl_s / 3.0;
    double next = st_now_s() + period;
    while (!stopping(l)) {
        if (st_now_s() >= next) {
            keepalive(l);
            next = st_now_s() + period;
        }
        bool written = flush(l);
        double wait = next - st_now_s();
        if (!written && wait > RETRY_S) wait = RETRY_S;
        if (wait > 0) nap(l, wait, written); /* after a failure: no busy retry on the next write */
    }
    flush(l);
    st_err err = {{0}};
    if (etcd_lease_revoke(l->etcd, l->lease, &err) != 0)
        ST_WARN("leader: revoking the lease at the stop: %s (a standby takes over when it expires)", err.msg);
    else
        ST_INFO("leader: resigned (lease revoked); a standby takes over now");
}

static void *leader_main(void *arg) {
    leader *l = arg;
    bool logged = false;
    while (!stopping(l)) {
        if (standby_round(l, &logged) != 1) continue;
        /* Won: read the state before the loop thread takes over. */
        st_err err = {{0}};
        double t0 = st_now_s();
        if (pthread_create(&l->fence, NULL, fence_main, l) != 0) step_down(l, "cannot start the fence thread");
        l->fenced = true;
        while (etcd_range(l->etcd, l->prefix, true, &l->loaded, &err) != 0) {
            ST_WARN("leader: reading the state: %s; retrying", err.msg);
            nap(l, 0.1, false);
            if (stopping(l)) return NULL;
        }
        for (size_t i = 0; i < l->loaded.n; i++)
            if (!strcmp(l->loaded.kv[i].key, l->seq_key)) l->seq = strdup(l->loaded.kv[i].value);
        pthread_mutex_lock(&l->mu);
        l->is_leader = true;
        snprintf(l->cur_http, sizeof l->cur_http, "%s", l->http);
        snprintf(l->cur_grpc, sizeof l->cur_grpc, "%s", l->grpc);
        pthread_mutex_unlock(&l->mu);
        ST_INFO("leader: %s is the leader (lease %" PRIx64 ", TTL %.0f s, revision %" PRId64 "); %zu key(s) read "
                "in %.0f ms",
                l->name, (uint64_t)l->lease, l->o.ttl_s, l->my_rev, l->loaded.n, (st_now_s() - t0) * 1e3);
        char b = 1;
        if (write(l->pipe_fd[1], &b, 1) != 1) step_down(l, "cannot wake the event loop");
        lead(l);
        return NULL;
    }
    return NULL;
}

static void on_pipe(evutil_socket_t fd, short what, void *arg) {
    (void)what;
    leader *l = arg;
    char b;
    if (read(fd, &b, 1) != 1) return;
    l->fn(l->ud, &l->loaded);
    etcd_kvs_free(&l->loaded);
}

/* ---------------------------------------------------------------- lifetime */

static void free_leader(leader *l) {
    if (!l) return;
    while (l->head) {
        wop *w = l->head;
        l->head = w->next;
        free(w->key), free(w->value), free(w);
    }
    while (l->refused) {
        refused_key *r = l->refused;
        l->refused = r->next;
        free(r->key), free(r);
    }
    free(l->seq);
    if (l->ev) event_free(l->ev);
    for (int i = 0; i < 2; i++)
        if (l->pipe_fd[i] >= 0) close(l->pipe_fd[i]);
    etcd_client_destroy(l->etcd);
    etcd_kvs_free(&l->loaded);
    free(l->prefix), free(l->name), free(l->http), free(l->grpc), free(l->record);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    free(l);
}

leader *leader_start(const leader_opts *o, struct event_base *base, leader_elected_fn fn, void *ud, st_err *err) {
    leader *l = calloc(1, sizeof *l);
    if (!l) return st_errf(err, "leader: out of memory"), NULL;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    l->pipe_fd[0] = l->pipe_fd[1] = -1;
    l->warn_lim = (st_log_limit)ST_LOG_LIMIT_INIT(10.0);
    l->o = *o;
    if (!(l->o.ttl_s >= 1)) l->o.ttl_s = l->o.ttl_s > 0 ? 1 : 3;
    l->base = base;
    l->fn = fn;
    l->ud = ud;
    size_t pl = o->prefix ? strlen(o->prefix) : 0;
    while (pl > 1 && o->prefix[pl - 1] == '/') pl--;
    if (!o->prefix || o->prefix[0] != '/' || pl + 64 > ETCD_KEY_MAX) {
        st_errf(err, "--etcd-prefix %s: a key path starting with / (at most %d bytes)", o->prefix ? o->prefix : "",
                ETCD_KEY_MAX - 64);
        goto fail;
    }
    l->prefix = strndup(o->prefix, pl);
    l->name = strdup(o->name ? o->name : "coordinator");
    l->http = strdup(o->http ? o->http : "");
    l->grpc = strdup(o->grpc ? o->grpc : "");
    json_t *rec = json_pack("{s:s,s:s,s:s,s:I}", "name", l->name ? l->name : "", "http", l->http ? l->http : "",
                            "grpc", l->grpc ? l->grpc : "", "pid", (json_int_t)getpid());
    l->record = rec ? json_dumps(rec, JSON_COMPACT) : NULL;
    json_decref(rec);
    if (!l->prefix || !l->name || !l->http || !l->grpc || !l->record) {
        st_errf(err, "leader: out of memory");
        goto fail;
    }
    snprintf(l->key, sizeof l->key, "%s/leader", l->prefix);
    snprintf(l->seq_key, sizeof l->seq_key, "%s/seq", l->prefix);
    etcd_client_opts eo = {o->etcd, o->cacert, o->cert, o->key, o->insecure, 0};
    eo.timeout_s = l->o.ttl_s / 3.0 < 2.0 ? l->o.ttl_s / 3.0 : 2.0;
    if (!(l->etcd = etcd_client_create(&eo, err))) goto fail;
    if (pipe(l->pipe_fd) != 0) {
        st_errf(err, "leader: pipe: %s", strerror(errno));
        goto fail;
    }
    fcntl(l->pipe_fd[0], F_SETFD, FD_CLOEXEC);
    fcntl(l->pipe_fd[1], F_SETFD, FD_CLOEXEC);
    if (!(l->ev = event_new(base, l->pipe_fd[0], EV_READ | EV_PERSIST, on_pipe, l)) || event_add(l->ev, NULL) != 0) {
        st_errf(err, "leader: cannot create an event");
        goto fail;
    }
    if (pthread_create(&l->thread, NULL, leader_main, l) != 0) {
        st_errf(err, "leader: cannot start the thread");
        goto fail;
    }
    l->started = true;
    ST_INFO("leader: %s campaigns on etcd %s under %s (lease TTL %.0f s)", l->name, o->etcd, l->prefix, l->o.ttl_s);
    return l;
fail:
    free_leader(l);
    return NULL;
}

const char *leader_prefix(const leader *l) { return l->prefix; }

bool leader_is_leader(leader *l) {
    pthread_mutex_lock(&l->mu);
    bool v = l->is_leader;
    pthread_mutex_unlock(&l->mu);
    return v;
}

void leader_current(leader *l, char *http, size_t http_cap, char *grpc, size_t grpc_cap) {
    pthread_mutex_lock(&l->mu);
    snprintf(http, http_cap, "%s", l->cur_http);
    snprintf(grpc, grpc_cap, "%s", l->cur_grpc);
    pthread_mutex_unlock(&l->mu);
}

void leader_stats(leader *l, leader_write_stats *out) {
    pthread_mutex_lock(&l->mu);
    *out = l->ws;
    double now = st_now_s(), oldest = unwritten_since(l);
    out->queued = l->queued;
    out->unwritten_s = oldest ? now - oldest : 0;
    out->last_refusal_age_s = l->ws.last_refusal[0] ? now - l->refusal_at : 0;
    pthread_mutex_unlock(&l->mu);
}

void leader_write(leader *l, const char *rel_key, const char *value) {
    if (!leader_is_leader(l)) return;
    wop *w = calloc(1, sizeof *w);
    size_t n = strlen(l->prefix) + strlen(rel_key) + 2;
    if (w) w->key = malloc(n);
    if (w && value) w->value = strdup(value);
    if (!w || !w->key || (value && !w->value)) {
        ST_ERROR("leader: out of memory; a change to %s is not written to etcd", rel_key);
        if (w) free(w->key), free(w->value), free(w);
        return;
    }
    snprintf(w->key, n, "%s/%s", l->prefix, rel_key);
    w->queued = st_now_s();
    pthread_mutex_lock(&l->mu);
    l->queued++;
    if (l->tail)
        l->tail->next = w;
    else
        l->head = w;
    l->tail = w;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

void leader_stop(leader *l) {
    if (!l) return;
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    if (l->started) pthread_join(l->thread, NULL);
    if (l->fenced) pthread_join(l->fence, NULL);
    free_leader(l);
}
