/*
 * An export's state, shared by the NBD server's files: what it serves
 * (its image or read backend), the hooks on its writes, its read index,
 * its listeners and its connections.  nbd_export.c owns what is served
 * and the hooks, nbd_server.c the listeners, nbd_conn.c the connections.
 */
#ifndef REMUSDB_NBD_EXPORT_INTERNAL_H
#define REMUSDB_NBD_EXPORT_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "base/accept_policy.h"
#include "base/event_loop.h"
#include "nbd/disk_file.h"
#include "nbd/nbd_server.h"

struct nbd_conn;

struct nbd_before_write {
	nbd_before_write_fn fn;
	nbd_detach_fn detach;
	void *opaque;
	struct nbd_before_write *next;
};

struct nbd_export {
	event_loop *loop;
	char *name;
	char *socket_path;
	/*
	 * disk.size and disk.path describe what is served.  A read-only
	 * export reads backend instead and has no image (disk.fd is -1).
	 */
	struct disk_file disk;
	bool read_only;
	struct nbd_read_backend backend;
	uint16_t transmission_flags;
	int listen_fd;
	struct accept_policy accept;
	int tcp_listen_fd; /* -1 without TCP */
	struct accept_policy tcp_accept;
	struct nbd_before_write *before_write; /* in registration order */
	unsigned next_conn_id;
	struct nbd_conn *conns;
	struct nbd_export_stats stats;
	nbd_write_hook write_hook;
	void *write_hook_opaque;
	struct read_index *read_index; /* owned; NULL = read tracking off */
};

/* An export that serves nothing yet and listens nowhere.  NULL (logged). */
struct nbd_export *nbd_export_alloc(event_loop *loop, const char *name,
				    const char *socket_path);
/* The same with disk_path opened as its image.  NULL (logged). */
struct nbd_export *nbd_export_open_image(event_loop *loop, const char *name,
					 const char *socket_path,
					 const char *disk_path);
/*
 * Tells every copy-on-write hook still registered that the image goes
 * away (its detach), and drops them: the first step of a destruction.
 */
void nbd_export_detach_hooks(struct nbd_export *export);
/*
 * Frees what is served and the export itself, once its connections are
 * closed and its listeners stopped (nbd_export_destroy).
 */
void nbd_export_free(struct nbd_export *export);

#endif
