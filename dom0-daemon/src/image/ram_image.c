/* The backup's committed RAM image and device state (ram_image.h). */
#include "image/ram_image.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "image/ram_image_internal.h"
#include "qemu/migration_writer.h"

void ram_image_set_err(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || errlen == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

/* Names go on the wire as u8 length + bytes, and QEMU never sends "". */
static int valid_name(const char *name)
{
	size_t len = name ? strnlen(name, 256) : 0;

	return len > 0 && len < 256;
}

static int check_layout(const char *machine_type, uint32_t ram_section_id,
			const char *const *names, const uint64_t *lengths,
			size_t count, char *err, size_t errlen)
{
	if (!valid_name(machine_type)) {
		ram_image_set_err(err, errlen, "machine type must be 1..255 bytes");
		return -1;
	}
	if (ram_section_id == 0) {
		ram_image_set_err(err, errlen, "ram section id 0 is invalid (QEMU matches "
				     "unloaded entries for id 0)");
		return -1;
	}
	if (count == 0 || count > RAM_IMAGE_MAX_BLOCKS) {
		ram_image_set_err(err, errlen, "%zu RAM blocks (need 1..%d)", count,
			RAM_IMAGE_MAX_BLOCKS);
		return -1;
	}
	for (size_t i = 0; i < count; i++) {
		if (!valid_name(names[i])) {
			ram_image_set_err(err, errlen, "RAM block %zu: name must be 1..255 "
					     "bytes", i);
			return -1;
		}
		if (lengths[i] == 0 || lengths[i] % MIG_PAGE_SIZE ||
		    lengths[i] > SIZE_MAX) {
			ram_image_set_err(err, errlen, "RAM block %s: length 0x%llx is not a "
					     "positive multiple of %u", names[i],
				(unsigned long long)lengths[i], MIG_PAGE_SIZE);
			return -1;
		}
		for (size_t j = 0; j < i; j++) {
			if (strcmp(names[i], names[j]) == 0) {
				ram_image_set_err(err, errlen, "duplicate RAM block '%s'",
					names[i]);
				return -1;
			}
		}
	}
	return 0;
}

static int map_block(struct ram_image *img, struct ram_image_block *b, const char *name,
		     uint64_t length, char *err, size_t errlen)
{
	uint64_t words = (length / MIG_PAGE_SIZE + 63) / 64;

	snprintf(b->name, sizeof(b->name), "%s", name);
	b->length = length;
	b->fd = -1;
	if (ram_image_map_file(b, err, errlen) < 0)
		return -1;
	b->written_bitmap = calloc((size_t)words, sizeof(uint64_t));
	size_t i = (size_t)(b - img->blocks);
	img->recent[i][0] = calloc((size_t)words, sizeof(uint64_t));
	img->recent[i][1] = calloc((size_t)words, sizeof(uint64_t));
	if (!b->written_bitmap || !img->recent[i][0] || !img->recent[i][1]) {
		ram_image_set_err(err, errlen, "out of memory for the bitmap of RAM block %s",
			name);
		return -1;
	}
	return 0;
}

struct ram_image *ram_image_create(const char *machine_type,
				   uint32_t ram_section_id,
				   const char *const *names,
				   const uint64_t *lengths, size_t count,
				   char *err, size_t errlen)
{
	if (check_layout(machine_type, ram_section_id, names, lengths, count,
			 err, errlen) < 0)
		return NULL;
	struct ram_image *img = calloc(1, sizeof(*img));
	if (!img) {
		ram_image_set_err(err, errlen, "out of memory");
		return NULL;
	}
	snprintf(img->machine_type, sizeof(img->machine_type), "%s", machine_type);
	img->ram_section_id = ram_section_id;
	buffer_init(&img->device_blob);
	for (size_t i = 0; i < count; i++) {
		/* count first, so that destroy unmaps a half-built block too */
		img->count = i + 1;
		if (map_block(img, &img->blocks[i], names[i], lengths[i], err,
			      errlen) < 0) {
			ram_image_destroy(img);
			return NULL;
		}
		img->pages_total += block_pages(&img->blocks[i]);
	}
	return img;
}

void ram_image_destroy(struct ram_image *img)
{
	if (!img)
		return;
	for (size_t i = 0; i < img->count; i++) {
		struct ram_image_block *b = &img->blocks[i];

		ram_image_unmap_file(b);
		free(b->written_bitmap);
		free(img->diverged_since[i]);
		free(img->recent[i][0]);
		free(img->recent[i][1]);
	}
	buffer_free(&img->device_blob);
	free(img);
}

const char *ram_image_machine_type(const struct ram_image *img)
{
	return img->machine_type;
}

uint32_t ram_image_ram_section_id(const struct ram_image *img)
{
	return img->ram_section_id;
}

size_t ram_image_block_count(const struct ram_image *img)
{
	return img->count;
}

const struct ram_image_block *ram_image_block(const struct ram_image *img,
					      size_t i)
{
	return i < img->count ? &img->blocks[i] : NULL;
}

int ram_image_page_written(const struct ram_image_block *b, uint64_t page_index)
{
	return (b->written_bitmap[page_index / 64] >> (page_index % 64)) & 1;
}

int ram_image_store_page(struct ram_image *img, unsigned block,
			 uint64_t page_index, const uint8_t *data)
{
	if (block >= img->count)
		return -1;
	struct ram_image_block *b = &img->blocks[block];
	if (page_index >= block_pages(b))
		return -1;
	uint8_t *page = b->mem + page_index * MIG_PAGE_SIZE;
	uint64_t *word = &b->written_bitmap[page_index / 64];
	uint64_t bit = (uint64_t)1 << (page_index % 64);

	img->recent[block][img->gen][page_index / 64] |= bit;
	if (img->diverged)
		img->diverged_since[block][page_index / 64] |= bit;
	if (data) {
		memcpy(page, data, MIG_PAGE_SIZE);
		if (!(*word & bit))
			img->pages_written++;
		*word |= bit;
	} else if (*word & bit) {
		/* A never-written page is already zero: leave it unbacked. */
		memset(page, 0, MIG_PAGE_SIZE);
		*word &= ~bit;
		img->pages_written--;
	}
	return 0;
}

uint64_t ram_image_pages_total(const struct ram_image *img)
{
	return img->pages_total;
}

uint64_t ram_image_pages_written(const struct ram_image *img)
{
	return img->pages_written;
}

int ram_image_set_device_blob(struct ram_image *img, const uint8_t *data,
			      size_t len)
{
	struct buffer copy;

	buffer_init(&copy);
	if (len && buffer_append(&copy, data, len) < 0) {
		errno = ENOMEM;
		return -1;
	}
	ram_image_swap_device_blob(img, &copy);
	buffer_free(&copy);
	return 0;
}

void ram_image_swap_device_blob(struct ram_image *img, struct buffer *blob)
{
	struct buffer old = img->device_blob;

	img->device_blob = *blob;
	*blob = old;
}

const struct buffer *ram_image_device_blob(const struct ram_image *img)
{
	return &img->device_blob;
}

void ram_image_rotate_recent(struct ram_image *img)
{
	img->gen ^= 1;
	for (size_t i = 0; i < img->count; i++)
		memset(img->recent[i][img->gen], 0,
		       (block_pages(&img->blocks[i]) + 63) / 64 * sizeof(uint64_t));
}

struct page_ref *ram_image_recent_pages(const struct ram_image *img, size_t *count)
{
	size_t n = 0, cap = 0;
	struct page_ref *out = NULL;

	/* The older generation first: pushes go least recent first. */
	for (unsigned pass = 0; pass < 2; pass++) {
		unsigned g = pass == 0 ? img->gen ^ 1 : img->gen;

		for (size_t b = 0; b < img->count; b++) {
			uint64_t words = (block_pages(&img->blocks[b]) + 63) / 64;

			for (uint64_t w = 0; w < words; w++) {
				uint64_t bits = img->recent[b][g][w];

				if (pass == 1)
					bits &= ~img->recent[b][g ^ 1][w]; /* listed already */
				while (bits) {
					unsigned bit = (unsigned)__builtin_ctzll(bits);

					bits &= bits - 1;
					if (n == cap) {
						size_t ncap = cap ? cap * 2 : 1024;
						struct page_ref *grown = realloc(out, ncap * sizeof(*out));

						if (!grown) {
							free(out);
							*count = 0;
							return NULL;
						}
						out = grown;
						cap = ncap;
					}
					out[n].block = (uint32_t)b;
					out[n].page = w * 64 + bit;
					n++;
				}
			}
		}
	}
	*count = n;
	return out;
}
