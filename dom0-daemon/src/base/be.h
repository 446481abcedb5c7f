/*
 * Big-endian loads and stores: the byte order of every wire format the
 * daemon speaks (the replication protocol, NBD, QEMU's migration stream).
 * The one set of such helpers in the tree.
 */
#ifndef REMUSDB_BE_H
#define REMUSDB_BE_H

#include <stdint.h>

static inline uint16_t load_be16(const uint8_t *p)
{
	return (uint16_t)(p[0] << 8 | p[1]);
}

static inline uint32_t load_be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
	       (uint32_t)p[2] << 8 | p[3];
}

static inline uint64_t load_be64(const uint8_t *p)
{
	return (uint64_t)load_be32(p) << 32 | load_be32(p + 4);
}

static inline void store_be16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

static inline void store_be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

static inline void store_be64(uint8_t *p, uint64_t v)
{
	store_be32(p, (uint32_t)(v >> 32));
	store_be32(p + 4, (uint32_t)v);
}

#endif
