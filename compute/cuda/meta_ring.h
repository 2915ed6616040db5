/* meta_ring.h — the reuse rule of the CUDA backend's metadata ring: a
 * pinned host buffer (cudaHostAlloc) and a device buffer of the same size,
 * cut into n_segs segments. Each op's small host metadata (positions, slots,
 * block tables, token ids) is written into the next free bytes of the host
 * ring and copied asynchronously (cudaMemcpyAsync from pinned memory: no
 * driver bounce, no host wait) to the same offset of the device ring. Plain C,
 * no CUDA: the events come through meta_ring_ops, so a CPU test
 * (tests/backend/test_meta_ring.c) checks the rule with fake events.
 *
 * The rule: when a take does not fit in the rest of the current segment, the
 * segment is closed (record: an event on the stream after every copy issued
 * from it) and the next one opened; a segment used before is first waited for
 * (its event), because the GPU may still be copying from its host bytes. With
 * 4 segments the host waits only when the GPU is 3 segments of metadata
 * behind, which a forward never is. Device bytes need no event: the copies
 * and the kernels that read them are ordered on one stream.
 *
 * Contract: issue the copy from a taken range before the next take. Offsets
 * are multiples of META_RING_ALIGN; a take larger than a segment fails (the
 * caller sizes the ring, meta_ring_seg_bytes_for).
 */
#ifndef STRATA_COMPUTE_CUDA_META_RING_H
#define STRATA_COMPUTE_CUDA_META_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define META_RING_ALIGN 256
#define META_RING_MAX_SEGS 16

typedef struct meta_ring_ops {
    /* Segment seg's event <- now, on the stream. */
    int (*record)(void *ctx, int seg, st_err *err);
    /* Host waits for segment seg's last recorded event. */
    int (*wait)(void *ctx, int seg, st_err *err);
} meta_ring_ops;

typedef struct meta_ring {
    const meta_ring_ops *ops;
    void *ctx;
    size_t seg_bytes;
    int n_segs;
    int cur;       /* the segment takes come from */
    size_t off;    /* next free byte in it */
    bool pending[META_RING_MAX_SEGS]; /* recorded, not yet waited for */
    uint64_t opened[META_RING_MAX_SEGS]; /* times each segment was (re)opened */
    uint64_t takes, closes, waits;    /* counters (tests, stats) */
} meta_ring;

/* seg_bytes (a multiple of META_RING_ALIGN, >= 1) per segment, 2..META_RING_MAX_SEGS segments. */
int meta_ring_init(meta_ring *r, size_t seg_bytes, int n_segs, const meta_ring_ops *ops, void *ctx,
                   st_err *err);
/* n bytes: their offset in the ring (host and device buffers alike), or -1
 * with err when n exceeds a segment or a record/wait failed. n = 0 takes
 * META_RING_ALIGN bytes. */
int64_t meta_ring_take(meta_ring *r, size_t n, st_err *err);
/* An earlier take, to re-use its bytes (the same metadata again: the
 * positions of every layer's rope, say) without a new copy. */
typedef struct meta_ring_ref {
    int64_t at;      /* offset; -1 = none */
    size_t bytes;
    int seg;
    uint64_t opened; /* the segment's opened count when taken */
} meta_ring_ref;

/* The reference of the take that returned `at` (call right after it). */
meta_ring_ref meta_ring_ref_of(const meta_ring *r, int64_t at, size_t bytes);
/* Whether ref's bytes are still in the ring as they were taken: their
 * segment has not been reopened since (so neither the host bytes nor the
 * device copy of them were overwritten). */
bool meta_ring_still_has(const meta_ring *r, const meta_ring_ref *ref);

/* Rounds n up to META_RING_ALIGN (what a take of n uses). */
size_t meta_ring_aligned(size_t n);
/* A segment size for metadata of up to max_op_bytes per op (rounded up, at least 1 MiB). */
size_t meta_ring_seg_bytes_for(size_t max_op_bytes);

#endif
