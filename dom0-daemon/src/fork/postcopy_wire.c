/* Postcopy source bytes and the return-path parser; see postcopy_wire.h. */
#include "fork/postcopy_wire.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/be.h"
#include "qemu/migration_writer.h"

#define RAM_IDSTR "ram"
#define RAM_INSTANCE 0
#define DISCARD_VERSION 0

static int fail(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -1;
}

static int advise(struct buffer *b)
{
	uint8_t payload[16];

	/* Every block here uses 4 KiB host pages: the summary is that size. */
	store_be64(payload, MIG_PAGE_SIZE);
	store_be64(payload + 8, MIG_PAGE_SIZE);
	return migw_command(b, MIG_CMD_POSTCOPY_ADVISE, payload, sizeof(payload));
}

static int ram_start_section(struct buffer *b, const struct ram_image *img)
{
	size_t n = ram_image_block_count(img);
	struct migw_ram_block blocks[RAM_IMAGE_MAX_BLOCKS];
	uint32_t id = ram_image_ram_section_id(img);

	for (size_t i = 0; i < n; i++) {
		blocks[i].name = ram_image_block(img, i)->name;
		blocks[i].length = ram_image_block(img, i)->length;
	}
	if (migw_section_start(b, MIG_SECTION_START, id, RAM_IDSTR, RAM_INSTANCE,
			       MIG_RAM_SECTION_VERSION) < 0 ||
	    migw_ram_mem_size(b, blocks, n) < 0 || migw_ram_eos(b) < 0 ||
	    migw_section_footer(b, id) < 0)
		return -1;
	return 0;
}

/*
 * Discarding every block makes each of its pages "missing" in the clone,
 * so the first touch faults and asks us (nothing was sent in precopy).
 */
static int discard_all(struct buffer *b, const struct ram_image *img)
{
	for (size_t i = 0; i < ram_image_block_count(img); i++) {
		const struct ram_image_block *blk = ram_image_block(img, i);
		size_t len = strlen(blk->name);
		uint8_t payload[3 + 255 + 16];

		payload[0] = DISCARD_VERSION;
		payload[1] = (uint8_t)len;
		memcpy(payload + 2, blk->name, len);
		payload[2 + len] = 0;
		store_be64(payload + 3 + len, 0);
		store_be64(payload + 3 + len + 8, blk->length);
		if (migw_command(b, MIG_CMD_POSTCOPY_RAM_DISCARD, payload,
				 (uint16_t)(3 + len + 16)) < 0)
			return -1;
	}
	return 0;
}

/*
 * LISTEN, the device state and RUN go as one package: QEMU loads the
 * package on its main thread while its listen thread already takes pages,
 * so the devices can touch guest RAM (faulting it in) while loading.
 */
static int package(struct buffer *b, const struct buffer *blob)
{
	size_t blob_len = buffer_len(blob) - 1; /* without the EOF byte */
	size_t pkg_len = 5 + blob_len + 5;
	uint8_t len_be[4];
	size_t before = buffer_len(b);

	store_be32(len_be, (uint32_t)pkg_len);
	if (migw_command(b, MIG_CMD_PACKAGED, len_be, sizeof(len_be)) < 0 ||
	    migw_command(b, MIG_CMD_POSTCOPY_LISTEN, NULL, 0) < 0 ||
	    buffer_append(b, buffer_head(blob), blob_len) < 0 ||
	    migw_command(b, MIG_CMD_POSTCOPY_RUN, NULL, 0) < 0)
		return -1;
	return buffer_len(b) - before == 9 + pkg_len ? 0 : -1;
}

int pcw_preamble(struct buffer *b, const struct ram_image *img, char *err,
		 size_t errlen)
{
	const struct buffer *blob = ram_image_device_blob(img);

	if (buffer_len(blob) == 0)
		return fail(err, errlen, "the snapshot has no device state");
	if (buffer_head(blob)[buffer_len(blob) - 1] != MIG_EOF)
		return fail(err, errlen, "the snapshot's device state does not "
			    "end with the EOF byte");
	if (buffer_len(blob) > UINT32_MAX - 16)
		return fail(err, errlen, "the device state is too large for a "
			    "package (%zu bytes)", buffer_len(blob));
	if (migw_header(b) < 0 ||
	    migw_configuration(b, ram_image_machine_type(img)) < 0 ||
	    migw_command(b, MIG_CMD_OPEN_RETURN_PATH, NULL, 0) < 0 ||
	    advise(b) < 0 || ram_start_section(b, img) < 0 ||
	    discard_all(b, img) < 0 || package(b, blob) < 0)
		return fail(err, errlen, "out of memory building the preamble");
	return 0;
}

static int page_is_zero(const uint8_t *p)
{
	static const uint8_t zero[MIG_PAGE_SIZE];

	return memcmp(p, zero, MIG_PAGE_SIZE) == 0;
}

