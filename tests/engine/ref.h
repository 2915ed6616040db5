/* ref.h — loads the golden llama.cpp references (../shared/reference, JSON)
 * for the engine tests. */
#ifndef STRATA_TESTS_ENGINE_REF_H
#define STRATA_TESTS_ENGINE_REF_H

#include <stdint.h>

typedef struct ref_case {
    int32_t *prompt;
    int n_prompt;
    int32_t *completion;
    int n_completion;
    int n_top_steps;           /* steps with top-3 logprobs (0 when absent) */
    int32_t top_ids[4][3];
    double top_lp[4][3];
} ref_case;

/* Reads all cases of a reference file; exits on a malformed file. */
ref_case *ref_load(const char *path, int *n_out);
void ref_free(ref_case *c, int n);

#endif
