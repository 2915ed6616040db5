/* model_info.h — the model as the live control plane sees it: its file name
 * (what the workers resolve and Register must list), its sha256 (the same
 * file everywhere; the state is for it) and the memory model placement
 * needs (placement.h's place_model: layer, embedding, head, KV and
 * activation bytes), read once from the GGUF at start. */
#ifndef STRATA_COORDINATOR_CONTROL_MODEL_INFO_H
#define STRATA_COORDINATOR_CONTROL_MODEL_INFO_H

#include "common/err.h"
#include "coordinator/config/cluster_config.h"
#include "coordinator/control/placement.h"

typedef struct model_info {
    char file[256];          /* the model's file name, without its directory */
    char sha[65];            /* sha256, lowercase hex */
    place_model pm;
} model_info;

/* Reads cfg->model (with cfg's KV geometry and batch limits). -1 + err on a
 * bad model or one of more than PLACE_MAX_STAGES layers. */
int model_info_read(const coord_config *cfg, model_info *m, st_err *err);

#endif
