/* xport_wire.c — see xport_wire.h. */
#include "ib/xport_wire.h"

static void put_le16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get_le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint64_t get_le64(const uint8_t *p) { return (uint64_t)xw_get_le32(p) | (uint64_t)xw_get_le32(p + 4) << 32; }

void xw_put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

uint32_t xw_get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void xw_prefix_pack(uint8_t *out, bool hdr_in_data, uint32_t hdr_len, uint64_t seq)
{
    xw_put_le32(out, XPORT_MAGIC);
    put_le16(out + 4, XPORT_VERSION);
    put_le16(out + 6, hdr_in_data ? XPORT_FLAG_HDR_IN_DATA : 0);
    xw_put_le32(out + 8, hdr_len);
    xw_put_le32(out + 12, 0);
    put_le64(out + 16, seq);
}

const char *xw_prefix_parse(const uint8_t *h, size_t len, xw_prefix *out)
{
    if (len < XPORT_PREFIX || xw_get_le32(h) != XPORT_MAGIC) return "bad prefix";
    if (get_le16(h + 4) != XPORT_VERSION) return "unsupported version";
    out->flags = get_le16(h + 6);
    out->hdr_len = xw_get_le32(h + 8);
    out->seq = get_le64(h + 16);
    if ((out->flags & ~XPORT_FLAG_HDR_IN_DATA) || xw_get_le32(h + 12) != 0) return "bad prefix flags";
    return NULL;
}
