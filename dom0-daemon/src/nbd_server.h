/*
 * One NBD export (a raw disk image) served on its own unix socket, for
 * QEMU's `-blockdev driver=nbd,server.type=unix,...`.  Several clients may
 * connect; each runs the fixed-newstyle handshake and then transmission
 * with simple replies.  Everything runs on the daemon's event loop.
 */
#ifndef REMUSDB_NBD_SERVER_H
#define REMUSDB_NBD_SERVER_H

#include <stdint.h>

#include "event_loop.h"

struct nbd_export_stats {
	uint64_t reads;
	uint64_t writes;        /* NBD_CMD_WRITE requests that succeeded */
	uint64_t bytes_read;
	uint64_t bytes_written;
	uint64_t flushes;       /* NBD_CMD_FLUSH plus FUA-forced syncs */
	uint64_t trims;
	uint64_t write_zeroes;
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
/* Closes all connections and removes the socket file. */
void nbd_export_destroy(struct nbd_export *export);
void nbd_export_get_stats(const struct nbd_export *export,
			  struct nbd_export_stats *out);
uint64_t nbd_export_size(const struct nbd_export *export);

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
void nbd_export_notify_write(struct nbd_export *export, enum nbd_write_kind kind,
			     uint64_t offset, const uint8_t *data, uint64_t len);

#endif
