/* registration.c — the worker's Register/Heartbeat thread (registration.h):
 * host resources, model file hashes, and the call loop against the
 * coordinator's strata.v1.Control service. */
#include "daemon/registration.h"

#include "compute/registry.h"
#include "ib/nvml_links.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/sha256.h"
#include "proto/control.pb-c.h"
#include "rpc/grpc_client.h"

#define SVC "/strata.v1.Control/"
#define COORD_MAX 8 /* --coordinator a,b,...: a leader and its standbys */

typedef struct model_info {
    char *name; /* basename */
    uint64_t size;
    char sha[65];
} model_info;

struct reg_client {
    char *coordinator, *node, *data_address;
    char *targets[COORD_MAX]; /* the coordinator list (pointers into `list`) */
    char *list;
    int n_targets, cur;       /* the one in use */
    bool quiet;               /* a fail-over was logged; quiet until registered again */
    unsigned moves;           /* fail-overs since the last registration (the back-off) */
    char *ca, *cert, *key; /* NULL: plaintext */
    char **paths;
    int n_models;
    model_info *models;
    uint64_t memory_bytes;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    const char *leave_reason; /* reg_leave: send Leave before the thread ends */
    reg_load load;
    int registered;
    uint64_t serving_epoch; /* the coordinator's serving placement epoch, last answer (reg_serving_epoch) */
};

static void set_serving_epoch(reg_client *r, uint64_t epoch)
{
    pthread_mutex_lock(&r->mu);
    r->serving_epoch = epoch;
    pthread_mutex_unlock(&r->mu);
}

/* ---------------------------------------------------------------- hashing */

int reg_file_sha256(const char *path, char hex[65], uint64_t *size, st_err *err)
{
    struct stat sb;
    if (stat(path, &sb) != 0) return st_errf(err, "%s: %s", path, strerror(errno));
    *size = (uint64_t)sb.st_size;
    long long mt = (long long)sb.st_mtim.tv_sec * 1000000000LL + sb.st_mtim.tv_nsec;
    char cache[4096];
    snprintf(cache, sizeof cache, "%s.sha256", path);
    FILE *cf = fopen(cache, "r");
    if (cf) {
        char h[80];
        unsigned long long csz;
        long long cmt;
        int ok = fscanf(cf, "%79s %llu %lld", h, &csz, &cmt) == 3 && strlen(h) == 64 &&
                 csz == *size && cmt == mt;
        fclose(cf);
        if (ok) {
            memcpy(hex, h, 65);
            return 0;
        }
    }
    if (st_file_sha256(path, hex, err)) return -1;
    cf = fopen(cache, "w"); /* best effort: a read-only directory has no cache */
    if (cf) {
        fprintf(cf, "%s %llu %lld\n", hex, (unsigned long long)*size, mt);
        fclose(cf);
    }
    return 0;
}

/* ---------------------------------------------------------------- host resources */

uint64_t reg_host_memory(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

uint32_t reg_numa_nodes(void)
{
    DIR *d = opendir("/sys/devices/system/node");
    if (!d) return 1;
    uint32_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, "node", 4) && e->d_name[4] >= '0' && e->d_name[4] <= '9') n++;
    closedir(d);
    return n ? n : 1;
}

/* ---------------------------------------------------------------- calls */

static int unary(rpc_client *c, const char *method, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *rd, ProtobufCMessage **out, rpc_status *st)
{
    size_t len = protobuf_c_message_get_packed_size(req);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) return -1;
    protobuf_c_message_pack(req, buf);
    uint8_t *rep = NULL;
    size_t rlen = 0;
    int rc = rpc_client_unary(c, method, buf, len, REG_CALL_TIMEOUT_S, &rep, &rlen, st);
    free(buf);
    if (rc != 0) return -1;
    *out = protobuf_c_message_unpack(rd, NULL, rlen, rep);
    free(rep);
    if (!*out) {
        st->code = RPC_INTERNAL;
        snprintf(st->msg, sizeof st->msg, "undecodable reply");
        return -1;
    }
    return 0;
}

