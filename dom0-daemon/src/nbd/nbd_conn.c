/*
 * One NBD client connection: its lifetime and socket I/O.  It reads
 * requests into c->in, lets the protocol step (nbd_conn_step_fn) turn
 * them into replies in c->out, and sends those, with backpressure: no
 * new requests are read while the client leaves replies unread.
 */
#include "nbd/nbd_conn_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nbd/nbd_io_batch.h"
#include "nbd/nbd_proto.h"

/* Stop reading requests while this much reply data waits for the client. */
#define OUTPUT_HIGH_WATER (4u * 1024 * 1024)
#define READ_CHUNK (256u * 1024)

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

void nbd_conn_close(struct nbd_conn *c)
{
	struct nbd_export *export = c->export;

	for (struct nbd_conn **link = &export->conns; *link; link = &(*link)->next) {
		if (*link == c) {
			*link = c->next;
			break;
		}
	}
	/*
	 * A job still running is waited for here, and its end handled
	 * without serving more: the client is gone, but a batch's writes
	 * are in the image, and the write hooks (replication, change log)
	 * must see every change the image has.
	 */
	c->closing = true;
	loop_worker_finish(c->worker);
	loop_worker_destroy(c->worker);
	nbd_io_batch_free(c->batch);
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
		r = c->step(c);
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

static void on_conn_event(event_loop *loop, int fd, void *data, int ready);

/*
 * Sends queued output and re-arms the fd.  input_left: requests were left
 * in c->in for want of output room.  Returns -1 when c was closed.
 */
static int flush_and_rearm(struct nbd_conn *c, bool input_left)
{
	if (buffer_write_fd(&c->out, c->fd) < 0) {
		nbd_conn_log(c, LOG_INFO, "send failed: %s; closing", strerror(errno));
		nbd_conn_close(c);
		return -1;
	}
	if (c->phase == PHASE_CLOSING && buffer_len(&c->out) == 0) {
		nbd_conn_close(c);
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
	/*
	 * Backpressure: no new requests while the client is not reading,
	 * nor while a job on the worker holds the connection (QEMU keeps at
	 * most 16 requests in flight; they wait in the socket, not in c->in,
	 * which a batch's writes point into).
	 */
	if (c->phase != PHASE_CLOSING && buffer_len(&c->out) < OUTPUT_HIGH_WATER &&
	    !c->io_pending)
		mask |= EV_READABLE;
	/* Watched again with its handler: a mask of 0 (a job pending, nothing to send) drops it. */
	if (event_loop_watch(c->export->loop, c->fd, mask, on_conn_event, c) < 0) {
		nbd_conn_log(c, LOG_ERROR, "epoll: %s; closing", strerror(errno));
		nbd_conn_close(c);
		return -1;
	}
	return 0;
}

void nbd_conn_serve_buffered(struct nbd_conn *c)
{
	int r = process_input(c);

	if (r < 0) {
		nbd_conn_close(c);
		return;
	}
	flush_and_rearm(c, r == 1);
}

static void on_conn_event(event_loop *loop, int fd, void *data, int ready)
{
	struct nbd_conn *c = data;

	/* Never while a job runs: c->in must not move under a batch's writes. */
	if ((ready & EV_READABLE) && !c->io_pending) {
		ssize_t n = buffer_read_fd(&c->in, fd, READ_CHUNK);
		if (n == 0) {
			describe_eof(c);
			nbd_conn_close(c);
			return;
		}
		if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
			nbd_conn_log(c, LOG_WARN, "read failed: %s; closing", strerror(errno));
			nbd_conn_close(c);
			return;
		}
	}
	/* Also after a write: buffered requests may wait for output room. */
	nbd_conn_serve_buffered(c);
}

struct loop_worker *nbd_conn_worker(struct nbd_conn *c)
{
	char err[128];

	if (c->worker || c->no_worker)
		return c->worker;
	c->worker = loop_worker_create(c->export->loop, "remusdb-nbd", err, sizeof(err));
	if (!c->worker) {
		c->no_worker = true;
		nbd_conn_log(c, LOG_WARN, "no worker thread (%s): its disk I/O runs on the "
			     "event loop", err);
	}
	return c->worker;
}

static int flush_export(void *arg)
{
	return disk_file_flush(arg);
}

/* The worker's fdatasync ended: reply, then serve what waited behind it. */
static void on_flushed(void *opaque, int err)
{
	struct nbd_conn *c = opaque;

	c->io_pending = false;
	if (c->closing)
		return;
	if (nbd_transmission_flushed(c, &c->flush_req, err) < 0) {
		nbd_conn_close(c);
		return;
	}
	nbd_conn_serve_buffered(c);
}

int nbd_conn_flush_then_reply(struct nbd_conn *c, const struct nbd_request *req)
{
	struct loop_worker *w = nbd_conn_worker(c);

	if (w && loop_worker_post(w, flush_export, &c->export->disk, on_flushed, c) == 0) {
		c->io_pending = true;
		c->flush_req = *req;
		return 0;
	}
	return nbd_transmission_flushed(c, req, disk_file_flush(&c->export->disk));
}

void nbd_conn_start(struct nbd_export *export, int fd, const char *from,
		    nbd_conn_step_fn step)
{
	uint8_t greeting[NBD_GREETING_SIZE];
	struct nbd_conn *c = calloc(1, sizeof(*c));

	if (!c) {
		log_error("nbd export '%s': out of memory for a connection", export->name);
		close(fd);
		return;
	}
	c->export = export;
	c->step = step;
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
		nbd_conn_close(c);
		return;
	}
	nbd_conn_log(c, LOG_INFO, "client connected%s", from);
	nbd_encode_greeting(greeting);
	if (nbd_conn_queue(c, greeting, sizeof(greeting)) < 0) {
		nbd_conn_close(c);
		return;
	}
	flush_and_rearm(c, false);
}
