/* test_engine_mem.c — each TP rank holds only its shard.
 *
 * A synth model with 4 layers of the bench-1b shape (n_embd 2048, 32 heads,
 * 8 KV heads, n_ff 8192; vocabulary reduced to 4000; F16 matrices, F32 norms)
 * is loaded at TP 2 and TP 4. Each rank's resident weight bytes, read from the
 * backend's own accounting, must be within 5% of
 *     sharded / t + replicated
 * where sharded = every 2-D matrix (embedding, Q, K, V, O, gate, up, down, LM
 * head) and replicated = the norms (2 per layer + the final one), which every
 * rank holds whole. The ranks together must hold exactly sharded + t * replicated. */
#include <stdlib.h>
#include <unistd.h>

#include "engine/stage.h"
#include "model/gguf.h"
#include "model/synth.h"
#include "tests/testutil.h"

int main(void) {
    st_err err;
    synth_params sp;
    synth_params_default(&sp);
    REQUIRE(synth_preset("bench-1b", &sp, &err) == 0);
    sp.n_layer = 4;
    sp.n_vocab = 4000;
    sp.dtype = GGML_TYPE_F16;
    char path[] = "/tmp/strata-test-mem-XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    close(fd);
    REQUIRE_MSG(synth_write(&sp, path, &err) == 0, "%s", err.msg);

    gguf_file *f = gguf_open(path, &err);
    REQUIRE_MSG(f, "%s", err.msg);
    size_t sharded = 0, replicated = 0;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if (t->n_dims == 2 && t->ne[1] > 1)
            sharded += t->nbytes;
        else
            replicated += (size_t)t->ne[0] * sizeof(float); /* norms are held as f32 */
    }
    gguf_close(f);
    CHECK_EQ_INT(replicated, (2 * 4 + 1) * 2048 * 4);
    fprintf(stderr, "sharded %.1f MiB, replicated %.1f KiB\n", sharded / 1048576.0, replicated / 1024.0);

    const int tps[2] = {2, 4};
    for (int k = 0; k < 2; k++) {
        int tp = tps[k];
        stage_params p = {.model_path = path, .last_layer = -1, .tp = tp, .n_threads = 2,
                          .kv_blocks = 1, .block_size = 16};
        stage *s = stage_open(&p, &err);
        REQUIRE_MSG(s, "%s", err.msg);
        const double expect = (double)sharded / tp + (double)replicated;
        size_t total = 0;
        for (int r = 0; r < tp; r++) {
            stage_rank_stats st;
            REQUIRE(stage_rank_stats_get(s, r, &st) == 0);
            fprintf(stderr, "tp %d rank %d: %.2f MiB (expected %.2f MiB)\n", tp, r,
                    st.weight_bytes / 1048576.0, expect / 1048576.0);
            CHECK_MSG(st.weight_bytes >= expect * 0.95 && st.weight_bytes <= expect * 1.05,
                      "tp %d rank %d: %zu bytes, expected %.0f +- 5%%", tp, r, st.weight_bytes, expect);
            total += st.weight_bytes;
        }
        CHECK_EQ_INT(total, sharded + (size_t)tp * replicated);
        stage_close(s);
    }
    unlink(path);
    return test_summary();
}
