/* registry.h — the coordinator's node registry (live mode): the workers that
 * registered over gRPC (strata.v1.Control/Register), their leases, resources,
 * model checksums, last load (Heartbeat) and their state:
 *
 *   REGISTERED  after Register, until its first heartbeat
 *   READY       heartbeating
 *   SUSPECT     no heartbeat for suspect_after_missed intervals (default 3)
 *   DEAD        no heartbeat for dead_after_ms; the lease is revoked, so the
 *               next heartbeat is answered `reregister` and the node rejoins
 *               by registering again
 *   DRAINING    the operator drained it (stratactl drain): no new work; a
 *               drained node stays DRAINING until it registers again or is
 *               undrained (stratactl undrain: back to READY)
 *
 * Lookups by name go through a hash index (open addressing, linear probing):
 * Register and Heartbeat cost O(1), and a heartbeat allocates nothing.
 * Removal (registry_remove) moves the last node into the freed slot, so a
 * reg_node pointer is valid only until the next add or remove.
 *
 * Time is passed in (monotonic seconds) so that tests can drive it. State
 * changes happen in registry_tick (call it often: every heartbeat interval / 4)
 * and on Register / Heartbeat. Everything on the coordinator's loop thread,
 * but registry_lease_is (any thread).
 * Values of `state` are proto/control.proto's NodeState.
 */
#ifndef STRATA_COORDINATOR_REGISTRY_H
#define STRATA_COORDINATOR_REGISTRY_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"

#define REG_NAME_MAX 64
#define REG_ADDR_MAX 300

enum reg_state {
    REG_REGISTERED = 1,
    REG_READY = 2,
    REG_SUSPECT = 3,
    REG_DEAD = 4,
    REG_DRAINING = 5,
};

#define REG_GPU_MAX 16

/* One GPU of a node (RegisterRequest's Device.gpus). */
typedef struct reg_gpu {
    char name[64];
    uint64_t memory;   /* bytes */
    char pci_bus_id[16];
    int numa;          /* NUMA node, -1 = unknown */
} reg_gpu;

#define REG_NIC_MAX 32
#define REG_LINK_CELL 8

/* A GPU node's link matrix as it registered it (Gpu.links, Gpu.nic_links,
 * RegisterRequest.nics): the classes of `nvidia-smi topo -m` ("X", "NV18",
 * "PIX", "PXB", "PHB", "NODE", "SYS"), GPUs in Device.gpus order. */
typedef struct reg_links {
    int n_nic;
    char nic[REG_NIC_MAX][32];
    char gg[REG_GPU_MAX][REG_GPU_MAX][REG_LINK_CELL]; /* GPU i to GPU j */
    char gn[REG_GPU_MAX][REG_NIC_MAX][REG_LINK_CELL]; /* GPU i to NIC k */
} reg_links;

/* True when cell is one of the classes above ("NV<n>": n in 1..99). */
bool reg_link_valid(const char *cell);

typedef struct reg_node {
    char name[REG_NAME_MAX];
    uint64_t lease;            /* 0: none (dead, or known from the state file only) */
    int state;                 /* enum reg_state; 0 = known from the state file, not registered */
    double last_seen;          /* monotonic s of the last heartbeat or Register */
    double dead_since;         /* monotonic s it turned DEAD (timeout or Leave) */
    char device_kind[16];      /* "cpu", "cuda" */
    uint32_t device_count;
    uint64_t device_memory;    /* bytes, each */
    uint64_t host_memory;      /* bytes */
    uint32_t tp_limit;         /* the link matrix's TP rule (ib/gpu_links.h); 0 = not reported */
    char link_summary[256];    /* one line for stratactl nodes; "" = none */
    int n_gpus;
    reg_gpu gpus[REG_GPU_MAX];
    reg_links *links;          /* NULL: not reported; owned (only GPU nodes pay for it) */
    uint32_t numa_nodes;
    char data_address[REG_ADDR_MAX];
    /* last heartbeat */
    uint32_t running_sequences, kv_blocks_used, kv_blocks_free;
    double busy_fraction;
    uint64_t bytes_sent;
    uint64_t heartbeats;
    /* Accepted Registers under this name (0: known from the state file only).
     * A new value means a worker that registered again: restarted, or back
     * from dead. It holds no stage of an epoch assigned before (a restarted
     * process has none; one declared dead may have been fenced), so a
     * placement naming it is a change even with the same stages
     * (placement_rpc.c's same_as_current). */
    uint64_t registrations;
} reg_node;