static int do_register(reg_client *r, rpc_client *c, uint64_t *lease, uint32_t *interval_ms,
                       rpc_status *st)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    uint64_t mem = r->memory_bytes ? r->memory_bytes : reg_host_memory();
    Strata__V1__Device dev = STRATA__V1__DEVICE__INIT;
    dev.kind = "cpu";
    dev.count = (uint32_t)cores;
    dev.memory_bytes = mem / (uint64_t)cores;
    Strata__V1__Device *devp = &dev;
    /* GPUs through the backend registry (the cuda module, when it loads and
     * sees one) and the link matrix's TP rule (ib/nvml_links.h). */
    backend_device_info gi[16];
    Strata__V1__Gpu gpus[16], *gpup[16];
    int n_gpu = 0;
    if (!strcmp(backend_registry_detect(gi, 16, &n_gpu), "cuda") && n_gpu > 0) {
        dev.kind = "cuda";
        dev.count = (uint32_t)n_gpu;
        dev.memory_bytes = gi[0].memory_bytes;
        for (int i = 0; i < n_gpu; i++) {
            strata__v1__gpu__init(&gpus[i]);
            gpus[i].name = gi[i].name;
            gpus[i].memory_bytes = gi[i].memory_bytes;
            gpus[i].pci_bus_id = gi[i].pci_bus_id;
            gpus[i].numa_node = -1; /* the link matrix below knows it */
            gpup[i] = &gpus[i];
            if (gi[i].memory_bytes < dev.memory_bytes) dev.memory_bytes = gi[i].memory_bytes;
        }
        dev.gpus = gpup;
        dev.n_gpus = (size_t)n_gpu;
    }
    /* The link matrix (ib/nvml_links.h), in CUDA's order of the GPUs above:
     * its TP rule, summary, and each GPU's rows (Gpu.links, Gpu.nic_links). */
    gpu_links links, ordered; /* sysfs/NVML order; CUDA's */
    char summary[256] = "";
    uint32_t tp_limit = 0;
    st_err lerr;
    char cell[GPU_LINKS_MAX_GPU][GPU_LINKS_MAX_GPU + GPU_LINKS_MAX_NIC][8];
    char *cellp[GPU_LINKS_MAX_GPU][GPU_LINKS_MAX_GPU + GPU_LINKS_MAX_NIC], *nicp[GPU_LINKS_MAX_NIC];
    int n_nic = 0;
    if (n_gpu > 0 && n_gpu <= GPU_LINKS_MAX_GPU && node_links_detect("/", &links, &lerr) == 0) {
        const char *bus[GPU_LINKS_MAX_GPU];
        for (int i = 0; i < n_gpu; i++) bus[i] = gi[i].pci_bus_id;
        int ordered_ok = gpu_links_reorder(&links, bus, n_gpu, &ordered, &lerr) == 0;
        /* The TP rule does not depend on the order: without bus ids that
         * match, the sysfs/NVML matrix still gives it when it has every GPU. */
        const gpu_links *rule = ordered_ok ? &ordered : links.n_gpu >= n_gpu ? &links : NULL;
        if (rule) {
            tp_limit = (uint32_t)gpu_links_tp_rule(rule, NULL, 0);
            gpu_links_summary(rule, summary, sizeof summary);
        }
        int unknown = 0; /* a class sysfs could not tell: no matrix (the coordinator takes whole ones) */
        for (int i = 0; ordered_ok && i < n_gpu; i++)
            for (int j = 0; j < n_gpu + ordered.n_nic; j++)
                unknown += (j < n_gpu ? ordered.gg[i][j].cls : ordered.gn[i][j - n_gpu].cls) == LINK_UNKNOWN;
        if (ordered_ok && !unknown) {
            n_nic = ordered.n_nic;
            for (int k = 0; k < n_nic; k++) nicp[k] = ordered.nic[k];
            for (int i = 0; i < n_gpu; i++) {
                for (int j = 0; j < n_gpu + n_nic; j++) {
                    gpu_link_str(j < n_gpu ? ordered.gg[i][j] : ordered.gn[i][j - n_gpu], cell[i][j], sizeof cell[i][j]);
                    cellp[i][j] = cell[i][j];
                }
                gpus[i].links = cellp[i];
                gpus[i].n_links = (size_t)n_gpu;
                gpus[i].nic_links = cellp[i] + n_gpu;
                gpus[i].n_nic_links = (size_t)n_nic;
                gpus[i].numa_node = ordered.gpu_numa[i];
            }
        } else if (ordered_ok) {
            ST_WARN("registration: no link matrix: %d link(s) of unknown class (a device without a PCI path)", unknown);
        } else {
            ST_WARN("registration: no link matrix: %s", lerr.msg);
        }
    }
    Strata__V1__ModelFile *mf = calloc((size_t)(r->n_models ? r->n_models : 1), sizeof *mf);
    Strata__V1__ModelFile **mfp = calloc((size_t)(r->n_models ? r->n_models : 1), sizeof *mfp);
    if (!mf || !mfp) {
        free(mf);
        free(mfp);
        return -1;
    }
    for (int i = 0; i < r->n_models; i++) {
        strata__v1__model_file__init(&mf[i]);
        mf[i].name = r->models[i].name;
        mf[i].size_bytes = r->models[i].size;
        mf[i].sha256 = r->models[i].sha;
        mfp[i] = &mf[i];
    }
    Strata__V1__RegisterRequest q = STRATA__V1__REGISTER_REQUEST__INIT;
    q.node = r->node;
    q.devices = &devp;
    q.n_devices = 1;
    q.host_memory_bytes = mem;
    q.numa_nodes = reg_numa_nodes();
    q.data_address = r->data_address;
    q.models = mfp;
    q.n_models = (size_t)r->n_models;
    q.tp_limit = tp_limit;
    q.link_summary = summary;
    q.nics = nicp;
    q.n_nics = (size_t)n_nic;
    ProtobufCMessage *out = NULL;
    int rc = unary(c, SVC "Register", &q.base, &strata__v1__register_reply__descriptor, &out, st);
    free(mf);
    free(mfp);
    if (rc != 0) return -1;
    Strata__V1__RegisterReply *rep = (Strata__V1__RegisterReply *)out;
    *lease = rep->lease_id;
    *interval_ms = rep->heartbeat_interval_ms ? rep->heartbeat_interval_ms : 1000;
    ST_INFO("registration: registered as %s with %s: lease %016" PRIx64 ", heartbeat every %u ms, "
            "placement epoch %" PRIu64,
            r->node, r->coordinator, rep->lease_id, *interval_ms, rep->placement_epoch);
    set_serving_epoch(r, rep->placement_epoch);
    protobuf_c_message_free_unpacked(out, NULL);
    return 0;
}

