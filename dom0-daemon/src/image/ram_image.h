/*
 * The backup's copy of the guest: every RAM block as of the last committed
 * epoch, plus that epoch's device state blob, machine type and the ram
 * section id of the primary's stream (what a restore needs to rebuild a
 * stream `qemu -incoming` accepts, see restore_stream.h).
 *
 * Why a memfd per block (MAP_SHARED|MAP_NORESERVE): pages the guest never
 * touched cost nothing until written, nothing outlives the process (a
 * crashed backup must not leave an image that mixes two epochs behind;
 * the primary re-syncs instead), and a takeover's QEMU maps the main RAM
 * block's memfd itself (memory-backend-file, share=on): it resumes the
 * committed image where it lies, and no page is copied, so a takeover's
 * time does not grow with the guest's RAM (failover_qemu.c).
 *
 * Why the image diverges from its memfds while a fork holds it: a fork
 * (vm_fork.c) freezes the image by fork()ing the daemon, and fork()
 * freezes private mappings only.  So before that fork() the daemon views
 * every memfd privately: the child sees the memfds, which nobody writes
 * meanwhile, the daemon's own stores go to its private copies, and it
 * notes which pages it stored.  When the fork ends those pages are
 * written back and the views are shared again (ram_image_converge).
 * While diverged a takeover streams the image instead.
 *
 * Why a "written" bitmap per block: a restore must describe every page of
 * every block, and most of a freshly booted guest's RAM was never written.
 * With the bitmap the restore emits those as zero records without reading
 * (and thereby faulting in) their memory.  A bit set means "may hold
 * non-zero data"; a page stored as zero clears it again.
 *
 * Single-threaded like the rest of the daemon; no locking.
 */
#ifndef REMUSDB_RAM_IMAGE_H
#define REMUSDB_RAM_IMAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buffer.h"

/* The same limit as the COLO parser's MEM_SIZE record. */
#define RAM_IMAGE_MAX_BLOCKS 64

struct ram_image_block {
	char name[256]; /* NUL-terminated, 1..255 bytes (u8 length on the wire) */
	uint64_t length; /* bytes, a positive multiple of MIG_PAGE_SIZE */
	uint8_t *mem;
	uint64_t *written_bitmap; /* bit p of word p/64: page p was written */
	int fd;                   /* the memfd mem views (ram_image_file.c) */
};

struct ram_image;

/* One page of one block. */
struct page_ref {
	uint32_t block;
	uint64_t page;
};

/*
 * Maps one memfd per block (see above).  Rejects (NULL, reason in err):
 * count 0 or above RAM_IMAGE_MAX_BLOCKS, an empty or over-long machine
 * type or block name, duplicate names, zero or unaligned lengths, and
 * ram section id 0 (QEMU's section lookup matches unloaded entries for id
 * 0, so a restore stream using it would load into the wrong device).
 */
struct ram_image *ram_image_create(const char *machine_type,
				   uint32_t ram_section_id,
				   const char *const *names,
				   const uint64_t *lengths, size_t count,
				   char *err, size_t errlen);
void ram_image_destroy(struct ram_image *img); /* NULL is a no-op */

const char *ram_image_machine_type(const struct ram_image *img);
uint32_t ram_image_ram_section_id(const struct ram_image *img);
size_t ram_image_block_count(const struct ram_image *img);
/* NULL when i is out of range. */
const struct ram_image_block *ram_image_block(const struct ram_image *img,
					      size_t i);

/*
 * Stores page `page_index` of block `block`: 4096 bytes from data, or a
 * zero page when data is NULL.  Returns 0, or -1 when the block or page is
 * out of range (nothing changed).  A zero page over a never-written page
 * touches no memory.
 */
int ram_image_store_page(struct ram_image *img, unsigned block,
			 uint64_t page_index, const uint8_t *data);
/* True when the bit is set: the page may hold non-zero data. */
int ram_image_page_written(const struct ram_image_block *b, uint64_t page_index);

uint64_t ram_image_pages_total(const struct ram_image *img);
/* Pages whose written bit is set. */
uint64_t ram_image_pages_written(const struct ram_image *img);

/*
 * Recently stored pages, for a fork taken from this image (vm_fork.h):
 * every store marks its page in the current generation; a rotation
 * starts a new one and forgets the one before the previous.
 * ram_image_recent_pages lists the pages of the previous and current
 * generations, the previous first, as a malloc'd array (NULL and
 * *count 0 when there are none or memory ran out).
 */
void ram_image_rotate_recent(struct ram_image *img);
struct page_ref *ram_image_recent_pages(const struct ram_image *img, size_t *count);

/*
 * Diverging for a fork, and converging back (see above; ram_image_file.c).
 * ram_image_diverge: call it before the fork() that is to freeze the
 * image; 0 when already diverged.  ram_image_converge: call it once no
 * forked child can read the memfds any more; pages_written_back (may be
 * NULL) tells how many pages it wrote back.  Both: 0, or -1 with err (the
 * image is then as it was, and still correct to read and store into).
 */
int ram_image_diverge(struct ram_image *img, char *err, size_t errlen);
int ram_image_converge(struct ram_image *img, uint64_t *pages_written_back,
		       char *err, size_t errlen);
/*
 * The same a slice at a time, so that the event loop goes on between
 * slices: writes back at most max_pages (0: no bound) pages, counted in
 * *written (may be NULL); returns 1 while pages remain (call again; the
 * image is still diverged, and stores meanwhile are written back too), 0
 * once converged, -1 with err.  Only while no forked child reads the
 * memfds: a fork taken meanwhile must stop the slices until its end.
 */
int ram_image_converge_some(struct ram_image *img, uint64_t max_pages, uint64_t *written,
			    char *err, size_t errlen);
bool ram_image_diverged(const struct ram_image *img);
/*
 * The memfd holding the block named block_name, in sync with the image,
 * and its length: -1 while the image is diverged or when there is no
 * such block.  The fd stays the image's (close nothing).
 */
int ram_image_shared_fd(const struct ram_image *img, const char *block_name,
			uint64_t *length);

/* Replaces the device blob with a copy of data; -1 (ENOMEM) keeps the old. */
int ram_image_set_device_blob(struct ram_image *img, const uint8_t *data,
			      size_t len);
/*
 * Exchanges the image's blob with *blob without copying or allocating, so
 * that a commit cannot fail half-way (epoch_stage.c); *blob then holds the
 * previous blob.
 */
void ram_image_swap_device_blob(struct ram_image *img, struct buffer *blob);
/* Empty until the first epoch carrying device state was committed. */
const struct buffer *ram_image_device_blob(const struct ram_image *img);

#endif