int pcw_pages(struct buffer *b, const struct ram_image *img, unsigned block,
	      uint64_t first, uint64_t count)
{
	const struct ram_image_block *blk = ram_image_block(img, block);
	uint32_t id = ram_image_ram_section_id(img);

	if (!blk || first > blk->length / MIG_PAGE_SIZE ||
	    count > blk->length / MIG_PAGE_SIZE - first)
		return -1;
	if (migw_section_part(b, MIG_SECTION_PART, id) < 0)
		return -1;
	for (uint64_t i = 0; i < count; i++) {
		uint64_t page = first + i;
		uint64_t offset = page * MIG_PAGE_SIZE;
		/* The first record names the block; CONTINUE state also carries
		 * across sections in QEMU, but naming it keeps each section
		 * self-contained. */
		const char *name = i == 0 ? blk->name : NULL;
		const uint8_t *data = blk->mem + offset;
		int rc;

		if (ram_image_page_written(blk, page) && !page_is_zero(data))
			rc = migw_ram_page(b, name, offset, data);
		else
			rc = migw_ram_zero(b, name, offset, 0);
		if (rc < 0)
			return -1;
	}
	if (migw_ram_eos(b) < 0 || migw_section_footer(b, id) < 0)
		return -1;
	return 0;
}

int pcw_finish(struct buffer *b, const struct ram_image *img)
{
	uint32_t id = ram_image_ram_section_id(img);

	if (migw_section_part(b, MIG_SECTION_END, id) < 0 || migw_ram_eos(b) < 0 ||
	    migw_section_footer(b, id) < 0 || migw_eof(b) < 0)
		return -1;
	return 0;
}

/* ---- return path --------------------------------------------------------- */

void pcw_rp_init(struct pcw_rp_parser *p, const struct pcw_rp_callbacks *cb)
{
	memset(p, 0, sizeof(*p));
	if (cb)
		p->cb = *cb;
}

static int rp_fail(struct pcw_rp_parser *p, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static int rp_fail(struct pcw_rp_parser *p, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(p->error, sizeof(p->error), fmt, ap);
	va_end(ap);
	return -1;
}

static int rp_request(struct pcw_rp_parser *p, uint16_t type, const uint8_t *d,
		      uint16_t len)
{
	if (type == PCW_RP_REQ_PAGES_ID) {
		if (len < 13 || len != 13 + d[12])
			return rp_fail(p, "REQ_PAGES_ID with length %u", len);
		/* A NUL inside the name would make it another (or an empty)
		 * C string than the one on the wire. */
		if (d[12] == 0 || memchr(d + 13, 0, d[12]))
			return rp_fail(p, "REQ_PAGES_ID with an empty block name or "
				       "one containing a NUL byte");
		memcpy(p->block, d + 13, d[12]);
		p->block[d[12]] = 0;
	} else {
		if (len != 12)
			return rp_fail(p, "REQ_PAGES with length %u (expected 12)", len);
		if (!p->block[0])
			return rp_fail(p, "REQ_PAGES before any block was named");
	}
	if (p->cb.on_request &&
	    p->cb.on_request(p->cb.opaque, p->block, load_be64(d), load_be32(d + 8)))
		return rp_fail(p, "page request refused (block %s offset 0x%llx "
			       "length %u)", p->block,
			       (unsigned long long)load_be64(d), load_be32(d + 8));
	return 0;
}

static int rp_message(struct pcw_rp_parser *p, uint16_t type, const uint8_t *d,
		      uint16_t len)
{
	switch (type) {
	case PCW_RP_SHUT:
		if (len != 4)
			return rp_fail(p, "SHUT with length %u", len);
		if (p->cb.on_shut && p->cb.on_shut(p->cb.opaque, load_be32(d)))
			return rp_fail(p, "SHUT refused");
		return 0;
	case PCW_RP_PONG:
		return len == 4 ? 0 : rp_fail(p, "PONG with length %u", len);
	case PCW_RP_REQ_PAGES_ID:
	case PCW_RP_REQ_PAGES:
		return rp_request(p, type, d, len);
	default:
		/* RECV_BITMAP and RESUME_ACK belong to postcopy recovery,
		 * which we never start. */
		return rp_fail(p, "unexpected return-path message type %u "
			       "(length %u)", type, len);
	}
}

int pcw_rp_feed(struct pcw_rp_parser *p, const uint8_t *data, size_t len)
{
	if (p->error[0])
		return -1;
	while (len) {
		size_t want = 4;

		if (p->have >= 4)
			want = 4 + load_be16(p->msg + 2);
		size_t n = want - p->have < len ? want - p->have : len;
		memcpy(p->msg + p->have, data, n);
		p->have += n;
		data += n;
		len -= n;
		if (p->have == 4 && load_be16(p->msg + 2) > 0)
			continue;
		if (p->have < 4 || p->have < 4 + (size_t)load_be16(p->msg + 2))
			continue;
		uint16_t type = load_be16(p->msg);
		uint16_t mlen = load_be16(p->msg + 2);
		p->have = 0;
		if (rp_message(p, type, p->msg + 4, mlen) < 0)
			return -1;
	}
	return 0;
}
