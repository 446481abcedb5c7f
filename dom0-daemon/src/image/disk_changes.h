/*
 * A disk image's change log: the persisted record, beside the image
 * (IMAGE.changes), of which protection generation the image belongs to
 * and which 1 MiB extents may differ from that generation's committed
 * state.  It is what lets a failback resend only changed blocks instead
 * of the whole disk (DRBD's activity log, bitmap and generation UUIDs in
 * one small file).
 *
 * Why a persisted log and not only a bitmap in memory: the hosts that
 * need it are the ones that crashed.  A primary applies a guest write to
 * its image at once but the backup applies it only when its epoch
 * commits, so a dead primary's image holds writes the backup never saw.
 * The backup cannot know them; only this log, made durable before the
 * write reaches the image, can tell the primary's image apart later.
 *
 * The rules that make "an extent not marked equals the generation's
 * committed state" true:
 *  - a write marks its extents first, durably (fdatasync) when a mark is
 *    new, and remembers the epoch it belongs to (DISK_CHANGES_NO_EPOCH
 *    when no protection runs: such a mark never clears on its own);
 *  - a mark clears only once the backup acknowledged that epoch and the
 *    image was flushed after it (disk_changes_forget_acked), and only
 *    within the generation the backup holds: after a power cut an
 *    unmarked extent must still hold every write the backup has;
 *  - a new generation starts when a protection's initial copy is
 *    acknowledged (disk_changes_begin_generation); until then the old
 *    generation and all its marks stay, so a copy that dies half way
 *    leaves the old copy usable;
 *  - a file that is torn, of another size, unreadable, or kept for
 *    another image file at that path (its inode) is "unproven":
 *    generation 0, every extent marked, with the reason kept.  A disk
 *    overwritten in place by other contents cannot be told apart: the
 *    log must go with its disk (remusdb-vm --fresh removes it).
 */
#ifndef REMUSDB_DISK_CHANGES_H
#define REMUSDB_DISK_CHANGES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DISK_CHANGES_EXTENT_SHIFT 20 /* 1 MiB extents */
#define DISK_CHANGES_NO_EPOCH UINT64_MAX
/* Generation 0 names no generation: an image nobody can vouch for. */
#define DISK_CHANGES_NO_GENERATION 0

/* The extents of a size-byte disk, and one extent's bit in a bitmap (LSB first). */
static inline uint64_t disk_changes_extents_of(uint64_t size)
{
	return (size + (1u << DISK_CHANGES_EXTENT_SHIFT) - 1) >> DISK_CHANGES_EXTENT_SHIFT;
}

static inline bool extent_bit(const uint8_t *bits, uint64_t i)
{
	return bits[i / 8] & (1u << (i % 8));
}

static inline void extent_bit_set(uint8_t *bits, uint64_t i, bool on)
{
	if (on)
		bits[i / 8] |= (uint8_t)(1u << (i % 8));
	else
		bits[i / 8] &= (uint8_t)~(1u << (i % 8));
}

struct disk_changes;

/*
 * Opens IMAGE.changes for an image of image_size bytes, or starts an
 * empty one (generation 0, nothing written yet) when there is none.  An
 * unreadable or torn file is not an error: the log is then unproven,
 * disk_changes_trouble says why.  NULL only when out of memory or the
 * path is too long, with err filled.
 */
struct disk_changes *disk_changes_open(const char *image_path, uint64_t image_size,
				       char *err, size_t errlen);
/* Whether IMAGE.changes exists (a generation was ever recorded there). */
bool disk_changes_exist(const char *image_path);
void disk_changes_close(struct disk_changes *dc); /* NULL is a no-op */

uint64_t disk_changes_generation(const struct disk_changes *dc);
/* Why the log cannot vouch for the image, or NULL when it can. */
const char *disk_changes_trouble(const struct disk_changes *dc);
uint64_t disk_changes_extent_count(const struct disk_changes *dc);
/* The marks, one bit per extent (bit i of byte i/8, LSB first). */
const uint8_t *disk_changes_bitmap(const struct disk_changes *dc);
size_t disk_changes_bitmap_bytes(uint64_t extent_count);
uint64_t disk_changes_marked(const struct disk_changes *dc);
/* The extent this process saw written last (UINT64_MAX: none): the negative control's pick. */
uint64_t disk_changes_last_written(const struct disk_changes *dc);

/*
 * Marks the extents of [offset, offset+len) as written in epoch.  A new
 * mark is made durable before this returns.  0, or -1 when the log could
 * not be written: it is then unproven (a later failback copies the whole
 * disk) but the write may go on; the error is logged once.
 */
int disk_changes_mark(struct disk_changes *dc, uint64_t offset, uint64_t len, uint64_t epoch);
/* Marks whole extents (the bitmap's bits) with DISK_CHANGES_NO_EPOCH, durably. */
int disk_changes_mark_bitmap(struct disk_changes *dc, const uint8_t *bits, uint64_t count);
/* A new protection session numbers epochs from 1 again: old marks predate it. */
void disk_changes_new_session(struct disk_changes *dc);
/*
 * The image now holds generation's committed state except for the
 * extents written after acked_epoch of the current session: those stay
 * marked, the rest clear.  The caller flushed the image after every
 * write of epochs <= acked_epoch (file_flush.h).  Durable.  0 or -1
 * (then unproven).
 */
int disk_changes_begin_generation(struct disk_changes *dc, uint64_t generation,
				  uint64_t acked_epoch);
/*
 * Clears the marks of this generation whose epochs the backup
 * acknowledged, up to acked_epoch, once the caller flushed the image
 * after them (lazily persisted: a lost clear only keeps a mark).
 */
void disk_changes_forget_acked(struct disk_changes *dc, uint64_t acked_epoch);
/* The image is being rewritten: no generation until it is whole again.  Durable. */
int disk_changes_invalidate(struct disk_changes *dc, const char *why);
/*
 * A backup's replica once its copy is whole and committed, before any
 * flush: the image holds generation's committed state as the page cache
 * shows it, with writes of later epochs the primary still marks.  That
 * holds while this kernel runs (a daemon killed and restarted reads what
 * it wrote), not after a reboot or a power cut, which may lose writes not
 * yet on disk: so the claim names the kernel's boot id, and a log read
 * under another boot is unproven.  Why not flush instead: the replica's
 * writes would have to reach the disk before each acknowledgement.
 * Durable.  0, or -1 (a log that cannot be written, or no boot id; the
 * image then vouches for nothing).
 */
int disk_changes_claim_unflushed(struct disk_changes *dc, uint64_t generation);
/* Whether the generation is such an unflushed claim (not a flushed seal). */
bool disk_changes_unflushed(const struct disk_changes *dc);
/* Tests only: where the kernel's boot id is read (NULL: /proc's). */
void disk_changes_set_boot_id_file(const char *path);

#endif
