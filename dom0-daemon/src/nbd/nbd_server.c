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
#include "nbd/nbd_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/inet_socket.h"
#include "nbd/nbd_conn.h"
#include "nbd/nbd_proto.h"
#include "nbd/read_index.h"
#include "base/unix_socket.h"

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

unsigned nbd_conn_negotiated(const struct nbd_conn *c)
{
	return (c->structured ? NBD_NEGOTIATED_STRUCTURED : 0) |
	       (c->meta_allocation ? NBD_NEGOTIATED_BLOCK_STATUS : 0);
}

uint16_t nbd_conn_transmission_flags(const struct nbd_conn *c)
{
	/* DF only means something with chunks; the spec forbids it without. */
	return c->export->transmission_flags |
	       (c->structured ? NBD_FLAG_SEND_DF : 0);
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

/*
 * Parses and serves what is buffered.  Returns -1 when c must be closed,
 * 1 when it stopped for the output's high-water mark (input may be left),
 * 0 when it needs more input (or the connection is closing).
 */
static int process_input(struct nbd_conn *c)
{
	int r = 1;

	while (r > 0 && c->phase != PHASE_CLOSING) {
		if (buffer_len(&c->out) >= OUTPUT_HIGH_WATER)
			return 1;
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

/*
 * Sends queued output and re-arms the fd.  input_left: requests were left
 * in c->in for want of output room.  Returns -1 when c was closed.
 */
static int flush_and_rearm(struct nbd_conn *c, bool input_left)
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
	/*
	 * Requests left for want of room must be served even when this flush
	 * took all of the output: a client that pipelines (nbdcopy, QEMU) and
	 * reads as fast as we write sends nothing more until it has their
	 * replies, so no input would come to wake us.  EV_WRITABLE (level-
	 * triggered, the socket has room) brings us back at once, after the
	 * loop's other fds had their turn.
	 */
	int mask = buffer_len(&c->out) || input_left ? EV_WRITABLE : 0;
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
	int r = process_input(c);
	if (r < 0) {
		conn_close(c);
		return;
	}
	flush_and_rearm(c, r == 1);
}

/* ---- listening ---------------------------------------------------- */

static void start_connection(struct nbd_export *export, int fd, const char *from)
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
	nbd_conn_log(c, LOG_INFO, "client connected%s", from);
	nbd_encode_greeting(greeting);
	if (nbd_conn_queue(c, greeting, sizeof(greeting)) < 0) {
		conn_close(c);
		return;
	}
	flush_and_rearm(c, false);
}

static void on_listen_readable(event_loop *loop, int fd, void *data, int ready)
{
	struct nbd_export *export = data;
	int tcp = fd == export->tcp_listen_fd;
	struct accept_policy *policy = tcp ? &export->tcp_accept : &export->accept;

	for (;;) {
		struct sockaddr_in peer;
		socklen_t peer_len = sizeof(peer);
		char from[64] = "";
		int conn_fd = accept_policy_accept(policy, tcp ? (struct sockaddr *)&peer : NULL,
						   tcp ? &peer_len : NULL);
		if (conn_fd < 0)
			return;
		if (tcp) {
			int one = 1;
			char ip[INET_ADDRSTRLEN] = "?";

			/* Replies are small and a client waits for each one. */
			setsockopt(conn_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
			inet_ntop(AF_INET, &peer.sin_addr, ip, sizeof(ip));
			snprintf(from, sizeof(from), " over TCP from %s:%u", ip,
				 ntohs(peer.sin_port));
		}
		if (export->stats.connections_current >= MAX_CONNECTIONS) {
			log_warn("nbd export '%s': refusing a connection, already %d open",
				 export->name, MAX_CONNECTIONS);
			close(conn_fd);
			continue;
		}
		start_connection(export, conn_fd, from);
	}
}

static struct nbd_export *export_alloc(event_loop *loop, const char *name,
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
		nbd_export_destroy(export);
		return NULL;
	}
	return export;
}

static int start_listener(struct nbd_export *export, int fd,
			  struct accept_policy *policy, const char *kind)
{
	char what[112];

	snprintf(what, sizeof(what), "nbd export '%s'%s", export->name, kind);
	if (accept_policy_start(policy, export->loop, fd, what, on_listen_readable,
				export) < 0) {
		log_error("nbd export '%s': epoll: %s", export->name, strerror(errno));
		return -1;
	}
	return 0;
}

/* The unix socket, and TCP when tcp_listen is not NULL.  -1 (logged). */
static int export_listen(struct nbd_export *export, const char *tcp_listen)
{
	char err[256];

	export->listen_fd = unix_listen(export->socket_path, err, sizeof(err));
	if (export->listen_fd < 0) {
		log_error("nbd export '%s': %s", export->name, err);
		return -1;
	}
	if (start_listener(export, export->listen_fd, &export->accept, "") < 0)
		return -1;
	if (!tcp_listen)
		return 0;
	export->tcp_listen_fd = inet_listen(tcp_listen, err, sizeof(err));
	if (export->tcp_listen_fd < 0) {
		log_error("nbd export '%s': %s", export->name, err);
		return -1;
	}
	return start_listener(export, export->tcp_listen_fd, &export->tcp_accept,
			      " (TCP)");
}

/* The export with its image open, listening nowhere yet. */
static struct nbd_export *open_image(event_loop *loop, const char *name,
				     const char *socket_path, const char *disk_path)
{
	struct nbd_export *export = export_alloc(loop, name, socket_path);

	if (!export)
		return NULL;
	int rc = disk_file_open(&export->disk, disk_path);
	if (rc < 0) {
		log_error("nbd export '%s': cannot open disk image %s: %s",
			  name, disk_path, strerror(-rc));
		nbd_export_destroy(export);
		return NULL;
	}
	return export;
}

struct nbd_export *nbd_export_create(event_loop *loop, const char *name,
				     const char *socket_path,
				     const char *disk_path)
{
	struct nbd_export *export = open_image(loop, name, socket_path, disk_path);

	if (!export)
		return NULL;
	if (export_listen(export, NULL) < 0) {
		nbd_export_destroy(export);
		return NULL;
	}
	log_info("nbd export '%s': serving %s (%llu bytes) on %s", name, disk_path,
		 (unsigned long long)export->disk.size, socket_path);
	return export;
}

struct nbd_export *nbd_export_open_unserved(event_loop *loop, const char *name,
					    const char *disk_path)
{
	return open_image(loop, name, "", disk_path);
}

struct nbd_export *nbd_export_create_read_only(event_loop *loop, const char *name,
					       const char *socket_path,
					       const char *tcp_listen,
					       const struct nbd_read_backend *backend)
{
	struct nbd_export *export = export_alloc(loop, name, socket_path);

	if (!export)
		return NULL;
	export->read_only = true;
	/* Nothing changes a frozen view: every connection reads the same. */
	export->transmission_flags = NBD_FLAG_HAS_FLAGS | NBD_FLAG_READ_ONLY |
				     NBD_FLAG_SEND_FLUSH | NBD_FLAG_CAN_MULTI_CONN;
	export->disk.size = backend->size;
	export->disk.path = strdup(backend->what);
	if (!export->disk.path) {
		log_error("nbd export '%s': out of memory", name);
		goto fail;
	}
	if (export_listen(export, tcp_listen) < 0)
		goto fail;
	/* Only now: a failed creation must not call release(). */
	export->backend = *backend;
	export->backend.what = export->disk.path;
	char tcp[48] = "";
	if (tcp_listen)
		snprintf(tcp, sizeof(tcp), " and TCP port %u", nbd_export_tcp_port(export));
	log_info("nbd export '%s': serving %s (%llu bytes, read-only) on %s%s", name,
		 export->disk.path, (unsigned long long)export->disk.size, socket_path, tcp);
	return export;
fail:
	nbd_export_destroy(export);
	return NULL;
}

void nbd_export_destroy(struct nbd_export *export)
{
	if (!export)
		return;
	/* Snapshots of this image lose it: they are told before it closes. */
	while (export->before_write) {
		struct nbd_before_write *h = export->before_write;
		export->before_write = h->next;
		if (h->detach)
			h->detach(h->opaque);
		free(h);
	}
	while (export->conns)
		conn_close(export->conns);
	if (export->listen_fd >= 0) {
		accept_policy_stop(&export->accept);
		close(export->listen_fd);
		/* Ours only if we listened on it: a refused path is left alone. */
		unlink(export->socket_path);
	}
	if (export->tcp_listen_fd >= 0) {
		accept_policy_stop(&export->tcp_accept);
		close(export->tcp_listen_fd);
	}
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

uint16_t nbd_export_tcp_port(const struct nbd_export *export)
{
	return export->tcp_listen_fd >= 0 ? inet_local_port(export->tcp_listen_fd) : 0;
}

int nbd_export_read_image(struct nbd_export *export, void *buf, size_t len,
			  uint64_t offset)
{
	if (export->read_only)
		return export->backend.read(export->backend.opaque, buf, len, offset);
	return disk_file_read(&export->disk, buf, len, offset);
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
