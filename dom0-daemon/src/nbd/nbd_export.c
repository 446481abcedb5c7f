/*
 * What an NBD export serves and what hears of its writes: the image or
 * read backend, its reads and base:allocation extents, the copy-on-write
 * hooks, the replication write hook and the read index.  No sockets:
 * nbd_server.c listens, nbd_conn.c serves the connections.
 */
#include "nbd/nbd_export_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "nbd/nbd_proto.h"
#include "nbd/read_index.h"

struct nbd_export *nbd_export_alloc(event_loop *loop, const char *name,
				    const char *socket_path)
{
	struct nbd_export *export = calloc(1, sizeof(*export));

	if (!export) {
		log_error("nbd export '%s': out of memory", name);
		return NULL;
	}
	export->loop = loop;
	export->listen_fd = -1;
	export->tcp_listen_fd = -1;
	export->disk.fd = -1;
	/*
	 * CAN_MULTI_CONN is safe on every export of ours: all connections
	 * to an export share one process, one thread and one file
	 * descriptor, and requests run one at a time.  A write is in the
	 * page cache before its reply, so every other connection reads it at
	 * once, and a FLUSH (or FUA) is an fdatasync of the image, which
	 * covers every write replied to on any connection.  That is exactly
	 * the cache consistency the flag promises.  The copy-on-write hooks,
	 * read tracking and the replication write hook see the writes of all
	 * connections in the one order they were applied, too.
	 */
	export->transmission_flags = NBD_SERVER_TRANSMISSION_FLAGS |
				     NBD_FLAG_CAN_MULTI_CONN;
	export->name = strdup(name);
	export->socket_path = strdup(socket_path);
	if (!export->name || !export->socket_path) {
		log_error("nbd export '%s': out of memory", name);
		nbd_export_free(export);
		return NULL;
	}
	return export;
}

struct nbd_export *nbd_export_open_image(event_loop *loop, const char *name,
					 const char *socket_path,
					 const char *disk_path)
{
	struct nbd_export *export = nbd_export_alloc(loop, name, socket_path);

	if (!export)
		return NULL;
	int rc = disk_file_open(&export->disk, disk_path);
	if (rc < 0) {
		log_error("nbd export '%s': cannot open disk image %s: %s",
			  name, disk_path, strerror(-rc));
		nbd_export_free(export);
		return NULL;
	}
	return export;
}

void nbd_export_detach_hooks(struct nbd_export *export)
{
	/* Snapshots of this image lose it: they are told before it closes. */
	while (export->before_write) {
		struct nbd_before_write *h = export->before_write;
		export->before_write = h->next;
		if (h->detach)
			h->detach(h->opaque);
		free(h);
	}
}

void nbd_export_free(struct nbd_export *export)
{
	nbd_export_detach_hooks(export);
	disk_file_close(&export->disk);
	if (export->backend.release)
		export->backend.release(export->backend.opaque);
	read_index_destroy(export->read_index);
	free(export->name);
	free(export->socket_path);
	free(export);
}

void nbd_export_get_stats(const struct nbd_export *export,
			  struct nbd_export_stats *out)
{
	*out = export->stats;
}

uint64_t nbd_export_size(const struct nbd_export *export)
{
	return export->disk.size;
}

const char *nbd_export_name(const struct nbd_export *export)
{
	return export->name;
}

int nbd_export_read_image(struct nbd_export *export, void *buf, size_t len,
			  uint64_t offset)
{
	if (export->read_only)
		return export->backend.read(export->backend.opaque, buf, len, offset);
	return disk_file_read(&export->disk, buf, len, offset);
}

int nbd_export_extents(struct nbd_export *export, uint64_t offset, uint64_t len,
		       struct disk_extent *out, size_t max, size_t *count)
{
	if (!export->read_only) {
		disk_file_extents(&export->disk, offset, len, out, max, count);
		return 0;
	}
	if (export->backend.extents)
		return export->backend.extents(export->backend.opaque, offset, len, out,
					       max, count);
	/*
	 * A backend that cannot tell: everything is data (status 0), which
	 * the spec allows for any block.  Clients then read it, and the copy
	 * is right, only not sparse-aware.
	 */
	out[0].length = len;
	out[0].hole = 0;
	*count = 1;
	return 0;
}

int nbd_export_add_before_write(struct nbd_export *export, nbd_before_write_fn fn,
				nbd_detach_fn detach, void *opaque)
{
	struct nbd_before_write *h = calloc(1, sizeof(*h)), **tail;

	if (!h)
		return -1;
	h->fn = fn;
	h->detach = detach;
	h->opaque = opaque;
	for (tail = &export->before_write; *tail; tail = &(*tail)->next)
		;
	*tail = h;
	return 0;
}

void nbd_export_remove_before_write(struct nbd_export *export, void *opaque)
{
	for (struct nbd_before_write **link = &export->before_write; *link;
	     link = &(*link)->next) {
		if ((*link)->opaque == opaque) {
			struct nbd_before_write *h = *link;
			*link = h->next;
			free(h);
			return;
		}
	}
}

int nbd_export_before_write(struct nbd_export *export, uint64_t offset, uint64_t len)
{
	for (struct nbd_before_write *h = export->before_write; h; h = h->next) {
		int err = h->fn(h->opaque, offset, len);
		if (err)
			return err;
	}
	return 0;
}

void nbd_export_set_write_hook(struct nbd_export *export, nbd_write_hook hook,
			       void *opaque)
{
	export->write_hook = hook;
	export->write_hook_opaque = opaque;
}

void nbd_export_set_read_index(struct nbd_export *export, struct read_index *idx)
{
	if (export->read_index != idx)
		read_index_destroy(export->read_index);
	export->read_index = idx;
}

struct read_index *nbd_export_read_index(const struct nbd_export *export)
{
	return export->read_index;
}

void nbd_export_notify_write(struct nbd_export *export, enum nbd_write_kind kind,
			     uint64_t offset, const uint8_t *data, uint64_t len)
{
	if (export->write_hook)
		export->write_hook(export->write_hook_opaque, kind, offset, data, len);
}
