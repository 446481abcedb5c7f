/*
 * NBD server: the listening socket, connection lifetimes and socket I/O.
 * The protocol phases live in nbd_handshake.c and nbd_transmission.c.
 *
 * Disk I/O is synchronous (pread/pwrite/fdatasync inside the event
 * handler).  That is acceptable here because each export serves one VM
 * whose QEMU waits for the reply anyway, the image lives on a local
 * filesystem where reads and writes mostly hit the page cache, and a
 * single thread gives a total order of disk operations that the
 * checkpoint code will later rely on.  The cost is that an fdatasync
 * stalls the whole loop for its duration.
 */
#include "nbd_server.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nbd_conn.h"
#include "nbd_proto.h"
#include "read_index.h"
#include "unix_socket.h"

#define MAX_CONNECTIONS 16
/* Stop reading requests while this much reply data waits for the client. */
#define OUTPUT_HIGH_WATER (4u * 1024 * 1024)
#define READ_CHUNK (256u * 1024)

static void on_listen_readable(event_loop *loop, int fd, void *data, int ready);

void nbd_conn_log(struct nbd_conn *c, enum log_level level, const char *fmt, ...)
{
	char text[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	log_msg(level, "nbd export '%s' connection #%u: %s", c->export->name,
		c->id, text);
}

/* A protocol violation: one clear line, then drop only this connection. */
int nbd_conn_protocol_error(struct nbd_conn *c, const char *what)
{
	c->export->stats.errors++;
	nbd_conn_log(c, LOG_WARN, "protocol error: %s; closing this connection", what);
	return -1;
}

int nbd_conn_queue(struct nbd_conn *c, const void *data, size_t len)
{
	if (buffer_append(&c->out, data, len) < 0) {
		nbd_conn_log(c, LOG_ERROR, "out of memory queueing %zu bytes", len);
		return -1;
	}
	return 0;
}

static void conn_close(struct nbd_conn *c)
{
	struct nbd_export *export = c->export;

	for (struct nbd_conn **link = &export->conns; *link; link = &(*link)->next) {
		if (*link == c) {
			*link = c->next;
			break;
		}
	}
	event_loop_unwatch(export->loop, c->fd);
	close(c->fd);
	buffer_free(&c->in);
	buffer_free(&c->out);
	export->stats.connections_current--;
	free(c);
}

/* Parses and serves what is buffered.  Returns -1 when c must be closed. */
static int process_input(struct nbd_conn *c)
{
	int r = 1;

	while (r > 0 && c->phase != PHASE_CLOSING &&
	       buffer_len(&c->out) < OUTPUT_HIGH_WATER) {
		if (c->phase == PHASE_TRANSMISSION)
			r = nbd_transmission_step(c);
		else
			r = nbd_handshake_step(c);
	}
	return r < 0 ? -1 : 0;
}

static void describe_eof(struct nbd_conn *c)
{
	size_t have = buffer_len(&c->in);
	struct nbd_request req;
	const char *reason;

	if (c->phase != PHASE_TRANSMISSION) {
		nbd_conn_log(c, have ? LOG_WARN : LOG_INFO,
			     "client went away during the handshake%s",
			     have ? " in the middle of a message" : "");
		return;
	}
	if (have == 0) {
		nbd_conn_log(c, LOG_INFO, "client closed the connection without NBD_CMD_DISC");
		return;
	}
	c->export->stats.errors++;
	if (nbd_parse_request(buffer_head(&c->in), have, &req, &reason) == NBD_PARSE_OK &&
	    req.type == NBD_CMD_WRITE)
		nbd_conn_log(c, LOG_WARN, "client vanished in the middle of a WRITE at "
			     "offset %llu: got %zu of %u payload bytes; the write "
			     "was not applied", (unsigned long long)req.offset,
			     have - NBD_REQUEST_SIZE, req.length);
	else
		nbd_conn_log(c, LOG_WARN, "client vanished in the middle of a request "
			     "(%zu bytes of it received)", have);
}

/* Sends queued output and re-arms the fd.  Returns -1 when c was closed. */
static int flush_and_rearm(struct nbd_conn *c)
{
	if (buffer_write_fd(&c->out, c->fd) < 0) {
		nbd_conn_log(c, LOG_INFO, "send failed: %s; closing", strerror(errno));
		conn_close(c);
		return -1;
	}
	if (c->phase == PHASE_CLOSING && buffer_len(&c->out) == 0) {
		conn_close(c);
		return -1;
	}
	int mask = buffer_len(&c->out) ? EV_WRITABLE : 0;
	/* Backpressure: no new requests while the client is not reading. */
	if (c->phase != PHASE_CLOSING && buffer_len(&c->out) < OUTPUT_HIGH_WATER)
		mask |= EV_READABLE;
	if (event_loop_set_mask(c->export->loop, c->fd, mask) < 0) {
		nbd_conn_log(c, LOG_ERROR, "epoll: %s; closing", strerror(errno));
		conn_close(c);
		return -1;
	}
	return 0;
}

static void on_conn_event(event_loop *loop, int fd, void *data, int ready)
{
	struct nbd_conn *c = data;

	if (ready & EV_READABLE) {
		ssize_t n = buffer_read_fd(&c->in, fd, READ_CHUNK);
		if (n == 0) {
			describe_eof(c);
			conn_close(c);
			return;
		}
		if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
			nbd_conn_log(c, LOG_WARN, "read failed: %s; closing", strerror(errno));
			conn_close(c);
			return;
		}
	}
	/* Also after a write: buffered requests may wait for output room. */
	if (process_input(c) < 0) {
		conn_close(c);
		return;
	}
	flush_and_rearm(c);
}

