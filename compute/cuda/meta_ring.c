/* meta_ring.c — the segment rule of meta_ring.h. */
#include "compute/cuda/meta_ring.h"

#include <string.h>

size_t meta_ring_aligned(size_t n) {
    if (n == 0) n = 1;
    return (n + META_RING_ALIGN - 1) / META_RING_ALIGN * META_RING_ALIGN;
}

size_t meta_ring_seg_bytes_for(size_t max_op_bytes) {
    size_t s = meta_ring_aligned(max_op_bytes);
    return s < ((size_t)1 << 20) ? (size_t)1 << 20 : s;
}

int meta_ring_init(meta_ring *r, size_t seg_bytes, int n_segs, const meta_ring_ops *ops, void *ctx,
                   st_err *err) {
    memset(r, 0, sizeof *r);
    if (seg_bytes == 0 || seg_bytes % META_RING_ALIGN || n_segs < 2 || n_segs > META_RING_MAX_SEGS || !ops)
        return st_errf(err, "meta ring: %zu-byte segments x %d is not a ring (multiples of %d bytes, 2..%d segments)",
                       seg_bytes, n_segs, META_RING_ALIGN, META_RING_MAX_SEGS);
    r->ops = ops;
    r->ctx = ctx;
    r->seg_bytes = seg_bytes;
    r->n_segs = n_segs;
    return 0;
}

meta_ring_ref meta_ring_ref_of(const meta_ring *r, int64_t at, size_t bytes) {
    meta_ring_ref ref = {.at = -1};
    if (at < 0 || r->seg_bytes == 0) return ref;
    ref.at = at;
    ref.bytes = bytes;
    ref.seg = (int)((size_t)at / r->seg_bytes);
    ref.opened = r->opened[ref.seg];
    return ref;
}

bool meta_ring_still_has(const meta_ring *r, const meta_ring_ref *ref) {
    return ref && ref->at >= 0 && ref->seg >= 0 && ref->seg < r->n_segs && r->opened[ref->seg] == ref->opened;
}

int64_t meta_ring_take(meta_ring *r, size_t n, st_err *err) {
    const size_t need = meta_ring_aligned(n);
    if (need > r->seg_bytes)
        return st_errf(err, "meta ring: %zu bytes of op metadata exceed its %zu-byte segments", n, r->seg_bytes);
    if (r->off + need > r->seg_bytes) {
        if (r->ops->record(r->ctx, r->cur, err)) return -1;
        r->pending[r->cur] = true;
        r->closes++;
        r->cur = (r->cur + 1) % r->n_segs;
        r->off = 0;
        r->opened[r->cur]++;
    }
    /* Outside the branch: a wait that failed is made again at the next take. */
    if (r->pending[r->cur]) {
        if (r->ops->wait(r->ctx, r->cur, err)) return -1;
        r->pending[r->cur] = false;
        r->waits++;
    }
    int64_t at = (int64_t)((size_t)r->cur * r->seg_bytes + r->off);
    r->off += need;
    r->takes++;
    return at;
}
