/* xport_wire.h — the frame prefix on the wire (docs/protocol.md): the 24
 * bytes at the start of every frame's UCX AM header, and the little-endian
 * helpers the handshake message (ib/xport_auth.c) uses too. */
#ifndef STRATA_IB_XPORT_WIRE_H
#define STRATA_IB_XPORT_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define XPORT_AM_FRAME 17
#define XPORT_AM_AUTH 18        /* handshake messages (docs/protocol.md, "Handshake") */
#define XPORT_MAGIC 0x31465453u /* "STF1" little-endian */
#define XPORT_VERSION 1
#define XPORT_PREFIX 24
#define XPORT_FLAG_HDR_IN_DATA 1u

void xw_put_le32(uint8_t *p, uint32_t v);
uint32_t xw_get_le32(const uint8_t *p);

/* Writes the XPORT_PREFIX bytes of a frame: the FrameHeader of hdr_len bytes
 * follows in the AM header, or (hdr_in_data) at the start of the data. */
void xw_prefix_pack(uint8_t *out, bool hdr_in_data, uint32_t hdr_len, uint64_t seq);

typedef struct xw_prefix {
    uint16_t flags; /* XPORT_FLAG_HDR_IN_DATA or 0 */
    uint32_t hdr_len;
    uint64_t seq;
} xw_prefix;
/* Reads the prefix at the start of an AM header of len bytes. NULL, or why
 * it is malformed (the receiver disconnects the sender). */
const char *xw_prefix_parse(const uint8_t *h, size_t len, xw_prefix *out);

#endif
