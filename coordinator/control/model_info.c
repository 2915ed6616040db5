/* model_info.c — the model's name, checksum and memory model (model_info.h). */
#include "coordinator/control/model_info.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/sha256.h"
#include "model/gguf.h"
#include "model/llama.h"

int model_info_read(const coord_config *cfg, model_info *mi, st_err *err) {
    gguf_file *gf = gguf_open(cfg->model, err);
    if (!gf) return -1;
    llama_config mc;
    if (llama_config_from_gguf(gf, &mc, err) != 0) {
        gguf_close(gf);
        return -1;
    }
    if (mc.n_layer > PLACE_MAX_STAGES) {
        gguf_close(gf);
        return st_errf(err, "%s: %d layers (at most %d)", cfg->model, mc.n_layer, PLACE_MAX_STAGES);
    }
    place_model *m = &mi->pm;
    memset(m, 0, sizeof *m);
    m->n_layers = mc.n_layer;
    uint64_t embd = 0;
    for (int64_t i = 0; i < gguf_n_tensors(gf); i++) {
        const gguf_tensor *t = gguf_tensor_at(gf, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.data);
        int l;
        if (sscanf(name, "blk.%d.", &l) == 1 && l >= 0 && l < mc.n_layer)
            m->layer_bytes[l] += t->nbytes;
        else if (!strcmp(name, "token_embd.weight"))
            embd = t->nbytes;
        else if (!strncmp(name, "output", 6))
            m->head_bytes += t->nbytes;
    }
    m->embd_bytes = embd;
    m->head_tied = mc.tied_output;
    m->kv_bytes_per_layer = (uint64_t)cfg->kv_blocks * (uint64_t)cfg->kv_block_size * 2u *
                            (uint64_t)mc.n_head_kv * (uint64_t)mc.head_dim * sizeof(float);
    /* The stage's micro-batch buffers (placement.h's memory model). */
    m->act_tokens = (uint32_t)cfg->max_batch_tokens;
    m->act_token_rank = 3u * (uint64_t)mc.n_embd * sizeof(float);
    m->act_token_split = (2u * (uint64_t)mc.n_head * mc.head_dim + 2u * (uint64_t)mc.n_head_kv * mc.head_dim +
                          2u * (uint64_t)mc.n_ff) * sizeof(float);
    m->logits_bytes = (uint64_t)cfg->max_seqs * ((uint64_t)mc.n_vocab + (uint64_t)mc.n_embd) * sizeof(float);
    gguf_close(gf);
    const char *b = strrchr(cfg->model, '/');
    snprintf(mi->file, sizeof mi->file, "%s", b ? b + 1 : cfg->model);
    return st_file_sha256(cfg->model, mi->sha, err);
}
