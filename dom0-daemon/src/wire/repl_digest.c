/*
 * The epoch checksum: XXH3-64 over the covered frames of an epoch, fed
 * the same bytes on both sides (docs/protocol.md, section 4).
 */
#include "wire/repl_proto.h"

#include <errno.h>
#include <string.h>

bool repl_type_is_covered(uint16_t type)
{
	switch (type) {
	case REPL_RAM_LAYOUT:
	case REPL_PAGES:
	case REPL_PAGES_CODED:
	case REPL_DEVICE:
	case REPL_DEVICE_DELTA:
	case REPL_DISK_WRITE:
	case REPL_DISK_ZERO:
	case REPL_DISK_SYNC:
	case REPL_DISK_SYNC_DONE:
	case REPL_FLOW_STATE:
		return true;
	default:
		return false;
	}
}

int repl_digest_init(struct repl_digest *d)
{
	memset(d, 0, sizeof(*d));
	d->state = XXH3_createState();
	if (!d->state) {
		errno = ENOMEM;
		return -1;
	}
	repl_digest_reset(d);
	return 0;
}

void repl_digest_free(struct repl_digest *d)
{
	XXH3_freeState(d->state);
	memset(d, 0, sizeof(*d));
}

void repl_digest_reset(struct repl_digest *d)
{
	if (d->state)
		XXH3_64bits_reset(d->state);
	d->bytes = 0;
	d->frames = 0;
}

void repl_digest_add(struct repl_digest *d, const uint8_t *header8, const uint8_t *payload,
		     uint32_t len)
{
	if (!d->state)
		return;
	XXH3_64bits_update(d->state, header8, REPL_HEADER_SIZE);
	if (len)
		XXH3_64bits_update(d->state, payload, len);
	d->bytes += REPL_HEADER_SIZE + (uint64_t)len;
	d->frames++;
}

bool repl_digest_add_frame(struct repl_digest *d, const struct repl_frame *f)
{
	uint8_t header[REPL_HEADER_SIZE];

	if (!repl_type_is_covered(f->type))
		return false;
	repl_encode_header(header, f->type, f->length);
	repl_digest_add(d, header, f->payload, f->length);
	return true;
}

int repl_digest_add_buffered(struct repl_digest *d, const struct buffer *b, size_t start)
{
	size_t len = buffer_len(b);
	struct repl_frame f;

	if (start > len)
		return -1;
	if (start == len)
		return 0; /* nothing appended (and an empty buffer may have no data) */
	const uint8_t *data = buffer_head(b);
	/* Check first, so that a bad call adds nothing. */
	for (size_t pos = start; pos < len;) {
		ssize_t n = repl_frame_parse(data + pos, len - pos, &f, NULL);
		if (n <= 0)
			return -1;
		pos += (size_t)n;
	}
	for (size_t pos = start; pos < len;) {
		ssize_t n = repl_frame_parse(data + pos, len - pos, &f, NULL);
		repl_digest_add_frame(d, &f);
		pos += (size_t)n;
	}
	return 0;
}

uint64_t repl_digest_value(const struct repl_digest *d)
{
	return d->state ? XXH3_64bits_digest(d->state) : 0;
}
