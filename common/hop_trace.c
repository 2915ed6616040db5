/* hop_trace.c — see hop_trace.h. */
#include "common/hop_trace.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define HOP_TRACE_MAX 65536

struct mark {
    const char *event;
    uint64_t batch_id, ns;
};

static struct mark *marks;
static atomic_uint n_marks;
static char prefix[512];
static bool on;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void dump(void)
{
    char path[600];
    snprintf(path, sizeof path, "%s.%d", prefix, (int)getpid());
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "STRATA_HOP_TRACE: cannot write %s\n", path);
        return;
    }
    unsigned n = atomic_load(&n_marks);
    if (n > HOP_TRACE_MAX) n = HOP_TRACE_MAX;
    for (unsigned i = 0; i < n; i++)
        fprintf(f, "%s %llu %llu\n", marks[i].event, (unsigned long long)marks[i].batch_id,
                (unsigned long long)marks[i].ns);
    fclose(f);
}

static void init(void)
{
    const char *p = getenv("STRATA_HOP_TRACE");
    if (!p || !*p || snprintf(prefix, sizeof prefix, "%s", p) >= (int)sizeof prefix) return;
    marks = calloc(HOP_TRACE_MAX, sizeof *marks);
    if (!marks || atexit(dump)) return;
    on = true;
}

bool st_hop_trace_on(void)
{
    pthread_once(&once, init);
    return on;
}

void st_hop_mark(const char *event, uint64_t batch_id, uint64_t ns)
{
    if (!batch_id || !st_hop_trace_on()) return;
    unsigned i = atomic_fetch_add(&n_marks, 1);
    if (i < HOP_TRACE_MAX) marks[i] = (struct mark){event, batch_id, ns};
}
