/*
 * Where the image's pages live (ram_image.h): one memfd per block, which
 * the daemon views shared while the image is in sync with it, so that a
 * takeover's QEMU can map the block itself, and privately while a fork
 * holds the image (diverged), so that fork() freezes it for the child.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/unmap_later.h"
#include "image/ram_image_internal.h"

static void *view_of(const struct ram_image_block *b, int sharing)
{
	/* NORESERVE: a sparse guest must not need its full size in swap. */
	return mmap(NULL, (size_t)b->length, PROT_READ | PROT_WRITE,
		    sharing | MAP_NORESERVE, b->fd, 0);
}

int ram_image_map_file(struct ram_image_block *b, char *err, size_t errlen)
{
	char name[80];

	/* The name shows in /proc/PID/maps and QEMU's: which VM's block it is. */
	snprintf(name, sizeof(name), "remusdb-image:%.60s", b->name);
	b->fd = memfd_create(name, MFD_CLOEXEC);
	if (b->fd < 0) {
		ram_image_set_err(err, errlen, "cannot create a memfd for RAM block %s: %s",
				  b->name, strerror(errno));
		return -1;
	}
	/* A memfd's size costs nothing until pages are written. */
	if (ftruncate(b->fd, (off_t)b->length) < 0) {
		ram_image_set_err(err, errlen, "cannot size the memfd of RAM block %s "
				  "(%llu MiB): %s", b->name,
				  (unsigned long long)(b->length >> 20), strerror(errno));
		return -1;
	}
	void *mem = view_of(b, MAP_SHARED);
	if (mem == MAP_FAILED) {
		ram_image_set_err(err, errlen, "cannot map RAM block %s (%llu MiB): %s",
				  b->name, (unsigned long long)(b->length >> 20),
				  strerror(errno));
		return -1;
	}
	b->mem = mem;
	return 0;
}

/* Off the loop: the image's pages are freed with its last mapping (unmap_later.h). */
void ram_image_unmap_file(struct ram_image_block *b)
{
	unmap_later(b->mem, b->mem ? (size_t)b->length : 0, b->fd);
	b->mem = NULL;
	b->fd = -1;
}

/* Every block viewed anew (MAP_SHARED or MAP_PRIVATE), or none: -1 with errno. */
static int switch_views(struct ram_image *img, int sharing)
{
	void *views[RAM_IMAGE_MAX_BLOCKS];

	for (size_t i = 0; i < img->count; i++) {
		views[i] = view_of(&img->blocks[i], sharing);
		if (views[i] == MAP_FAILED) {
			int saved = errno;

			while (i-- > 0)
				munmap(views[i], (size_t)img->blocks[i].length);
			errno = saved;
			return -1;
		}
	}
	for (size_t i = 0; i < img->count; i++) {
		munmap(img->blocks[i].mem, (size_t)img->blocks[i].length);
		img->blocks[i].mem = views[i];
	}
	return 0;
}

int ram_image_diverge(struct ram_image *img, char *err, size_t errlen)
{
	if (img->diverged)
		return 0;
	for (size_t i = 0; i < img->count; i++) {
		img->diverged_since[i] = calloc((size_t)(block_pages(&img->blocks[i]) + 63) / 64,
						sizeof(uint64_t));
		if (!img->diverged_since[i])
			goto fail;
	}
	if (switch_views(img, MAP_PRIVATE) < 0) {
		ram_image_set_err(err, errlen, "cannot map the image privately: %s",
				  strerror(errno));
		goto freed;
	}
	img->diverged = true;
	return 0;
fail:
	ram_image_set_err(err, errlen, "out of memory for the bitmaps of a diverged image");
freed:
	for (size_t i = 0; i < img->count; i++) {
		free(img->diverged_since[i]);
		img->diverged_since[i] = NULL;
	}
	return -1;
}

static int write_all(int fd, const uint8_t *data, size_t len, off_t at)
{
	while (len) {
		ssize_t n = pwrite(fd, data, len, at);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		data += n;
		len -= (size_t)n;
		at += n;
	}
	return 0;
}

/*
 * Up to *budget of the pages stored since the divergence, from the
 * private view into the memfd, each run of adjacent pages in one
 * pwrite; their bits are cleared as they are written, so that a later
 * call (or a retry after a failure) goes on where this one stopped.
 */
static int write_back(struct ram_image_block *b, uint64_t *since, uint64_t *budget)
{
	uint64_t pages = block_pages(b);

	for (uint64_t p = 0; p < pages && *budget;) {
		if (!since[p / 64]) {
			p = (p / 64 + 1) * 64;
			continue;
		}
		if (!((since[p / 64] >> (p % 64)) & 1)) {
			p++;
			continue;
		}
		uint64_t run = p;

		while (run < pages && run - p < *budget && ((since[run / 64] >> (run % 64)) & 1))
			run++;
		if (write_all(b->fd, b->mem + p * MIG_PAGE_SIZE,
			      (size_t)(run - p) * MIG_PAGE_SIZE, (off_t)(p * MIG_PAGE_SIZE)) < 0)
			return -1;
		for (uint64_t q = p; q < run; q++)
			since[q / 64] &= ~((uint64_t)1 << (q % 64));
		*budget -= run - p;
		p = run;
	}
	return 0;
}

int ram_image_converge_some(struct ram_image *img, uint64_t max_pages, uint64_t *written,
			    char *err, size_t errlen)
{
	uint64_t budget = max_pages ? max_pages : UINT64_MAX;

	if (written)
		*written = 0;
	if (!img->diverged)
		return 0;
	for (size_t i = 0; i < img->count && budget; i++) {
		uint64_t before = budget;
		int rc = write_back(&img->blocks[i], img->diverged_since[i], &budget);

		if (written)
			*written += before - budget;
		if (rc < 0) {
			ram_image_set_err(err, errlen, "cannot write RAM block %s back into its "
					  "memfd: %s", img->blocks[i].name, strerror(errno));
			return -1;
		}
	}
	/* Pages left (the budget ran out): the next call goes on. */
	for (size_t i = 0; i < img->count; i++) {
		uint64_t words = (block_pages(&img->blocks[i]) + 63) / 64;

		for (uint64_t w = 0; w < words; w++)
			if (img->diverged_since[i][w])
				return 1;
	}
	/* Every page is back, and nothing is stored between here and the switch. */
	if (switch_views(img, MAP_SHARED) < 0) {
		ram_image_set_err(err, errlen, "cannot map the image shared again: %s",
				  strerror(errno));
		return -1;
	}
	for (size_t i = 0; i < img->count; i++) {
		free(img->diverged_since[i]);
		img->diverged_since[i] = NULL;
	}
	img->diverged = false;
	return 0;
}

int ram_image_converge(struct ram_image *img, uint64_t *pages_written_back,
		       char *err, size_t errlen)
{
	return ram_image_converge_some(img, 0, pages_written_back, err, errlen);
}

bool ram_image_diverged(const struct ram_image *img)
{
	return img->diverged;
}

int ram_image_shared_fd(const struct ram_image *img, const char *block_name,
			uint64_t *length)
{
	if (img->diverged)
		return -1;
	for (size_t i = 0; i < img->count; i++) {
		if (!strcmp(img->blocks[i].name, block_name)) {
			*length = img->blocks[i].length;
			return img->blocks[i].fd;
		}
	}
	return -1;
}
