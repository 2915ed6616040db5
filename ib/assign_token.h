/* assign_token.h — the coordinator's token on a StageAssign
 * (proto/stage.proto, StageAssign.token; docs/security.md).
 *
 * token = HMAC-SHA256 under the cluster key's assign key (ib/cluster_key.h)
 * of a fixed encoding of every field that steers the worker: epoch, stage,
 * n_stages, model_path, first_layer, last_layer, tp, kv_blocks, block_size,
 * act_dtype, next_hop, n_threads, keep_loaded, adopt_epoch, backend, devices (integers as 8-byte little
 * endian, strings length-prefixed). A copy with any field changed fails.
 */
#ifndef STRATA_IB_ASSIGN_TOKEN_H
#define STRATA_IB_ASSIGN_TOKEN_H

#include <stdbool.h>
#include <stdint.h>

#include "ib/cluster_key.h"
#include "proto/stage.pb-c.h"

/* Fills out with the token of a under the current key. 0 or -1. */
int assign_token_make(const cluster_key *k, const Strata__V1__StageAssign *a, uint8_t out[CLUSTER_MAC_LEN]);
/* Whether a->token is a valid token of a under one of the keys. */
bool assign_token_ok(const cluster_key *k, const Strata__V1__StageAssign *a);

#endif
