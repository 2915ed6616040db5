/* stage_shape.h — plain data: what every rank of a stage reads and never
 * changes once the stage is open (the model, the layer range, the TP degree,
 * the KV cache geometry, the backend module). The stage (stage.c) owns it;
 * the rank files get a pointer to it, so they need nothing of the stage. */
#ifndef STRATA_ENGINE_STAGE_SHAPE_H
#define STRATA_ENGINE_STAGE_SHAPE_H

#include <stdbool.h>
#include <stdint.h>

#include "compute/registry.h"
#include "model/gguf.h"
#include "model/llama.h"

typedef struct stage_shape {
    llama_config cfg;
    const gguf_file *f;        /* the mapping the weights are copied from */
    const backend_module *bm;  /* the backend (compute/registry.h) */
    bool device_memory;        /* bm->device_memory: buffers are device memory */
    int first, last, tp;       /* layers [first, last) at TP tp */
    int kv_blocks, block_size; /* KV cache: blocks of block_size slots (each rank) */
    uint32_t kv_type;          /* GGML_TYPE_F32 or GGML_TYPE_F16 */
    const float *rope_ff;      /* host [n_rot/2] rope frequency factors, or NULL */
} stage_shape;

#endif