/* Sleeps ms unless stopped; true when stopping. */
static bool nap(reg_client *r, unsigned ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&r->mu);
    while (!r->stop)
        if (pthread_cond_timedwait(&r->cv, &r->mu, &ts) == ETIMEDOUT) break;
    bool s = r->stop;
    pthread_mutex_unlock(&r->mu);
    return s;
}

/* Leave (reg_leave): the coordinator re-places this node's stage now. */
static void send_leave(reg_client *r, rpc_client *c, uint64_t lease, const char *reason)
{
    Strata__V1__LeaveRequest q = STRATA__V1__LEAVE_REQUEST__INIT;
    q.node = r->node;
    q.lease_id = lease;
    q.reason = (char *)reason;
    ProtobufCMessage *out = NULL;
    rpc_status st = {0};
    if (unary(c, SVC "Leave", &q.base, &strata__v1__leave_reply__descriptor, &out, &st) != 0) {
        ST_WARN("registration: Leave: %s: %s (the coordinator notices when the connection drops)",
                rpc_code_name(st.code), st.msg);
        return;
    }
    Strata__V1__LeaveReply *rep = (Strata__V1__LeaveReply *)out;
    ST_INFO("registration: left the cluster (%s): %u stage(s) of epoch %" PRIu64 " to re-place", reason,
            rep->stages_lost, rep->placement_epoch);
    protobuf_c_message_free_unpacked(out, NULL);
}

