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
#define RETRY_S 0.5         /* after a failed etcd call */
#define WATCH_S 2.0         /* a watch is renewed this often (it also re-reads the key) */

typedef struct wop {
    struct wop *next;
    char *key;   /* full key */
    char *value; /* NULL: delete */
} wop;

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
        double since = st_now_s() - l->renewed_sent;
        pthread_mutex_unlock(&l->mu);
        if (since > l->o.ttl_s - margin) {
            char why[128];
            snprintf(why, sizeof why, "the lease could not be renewed for %.1f s (TTL %.0f s)", since, l->o.ttl_s);
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

/* Writes the queued changes as fenced txns; a failed call leaves them
 * queued (false: retry later). */
static bool flush(leader *l) {
    for (;;) {
        pthread_mutex_lock(&l->mu);
        wop *batch = l->head;
        size_t n = 0;
        for (wop *w = batch; w && n < TXN_OPS_MAX; w = w->next) n++;
        pthread_mutex_unlock(&l->mu);
        if (!n) return true;
        etcd_op ops[TXN_OPS_MAX];
        wop *w = batch;
        for (size_t i = 0; i < n; i++, w = w->next)
            ops[i] = (etcd_op){w->key, w->value, w->value ? strlen(w->value) : 0, 0};
        etcd_cmp cmp = {l->key, ETCD_CMP_CREATE, l->my_rev, NULL};
        bool ok = false;
        int64_t rev;
        st_err err = {{0}};
        if (etcd_txn(l->etcd, &cmp, 1, ops, n, NULL, 0, &ok, &rev, NULL, &err) != 0) {
            ST_WARN("leader: writing %zu change(s): %s; kept for the next try", n, err.msg);
            return false;
        }
        if (!ok) step_down(l, "a write was refused: the leader key is no longer ours");
        pthread_mutex_lock(&l->mu);
        for (size_t i = 0; i < n; i++) {
            wop *d = l->head;
            l->head = d->next;
            free(d->key);
            free(d->value);
            free(d);
        }
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
    pthread_mutex_lock(&l->mu);
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
