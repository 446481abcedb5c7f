/*
 * Framing of QEMU's stream netdev: every Ethernet frame travels as a
 * big-endian 32-bit length followed by that many bytes (QEMU net/stream.c,
 * net_fill_rstate()).  Pure codec without I/O so it can be unit-tested and
 * fuzzed on its own.
 */
#ifndef REMUSDB_NET_FRAME_H
#define REMUSDB_NET_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define NET_FRAME_HEADER_LEN 4
/*
 * QEMU refuses lengths above NET_BUFSIZE (4096 + 65536) on this stream, so
 * anything longer cannot be a frame QEMU sent: the stream is out of sync.
 * A 64 KiB tap MTU plus the Ethernet header stays well below it.
 */
#define NET_FRAME_MAX_LEN (65536 + 4096)

enum net_frame_result {
	NET_FRAME_NEED_MORE, /* no complete frame yet; read more bytes */
	NET_FRAME_OK,        /* one frame decoded */
	NET_FRAME_MALFORMED, /* length 0 or above NET_FRAME_MAX_LEN */
};

struct net_frame {
	const uint8_t *payload; /* points into the decoded buffer (OK only) */
	uint32_t len;           /* declared frame length (OK and MALFORMED) */
	size_t consumed;        /* header + payload bytes to drop (OK only) */
	size_t needed;          /* bytes needed in total (NEED_MORE only) */
	const char *error;      /* static reason (MALFORMED only) */
};

/* Decodes the frame at the start of data[0..len). */
enum net_frame_result net_frame_decode(const uint8_t *data, size_t len,
				       struct net_frame *out);

/* Writes the 4-byte header announcing a frame of frame_len bytes. */
void net_frame_encode_header(uint32_t frame_len,
			     uint8_t header[NET_FRAME_HEADER_LEN]);

#endif
