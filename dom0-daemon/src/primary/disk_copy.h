/*
 * The primary's disk replication: the initial copy of the VM's disk to
 * the backup while the VM runs, and the mirroring of every guest write
 * since, tagged with the epoch open when it completed.
 *
 * Why both in one unit: they are the two halves of one replica.  The
 * copy reads the disk file (only its allocated extents: SEEK_DATA /
 * SEEK_HOLE; in a failback's resync only the changed 1 MiB extents) in chunks paced by the connection's backlog; the mirror
 * hooks the VM's NBD export, so a write that lands behind the copy's
 * position is sent as a DISK_WRITE of its epoch and the backup applies it
 * when that epoch commits, after the copy.  Both append to the epoch
 * stream and its checksum, which the caller owns.
 *
 * The copy's chunks are read on a worker thread of the copy's own, one at
 * a time, and queued on the loop when read; a chunk that a mirrored write
 * touched while it was read is read again, since its frame would follow
 * the write's and undo it at the backup.
 */
#ifndef REMUSDB_DISK_COPY_H
#define REMUSDB_DISK_COPY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/event_loop.h"
#include "nbd/nbd_server.h"
#include "base/buffer.h"

enum disk_copy_fault {
	DISK_COPY_READ_FAILED,  /* the local disk: nothing the backup did */
	DISK_COPY_QUEUE_FAILED, /* a frame could not be queued (out of memory) */
};

struct disk_copy_events {
	void *opaque;
	/* The epoch that writes completing now belong to. */
	uint64_t (*open_epoch)(void *opaque);
	/* DISK_SYNC_DONE is queued: the whole disk is on its way. */
	void (*on_copied)(void *opaque);
	/* Copying or mirroring stopped (disk_copy_stop already ran). */
	void (*on_failed)(void *opaque, enum disk_copy_fault fault, const char *why);
};

/*
 * Where the frames go.  Frames of one epoch: buffer_for(epoch), append
 * whole frames with repl_put_*, then appended(epoch, buffer_len taken
 * before).  The copy's DISK_SYNC frames are tagged with the open epoch
 * like the writes, so that a chunk read while epoch N is open reaches the
 * backup inside N's span: the backup becomes ready at the first commit
 * after DISK_SYNC_DONE, and everything the copy read must be committed
 * by then.
 */
struct disk_copy_sink {
	void *opaque;
	/* NULL: the frames cannot be queued (the copy fails). */
	struct buffer *(*buffer_for)(void *opaque, uint64_t epoch);
	/* 0, or -1: the copy fails. */
	int (*appended)(void *opaque, uint64_t epoch, size_t before);
	/* Bytes queued but not yet sent: the copy adds a chunk only while this is small. */
	size_t (*backlog)(void *opaque);
};

struct disk_copy;

/* Opens the disk file for reading.  NULL with a message in err. */
struct disk_copy *disk_copy_open(event_loop *loop, const char *disk_path,
				 const struct disk_copy_events *ev, char *err, size_t errlen);
void disk_copy_destroy(struct disk_copy *dc); /* NULL is a no-op */
uint64_t disk_copy_size(const struct disk_copy *dc);
uint64_t disk_copy_bytes(const struct disk_copy *dc);  /* data queued so far */
bool disk_copy_done(const struct disk_copy *dc);

/*
 * Mirrors export's writes into the sink (copied) and starts the copy,
 * paced by a timer and disk_copy_pump, once disk_copy_set_plan says what
 * to copy.  0, or -1 with err filled (no timer).
 */
int disk_copy_start(struct disk_copy *dc, struct nbd_export *export,
		    const struct disk_copy_sink *sink, char *err, size_t errlen);
/*
 * What to copy, as the backup decided (DISK_PLAN): bits marks the 1 MiB
 * extents of a resync, NULL means the whole disk.  The copy waits for
 * this; the write mirror does not.  0, or -1 when out of memory.
 */
#define DISK_COPY_EXTENT_SHIFT 20
int disk_copy_set_plan(struct disk_copy *dc, const uint8_t *bits, uint64_t extent_count);
uint64_t disk_copy_planned_extents(const struct disk_copy *dc);
/* Queues more of the copy while the connection's backlog is small (on drained). */
void disk_copy_pump(struct disk_copy *dc);
/* Detaches the write hook and stops the copy; the sink is no longer used. */
void disk_copy_stop(struct disk_copy *dc);

#endif