typedef struct registry {
    reg_node *nodes;
    int n, cap;
    int *index;                    /* hash slots: node index + 1, 0 = empty */
    uint32_t index_mask;           /* slots - 1 (a power of two >= 2 * cap) */
    uint32_t heartbeat_ms;         /* > 0 */
    uint32_t suspect_after_missed; /* > 0 */
    uint32_t dead_after_ms;        /* > 0 */
    uint64_t lease_seed;           /* leases differ between coordinator processes */
    /* Held by the loop's thread while it changes what registry_lease_is
     * reads (nodes, n, index, a node's name or lease) and by
     * registry_lease_is itself; the loop reads without it. */
    pthread_mutex_t mu;
} registry;

/* What Register carries (borrowed strings). */
typedef struct reg_info {
    const char *name;
    const char *device_kind;
    uint32_t device_count;
    uint64_t device_memory, host_memory;
    uint32_t numa_nodes;
    const char *data_address;
    uint32_t tp_limit;        /* 0 = not reported */
    const char *link_summary; /* NULL = none */
    int n_gpus;
    const reg_gpu *gpus;
    const reg_links *links;   /* NULL = none; copied. Its rows are n_gpus long. */
} reg_info;

void registry_init(registry *r, uint32_t heartbeat_ms, uint32_t suspect_after_missed,
                   uint32_t dead_after_ms, uint64_t lease_seed);
void registry_free(registry *r);

reg_node *registry_find(registry *r, const char *name);
/* A node known from the state file (state 0, no lease) unless present. */
reg_node *registry_add_known(registry *r, const char *name, const char *data_address);

/* Registers (or re-registers) a node: a fresh lease, state REGISTERED (a
 * draining node is no longer draining), registrations + 1. -1 + err (INVALID_ARGUMENT-worthy:
 * empty name, name too long, no data address) otherwise. */
int registry_register(registry *r, const reg_info *in, double now, uint64_t *lease, st_err *err);

typedef struct reg_load {
    uint32_t running_sequences, kv_blocks_used, kv_blocks_free;
    double busy_fraction;
    uint64_t bytes_sent;
} reg_load;
/* The one call for another thread (the coordinator's rpc thread answers
 * heartbeats there, control/hb_inbox.h): true when name is registered under
 * this lease (nonzero) right now. */
bool registry_lease_is(registry *r, const char *name, uint64_t lease);
/* A heartbeat: 0 (state READY unless DRAINING), or 1 = unknown node or lease
 * (answer reregister). */
int registry_heartbeat(registry *r, const char *name, uint64_t lease, const reg_load *l,
                       double now);

/* Applies the timeouts. Returns the number of nodes whose state changed;
 * each change is logged. */
int registry_tick(registry *r, double now);

/* Whole missed heartbeat intervals since the node was last seen. */
uint32_t registry_missed(const registry *r, const reg_node *n, double now);

/* Undrain: a DRAINING node goes back to READY (the timeouts apply to it as
 * to any ready node). -1 + err otherwise: unknown node ("unknown node"), or
 * not draining ("node-a is ready, not draining"). */
int registry_undrain(registry *r, const char *name, st_err *err);

/* Leave (the worker shuts down): the node turns DEAD and its lease is
 * revoked at once, as after the heartbeat timeout; it joins again by
 * registering. -1 + err for an unknown node or a lease that is not its
 * current one. */
int registry_leave(registry *r, const char *name, uint64_t lease, st_err *err);

/* Removes the node's record (its lease goes with it: a heartbeat under it
 * answers reregister, and a Register after it is a new node, registrations
 * 1). 0, or 1 when no node has that name. */
int registry_remove(registry *r, const char *name);

/* Usable for placement: registered or ready, and not draining. */
bool registry_usable(const reg_node *n);

/* "registered", "ready", "suspect", "dead", "draining", "unknown". */
const char *registry_state_name(int state);

/* Read API for metrics and status: fn for every node with its heartbeat age
 * in seconds (now - last_seen). */
typedef void (*registry_fn)(const reg_node *n, double heartbeat_age_s, void *ud);
void registry_foreach(const registry *r, double now, registry_fn fn, void *ud);

#endif
