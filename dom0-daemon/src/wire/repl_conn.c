/* Framed, non-blocking TCP connection between replication peers. */
#include "wire/repl_conn.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <string.h>
#include <unistd.h>

#include "base/inet_socket.h"
#include "base/log.h"

/*
 * What one wakeup may read (and parse) or write: READS_PER_WAKEUP reads of
 * READ_CHUNK, or WRITE_SHARE bytes, then the loop gets its turn back (the
 * socket is watched level-triggered, so the rest comes at the next turn).
 * Every VM of the host shares the loop.  Reading 8 MiB per wakeup on the
 * backup and writing all that was queued on the primary held the loop for
 * a busy VM's whole epoch (4 MiB in the noisy-neighbour bench).  A probe
 * of which handler held each loop turn over 1 ms, in the first minutes of
 * a noisy-neighbour run (2026-11-28), found this one in 341 of the
 * primary's (up to 10 ms) and 715 of the backup's (up to 21 ms), and every
 * other VM's events waited them out: a quiet VM's checkpoint messages on
 * the primary, its epochs and acknowledgements on the backup.  The cost of
 * a smaller share is an epoll_wait per share.
 */
#define READ_CHUNK (256u << 10)
#define READS_PER_WAKEUP 2
#define WRITE_SHARE (512u << 10)

struct repl_conn {
	event_loop *loop;
	int fd;
	char peer[64];
	struct repl_conn_events ev;
	struct buffer in;
	struct buffer out;
	int closed;      /* on_closed was called */
	int socket_ended; /* the peer closed or reset it, or a send failed */
	int in_callback; /* destroy deferred until the callback returns */
	int destroy_requested;
	int64_t last_heard_us;
	uint64_t bytes_sent;
	int finishing;           /* repl_conn_finish: no owner any more */
	int fin_sent;            /* shutdown(SHUT_WR) done */
	long long finish_timer;  /* frees it if the peer never closes */
	void (*freed_fn)(void *opaque);
	void *freed_opaque;
};

static void update_mask(struct repl_conn *c);

static void free_conn(struct repl_conn *c)
{
	/*
	 * Best effort, without blocking: an ERROR or BYE queued just before
	 * the close is the only way the peer learns why.
	 */
	if (buffer_len(&c->out))
		buffer_write_fd(&c->out, c->fd);
	if (c->finish_timer)
		event_loop_del_timer(c->loop, c->finish_timer);
	event_loop_unwatch(c->loop, c->fd);
	close(c->fd);
	buffer_free(&c->in);
	buffer_free(&c->out);
	if (c->freed_fn)
		c->freed_fn(c->freed_opaque);
	free(c);
}

void repl_conn_on_freed(struct repl_conn *c, void (*fn)(void *opaque), void *opaque)
{
	c->freed_fn = fn;
	c->freed_opaque = opaque;
}

static void report_closed(struct repl_conn *c, const char *why)
{
	if (c->finishing) {
		/* Nobody to tell: the connection just goes (on_event frees it). */
		c->destroy_requested = 1;
		return;
	}
	if (c->closed)
		return;
	c->closed = 1;
	event_loop_unwatch(c->loop, c->fd);
	c->in_callback++;
	c->ev.on_closed(c->ev.opaque, why);
	c->in_callback--;
}

/* Returns -1 when the connection ended (reported). */
static int parse_frames(struct repl_conn *c)
{
	while (!c->closed && !c->destroy_requested) {
		struct repl_frame frame;
		const char *err = NULL;
		ssize_t n = repl_frame_parse(buffer_head(&c->in), buffer_len(&c->in),
					     &frame, &err);
		if (n == 0)
			return 0;
		if (n < 0) {
			char why[160];
			snprintf(why, sizeof(why), "malformed frame from %s: %s",
				 c->peer, err ? err : "?");
			report_closed(c, why);
			return -1;
		}
		c->in_callback++;
		int rc = c->ev.on_frame(c->ev.opaque, &frame);
		c->in_callback--;
		if (c->destroy_requested)
			return -1;
		buffer_consume(&c->in, (size_t)n);
		if (rc != 0) {
			report_closed(c, "protocol error (see the log)");
			return -1;
		}
	}
	return c->closed ? -1 : 0;
}

/* A finishing connection reads only to see the peer's FIN. */
static void drain_until_closed(struct repl_conn *c)
{
	for (int i = 0; i < READS_PER_WAKEUP; i++) {
		ssize_t n = buffer_read_fd(&c->in, c->fd, READ_CHUNK);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		buffer_consume(&c->in, buffer_len(&c->in));
		if (n <= 0) {
			c->destroy_requested = 1;
			return;
		}
	}
}

static void send_fin_when_flushed(struct repl_conn *c)
{
	if (!c->finishing || c->fin_sent || buffer_len(&c->out))
		return;
	c->fin_sent = 1;
	if (shutdown(c->fd, SHUT_WR) < 0)
		c->destroy_requested = 1; /* not connected any more: nothing to wait for */
}

static void on_readable(struct repl_conn *c)
{
	if (c->finishing) {
		drain_until_closed(c);
		return;
	}
	for (int i = 0; i < READS_PER_WAKEUP; i++) {
		ssize_t n = buffer_read_fd(&c->in, c->fd, READ_CHUNK);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		if (n <= 0) {
			char why[160];
			snprintf(why, sizeof(why), "%s %s", c->peer,
				 n == 0 ? "closed the connection" : strerror(errno));
			c->socket_ended = 1;
			report_closed(c, why);
			return;
		}
		c->last_heard_us = monotonic_us();
		if (parse_frames(c) < 0)
			return;
	}
}