/* ---- listening ---------------------------------------------------- */

static void start_connection(struct nbd_export *export, int fd)
{
	uint8_t greeting[NBD_GREETING_SIZE];
	struct nbd_conn *c = calloc(1, sizeof(*c));

	if (!c) {
		log_error("nbd export '%s': out of memory for a connection", export->name);
		close(fd);
		return;
	}
	c->export = export;
	c->fd = fd;
	c->id = ++export->next_conn_id;
	c->phase = PHASE_CLIENT_FLAGS;
	buffer_init(&c->in);
	buffer_init(&c->out);
	c->next = export->conns;
	export->conns = c;
	export->stats.connections_current++;
	export->stats.connections_total++;
	if (event_loop_watch(export->loop, fd, EV_READABLE, on_conn_event, c) < 0) {
		nbd_conn_log(c, LOG_ERROR, "epoll: %s", strerror(errno));
		conn_close(c);
		return;
	}
	nbd_conn_log(c, LOG_INFO, "client connected");
	nbd_encode_greeting(greeting);
	if (nbd_conn_queue(c, greeting, sizeof(greeting)) < 0) {
		conn_close(c);
		return;
	}
	flush_and_rearm(c);
}

static void on_listen_readable(event_loop *loop, int fd, void *data, int ready)
{
	struct nbd_export *export = data;

	for (;;) {
		int conn_fd = accept_policy_accept(&export->accept, NULL, NULL);
		if (conn_fd < 0)
			return;
		if (export->stats.connections_current >= MAX_CONNECTIONS) {
			log_warn("nbd export '%s': refusing a connection, already %d open",
				 export->name, MAX_CONNECTIONS);
			close(conn_fd);
			continue;
		}
		start_connection(export, conn_fd);
	}
}

struct nbd_export *nbd_export_create(event_loop *loop, const char *name,
				     const char *socket_path,
				     const char *disk_path)
{
	char err[256];
	struct nbd_export *export = calloc(1, sizeof(*export));

	if (!export) {
		log_error("nbd export '%s': out of memory", name);
		return NULL;
	}
	export->loop = loop;
	export->listen_fd = -1;
	export->disk.fd = -1;
	export->name = strdup(name);
	export->socket_path = strdup(socket_path);
	if (!export->name || !export->socket_path) {
		log_error("nbd export '%s': out of memory", name);
		goto fail;
	}
	int rc = disk_file_open(&export->disk, disk_path);
	if (rc < 0) {
		log_error("nbd export '%s': cannot open disk image %s: %s",
			  name, disk_path, strerror(-rc));
		goto fail;
	}
	export->listen_fd = unix_listen(socket_path, err, sizeof(err));
	if (export->listen_fd < 0) {
		log_error("nbd export '%s': %s", name, err);
		goto fail;
	}
	char what[96];
	snprintf(what, sizeof(what), "nbd export '%s'", name);
	if (accept_policy_start(&export->accept, loop, export->listen_fd, what,
				on_listen_readable, export) < 0) {
		log_error("nbd export '%s': epoll: %s", name, strerror(errno));
		goto fail;
	}
	log_info("nbd export '%s': serving %s (%llu bytes) on %s", name, disk_path,
		 (unsigned long long)export->disk.size, socket_path);
	return export;
fail:
	nbd_export_destroy(export);
	return NULL;
}

void nbd_export_destroy(struct nbd_export *export)
{
	if (!export)
		return;
	while (export->conns)
		conn_close(export->conns);
	if (export->listen_fd >= 0) {
		accept_policy_stop(&export->accept);
		close(export->listen_fd);
		/* Ours only if we listened on it: a refused path is left alone. */
		unlink(export->socket_path);
	}
	disk_file_close(&export->disk);
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
