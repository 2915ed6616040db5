/* registry.c — nodes, leases, heartbeats and failure detection (registry.h). */
#include "coordinator/control/registry.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

void registry_init(registry *r, uint32_t heartbeat_ms, uint32_t suspect_after_missed,
                   uint32_t dead_after_ms, uint64_t lease_seed) {
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    r->heartbeat_ms = heartbeat_ms ? heartbeat_ms : 1000;
    r->suspect_after_missed = suspect_after_missed ? suspect_after_missed : 3;
    r->dead_after_ms = dead_after_ms ? dead_after_ms : 10000;
    r->lease_seed = lease_seed;
}

void registry_free(registry *r) {
    for (int i = 0; i < r->n; i++) free(r->nodes[i].links);
    free(r->nodes);
    free(r->index);
    pthread_mutex_destroy(&r->mu);
    memset(r, 0, sizeof *r);
}

/* FNV-1a */
static uint32_t name_hash(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

/* The slot of name, or of the empty slot where it would go. */
static uint32_t slot_of(const registry *r, const char *name) {
    uint32_t i = name_hash(name) & r->index_mask;
    while (r->index[i] && strcmp(r->nodes[r->index[i] - 1].name, name)) i = (i + 1) & r->index_mask;
    return i;
}

static int index_rebuild(registry *r, uint32_t slots) {
    int *idx = calloc(slots, sizeof *idx);
    if (!idx) return -1;
    free(r->index);
    r->index = idx;
    r->index_mask = slots - 1;
    for (int k = 0; k < r->n; k++) r->index[slot_of(r, r->nodes[k].name)] = k + 1;
    return 0;
}

reg_node *registry_find(registry *r, const char *name) {
    if (!r->index) return NULL;
    int k = r->index[slot_of(r, name)];
    return k ? &r->nodes[k - 1] : NULL;
}

static reg_node *add_locked(registry *r, const char *name) {
    if (r->n == r->cap) {
        int cap = r->cap ? r->cap * 2 : 8;
        reg_node *nn = realloc(r->nodes, sizeof *nn * (size_t)cap);
        if (!nn) return NULL;
        r->nodes = nn;
        r->cap = cap;
    }
    if (!r->index || (uint32_t)r->cap * 2 > r->index_mask + 1) {
        uint32_t slots = 16;
        while (slots < (uint32_t)r->cap * 2) slots *= 2;
        if (index_rebuild(r, slots) != 0) return NULL;
    }
    reg_node *n = &r->nodes[r->n++];
    memset(n, 0, sizeof *n);
    snprintf(n->name, sizeof n->name, "%s", name);
    r->index[slot_of(r, n->name)] = r->n;
    return n;
}

static reg_node *add(registry *r, const char *name) {
    pthread_mutex_lock(&r->mu);
    reg_node *n = add_locked(r, name);
    pthread_mutex_unlock(&r->mu);
    return n;
}

static void set_lease(registry *r, reg_node *n, uint64_t lease) {
    pthread_mutex_lock(&r->mu);
    n->lease = lease;
    pthread_mutex_unlock(&r->mu);
}

bool registry_lease_is(registry *r, const char *name, uint64_t lease) {
    pthread_mutex_lock(&r->mu);
    const reg_node *n = registry_find(r, name);
    bool ok = n && n->lease && n->lease == lease;
    pthread_mutex_unlock(&r->mu);
    return ok;
}

static int remove_locked(registry *r, const char *name) {
    if (!r->index) return 1;
    uint32_t i = slot_of(r, name);
    int k = r->index[i];
    if (!k) return 1;
    /* backward-shift deletion keeps every probe chain unbroken */
    r->index[i] = 0;
    for (uint32_t j = (i + 1) & r->index_mask; r->index[j]; j = (j + 1) & r->index_mask) {
        uint32_t home = name_hash(r->nodes[r->index[j] - 1].name) & r->index_mask;
        if (((j - home) & r->index_mask) >= ((j - i) & r->index_mask)) {
            r->index[i] = r->index[j];
            r->index[j] = 0;
            i = j;
        }
    }
    int last = r->n - 1;
    free(r->nodes[k - 1].links);
    r->nodes[k - 1].links = NULL;
    if (k - 1 != last) { /* the last node moves into the freed place */
        r->nodes[k - 1] = r->nodes[last];
        r->index[slot_of(r, r->nodes[k - 1].name)] = k;
    }
    r->n--;
    return 0;
}

int registry_remove(registry *r, const char *name) {
    pthread_mutex_lock(&r->mu);
    int rc = remove_locked(r, name);
    pthread_mutex_unlock(&r->mu);
    return rc;
}

reg_node *registry_add_known(registry *r, const char *name, const char *data_address) {
    reg_node *n = registry_find(r, name);
    if (n) return n;
    if (strlen(name) >= REG_NAME_MAX || !(n = add(r, name))) return NULL;
    snprintf(n->data_address, sizeof n->data_address, "%s", data_address ? data_address : "");
    return n;
}

/* splitmix64: leases are unguessable enough across restarts and never 0. */
static uint64_t next_lease(registry *r) {
    uint64_t z = (r->lease_seed += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return z ? z : 1;
}

int registry_register(registry *r, const reg_info *in, double now, uint64_t *lease, st_err *err) {
    if (!in->name || !in->name[0]) return st_errf(err, "Register: empty node name");
    if (strlen(in->name) >= REG_NAME_MAX)
        return st_errf(err, "Register: node name longer than %d characters", REG_NAME_MAX - 1);
    if (!in->data_address || !in->data_address[0])
        return st_errf(err, "Register: node %s has no data_address", in->name);
    if (strlen(in->data_address) >= REG_ADDR_MAX)
        return st_errf(err, "Register: node %s: data_address too long", in->name);
    reg_node *n = registry_find(r, in->name);
    if (!n && !(n = add(r, in->name))) return st_errf(err, "Register: out of memory");
    bool again = n->state != 0;
    set_lease(r, n, next_lease(r));
    n->registrations++;
    n->state = REG_REGISTERED;
    n->last_seen = now;
    snprintf(n->device_kind, sizeof n->device_kind, "%s",
             in->device_kind && in->device_kind[0] ? in->device_kind : "cpu");
    n->device_count = in->device_count ? in->device_count : 1;
    n->device_memory = in->device_memory;
    n->host_memory = in->host_memory;
    n->numa_nodes = in->numa_nodes ? in->numa_nodes : 1;
    n->tp_limit = in->tp_limit;
    snprintf(n->link_summary, sizeof n->link_summary, "%s", in->link_summary ? in->link_summary : "");
    n->n_gpus = in->n_gpus < REG_GPU_MAX ? (in->n_gpus > 0 ? in->n_gpus : 0) : REG_GPU_MAX;
    for (int i = 0; i < n->n_gpus; i++) n->gpus[i] = in->gpus[i];
    if (in->links && n->n_gpus > 0) {
        if (!n->links && !(n->links = malloc(sizeof *n->links))) return st_errf(err, "Register: out of memory");
        *n->links = *in->links;
    } else {
        free(n->links);
        n->links = NULL;
    }
    snprintf(n->data_address, sizeof n->data_address, "%s", in->data_address);
    n->running_sequences = n->kv_blocks_used = n->kv_blocks_free = 0;
    n->busy_fraction = 0;
    ST_INFO("registry: %s %s: %u %s device(s) of %llu bytes, host memory %llu, data plane %s",
            n->name, again ? "registered again" : "registered", n->device_count, n->device_kind,
            (unsigned long long)n->device_memory, (unsigned long long)n->host_memory,
            n->data_address);
    *lease = n->lease;
    return 0;
}

int registry_heartbeat(registry *r, const char *name, uint64_t lease, const reg_load *l,
                       double now) {
    reg_node *n = registry_find(r, name);
    if (!n || !n->lease || n->lease != lease) return 1;
    n->last_seen = now;
    n->heartbeats++;
    if (n->state != REG_DRAINING && n->state != REG_READY) {
        if (n->state == REG_SUSPECT) ST_INFO("registry: %s is back (ready)", n->name);
        n->state = REG_READY;
    }
    if (l) {
        n->running_sequences = l->running_sequences;
        n->kv_blocks_used = l->kv_blocks_used;
        n->kv_blocks_free = l->kv_blocks_free;
        n->busy_fraction = l->busy_fraction;
        n->bytes_sent = l->bytes_sent;
    }
    return 0;
}

uint32_t registry_missed(const registry *r, const reg_node *n, double now) {
    if (!n->state) return 0;
    double age = now - n->last_seen;
    if (age <= 0) return 0;
    return (uint32_t)(age * 1000.0 / r->heartbeat_ms);
}

int registry_tick(registry *r, double now) {
    int changed = 0;
    for (int i = 0; i < r->n; i++) {
        reg_node *n = &r->nodes[i];
        if (!n->state || n->state == REG_DEAD) continue;
        double age_ms = (now - n->last_seen) * 1000.0;
        if (age_ms > r->dead_after_ms) {
            ST_WARN("registry: %s is dead: no heartbeat for %.0f ms (timeout %u ms); lease revoked",
                    n->name, age_ms, r->dead_after_ms);
            n->state = REG_DEAD;
            n->dead_since = now;
            set_lease(r, n, 0);
            changed++;
        } else if (n->state == REG_READY && age_ms > (double)r->suspect_after_missed * r->heartbeat_ms) {
            ST_WARN("registry: %s is suspect: %u heartbeats missed", n->name,
                    registry_missed(r, n, now));
            n->state = REG_SUSPECT;
            changed++;
        }
    }
    return changed;
}

int registry_leave(registry *r, const char *name, uint64_t lease, st_err *err) {
    reg_node *n = registry_find(r, name);
    if (!n || !n->state || !lease || n->lease != lease)
        return st_errf(err, "unknown node \"%s\" or lease", name);
    n->state = REG_DEAD;
    n->dead_since = n->last_seen > 0 ? n->last_seen : 0; /* Leave: dead now (no clock here) */
    set_lease(r, n, 0);
    return 0;
}

int registry_undrain(registry *r, const char *name, st_err *err) {
    reg_node *n = registry_find(r, name);
    if (!n || !n->state) return st_errf(err, "unknown node \"%s\"", name);
    if (n->state != REG_DRAINING)
        return st_errf(err, "%s is %s, not draining", n->name, registry_state_name(n->state));
    n->state = REG_READY;
    ST_INFO("registry: %s undrained (ready)", n->name);
    return 0;
}

bool reg_link_valid(const char *c) {
    static const char *const k[] = {"X", "PIX", "PXB", "PHB", "NODE", "SYS"};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (!strcmp(c, k[i])) return true;
    if (strncmp(c, "NV", 2) || c[2] < '1' || c[2] > '9') return false;
    return !c[3] || (c[3] >= '0' && c[3] <= '9' && !c[4]);
}

bool registry_usable(const reg_node *n) {
    return n->state == REG_REGISTERED || n->state == REG_READY;
}

const char *registry_state_name(int state) {
    switch (state) {
    case REG_REGISTERED: return "registered";
    case REG_READY: return "ready";
    case REG_SUSPECT: return "suspect";
    case REG_DEAD: return "dead";
    case REG_DRAINING: return "draining";
    default: return "unknown";
    }
}

void registry_foreach(const registry *r, double now, registry_fn fn, void *ud) {
    for (int i = 0; i < r->n; i++) fn(&r->nodes[i], now - r->nodes[i].last_seen, ud);
}