/*
 * Our send failed: a peer that refused us may have sent ERROR and closed
 * with our data unread, and its reset fails the send.  The ERROR can
 * still be in our receive queue (a reset purges the send queue only), and
 * it is the reason the owner must hear, not the reset.
 */
static void read_what_is_left(struct repl_conn *c)
{
	for (int i = 0; i < READS_PER_WAKEUP && !c->closed && !c->destroy_requested; i++) {
		if (buffer_read_fd(&c->in, c->fd, READ_CHUNK) <= 0)
			return;
		if (parse_frames(c) < 0)
			return;
	}
}

static void on_writable(struct repl_conn *c)
{
	size_t before = buffer_len(&c->out);

	if (buffer_write_fd_upto(&c->out, c->fd, WRITE_SHARE) < 0) {
		char why[160];
		snprintf(why, sizeof(why), "send to %s: %s", c->peer, strerror(errno));
		c->socket_ended = 1;
		if (!c->finishing)
			read_what_is_left(c);
		if (!c->destroy_requested)
			report_closed(c, why);
		return;
	}
	c->bytes_sent += before - buffer_len(&c->out);
	if (c->finishing) {
		send_fin_when_flushed(c);
		return;
	}
	if (buffer_len(&c->out) == 0 && before > 0 && c->ev.on_drained) {
		c->in_callback++;
		c->ev.on_drained(c->ev.opaque);
		c->in_callback--;
	}
}

static void on_event(event_loop *loop, int fd, void *data, int ready)
{
	struct repl_conn *c = data;

	c->in_callback++;
	if (ready & EV_WRITABLE)
		on_writable(c);
	if (!c->closed && !c->destroy_requested && (ready & EV_READABLE))
		on_readable(c);
	c->in_callback--;
	if (c->destroy_requested) {
		free_conn(c);
		return;
	}
	if (!c->closed)
		update_mask(c);
}

static void update_mask(struct repl_conn *c)
{
	int mask = EV_READABLE;

	if (buffer_len(&c->out))
		mask |= EV_WRITABLE;
	if (event_loop_watch(c->loop, c->fd, mask, on_event, c) < 0)
		log_error("replication %s: epoll: %s", c->peer, strerror(errno));
}

struct repl_conn *repl_conn_create(event_loop *loop, int fd, const char *peer,
				   const struct repl_conn_events *events)
{
	struct repl_conn *c = calloc(1, sizeof(*c));

	if (!c) {
		close(fd);
		return NULL;
	}
	c->loop = loop;
	c->fd = fd;
	snprintf(c->peer, sizeof(c->peer), "%s", peer);
	c->ev = *events;
	buffer_init(&c->in);
	buffer_init(&c->out);
	c->last_heard_us = monotonic_us();
	/* Writable first: a connect() in progress completes as writability. */
	if (event_loop_watch(loop, fd, EV_READABLE | EV_WRITABLE, on_event, c) < 0) {
		free_conn(c);
		return NULL;
	}
	return c;
}

void repl_conn_destroy(struct repl_conn *c)
{
	if (!c)
		return;
	if (c->in_callback) {
		c->destroy_requested = 1;
		event_loop_unwatch(c->loop, c->fd);
		return;
	}
	free_conn(c);
}

static long on_finish_timeout(event_loop *loop, long long id, void *data)
{
	struct repl_conn *c = data;

	(void)loop;
	(void)id;
	log_info("replication %s: no close from the peer after our goodbye: closing", c->peer);
	c->finish_timer = 0; /* this timer is dropped by returning TIMER_DONE */
	free_conn(c);
	return TIMER_DONE;
}

void repl_conn_finish(struct repl_conn *c, unsigned timeout_ms)
{
	if (!c)
		return;
	c->finishing = 1;
	buffer_consume(&c->in, buffer_len(&c->in));
	if (c->socket_ended || c->destroy_requested) {
		repl_conn_destroy(c); /* already over: nothing to be polite to */
		return;
	}
	/*
	 * Closed by its owner (a frame it refused), not by the peer: the
	 * socket still works, and the goodbye goes out as for an open one.
	 * Finishing, it calls nobody back any more.
	 */
	c->closed = 0;
	c->finish_timer = event_loop_add_timer(c->loop, (long)timeout_ms, on_finish_timeout, c);
	if (c->finish_timer <= 0) {
		c->finish_timer = 0;
		c->destroy_requested = 1; /* no timer to bound the wait: close now */
	} else {
		send_fin_when_flushed(c);
	}
	if (c->destroy_requested) {
		if (c->in_callback)
			event_loop_unwatch(c->loop, c->fd); /* on_event frees it */
		else
			free_conn(c);
		return;
	}
	update_mask(c);
}

struct buffer *repl_conn_out(struct repl_conn *c)
{
	return &c->out;
}

void repl_conn_flush(struct repl_conn *c)
{
	/*
	 * Only arms EV_WRITABLE: writing here could end the connection and
	 * call the owner back while it is in the middle of queueing.
	 */
	if (c->closed || c->destroy_requested)
		return;
	update_mask(c);
}

size_t repl_conn_backlog(const struct repl_conn *c)
{
	return buffer_len(&c->out);
}

int64_t repl_conn_last_heard_us(const struct repl_conn *c)
{
	int pending = 0;

	/*
	 * Bytes waiting in the socket mean the peer spoke and we were the
	 * slow one (a starved loop): that is not the peer's silence.
	 */
	if (!c->closed && ioctl(c->fd, FIONREAD, &pending) == 0 && pending > 0)
		return monotonic_us();
	return c->last_heard_us;
}

uint64_t repl_conn_bytes_sent(const struct repl_conn *c)
{
	return c->bytes_sent;
}

int repl_parse_address(const char *text, struct sockaddr_in *out, char *err,
		       size_t errlen)
{
	return inet_parse_address(text, false, out, err, errlen);
}
