/* ref.c — reference JSON loading (jansson) for the engine tests. */
#include "tests/engine/ref.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "tests/testutil.h"

static int32_t *ids(json_t *a, int *n) {
    REQUIRE(json_is_array(a));
    *n = (int)json_array_size(a);
    int32_t *v = malloc((size_t)(*n ? *n : 1) * sizeof *v);
    REQUIRE(v);
    for (int i = 0; i < *n; i++) v[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    return v;
}

ref_case *ref_load(const char *path, int *n_out) {
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    REQUIRE_MSG(root, "%s: %s", path, je.text);
    json_t *arr = root;
    if (json_is_object(root)) {
        arr = json_array();
        json_array_append(arr, root);
    }
    int n = (int)json_array_size(arr);
    ref_case *cs = calloc((size_t)n, sizeof *cs);
    REQUIRE(cs);
    for (int i = 0; i < n; i++) {
        json_t *o = json_array_get(arr, (size_t)i);
        cs[i].prompt = ids(json_object_get(o, "prompt_tokens"), &cs[i].n_prompt);
        cs[i].completion = ids(json_object_get(o, "completion_tokens"), &cs[i].n_completion);
        json_t *top = json_object_get(o, "top3_logprobs_first4");
        if (top) {
            cs[i].n_top_steps = (int)json_array_size(top) < 4 ? (int)json_array_size(top) : 4;
            for (int s = 0; s < cs[i].n_top_steps; s++)
                for (int k = 0; k < 3; k++) {
                    json_t *pair = json_array_get(json_array_get(top, (size_t)s), (size_t)k);
                    cs[i].top_ids[s][k] = (int32_t)json_integer_value(json_array_get(pair, 0));
                    cs[i].top_lp[s][k] = json_number_value(json_array_get(pair, 1));
                }
        }
    }
    if (arr != root) json_decref(arr);
    json_decref(root);
    *n_out = n;
    return cs;
}

void ref_free(ref_case *c, int n) {
    for (int i = 0; i < n; i++) {
        free(c[i].prompt);
        free(c[i].completion);
    }
    free(c);
}
