/*
 * One epoch the backup has received but not yet committed: its dirty
 * pages, its device state blob and its disk writes, held aside until the
 * epoch's end-of-epoch checksum matched, then applied to the RAM image and
 * the disk replica in one call (or dropped).
 *
 * Why this is atomic without locks or a journal:
 *   - Nothing staged touches the image or the disk before commit.  Page
 *     data is copied in (the frames' buffers are reused by the receiver),
 *     so a discarded epoch leaves no trace.
 *   - epoch_stage_commit() applies the whole epoch in one call on the
 *     daemon's single thread.  Failover, status and restore run on the same
 *     thread, so no reader can observe an image with half an epoch in it.
 *   - Commit validates everything it can before changing anything (page
 *     ranges, device state complete, a disk to write to), and the RAM part
 *     cannot fail after that: pages are memcpy'd and the device blob is
 *     swapped in without allocating.  Only the disk can fail half-way; the
 *     caller must then treat the replica as broken (it is never resumed).
 *   - The image lives in anonymous memory (ram_image.h): a crash of the
 *     backup process loses it entirely instead of leaving a mix of epochs
 *     N-1 and N behind.  The primary then re-syncs from scratch.
 *
 * Within an epoch, everything is applied in arrival order, so a page or
 * disk range sent twice ends with its last version.
 */
#ifndef REMUSDB_EPOCH_STAGE_H
#define REMUSDB_EPOCH_STAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "image/ram_image.h"

struct epoch_stage;

/* NULL when out of memory. */
struct epoch_stage *epoch_stage_create(void);
void epoch_stage_destroy(struct epoch_stage *s); /* NULL is a no-op */

/* Drops anything staged and opens `epoch`. */
void epoch_stage_begin(struct epoch_stage *s, uint64_t epoch);
uint64_t epoch_stage_epoch(const struct epoch_stage *s);

/*
 * Stages page `page_index` of image block `block`: a copy of 4096 bytes,
 * or a zero page when data is NULL.  The range is checked against the
 * image at commit (the stage does not know the layout).  Returns 0, or -1
 * when out of memory.
 */
int epoch_stage_add_page(struct epoch_stage *s, unsigned block,
			 uint64_t page_index, const uint8_t *data);
/*
 * Stages a page whose content is not known yet (a coded page waiting for
 * its disk block or a resend) at its place in arrival order, and returns
 * where to write its 4096 bytes; they stay valid, and are applied with
 * the epoch, until the stage is committed or discarded.  The content
 * starts as zeros.  NULL when out of memory.
 */
uint8_t *epoch_stage_reserve_page(struct epoch_stage *s, unsigned block,
				  uint64_t page_index);
/*
 * Reads len bytes at offset of the disk as this epoch's commit would
 * leave it: disk_fd's content (zeros past its end) with the staged disk
 * writes and zero ranges laid over it in order.  For disk references
 * (DISK_REF), which name a block as of the end of their epoch.  0, or -1
 * with errno.
 */
int epoch_stage_read_disk(const struct epoch_stage *s, int disk_fd, uint64_t offset,
			  uint8_t *buf, size_t len);
/*
 * The next piece of the epoch's device state: `total` is the whole blob's
 * size and must be the same in every chunk; `offset` must equal the bytes
 * received so far.  Returns 0, or -1 with the reason in
 * epoch_stage_error() (out of order, inconsistent total, overflow, empty
 * blob, out of memory); the stage is unchanged then.
 */
int epoch_stage_add_device_chunk(struct epoch_stage *s, uint64_t total,
				 uint64_t offset, const uint8_t *d, size_t n);
/* Returns 0, or -1 (overflowing range, or out of memory). */
int epoch_stage_add_disk_write(struct epoch_stage *s, uint64_t offset,
			       const uint8_t *d, size_t n);
int epoch_stage_add_disk_zero(struct epoch_stage *s, uint64_t offset,
			      uint64_t length);

/* Page records staged (zero pages included). */
uint64_t epoch_stage_pages(const struct epoch_stage *s);
/* Data bytes held: non-zero pages, disk write payloads, device state. */
size_t epoch_stage_bytes(const struct epoch_stage *s);
/*
 * True when the epoch carries no device state at all (epoch 0 does not,
 * for one) or all `total` bytes of it arrived.
 */
bool epoch_stage_device_complete(const struct epoch_stage *s);
/* Why the last failing call failed ("" if none did). */
const char *epoch_stage_error(const struct epoch_stage *s);

/*
 * Calls fn for every disk range the epoch writes or zeroes, in order,
 * before the commit changes any (a fork's disk snapshot on the backup
 * preserves them, vm_fork.h); stops at and returns fn's first non-zero.
 */
int epoch_stage_for_each_disk_range(const struct epoch_stage *s,
				    int (*fn)(void *opaque, uint64_t offset, uint64_t length),
				    void *opaque);
/*
 * Applies the epoch: disk writes to disk_fd with pwrite, zero ranges with
 * fallocate(PUNCH_HOLE|KEEP_SIZE) or, where that is unsupported, by
 * writing zeros (disk_fd -1: the VM has no disk, and an epoch with disk
 * writes is then an error); then the pages into img; then the device blob
 * replaces img's, only if the epoch carried one.  Returns 0, or -1 with
 * err.  A failed check (page outside the image, device state incomplete,
 * no disk) changes nothing; a failed disk write leaves the disk partly
 * written and img untouched, and the caller must treat the replica as
 * broken.  Either way the stage is empty afterwards (same epoch number).
 */
int epoch_stage_commit(struct epoch_stage *s, struct ram_image *img,
		       int disk_fd, char *err, size_t errlen);
/* Drops everything staged (failover discards an unacknowledged epoch). */
void epoch_stage_discard(struct epoch_stage *s);

#endif
