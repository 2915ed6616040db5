/* dev_bufs.c — the hand-off buffer pool. See dev_bufs.h. */
#include "engine/dev_bufs.h"

#define DEV_BUF_MIN (64u << 10)

void *dev_bufs_get(dev_bufs *d, backend *be, size_t bytes, st_err *err) {
    int best = -1; /* the smallest free buffer that fits */
    for (int i = 0; i < d->n; i++)
        if (!d->bufs[i].used && d->bufs[i].cap >= bytes && (best < 0 || d->bufs[i].cap < d->bufs[best].cap))
            best = i;
    if (best >= 0) {
        d->bufs[best].used = true;
        return d->bufs[best].p;
    }
    if (d->n == DEV_BUFS_MAX) return st_errf(err, "stage: %d hand-off buffers live already", DEV_BUFS_MAX), NULL;
    size_t cap = DEV_BUF_MIN;
    while (cap < bytes) cap *= 2;
    void *p = be->ops->alloc(be, cap, err);
    if (p) d->bufs[d->n++] = (struct dev_buf){.p = p, .cap = cap, .used = true};
    return p;
}

void dev_bufs_put(dev_bufs *d, backend *be, void *p) {
    int i = 0;
    while (p && i < d->n && d->bufs[i].p != p) i++;
    if (!p || i == d->n) return;
    d->bufs[i].used = false;
    int kept = 0;
    for (int k = 0; k < d->n; k++) kept += !d->bufs[k].used;
    if (kept <= DEV_BUFS_KEEP) return;
    /* too many kept: release the smallest free one */
    int small = -1;
    for (int k = 0; k < d->n; k++)
        if (!d->bufs[k].used && (small < 0 || d->bufs[k].cap < d->bufs[small].cap)) small = k;
    be->ops->release(be, d->bufs[small].p);
    d->bufs[small] = d->bufs[--d->n];
}

void dev_bufs_release(dev_bufs *d, backend *be) {
    for (int i = 0; i < d->n; i++) be->ops->release(be, d->bufs[i].p);
    d->n = 0;
}
