/* act_transport.h — how the activations cross one pipeline boundary (stage
 * k -> stage k+1), chosen by one pure function from what both sides are and
 * can do, and the operator's --activation-transport override. The worker
 * negotiates it over the data plane (daemon/act_link.h) and logs the result
 * as "boundary K->K+1: NAME (REASON)". docs/cuda-backend.md, "Activations
 * between stages", has the table.
 *
 * Transports:
 *   ucx         host memory on both sides (CPU stages): today's path, the
 *               payload in registered pageable buffers (ucp_mem_map).
 *   ucx-pinned  a GPU stage on one side or both, UCX without CUDA memory
 *               support (Debian's UCX 1.13): the GPU side stages its rows
 *               through pinned (cudaHostAlloc), UCX-registered host buffers,
 *               never pageable memory (a pageable copy costs the driver a
 *               bounce through its own pinned buffer).
 *   ucx-cuda    both stages on GPUs and both UCX contexts report
 *               UCS_MEMORY_TYPE_CUDA (HPC-X, MOFED): device buffers are
 *               registered as CUDA memory, so UCX uses cuda_ipc on one node
 *               and GPUDirect RDMA across nodes.
 *   nccl        both stages on GPUs with NCCL point-to-point (ncclSend /
 *               ncclRecv on a 2-rank communicator per boundary), as vLLM and
 *               SGLang move pipeline activations; where GPUDirect RDMA and
 *               the NCCL_IB_* settings (ib/fabric_env.h) take effect.
 *
 * No state, no I/O: the same inputs give the same choice on either side.
 */
#ifndef STRATA_IB_ACT_TRANSPORT_H
#define STRATA_IB_ACT_TRANSPORT_H

#include <stdbool.h>

enum act_xport { ACT_XPORT_UCX = 0, ACT_XPORT_UCX_PINNED = 1, ACT_XPORT_UCX_CUDA = 2, ACT_XPORT_NCCL = 3 };

/* --activation-transport: auto (the table below), ucx (never NCCL) or nccl
 * (NCCL where both sides can; otherwise the auto choice without NCCL, and
 * the reason says the override was not honoured). */
enum act_override { ACT_OVERRIDE_AUTO = 0, ACT_OVERRIDE_UCX = 1, ACT_OVERRIDE_NCCL = 2 };

/* One side of the boundary. */
typedef struct act_side {
    bool gpu;      /* the stage runs on a device backend ("cuda") */
    bool nccl;     /* this worker can run the NCCL point-to-point transport */
    bool ucx_cuda; /* UCX takes CUDA memory here and the worker hands it device buffers */
} act_side;

typedef struct act_boundary {
    act_side send, recv;      /* stage k, stage k+1 */
    bool same_node;           /* both workers on one machine (the same machine id) */
    bool same_gpu;            /* ... and both stages' first rank on the same GPU (NCCL needs two) */
    enum act_override override;
} act_boundary;

typedef struct act_choice {
    enum act_xport xport;
    bool override_refused;    /* --activation-transport nccl could not be honoured */
    char reason[384];         /* one line, for the log and the peer */
} act_choice;

/* The transport of a boundary. NCCL is out when both stages sit on one GPU
 * (a communicator takes one rank per GPU). Auto rules, in order:
 *   a CPU stage on either side           -> ucx (both CPU) or ucx-pinned;
 *   both GPU, different nodes, NCCL both -> nccl;
 *   both GPU, UCX CUDA memory both       -> ucx-cuda (cuda_ipc on one node,
 *                                           GPUDirect RDMA across);
 *   both GPU, one node, NCCL both        -> nccl (P2P/NVLink, no host copy);
 *   else                                 -> ucx-pinned.
 * ucx removes NCCL from the candidates; nccl puts it first where both sides
 * can run it. */
act_choice act_transport_choose(const act_boundary *b);

/* "ucx", "ucx-pinned", "ucx-cuda", "nccl" ("?" for anything else). */
const char *act_xport_name(enum act_xport x);
/* The name back (0), or -1 for an unknown one. */
int act_xport_parse(const char *s, enum act_xport *out);
/* "auto", "ucx", "nccl" <-> the enum; parse returns 0 or -1. */
const char *act_override_name(enum act_override o);
int act_override_parse(const char *s, enum act_override *out);

#endif
