/* partition.h — pipeline-parallel layer placement: which contiguous layer range
 * [first, last) each stage runs.
 *
 * Default rule (vLLM, vllm/distributed/utils.py get_pp_indices): an even split,
 * the remainder going one layer each to the EARLIER stages, so that the last
 * stage, which also holds the final norm and the LM head, gets no extra layer.
 *   5 layers, 2 stages -> 3,2      5 layers, 3 stages -> 2,2,1
 * An explicit list of per-stage layer counts ("2,2,1") overrides the rule. Any
 * partition that does not cover every layer exactly once is refused: a count
 * list whose sum differs from n_layers, a stage with zero (or negative) layers,
 * more stages than layers, or a list whose length differs from the number of
 * stages.
 */
#ifndef STRATA_COORDINATOR_PARTITION_H
#define STRATA_COORDINATOR_PARTITION_H

#include "common/err.h"

#define PLACE_MAX_STAGES 256

typedef struct place_range {
    int first; /* first layer of the stage */
    int last;  /* one past its last layer */
} place_range;

/* Even split of n_layers over n_stages into counts[n_stages] (the rule above).
 * -1 + err when n_stages < 1, n_layers < 1 or n_stages > n_layers. */
int place_even_split(int n_layers, int n_stages, int *counts, st_err *err);

/* Checks that counts[n_stages] covers n_layers exactly once with >= 1 layer
 * per stage. -1 + err (naming the offending stage or the sum) otherwise. */
int place_check(int n_layers, const int *counts, int n_stages, st_err *err);

/* Parses "3,2" (spaces allowed around numbers) into counts[max]; *n_out gets
 * the count. -1 + err on an empty item, a non-number, a value < 1, or more
 * than max items. Does not check the sum (place_check does). */
int place_parse_list(const char *s, int *counts, int max, int *n_out, st_err *err);

/* The placement: explicit counts (n_explicit == n_stages) when given, else
 * the even split; checked, then turned into ranges[n_stages]. */
int place_partition(int n_layers, int n_stages, const int *explicit_counts, int n_explicit,
                    place_range *ranges, st_err *err);

#endif
