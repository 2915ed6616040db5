/* partition.c — layer placement over pipeline stages. See partition.h. */
#include "coordinator/config/partition.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>

int place_even_split(int n_layers, int n_stages, int *counts, st_err *err) {
    if (n_stages < 1) return st_errf(err, "partition: need at least one stage (got %d)", n_stages);
    if (n_stages > PLACE_MAX_STAGES)
        return st_errf(err, "partition: %d stages exceed the limit of %d", n_stages,
                       PLACE_MAX_STAGES);
    if (n_layers < 1) return st_errf(err, "partition: the model has no layers (%d)", n_layers);
    if (n_stages > n_layers)
        return st_errf(err,
                       "partition: %d stages for %d layers: every stage needs at least one layer",
                       n_stages, n_layers);
    int base = n_layers / n_stages, rem = n_layers % n_stages;
    for (int i = 0; i < n_stages; i++) counts[i] = base + (i < rem ? 1 : 0);
    return 0;
}

int place_check(int n_layers, const int *counts, int n_stages, st_err *err) {
    if (n_stages < 1) return st_errf(err, "partition: need at least one stage (got %d)", n_stages);
    if (n_stages > n_layers)
        return st_errf(err,
                       "partition: %d stages for %d layers: every stage needs at least one layer",
                       n_stages, n_layers);
    long sum = 0;
    for (int i = 0; i < n_stages; i++) {
        if (counts[i] < 1)
            return st_errf(err, "partition: stage %d has %d layers; every stage needs at least one",
                           i, counts[i]);
        sum += counts[i];
    }
    if (sum != n_layers)
        return st_errf(err,
                       "partition: the stages hold %ld layers but the model has %d; each layer must "
                       "be placed exactly once",
                       sum, n_layers);
    return 0;
}

int place_parse_list(const char *s, int *counts, int max, int *n_out, st_err *err) {
    int n = 0;
    const char *p = s;
    *n_out = 0;
    for (;;) {
        while (*p == ' ' || *p == '\t') p++;
        if (!isdigit((unsigned char)*p))
            return st_errf(err, "partition '%s': item %d is not a positive integer", s, n + 1);
        errno = 0;
        char *end;
        long v = strtol(p, &end, 10);
        if (errno || v < 1 || v > 1000000)
            return st_errf(err, "partition '%s': item %d must be a layer count >= 1", s, n + 1);
        if (n >= max)
            return st_errf(err, "partition '%s': more than %d stages", s, max);
        counts[n++] = (int)v;
        p = end;
        while (*p == ' ' || *p == '\t') p++;
        if (*p == '\0') break;
        if (*p != ',')
            return st_errf(err, "partition '%s': unexpected '%c' after item %d", s, *p, n);
        p++;
    }
    *n_out = n;
    return 0;
}

int place_partition(int n_layers, int n_stages, const int *explicit_counts, int n_explicit,
                    place_range *ranges, st_err *err) {
    int counts[PLACE_MAX_STAGES];
    if (n_stages < 1 || n_stages > PLACE_MAX_STAGES)
        return st_errf(err, "partition: number of stages %d outside [1, %d]", n_stages,
                       PLACE_MAX_STAGES);
    if (explicit_counts && n_explicit > 0) {
        if (n_explicit != n_stages)
            return st_errf(err, "partition: %d layer counts given for %d stages", n_explicit,
                           n_stages);
        for (int i = 0; i < n_stages; i++) counts[i] = explicit_counts[i];
    } else if (place_even_split(n_layers, n_stages, counts, err) != 0) {
        return -1;
    }
    if (place_check(n_layers, counts, n_stages, err) != 0) return -1;
    int first = 0;
    for (int i = 0; i < n_stages; i++) {
        ranges[i].first = first;
        ranges[i].last = first + counts[i];
        first = ranges[i].last;
    }
    return 0;
}
