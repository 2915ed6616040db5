/* test_tok_reference.c — the tokenizer against llama.cpp's golden outputs for
 * stories260K (reference/stories260K-greedy.json): each prompt tokenized with
 * BOS gives exactly `prompt_tokens`, and `completion_tokens` pushed one at a
 * time through the streaming decoder give exactly `completion_text`.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "tests/testutil.h"

int main(void) {
    st_err err = {{0}};
    gguf_file *f = gguf_open(test_shared_path("models/stories260K.gguf"), &err);
    REQUIRE_MSG(f, "%s", err.msg);
    tok_vocab *v = tok_vocab_load(f, &err);
    REQUIRE_MSG(v, "%s", err.msg);
    CHECK_EQ_INT(tok_model_kind(v), TOK_MODEL_SPM);
    CHECK_EQ_INT(tok_n_vocab(v), 512);
    CHECK_EQ_INT(tok_bos(v), 1);
    CHECK_EQ_INT(tok_eos(v), 2);
    CHECK_EQ_INT(tok_unk(v), 0);
    CHECK_EQ_INT(tok_pad(v), -1); /* 0xFFFFFFFF in the file means none */
    CHECK(tok_add_bos(v));
    CHECK(!tok_add_eos(v));
    CHECK(tok_add_space_prefix(v));
    CHECK(tok_is_eog(v, 2));
    CHECK(!tok_is_eog(v, 1));
    CHECK(!tok_is_eog(v, 512));
    CHECK(!tok_is_eog(v, -1));

    json_error_t jerr;
    json_t *root = json_load_file(test_shared_path("reference/stories260K-greedy.json"), 0, &jerr);
    REQUIRE_MSG(root && json_is_array(root), "%s", jerr.text);
    CHECK_EQ_INT(json_array_size(root), 10);

    tok_stream *ts = NULL;
    size_t n_prompt_ok = 0, n_text_ok = 0, idx;
    json_t *item;
    json_array_foreach(root, idx, item) {
        const char *prompt = json_string_value(json_object_get(item, "prompt"));
        json_t *pt = json_object_get(item, "prompt_tokens");
        json_t *ct = json_object_get(item, "completion_tokens");
        const char *ctext = json_string_value(json_object_get(item, "completion_text"));
        REQUIRE(prompt && json_is_array(pt) && json_is_array(ct) && ctext);

        int32_t *ids;
        size_t n;
        CHECK_MSG(tok_encode(v, prompt, strlen(prompt), true, false, &ids, &n, &err) == 0, "%s",
                  err.msg);
        bool same = n == json_array_size(pt);
        for (size_t i = 0; same && i < n; i++)
            same = ids[i] == json_integer_value(json_array_get(pt, i));
        CHECK_MSG(same, "prompt %zu \"%s\": token mismatch (got %zu tokens)", idx, prompt, n);
        n_prompt_ok += same;
        free(ids);

        /* completion text, streamed; llama-server concatenates the pieces */
        ts = tok_stream_new(v, false);
        REQUIRE(ts);
        size_t cap = tok_stream_max_out(ts);
        char *chunk = malloc(cap);
        size_t tl = 0, tcap = 4096;
        char *text = malloc(tcap);
        REQUIRE(chunk && text);
        for (size_t i = 0; i < json_array_size(ct); i++) {
            int w = tok_stream_push(ts, (int32_t)json_integer_value(json_array_get(ct, i)), chunk, cap);
            REQUIRE(w >= 0 && tl + (size_t)w < tcap);
            memcpy(text + tl, chunk, (size_t)w);
            tl += (size_t)w;
        }
        int w = tok_stream_flush(ts, chunk, cap);
        REQUIRE(w >= 0 && tl + (size_t)w < tcap);
        memcpy(text + tl, chunk, (size_t)w);
        tl += (size_t)w;
        text[tl] = 0;
        CHECK_EQ_STR(text, ctext);
        n_text_ok += strcmp(text, ctext) == 0;
        free(text);
        free(chunk);
        tok_stream_free(ts);

        /* the whole-sequence decoder of prompt + completion gives the prompt
         * text followed by the completion text (BOS removed, so no strip) */
        size_t np = json_array_size(pt), nc = json_array_size(ct);
        int32_t *all = malloc((np + nc) * sizeof *all);
        REQUIRE(all);
        for (size_t i = 0; i < np; i++) all[i] = (int32_t)json_integer_value(json_array_get(pt, i));
        for (size_t i = 0; i < nc; i++) all[np + i] = (int32_t)json_integer_value(json_array_get(ct, i));
        char *dec;
        size_t dl;
        CHECK(tok_detokenize(v, all, np, true, &dec, &dl, &err) == 0);
        /* " Once upon a time": add_space_prefix's space survives after BOS */
        CHECK(dec && dl == strlen(prompt) + 1 && dec[0] == ' ' && !strcmp(dec + 1, prompt));
        free(dec);
        CHECK(tok_detokenize(v, all + 1, np - 1, false, &dec, &dl, &err) == 0);
        CHECK_EQ_STR(dec, prompt); /* without BOS the leading space is stripped */
        free(dec);
        free(all);
    }
    printf("stories260K: %zu/10 prompts tokenized exactly, %zu/10 completion texts exact\n",
           n_prompt_ok, n_text_ok);
    CHECK_EQ_INT(n_prompt_ok, 10);
    CHECK_EQ_INT(n_text_ok, 10);
    json_decref(root);
    tok_vocab_free(v);
    gguf_close(f);
    return test_summary();
}
