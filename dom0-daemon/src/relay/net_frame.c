/* Framing of QEMU's stream netdev: be32 length + frame (net_frame.h). */
#include "relay/net_frame.h"

#include <string.h>

#include "base/be.h"

enum net_frame_result net_frame_decode(const uint8_t *data, size_t len,
				       struct net_frame *out)
{
	memset(out, 0, sizeof(*out));
	if (len < NET_FRAME_HEADER_LEN) {
		out->needed = NET_FRAME_HEADER_LEN;
		return NET_FRAME_NEED_MORE;
	}
	uint32_t frame_len = load_be32(data);

	out->len = frame_len;
	/* Checked before waiting for the payload: a bogus length must not make
	 * the reader buffer gigabytes first. */
	if (frame_len == 0) {
		out->error = "zero-length frame";
		return NET_FRAME_MALFORMED;
	}
	if (frame_len > NET_FRAME_MAX_LEN) {
		out->error = "frame length above maximum";
		return NET_FRAME_MALFORMED;
	}
	size_t total = NET_FRAME_HEADER_LEN + (size_t)frame_len;
	if (len < total) {
		out->needed = total;
		return NET_FRAME_NEED_MORE;
	}
	out->payload = data + NET_FRAME_HEADER_LEN;
	out->consumed = total;
	return NET_FRAME_OK;
}

void net_frame_encode_header(uint32_t frame_len,
			     uint8_t header[NET_FRAME_HEADER_LEN])
{
	store_be32(header, frame_len);
}
