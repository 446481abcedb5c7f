/*
 * A frozen view of a running VM's disk: the copy-on-write point of a VM
 * fork.  At fork time, with the parent paused, the snapshot is taken on
 * the parent's NBD export; the parent then keeps writing to its live
 * image while clones read the image as it was at that instant.
 *
 * Why copy-before-write into a side file, and not a copy of the image or
 * an overlay for the parent: taking the snapshot costs only a bitmap and
 * an empty sparse file, so the fork pause does not grow with the disk;
 * the parent's image stays a plain raw file that the rest of remusdbd
 * (replication, read tracking, disk copy) keeps using unchanged; and the
 * cost lands on the parent's first write to each 4 KiB block, once.
 *
 * How: the snapshot registers a before-write hook on the export
 * (nbd_server.h).  Before a WRITE, WRITE_ZEROES or TRIM changes the live
 * image, every 4 KiB block it touches that is not preserved yet is read
 * from the live image and written to the preserve file at the same
 * offset, and only then marked preserved; partial blocks at the edges of
 * the range are preserved whole, and the image's last block may be
 * short.  A block of zeros is marked without writing (the preserve file
 * is sparse and reads zeros there), so trimming free space costs no room.
 * A read takes preserved blocks from the preserve file, all others from
 * the live image, which has not changed them since the snapshot.
 *
 * Block status (NBD base:allocation, disk_snapshot_extents) follows the
 * same split: a block not preserved has the live image's allocation, a
 * preserved one the preserve file's, where only non-zero blocks were
 * written.  So the frozen view's holes are reported as holes, and a
 * clone's overlay backed by the snapshot (qemu-img convert, nbdcopy,
 * QEMU's block-stream or mirror) skips them instead of reading zeros.
 *
 * If preserving fails (the preserve directory is full, an I/O error),
 * the parent's write fails: the client gets ENOSPC (ENOSPC, EDQUOT,
 * EFBIG) or EIO and the live image is left as it was.  The snapshot is
 * never silently broken; the parent's guest sees a disk error instead
 * (QEMU's werror policy decides: by default it pauses the VM).
 *
 * Lifetimes:
 *  - Several snapshots of one export may exist at once, each independent
 *    (each fork has its own); each preserves what it needs.
 *  - disk_snapshot_destroy() unregisters the hook at once, so the parent
 *    stops paying for this snapshot.
 *  - Destroying the live export first detaches its snapshots: from then
 *    on every read of them fails with EIO (logged), because blocks never
 *    preserved can no longer be read.  They must still be destroyed.
 *  - A read-only export serving the snapshot (nbd_export_create_snapshot)
 *    holds it: destroying the snapshot while such an export exists
 *    detaches it as above, and its memory and preserve file go when the
 *    last of those exports is destroyed.  The intended order is still
 *    the export first, then the snapshot.
 *
 * Single-threaded, on the event loop like the NBD server, whose requests
 * run one at a time: nothing can change the live image between the
 * preservation of a block and the write that needed it.
 */
#ifndef REMUSDB_DISK_SNAPSHOT_H
#define REMUSDB_DISK_SNAPSHOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/event_loop.h"

#define DISK_SNAPSHOT_BLOCK_SIZE 4096u

struct nbd_export;
struct disk_snapshot;

struct disk_snapshot_stats {
	uint64_t size;              /* bytes, the live image's at creation */
	uint64_t blocks;            /* 4 KiB blocks, the last one maybe short */
	uint64_t blocks_preserved;  /* copied (or known zero) before a write */
	uint64_t bytes_preserved;   /* written to the preserve file */
	uint64_t preserve_failures; /* parent writes refused because of us */
	uint64_t reads;             /* disk_snapshot_read calls that succeeded */
	uint64_t bytes_read;        /* by clones */
	uint64_t extent_queries;    /* disk_snapshot_extents calls that succeeded */
	bool detached;              /* the live export is gone: reads fail */
};

/*
 * Freezes live's image as it is now.  The preserve file is created in
 * preserve_dir (O_TMPFILE, or created and unlinked at once), so nothing
 * is left behind by a crash.  NULL with a message in err on failure.
 */
struct disk_snapshot *disk_snapshot_create(struct nbd_export *live,
					   const char *preserve_dir,
					   char *err, size_t errlen);
/*
 * Another export now writes the same image (a backup took its VM over:
 * the VM's export replaces remusdbd's own view of the disk replica):
 * preserve before its writes from now on, instead of live's.  -1 when
 * ds is detached, the sizes differ or memory ran out (nothing changed).
 */
int disk_snapshot_rebind(struct disk_snapshot *ds, struct nbd_export *live);
/* Unregisters from the live export; frees now unless an export serves it. */
void disk_snapshot_destroy(struct disk_snapshot *ds);

/*
 * Reads the frozen content [offset, offset+len).  0, or a negative errno
 * with a message in err: EINVAL beyond the end, EIO once detached, or
 * the read's own error.
 */
int disk_snapshot_read(struct disk_snapshot *ds, uint64_t offset, void *buf,
		       size_t len, char *err, size_t errlen);
/*
 * Where the frozen view has holes (NBD base:allocation): [offset,
 * offset+len) as consecutive extents, each data or a hole that reads as
 * zeros, at most max of them from offset; fewer may cover less than len
 * (the NBD client asks again from where they end), and so may a range
 * whose preserved and live blocks alternate very often, to bound one
 * call's cost.  A block not preserved is what the live image says of it,
 * since the image has not changed there; a preserved block is what the
 * preserve file says, where only non-zero blocks were ever written.  So
 * a block that was a hole at the freeze stays a hole after the parent
 * writes it, and a block of data the parent trimmed stays data.  "Data"
 * only means "not known to be a hole" (a file system that cannot tell).
 * 0, or a negative errno with a message in err: EINVAL for an empty
 * range or one beyond the end, EIO once detached.
 */
struct disk_extent;
int disk_snapshot_extents(struct disk_snapshot *ds, uint64_t offset, uint64_t len,
			  struct disk_extent *out, size_t max, size_t *count,
			  char *err, size_t errlen);
uint64_t disk_snapshot_size(const struct disk_snapshot *ds);
void disk_snapshot_get_stats(const struct disk_snapshot *ds,
			     struct disk_snapshot_stats *out);

/*
 * A read-only NBD export of ds (nbd_export_create_read_only): on
 * socket_path for clones on this host, and on tcp_listen ("A.B.C.D:PORT",
 * port 0 picks one, see nbd_export_tcp_port; NULL: none) for clones on
 * other hosts, which connect with
 *   -blockdev driver=nbd,server.type=inet,server.host=A,server.port=P,
 *             export=NAME,read-only=on
 * The export holds ds until it is destroyed.  NULL on error (logged).
 */
struct nbd_export *nbd_export_create_snapshot(event_loop *loop, const char *name,
					      const char *socket_path,
					      const char *tcp_listen,
					      struct disk_snapshot *ds);

#endif
