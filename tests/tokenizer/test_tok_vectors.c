/* test_tok_vectors.c — llama.cpp's tokenizer test vectors (test-tokenizer-0)
 * for the SentencePiece (llama-spm) and byte-level BPE (gpt-2) vocabularies:
 * every input must tokenize (add_special = false, parse_special = false) to
 * exactly the expected ids, and decode back to the input.
 *
 * File format: `.inp` is the inputs, each followed by "\n__ggml_vocab_test__\n";
 * `.out` has one line per input of space-separated ids.
 */
#define _GNU_SOURCE /* memmem */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "tests/testutil.h"

static const char SEP[] = "\n__ggml_vocab_test__\n";

static void run_vocab(const char *name, int32_t n_vocab, size_t n_expected_inputs) {
    char rel[256];
    snprintf(rel, sizeof rel, "tokenizer/%s", name);
    st_err err = {{0}};
    gguf_file *f = gguf_open(test_shared_path(rel), &err);
    REQUIRE_MSG(f, "%s", err.msg);
    tok_vocab *v = tok_vocab_load(f, &err);
    REQUIRE_MSG(v, "%s", err.msg);
    gguf_close(f); /* the vocabulary must not depend on the file */
    CHECK_EQ_INT(tok_n_vocab(v), n_vocab);

    snprintf(rel, sizeof rel, "tokenizer/%s.inp", name);
    size_t inp_len;
    char *inp = test_read_file(test_shared_path(rel), &inp_len);
    snprintf(rel, sizeof rel, "tokenizer/%s.out", name);
    size_t out_len;
    char *outf = test_read_file(test_shared_path(rel), &out_len);

    size_t pos = 0, n_inputs = 0, n_ok = 0, n_roundtrip = 0;
    char *line = outf;
    while (pos < inp_len) {
        char *sep = memmem(inp + pos, inp_len - pos, SEP, sizeof SEP - 1);
        REQUIRE_MSG(sep, "%s: input %zu has no separator", name, n_inputs);
        size_t len = (size_t)(sep - (inp + pos));
        const char *text = inp + pos;
        pos += len + sizeof SEP - 1;

        /* expected ids */
        REQUIRE_MSG(line && *line, "%s: .out has fewer lines than inputs", name);
        char *eol = strchr(line, '\n');
        if (eol) *eol = 0;
        int32_t want[1024];
        size_t n_want = 0;
        for (char *p = line, *end; n_want < 1024; p = end) {
            long x = strtol(p, &end, 10);
            if (end == p) break;
            want[n_want++] = (int32_t)x;
        }
        line = eol ? eol + 1 : NULL;

        int32_t *ids;
        size_t n;
        int rc = tok_encode(v, text, len, false, false, &ids, &n, &err);
        CHECK_MSG(rc == 0, "%s input %zu: %s", name, n_inputs, err.msg);
        bool same = rc == 0 && n == n_want && (n == 0 || !memcmp(ids, want, n * sizeof *ids));
        if (!same) {
            fprintf(stderr, "%s input %zu \"%.*s\": got", name, n_inputs, (int)len, text);
            for (size_t i = 0; rc == 0 && i < n; i++) fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, "\n  want");
            for (size_t i = 0; i < n_want; i++) fprintf(stderr, " %d", want[i]);
            fprintf(stderr, "\n");
        }
        n_ok += same;
        CHECK(same);

        /* decoding gives the input back: streamed one token at a time (the
         * first piece's space prefix stripped when the vocabulary adds one),
         * and, for SPM (no clean_spaces), through tok_detokenize */
        if (rc == 0) {
            tok_stream *ts = tok_stream_new(v, tok_add_space_prefix(v));
            REQUIRE(ts);
            size_t cap = tok_stream_max_out(ts), dl = 0;
            char *chunk = malloc(cap), *dec = malloc(len * 3 + cap + 1);
            REQUIRE(chunk && dec);
            for (size_t i = 0; i <= n; i++) {
                int w = i < n ? tok_stream_push(ts, ids[i], chunk, cap) : tok_stream_flush(ts, chunk, cap);
                REQUIRE(w >= 0 && dl + (size_t)w <= len * 3 + cap);
                memcpy(dec + dl, chunk, (size_t)w);
                dl += (size_t)w;
            }
            dec[dl] = 0;
            bool rt = dl == len && !memcmp(dec, text, len);
            CHECK_MSG(rt, "%s input %zu: streamed \"%s\"", name, n_inputs, dec);
            free(dec);
            free(chunk);
            tok_stream_free(ts);
            if (tok_model_kind(v) == TOK_MODEL_SPM) {
                char *d2;
                CHECK(tok_detokenize(v, ids, n, false, &d2, &dl, &err) == 0);
                bool rt2 = d2 && dl == len && !memcmp(d2, text, len);
                CHECK_MSG(rt2, "%s input %zu: decoded \"%s\"", name, n_inputs, d2 ? d2 : "(null)");
                rt = rt && rt2;
                free(d2);
            }
            n_roundtrip += rt;
        }
        free(ids);
        n_inputs++;
    }
    CHECK_EQ_INT(n_inputs, n_expected_inputs);
    CHECK_EQ_INT(n_ok, n_inputs);
    CHECK_EQ_INT(n_roundtrip, n_inputs);
    printf("%s: %zu/%zu inputs match, %zu round-trip\n", name, n_ok, n_inputs, n_roundtrip);
    free(inp);
    free(outf);
    tok_vocab_free(v);
}

int main(void) {
    run_vocab("ggml-vocab-llama-spm.gguf", 32000, 46);
    run_vocab("ggml-vocab-gpt-2.gguf", 50257, 46);
    return test_summary();
}
