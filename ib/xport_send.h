/* xport_send.h — the send side of the data path: a frame (prefix, header
 * inline or in the data, payload eager or by rendezvous, from registered or
 * device memory) or a handshake message handed to UCX, the sends queued
 * while a peer's handshake runs, and the completions delivered on the loop. */
#ifndef STRATA_IB_XPORT_SEND_H
#define STRATA_IB_XPORT_SEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ib/xport_types.h"

/* Sends the packed header hb (hl bytes) and the payload to p; queued until
 * p's handshake is done. 0 (cb will run), or -1 + err (cb will not). */
int xsend_frame(xport_peer *p, const uint8_t *hb, size_t hl, const void *payload, size_t bytes,
                const xport_mem *mem, xport_send_cb cb, void *arg, st_err *err);
/* Sends a handshake message (copied; for xauth_io). 0, or -1 + err. */
int xsend_handshake(xport_peer *p, const uint8_t *msg, size_t len, st_err *err);
/* The sends queued during the handshake go out (it succeeded) ... */
void xsend_flush_deferred(xport_peer *p);
/* ... or fail (-1 to their callbacks, from the loop). */
void xsend_fail_deferred(xport_peer *p);
/* Runs the callbacks of the completed sends, counts them and frees them.
 * Returns true when there was any. */
bool xsend_run_completions(xport *x);
/* The same while the transport is destroyed: callbacks only, no counters. */
void xsend_run_completions_final(xport *x);

#endif
