/* placement.h — live-mode placements: which node runs which layers (a
 * placement, with its epoch), the memory a stage needs, the automatic
 * placement and the checks of an explicit one. Pure functions (no I/O).
 *
 * Memory of a stage (bytes) = its layers' weights (GGUF tensor bytes of
 * blk.N.*) + the KV-cache budget of its layers (kv_blocks * block_size tokens
 * * 2 (K and V) * n_head_kv * head_dim * 4 bytes, f32, per layer) + the token
 * embedding on the first stage + the final norm and LM head on the last.
 * A node's memory: host memory for CPU nodes, device count * device memory
 * otherwise.
 *
 * Automatic placement (place_auto): the usable nodes in name order; a node
 * whose memory cannot hold one layer (plus the embedding / LM head where it
 * sits) gets no stage. Layers are split in proportion to the memory each node
 * has left for weights + KV (after the embedding / LM head), rounded down,
 * every node at least one layer and at most what fits; the layers left over
 * go one each to the EARLIER stages (vLLM's get_pp_indices rule: equal
 * nodes give the even split with the remainder first). TP = the node's device
 * count, except CPU nodes: TP 1 (one rank uses all the node's cores; the
 * all-reduce between CPU ranks costs more than it saves). A model that does
 * not fit is refused (RESOURCE_EXHAUSTED) with the shortfall in bytes.
 *
 * Errors fill err and *code with a gRPC status code (rpc/rpc_code.h values).
 */
#ifndef STRATA_COORDINATOR_PLACEMENT_H
#define STRATA_COORDINATOR_PLACEMENT_H

#include <stdint.h>

#include "common/err.h"
#include "coordinator/config/partition.h"

/* Stages of one placement. A stage holds at least one layer, so a placement
 * has at most one stage per layer: the real limit is the model's layer count
 * (PLACE_MAX_STAGES, config/partition.h). The number of NODES is not limited:
 * candidate lists are as long as the registry; automatic placement uses the
 * first n_layers usable nodes that can hold a layer (name order). */
#define PLACE_STAGE_MAX PLACE_MAX_STAGES

typedef struct place_stage {
    char node[64];
    int first, last; /* layers, INCLUSIVE (the control API's convention) */
    int tp;
} place_stage;

typedef struct placement {
    uint64_t epoch;  /* 0 = none */
    int n_layers;
    int n_stages;
    place_stage st[PLACE_STAGE_MAX];
} placement;

typedef struct place_model {
    int n_layers;
    uint64_t layer_bytes[PLACE_MAX_STAGES]; /* weights per layer (n_layers entries, <= 256) */
    uint64_t embd_bytes;                    /* token_embd.weight */
    uint64_t head_bytes;                    /* output_norm + output.weight (0 when tied) */
    uint64_t kv_bytes_per_layer;            /* the KV budget of one layer */
} place_model;

typedef struct place_node {
    const char *name;
    uint64_t memory; /* bytes available for the stage */
    int tp;          /* TP the node would run */
} place_node;

/* Bytes a stage of layers first..last (inclusive) needs. */
uint64_t place_stage_bytes(const place_model *m, int first, int last, int n_layers);

/* Automatic placement over nodes[n] (already filtered to the usable ones).
 * out->epoch is left 0. */
int place_auto(const place_model *m, const place_node *nodes, int n, placement *out, int *code,
               st_err *err);

/* Checks an explicit placement: stages in pipeline order, each node known
 * (in nodes[]) and usable, layer ranges contiguous from 0 to n_layers-1
 * (overlap: "layer 3 is covered twice"; gap: "layers 3-4 are not covered"),
 * each stage's memory within its node's, a node at most once. tp 0 = the
 * node's. On success the stages are copied to out (epoch left 0). */
int place_check_explicit(const place_model *m, const place_node *nodes, int n, const place_stage *stages,
                int n_stages, placement *out, int *code, st_err *err);

/* "12.3 MiB" into buf. */
const char *place_fmt_bytes(uint64_t b, char *buf, size_t cap);

/* The TP a node runs by the seed's rule (ib/gpu_links.h): 1 on a CPU node;
 * on a GPU node the GPUs joined by NVLink, as the worker's link matrix
 * reported in tp_limit, and never more than device_count; a GPU node that
 * reported no limit gets the PCIe bound, 2. A placement naming a larger TP
 * is the operator's override (place_check warns). */
int place_node_tp(const char *device_kind, uint32_t device_count, uint32_t tp_limit);

#endif
