/*
 * One NBD export (a raw disk image) served on its own unix socket, for
 * QEMU's `-blockdev driver=nbd,server.type=unix,...`.  Several clients may
 * connect; each runs the fixed-newstyle handshake and then transmission,
 * with structured replies and block status (base:allocation) for clients
 * that negotiate them.  Everything runs on the daemon's event loop.
 *
 * A read-only export serves a read function instead of an image (a VM
 * fork's frozen disk, disk_snapshot.h), on a unix socket and optionally
 * on TCP for clones on other hosts.  It goes through the same handshake
 * and transmission code: only where the bytes come from differs, and
 * every request that would change them is refused with EPERM.
 */
#ifndef REMUSDB_NBD_SERVER_H
#define REMUSDB_NBD_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "base/event_loop.h"

struct nbd_export_stats {
	uint64_t reads;
	uint64_t writes;        /* NBD_CMD_WRITE requests that succeeded */
	uint64_t bytes_read;
	uint64_t bytes_written;
	uint64_t flushes;       /* NBD_CMD_FLUSH plus FUA-forced syncs */
	uint64_t trims;
	uint64_t write_zeroes;
	uint64_t block_status;  /* NBD_CMD_BLOCK_STATUS requests answered */
	uint64_t errors;        /* error replies and protocol violations */
	uint64_t connections_total;
	unsigned connections_current;
};

struct nbd_export;

/*
 * Opens disk_path read-write and listens on socket_path (a stale socket
 * file is replaced).  name is the export name clients ask for (an empty
 * name also selects it) and tags every log line.  NULL on error (logged).
 */
struct nbd_export *nbd_export_create(event_loop *loop, const char *name,
				     const char *socket_path,
				     const char *disk_path);
/*
 * The image opened as an export that listens nowhere: the live side of a
 * disk snapshot (disk_snapshot.h) on an image that remusdbd itself
 * writes, the backup's disk replica (a fork of a protected VM, vm_fork.h).
 * Whoever writes the image calls nbd_export_before_write first.
 */
struct nbd_export *nbd_export_open_unserved(event_loop *loop, const char *name,
					    const char *disk_path);
/*
 * What a read-only export serves: size bytes, read by read() (0 or a
 * negative errno).  release() is called once when the export is
 * destroyed (not when creating it failed); it may be NULL.  what names
 * the content in log lines.  extents() answers base:allocation as
 * nbd_export_extents does (below); NULL reports everything as data,
 * which is always true but makes clients read the holes too.
 */
struct disk_extent;
struct nbd_read_backend {
	uint64_t size;
	const char *what;
	int (*read)(void *opaque, void *buf, size_t len, uint64_t offset);
	int (*extents)(void *opaque, uint64_t offset, uint64_t len,
		       struct disk_extent *out, size_t max, size_t *count);
	void (*release)(void *opaque);
	void *opaque;
};

/*
 * A read-only export of backend on socket_path and, when tcp_listen is
 * not NULL, on that IPv4 "ADDR:PORT" too (port 0 picks a free port:
 * nbd_export_tcp_port).  It advertises NBD_FLAG_READ_ONLY; WRITE, TRIM
 * and WRITE_ZEROES get EPERM, FLUSH succeeds and does nothing.  NULL on
 * error (logged).
 */
struct nbd_export *nbd_export_create_read_only(event_loop *loop, const char *name,
					       const char *socket_path,
					       const char *tcp_listen,
					       const struct nbd_read_backend *backend);
/*
 * Closes all connections and removes the socket file.  Detaches the
 * copy-on-write hooks still registered (see below) first.
 */
void nbd_export_destroy(struct nbd_export *export);
void nbd_export_get_stats(const struct nbd_export *export,
			  struct nbd_export_stats *out);
uint64_t nbd_export_size(const struct nbd_export *export);
/* The name clients ask for. */
const char *nbd_export_name(const struct nbd_export *export);
/* The TCP port a read-only export listens on, 0 without TCP. */
uint16_t nbd_export_tcp_port(const struct nbd_export *export);
/*
 * Reads what the export serves, as a client's READ would but without
 * touching stats or read tracking.  0 or a negative errno.
 */
int nbd_export_read_image(struct nbd_export *export, void *buf, size_t len,
			  uint64_t offset);
/*
 * base:allocation of [offset, offset+len) of what the export serves, as
 * a client's BLOCK_STATUS would get it: at most max extents from offset
 * (fewer may cover less than len; *count >= 1 on success).  An image's
 * from disk_file_extents, a read-only export's from its backend.  0, or
 * a negative errno (a detached snapshot: EIO).
 */
int nbd_export_extents(struct nbd_export *export, uint64_t offset, uint64_t len,
		       struct disk_extent *out, size_t max, size_t *count);

/*
 * Copy-on-write hooks (disk_snapshot.h): before a WRITE, TRIM or
 * WRITE_ZEROES changes [offset, offset+len) of the image, every hook
 * registered runs, in registration order.  A hook that returns a
 * negative errno stops the request before the image is touched: the
 * client gets that error.  When the export is destroyed with hooks still
 * registered, each one's detach(opaque) is called (it may be NULL) and
 * the hook is dropped: the owner must stop using the export.
 */
typedef int (*nbd_before_write_fn)(void *opaque, uint64_t offset, uint64_t len);
typedef void (*nbd_detach_fn)(void *opaque);
/* 0, or -1 when out of memory. */
int nbd_export_add_before_write(struct nbd_export *export, nbd_before_write_fn fn,
				nbd_detach_fn detach, void *opaque);
/* Removes the hook registered with opaque; nothing if there is none. */
void nbd_export_remove_before_write(struct nbd_export *export, void *opaque);

/*
 * Disk replication: the hook hears of every write that completed
 * locally, before its reply is queued, in the order the writes were
 * applied.  data is NULL for TRIM and WRITE_ZEROES (the range reads as
 * zeros afterwards).  NULL hook: none.
 */
enum nbd_write_kind { NBD_WRITE_DATA, NBD_WRITE_ZEROES, NBD_WRITE_TRIM };
typedef void (*nbd_write_hook)(void *opaque, enum nbd_write_kind kind,
			       uint64_t offset, const uint8_t *data, uint64_t len);
void nbd_export_set_write_hook(struct nbd_export *export, nbd_write_hook hook,
			       void *opaque);
/*
 * Read tracking (read_index.h): the export takes ownership of idx and
 * destroys the one it had; NULL turns tracking off.  While on, every
 * whole 4 KiB block a successful READ returns is recorded with its
 * content hash, and WRITE, TRIM and WRITE_ZEROES forget the blocks they
 * touch before the image changes.  Tracking starts empty: blocks read
 * before it was on are unknown, never wrong.
 */
struct read_index;
void nbd_export_set_read_index(struct nbd_export *export, struct read_index *idx);
/* The export's index, NULL when tracking is off (lookups and stats); freed with the export. */
struct read_index *nbd_export_read_index(const struct nbd_export *export);

/* Called by the transmission phase; exposed for nbd_transmission.c. */
int nbd_export_before_write(struct nbd_export *export, uint64_t offset, uint64_t len);
void nbd_export_notify_write(struct nbd_export *export, enum nbd_write_kind kind,
			     uint64_t offset, const uint8_t *data, uint64_t len);

#endif
