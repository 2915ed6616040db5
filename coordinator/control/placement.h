/* placement.h — live-mode placements: which node runs which layers (a
 * placement, with its epoch), the memory a stage needs, the automatic
 * placement and the checks of an explicit one. Pure functions (no I/O).
 *
 * Memory model (bytes; docs/control-api.md, "Placement"). A stage of layers
 * first..last at TP t needs
 *   weights   sum of its layers' GGUF tensor bytes (blk.N.*), + token_embd on
 *             the first stage, + output_norm and output (or the tied
 *             token_embd) on the last;
 *   KV cache  per layer kv_blocks * kv_block_size tokens * 2 (K and V) *
 *             n_head_kv * head_dim * 4 bytes (f32), split over the TP ranks;
 *   activations  the stage's micro-batch buffers (engine/rank_workspace.c
 *             rank_workspace_prepare) for max_batch_tokens tokens, 4 bytes each:
 *             x, xn, o (n_embd) on every rank, q, att (n_head * head_dim),
 *             k, v (n_head_kv * head_dim), gate, up (n_ff) split over the
 *             ranks: max_batch_tokens * 4 * (3 * n_embd * t + 2 * n_head *
 *             head_dim + 2 * n_head_kv * head_dim + 2 * n_ff); on the last
 *             stage also the logits and their hidden rows for max_seqs
 *             sequences: max_seqs * 4 * (n_vocab + n_embd).
 * Weights and KV are split evenly over the ranks (the shard plans), so the
 * sum is compared with what the node has for t ranks:
 *   GPU node  t * one GPU's memory * gpu_memory_utilization (the smallest
 *             GPU; the rest is the CUDA context, cuBLAS/NCCL workspaces and
 *             fragmentation, as vLLM's gpu_memory_utilization), t <= GPUs;
 *   CPU node  its host memory (every rank is a thread of one process).
 *
 * Automatic placement (place_auto): the usable nodes in name order; a node
 * whose capacity at its TP cannot hold one layer plus its activations gets
 * no stage. Layers are split in proportion to the memory each node has left
 * for weights + KV (after the activations and the embedding / LM head),
 * rounded down, every node at least one layer and at most what fits; the
 * layers left over go one each to the EARLIER stages (vLLM's get_pp_indices
 * rule: equal nodes give the even split with the remainder first). TP = the
 * node's by the link rule (place_node_tp); CPU nodes: TP 1 (one rank uses all
 * the node's cores; the all-reduce between CPU ranks costs more than it
 * saves). A model that does not fit is refused (RESOURCE_EXHAUSTED) with the
 * shortfall in bytes; so is an explicit stage larger than its node.
 *
 * Errors fill err and *code with a gRPC status code (rpc/rpc_code.h values).
 */
#ifndef STRATA_COORDINATOR_PLACEMENT_H
#define STRATA_COORDINATOR_PLACEMENT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "coordinator/config/partition.h"

/* Stages of one placement. A stage holds at least one layer, so a placement
 * has at most one stage per layer: the real limit is the model's layer count
 * (PLACE_MAX_STAGES, config/partition.h). The number of NODES is not limited:
 * candidate lists are as long as the registry; automatic placement uses the
 * first n_layers usable nodes that can hold a layer (name order). */
#define PLACE_STAGE_MAX PLACE_MAX_STAGES

/* vLLM's gpu_memory_utilization default: the share of a GPU's memory a stage
 * may fill ([cluster] gpu_memory_utilization). */
#define PLACE_GPU_UTIL_DEFAULT 0.90

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
    bool head_tied;                         /* head_bytes holds only output_norm: the last
                                             * stage also holds token_embd (unless it is the first) */
    /* Activations (0 = not counted): per micro-batch token, bytes every rank
     * holds (3 * n_embd * 4) and bytes split over the ranks; the batch size;
     * the last stage's logits buffers ((n_vocab + n_embd) * 4 * max_seqs). */
    uint64_t act_token_rank, act_token_split;
    uint32_t act_tokens;
    uint64_t logits_bytes;
} place_model;

typedef struct place_node {
    const char *name;
    uint64_t memory; /* devices > 0: the usable bytes of ONE GPU (its memory *
                      * gpu_memory_utilization); 0 devices: the host memory */
    int tp;          /* TP the node would run (place_node_tp) */
    int devices;     /* GPUs; 0 = a CPU node */
} place_node;

/* A registered node as placement sees it (the rules above): kind "cpu" (or
 * NULL) uses host_memory; otherwise device_memory (one GPU) * util, and
 * tp = place_node_tp(kind, device_count, tp_limit). util in (0, 1]. */
place_node place_node_make(const char *name, const char *device_kind, uint32_t device_count,
                           uint64_t device_memory, uint64_t host_memory, uint32_t tp_limit, double util);

/* Bytes node n offers a stage at TP tp (the rule above); 0 when tp exceeds
 * its GPUs. */
uint64_t place_node_capacity(const place_node *n, int tp);

/* Weights + KV cache of a stage of layers first..last (inclusive): what it
 * loads (the load progress total). */
uint64_t place_stage_bytes(const place_model *m, int first, int last, int n_layers);

/* Everything the stage needs at TP tp: place_stage_bytes + its activations
 * (and logits on the last stage). */
uint64_t place_stage_need(const place_model *m, int first, int last, int n_layers, int tp);

/* Automatic placement over nodes[n] (already filtered to the usable ones).
 * out->epoch is left 0. */
int place_auto(const place_model *m, const place_node *nodes, int n, placement *out, int *code,
               st_err *err);

/* Checks an explicit placement: stages in pipeline order, each node known
 * (in nodes[]) and usable, layer ranges contiguous from 0 to n_layers-1
 * (overlap: "layer 3 is covered twice"; gap: "layers 3-4 are not covered"),
 * each stage's need (place_stage_need at its TP) within its node's capacity,
 * a node at most once, a TP no larger than the node's GPUs (INVALID_ARGUMENT).
 * tp 0 = the node's; a larger TP than the link rule's is honoured with a
 * warning (the operator's override). On success the stages are copied to out (epoch left 0). */
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
