/* The migration stream that resumes the committed image (restore_stream.h). */
#include "backup/restore_stream.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qemu/migration_writer.h"

enum restore_phase {
	RS_PREAMBLE, /* header .. ram END section header */
	RS_PAGES,    /* records of block `block` from page `page` on */
	RS_RAM_END,  /* EOS and footer of the END section */
	RS_DEVICE,   /* the device blob from `blob_at` on */
	RS_DONE,
	RS_FAILED,
};

struct restore_stream {
	const struct ram_image *img;
	long mapped;                 /* the block QEMU maps itself, or -1 */
	enum restore_phase phase;
	size_t block;
	uint64_t page;
	size_t blob_at;
	uint64_t bytes;
};

struct restore_stream *restore_stream_create(const struct ram_image *img,
					     const char *mapped_block,
					     char *err, size_t errlen)
{
	const struct buffer *blob = ram_image_device_blob(img);

	if (ram_image_ram_section_id(img) == 0) {
		snprintf(err, errlen, "ram section id 0 cannot be restored");
		return NULL;
	}
	if (buffer_len(blob) == 0) {
		snprintf(err, errlen, "no device state was committed yet: the "
				      "image cannot be resumed");
		return NULL;
	}
	if (buffer_head(blob)[buffer_len(blob) - 1] != MIG_EOF) {
		snprintf(err, errlen, "the committed device state (%zu bytes) does "
				      "not end with the EOF marker",
			 buffer_len(blob));
		return NULL;
	}
	long mapped = -1;
	for (size_t i = 0; mapped_block && i < ram_image_block_count(img); i++)
		if (!strcmp(ram_image_block(img, i)->name, mapped_block))
			mapped = (long)i;
	if (mapped_block && mapped < 0) {
		snprintf(err, errlen, "the image has no RAM block named %s", mapped_block);
		return NULL;
	}
	struct restore_stream *rs = calloc(1, sizeof(*rs));
	if (!rs) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	rs->img = img;
	rs->mapped = mapped;
	rs->phase = RS_PREAMBLE;
	return rs;
}

void restore_stream_destroy(struct restore_stream *rs)
{
	free(rs);
}

uint64_t restore_stream_bytes(const struct restore_stream *rs)
{
	return rs->bytes;
}

/*
 * memcpy into words keeps this free of aliasing assumptions; compilers
 * turn it into plain loads.  Eight words per test: an early exit for the
 * common non-zero page without a branch per word.
 */
static bool page_is_zero(const uint8_t *page)
{
	for (size_t at = 0; at < MIG_PAGE_SIZE; at += 64) {
		uint64_t w[8];

		memcpy(w, page + at, sizeof(w));
		if (w[0] | w[1] | w[2] | w[3] | w[4] | w[5] | w[6] | w[7])
			return false;
	}
	return true;
}

static int put_preamble(struct restore_stream *rs, struct buffer *out)
{
	const struct ram_image *img = rs->img;
	uint32_t id = ram_image_ram_section_id(img);
	size_t count = ram_image_block_count(img);
	struct migw_ram_block blocks[RAM_IMAGE_MAX_BLOCKS];

	for (size_t i = 0; i < count; i++) {
		const struct ram_image_block *b = ram_image_block(img, i);

		blocks[i].name = b->name;
		blocks[i].length = b->length;
	}
	if (migw_header(out) < 0 ||
	    migw_configuration(out, ram_image_machine_type(img)) < 0 ||
	    migw_section_start(out, MIG_SECTION_START, id, "ram", 0,
			       MIG_RAM_SECTION_VERSION) < 0 ||
	    migw_ram_mem_size(out, blocks, count) < 0 || migw_ram_eos(out) < 0 ||
	    migw_section_footer(out, id) < 0 ||
	    migw_section_part(out, MIG_SECTION_END, id) < 0)
		return -1;
	rs->phase = RS_PAGES;
	rs->block = 0;
	rs->page = 0;
	return 0;
}

/* Records of the current block until it ends or `budget` bytes were added. */
static int put_pages(struct restore_stream *rs, struct buffer *out,
		     size_t budget)
{
	const struct ram_image_block *b = ram_image_block(rs->img, rs->block);
	uint64_t pages = b->length / MIG_PAGE_SIZE;
	size_t start = buffer_len(out);

	if ((long)rs->block == rs->mapped)
		rs->page = pages; /* QEMU maps it: none of its pages go */
	while (rs->page < pages && buffer_len(out) - start < budget) {
		uint64_t p = rs->page;
		/* CONTINUE after the block's first record (and across sections). */
		const char *name = p == 0 ? b->name : NULL;
		const uint8_t *mem = b->mem + p * MIG_PAGE_SIZE;
		int rc;

		if (ram_image_page_written(b, p) && !page_is_zero(mem))
			rc = migw_ram_page(out, name, p * MIG_PAGE_SIZE, mem);
		else
			rc = migw_ram_zero(out, name, p * MIG_PAGE_SIZE, 0);
		if (rc < 0)
			return -1;
		rs->page++;
	}
	if (rs->page == pages) {
		rs->page = 0;
		if (++rs->block == ram_image_block_count(rs->img))
			rs->phase = RS_RAM_END;
	}
	return 0;
}

static int put_device(struct restore_stream *rs, struct buffer *out,
		      size_t budget)
{
	const struct buffer *blob = ram_image_device_blob(rs->img);
	size_t left = buffer_len(blob) - rs->blob_at;
	size_t n = left < budget ? left : budget;

	if (buffer_append(out, buffer_head(blob) + rs->blob_at, n) < 0)
		return -1;
	rs->blob_at += n;
	if (rs->blob_at == buffer_len(blob))
		rs->phase = RS_DONE;
	return 0;
}

static int step(struct restore_stream *rs, struct buffer *out, size_t budget)
{
	uint32_t id = ram_image_ram_section_id(rs->img);

	switch (rs->phase) {
	case RS_PREAMBLE:
		return put_preamble(rs, out);
	case RS_PAGES:
		return put_pages(rs, out, budget);
	case RS_RAM_END:
		if (migw_ram_eos(out) < 0 || migw_section_footer(out, id) < 0)
			return -1;
		rs->phase = RS_DEVICE;
		return 0;
	case RS_DEVICE:
		return put_device(rs, out, budget);
	default:
		return -1;
	}
}

int restore_stream_produce(struct restore_stream *rs, struct buffer *out,
			   size_t max_bytes)
{
	size_t budget = max_bytes ? max_bytes : 1;
	size_t added = 0;

	if (rs->phase == RS_FAILED) {
		errno = ENOMEM;
		return -1;
	}
	while (rs->phase != RS_DONE && added < budget) {
		size_t before = buffer_len(out);

		if (step(rs, out, budget - added) < 0) {
			rs->phase = RS_FAILED;
			rs->bytes += buffer_len(out) - before + added;
			errno = ENOMEM;
			return -1;
		}
		added += buffer_len(out) - before;
	}
	rs->bytes += added;
	return rs->phase == RS_DONE ? 0 : 1;
}