/* With several coordinators (a leader and standbys, docs/recovery.md): after
 * a call that found no leader there (unreachable, or UNAVAILABLE from a
 * standby, whose message names the leader "(gRPC HOST:PORT)"), moves to the
 * leader it named when it is in the list, else to the next one. True when it
 * moved (the caller registers there: leases are per coordinator). The channel
 * it leaves after a transport failure is made afresh: gRPC would otherwise
 * keep it in its reconnect back-off (up to minutes) and miss that coordinator
 * coming back, as a standby, when it is needed at the next fail-over. */
static bool fail_over(reg_client *r, const rpc_status *st, rpc_client **cs, const rpc_tls *tls)
{
    if (r->n_targets < 2 || (st->code != RPC_UNAVAILABLE && st->code != RPC_DEADLINE_EXCEEDED)) return false;
    if (!strstr(st->msg, "is a standby")) {
        st_err err = {{0}};
        rpc_client *fresh = rpc_client_create_small(r->targets[r->cur], r->ca ? tls : NULL, &err);
        if (fresh) {
            rpc_client_destroy(cs[r->cur]);
            cs[r->cur] = fresh;
        }
    }
    int next = (r->cur + 1) % r->n_targets;
    const char *named = strstr(st->msg, "(gRPC ");
    if (named) {
        named += 6;
        size_t n = strcspn(named, ")");
        for (int i = 0; i < r->n_targets; i++)
            if (i != r->cur && strlen(r->targets[i]) == n && !strncmp(r->targets[i], named, n)) next = i;
    }
    if (!r->quiet)
        ST_INFO("registration: coordinator %s: %s: %s; trying %s (and the others in turn until one leads)",
                r->targets[r->cur], rpc_code_name(st->code), st->msg, r->targets[next]);
    r->quiet = true;
    r->cur = next;
    r->coordinator = r->targets[next];
    return true;
}

