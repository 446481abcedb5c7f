/*
 * The ram_image struct, shared by the files that make up the image:
 * ram_image.c (layout, pages, device state, recent pages) and
 * ram_image_file.c (the memfd each block lives in, and its divergence
 * while a fork holds the image).  Nothing else includes this.
 */
#ifndef REMUSDB_RAM_IMAGE_INTERNAL_H
#define REMUSDB_RAM_IMAGE_INTERNAL_H

#include <stdbool.h>

#include "image/ram_image.h"
#include "qemu/migration_writer.h"

struct ram_image {
	char machine_type[256];
	uint32_t ram_section_id;
	size_t count;
	struct ram_image_block blocks[RAM_IMAGE_MAX_BLOCKS];
	uint64_t pages_total;
	uint64_t pages_written;
	struct buffer device_blob;
	/*
	 * Pages stored since the last rotation (recent[b][gen]) and in the
	 * generation before it: the guest's recently dirtied pages, which a
	 * fork taken from this image pushes to its clones first.
	 */
	uint64_t *recent[RAM_IMAGE_MAX_BLOCKS][2];
	unsigned gen;
	/*
	 * While diverged (ram_image.h): every block's mem is a private view
	 * of its memfd, and diverged_since[b] marks the pages stored since,
	 * which ram_image_converge writes back.
	 */
	bool diverged;
	uint64_t *diverged_since[RAM_IMAGE_MAX_BLOCKS];
};

static inline uint64_t block_pages(const struct ram_image_block *b)
{
	return b->length / MIG_PAGE_SIZE;
}

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
void ram_image_set_err(char *err, size_t errlen, const char *fmt, ...);

/* b->mem as a shared view of a new memfd of b->length bytes (b->fd). */
int ram_image_map_file(struct ram_image_block *b, char *err, size_t errlen);
/* Unmaps and closes what ram_image_map_file made; a no-op on a block it never made. */
void ram_image_unmap_file(struct ram_image_block *b);

#endif
