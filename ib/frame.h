/* frame.h — data-plane frames: encode, decode and validate the protobuf
 * header (strata.v1.FrameHeader, proto/frame.proto), and convert payloads
 * between f32 and bf16.
 *
 * A frame = header + payload. The payload is the hidden state, row-major
 * [n_tokens, n_embd] (shape[0], shape[1]) of dtype f32 (4 bytes) or bf16
 * (2 bytes); frames without payload (token ids for stage 0, TOKENS results,
 * CONTROL) have an empty shape and DTYPE_UNSPECIFIED. The full rules are in
 * docs/protocol.md. Errors: -1/NULL with a one-line message in st_err.
 */
#ifndef STRATA_IB_FRAME_H
#define STRATA_IB_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "proto/frame.pb-c.h"

typedef Strata__V1__FrameHeader frame_header;
typedef Strata__V1__SeqRecord frame_seq;
typedef Strata__V1__SamplingParams frame_sampling;
typedef Strata__V1__SeqResult frame_result;
typedef Strata__V1__TopLogprob frame_top_logprob;

/* Limits enforced by frame_validate (a header beyond them is malformed). */
#define FRAME_MAX_TOKENS 65536            /* rows per frame (sum of n_tokens) */
#define FRAME_MAX_EMBD 65536              /* shape[1] */
#define FRAME_MAX_SEQS 4096               /* seqs (and results) per frame */
#define FRAME_MAX_BLOCKS 1048576          /* block ids per sequence */
#define FRAME_MAX_TOP_LOGPROBS 20         /* n_top_logprobs and len(top) */
#define FRAME_MAX_REQUEST_ID 64           /* bytes of SeqRecord.request_id */
#define FRAME_MAX_CONTROL 65536           /* bytes of `control` */
#define FRAME_MAX_PAYLOAD (512ull << 20)  /* payload bytes (512 MiB) */
#define FRAME_MAX_HEADER (64u << 20)      /* packed header bytes (64 MiB) */

/* Bytes per element of a FrameHeader dtype: 4 (F32), 2 (BF16), 0 otherwise. */
size_t frame_dtype_size(int dtype);

/* Checks a decoded header against payload_bytes (the bytes that came with
 * it): kind known; per-seq n_tokens >= 1, pos >= 0, block table non-empty
 * with ids >= 0, sampling params in range; with a payload, shape ==
 * [sum n_tokens, n_embd] and shape[0]*shape[1]*dtype size == payload_bytes;
 * token_ids (when present) count == sum n_tokens and ids >= 0; ACTIVATIONS
 * carry seqs and token ids and/or a payload; TOKENS carry results (seq ids
 * unique, tokens >= 0, top <= FRAME_MAX_TOP_LOGPROBS) and no payload;
 * CONTROL carries no payload; every limit above. Returns 0 or -1. */
int frame_validate(const frame_header *h, size_t payload_bytes, st_err *err);

/* Packs h into a malloc'd buffer (*len bytes; free() it). NULL on failure. */
uint8_t *frame_header_pack(const frame_header *h, size_t *len, st_err *err);

/* Unpacks len bytes into a header (free with frame_header_free). NULL when
 * the bytes are not a FrameHeader or len > FRAME_MAX_HEADER. Does not
 * validate. */
frame_header *frame_header_unpack(const void *buf, size_t len, st_err *err);
void frame_header_free(frame_header *h);

/* Sum of n_tokens over h->seqs (the expected shape[0]). */
int64_t frame_total_tokens(const frame_header *h);

/* f32 <-> bf16 payload conversion of n elements (round-to-nearest-even,
 * common/dtype.h). For the config act_dtype = bf16. */
void frame_f32_to_bf16(const float *src, uint16_t *dst, size_t n);
void frame_bf16_to_f32(const uint16_t *src, float *dst, size_t n);

#endif