static void *reg_main(void *arg)
{
    reg_client *r = arg;
    for (int i = 0; i < r->n_models; i++) {
        st_err err = {{0}};
        if (reg_file_sha256(r->paths[i], r->models[i].sha, &r->models[i].size, &err) != 0) {
            ST_ERROR("registration: %s", err.msg);
            r->models[i].sha[0] = 0;
        }
    }
    st_err err = {{0}};
    rpc_tls tls = {r->ca, r->cert, r->key};
    rpc_client *cs[COORD_MAX] = {0};
    for (int i = 0; i < r->n_targets; i++)
        if (!(cs[i] = rpc_client_create_small(r->targets[i], r->ca ? &tls : NULL, &err))) {
            ST_ERROR("registration: %s", err.msg);
            for (int j = 0; j < i; j++) rpc_client_destroy(cs[j]);
            return NULL;
        }
    rpc_client *c = cs[0];
    r->coordinator = r->targets[0];
    uint64_t lease = 0;
    uint32_t interval = 1000;
    double prev_busy = 0, prev_up = 0;
    bool warned = false;
    while (1) {
        pthread_mutex_lock(&r->mu);
        bool stop = r->stop;
        pthread_mutex_unlock(&r->mu);
        if (stop) break;
        rpc_status st = {0};
        if (!lease) {
            if (do_register(r, c, &lease, &interval, &st) != 0) {
                lease = 0;
                if (fail_over(r, &st, cs, &tls)) {
                    /* 100, 200, then 250 ms between tries while no coordinator leads */
                    c = cs[r->cur];
                    unsigned ms = 100u << (r->moves < 2 ? r->moves : 2);
                    r->moves++;
                    if (nap(r, ms > 250 ? 250 : ms)) break;
                    continue;
                }
                if (st.code != RPC_UNAVAILABLE && st.code != RPC_DEADLINE_EXCEEDED) {
                    ST_ERROR("registration: Register refused: %s: %s", rpc_code_name(st.code), st.msg);
                    if (nap(r, REG_RETRY_REFUSED_MS)) break;
                } else {
                    if (!warned)
                        ST_WARN("registration: coordinator %s: %s%s", r->coordinator, st.msg,
                                r->ca ? " (mutual TLS: a failed handshake looks the same; check that the "
                                        "coordinator's certificate is from --grpc-ca and names this address)"
                                      : "");
                    warned = true;
                    if (nap(r, REG_RETRY_UNREACHABLE_MS)) break;
                }
                continue;
            }
            warned = false;
            r->quiet = false;
            r->moves = 0;
            pthread_mutex_lock(&r->mu);
            r->registered = 1;
            pthread_mutex_unlock(&r->mu);
        }
        if (nap(r, interval)) break;
        pthread_mutex_lock(&r->mu);
        reg_load l = r->load;
        pthread_mutex_unlock(&r->mu);
        Strata__V1__HeartbeatRequest q = STRATA__V1__HEARTBEAT_REQUEST__INIT;
        q.node = r->node;
        q.lease_id = lease;
        q.running_sequences = l.running_sequences;
        q.kv_blocks_used = l.kv_blocks_used;
        q.kv_blocks_free = l.kv_blocks_free;
        double du = l.uptime_seconds - prev_up;
        q.busy_fraction = du > 0 ? (l.busy_seconds - prev_busy) / du : 0.0;
        if (q.busy_fraction < 0) q.busy_fraction = 0;
        if (q.busy_fraction > 1) q.busy_fraction = 1;
        prev_busy = l.busy_seconds;
        prev_up = l.uptime_seconds;
        q.bytes_sent = l.bytes_sent;
        ProtobufCMessage *out = NULL;
        if (unary(c, SVC "Heartbeat", &q.base, &strata__v1__heartbeat_reply__descriptor, &out, &st) != 0) {
            if (!warned) ST_WARN("registration: heartbeat: %s: %s", rpc_code_name(st.code), st.msg);
            warned = true;
            if (st.code == RPC_NOT_FOUND) lease = 0;
            if (fail_over(r, &st, cs, &tls)) { /* the new coordinator gives a new lease */
                c = cs[r->cur];
                lease = 0;
                pthread_mutex_lock(&r->mu);
                r->registered = 0;
                r->serving_epoch = 0; /* unknown until the new one answers */
                pthread_mutex_unlock(&r->mu);
            }
            continue;
        }
        warned = false;
        Strata__V1__HeartbeatReply *rep = (Strata__V1__HeartbeatReply *)out;
        set_serving_epoch(r, rep->reregister ? 0 : rep->placement_epoch);
        if (rep->reregister) {
            ST_INFO("registration: the coordinator does not know lease %016" PRIx64 "; registering again", lease);
            lease = 0;
            pthread_mutex_lock(&r->mu);
            r->registered = 0;
            pthread_mutex_unlock(&r->mu);
        }
        protobuf_c_message_free_unpacked(out, NULL);
    }
    pthread_mutex_lock(&r->mu);
    const char *reason = r->leave_reason;
    pthread_mutex_unlock(&r->mu);
    if (reason && lease) send_leave(r, c, lease, reason);
    for (int i = 0; i < r->n_targets; i++) rpc_client_destroy(cs[i]);
    return NULL;
}

/* ---------------------------------------------------------------- lifetime */

