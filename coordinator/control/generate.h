/* generate.h — the Generate call of strata.v1.Control (proto/control.proto):
 * a prompt (tokenized here) through the serving engine, answered as a
 * server stream of GenerateChunk messages (whole UTF-8 characters; the last
 * chunk carries the finish reason and the token counts). Loop thread. */
#ifndef STRATA_COORDINATOR_CONTROL_GENERATE_H
#define STRATA_COORDINATOR_CONTROL_GENERATE_H

#include "coordinator/serve/engine_api.h"
#include "model/tokenizer.h"
#include "rpc/grpc_server.h"

typedef struct gen_stream gen_stream;

/* The open streams and what they run on. */
typedef struct gen_streams {
    gen_stream *head;
    coord_engine eng;        /* the serving engine (control_service.h's ctl_engine) */
    const tok_vocab *vocab;  /* must outlive */
} gen_streams;

/* An rpc_handler_fn (a server stream); ud is a gen_streams. */
void generate_rpc(rpc_call *c, const rpc_request *req, void *ud);
/* Ends every open stream (UNAVAILABLE) and cancels its request. */
void generate_close_all(gen_streams *s);

#endif