int reg_check_tls(const char *ca, const char *cert, const char *key, st_err *err)
{
    rpc_tls tls = {ca, cert, key};
    int given = rpc_tls_given(&tls, "--grpc-", err);
    rpc_tls_pem pem;
    if (given < 0 || (given == 1 && rpc_tls_load(&tls, &pem, err) != 0)) return -1;
    if (given == 1) rpc_tls_pem_free(&pem);
    return 0;
}

static void reg_free(reg_client *r)
{
    if (!r) return;
    free(r->list);
    free(r->node);
    free(r->data_address);
    free(r->ca);
    free(r->cert);
    free(r->key);
    for (int i = 0; i < r->n_models; i++) {
        free(r->paths ? r->paths[i] : NULL);
        free(r->models ? r->models[i].name : NULL);
    }
    free(r->paths);
    free(r->models);
    free(r);
}

reg_client *reg_start(const reg_opts *o, st_err *err)
{
    reg_client *r = calloc(1, sizeof *r);
    if (!r) return st_errf(err, "registration: out of memory"), NULL;
    r->list = strdup(o->coordinator);
    char *save = NULL;
    for (char *t = r->list ? strtok_r(r->list, ",", &save) : NULL; t; t = strtok_r(NULL, ",", &save)) {
        if (r->n_targets == COORD_MAX) {
            reg_free(r);
            return st_errf(err, "--coordinator: at most %d addresses", COORD_MAX), NULL;
        }
        r->targets[r->n_targets++] = t;
    }
    if (r->list && !r->n_targets) {
        reg_free(r);
        return st_errf(err, "--coordinator: no address"), NULL;
    }
    r->coordinator = r->targets[0];
    r->node = strdup(o->node);
    r->data_address = strdup(o->data_address);
    r->memory_bytes = o->memory_bytes;
    r->paths = calloc((size_t)(o->n_models + 1), sizeof *r->paths);
    r->models = calloc((size_t)(o->n_models + 1), sizeof *r->models);
    if (!r->list || !r->node || !r->data_address || !r->paths || !r->models) goto oom;
    if (reg_check_tls(o->ca, o->cert, o->key, err) != 0) {
        reg_free(r);
        return NULL;
    }
    if (o->ca && *o->ca) {
        if (!(r->ca = strdup(o->ca)) || !(r->cert = strdup(o->cert)) || !(r->key = strdup(o->key))) goto oom;
    }
    for (int i = 0; i < o->n_models; i++) {
        r->paths[i] = strdup(o->models[i]);
        const char *b = strrchr(o->models[i], '/');
        r->models[i].name = strdup(b ? b + 1 : o->models[i]);
        r->n_models = i + 1;
        if (!r->paths[i] || !r->models[i].name) goto oom;
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    if (pthread_create(&r->thread, NULL, reg_main, r) != 0) {
        pthread_mutex_destroy(&r->mu);
        pthread_cond_destroy(&r->cv);
        reg_free(r);
        return st_errf(err, "registration: cannot start the thread"), NULL;
    }
    return r;
oom:
    reg_free(r);
    return st_errf(err, "registration: out of memory"), NULL;
}

void reg_set_load(reg_client *r, const reg_load *l)
{
    pthread_mutex_lock(&r->mu);
    r->load = *l;
    pthread_mutex_unlock(&r->mu);
}

int reg_registered(reg_client *r)
{
    pthread_mutex_lock(&r->mu);
    int v = r->registered;
    pthread_mutex_unlock(&r->mu);
    return v;
}

uint64_t reg_serving_epoch(reg_client *r)
{
    pthread_mutex_lock(&r->mu);
    uint64_t v = r->serving_epoch;
    pthread_mutex_unlock(&r->mu);
    return v;
}

void reg_leave(reg_client *r, const char *reason)
{
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    r->leave_reason = reason ? reason : "shutting down";
    pthread_mutex_unlock(&r->mu);
    reg_stop(r);
}

void reg_stop(reg_client *r)
{
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->thread, NULL);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    reg_free(r);
}
