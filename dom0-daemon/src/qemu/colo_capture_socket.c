/*
 * The COLO source's migration socket: QEMU's one connection accepted, the
 * stream read into the parser (a chunk per wakeup in the bulk copy, until
 * empty inside a checkpoint, colo_capture.c says why) and our replies
 * written back.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/be.h"
#include "base/log.h"
#include "base/unix_socket.h"
#include "qemu/colo_capture_internal.h"

/*
 * Inside a checkpoint we read until the socket is empty, but give the
 * loop back after this many chunks (1 MiB) and come back at its next
 * turn (the socket is watched level-triggered, so nothing is missed).
 * Why so little: every VM of the host shares the loop, and each of them
 * is paused while its own checkpoint waits to be read.  Reading a busy
 * VM's whole epoch (tens of MiB, milliseconds of parsing and copying) in
 * one wakeup put all of it into a quiet neighbour's pause; a share of
 * 1 MiB puts at most that much, and costs the busy VM one epoll_wait per
 * MiB.  It also stops a peer streaming without end from starving the
 * daemon's other connections.
 */
#define MAX_READS_PER_WAKEUP 4
/* Our replies are 4-8 bytes; this much unsent means QEMU stopped reading. */
#define MAX_PENDING_OUTPUT (64u * 1024)

/* ---- output ---------------------------------------------------------- */

static void on_stream_io(event_loop *loop, int fd, void *data, int ready);

void capture_update_mask(struct checkpoint_source *src)
{
	int mask = buffer_len(&src->out) ? EV_WRITABLE : EV_NONE;

	if (src->conn_fd < 0)
		return;
	if (!(src->state == SRC_BULK && src->bulk_paused))
		mask |= EV_READABLE;
	if (event_loop_watch(src->loop, src->conn_fd, mask, on_stream_io, src) < 0)
		capture_fail(src, "cannot watch the checkpoint socket: %s", strerror(errno));
}

/* Returns -1 if the source failed. */
static int flush_output(struct checkpoint_source *src)
{
	while (buffer_len(&src->out) > 0) {
		/* MSG_NOSIGNAL: QEMU going away must not SIGPIPE the daemon. */
		ssize_t n = send(src->conn_fd, buffer_head(&src->out),
				 buffer_len(&src->out), MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			capture_fail(src, "cannot answer QEMU on the checkpoint socket: %s",
				     strerror(errno));
			return -1;
		}
		buffer_consume(&src->out, (size_t)n);
	}
	capture_update_mask(src);
	return capture_gone(src) ? -1 : 0;
}

int capture_send_messages(struct checkpoint_source *src, const enum colo_message *msgs,
			  size_t count)
{
	uint8_t bytes[16];

	for (size_t i = 0; i < count; i++)
		store_be32(bytes + 4 * i, (uint32_t)msgs[i]);
	if (buffer_append(&src->out, bytes, 4 * count) < 0) {
		capture_fail(src, "out of memory queueing %s for QEMU",
			     colo_message_name(msgs[0]));
		return -1;
	}
	if (flush_output(src) < 0)
		return -1;
	if (buffer_len(&src->out) > MAX_PENDING_OUTPUT) {
		capture_fail(src, "QEMU does not read our COLO replies (%zu bytes pending)",
			     buffer_len(&src->out));
		return -1;
	}
	return 0;
}

/* ---- input ------------------------------------------------------------ */

static void feed(struct checkpoint_source *src, const uint8_t *data, size_t len)
{
	const char *err = NULL;

	src->stop_reason[0] = '\0';
	if (colo_stream_feed(src->parser, data, len, &err) == COLO_STREAM_NEED_MORE)
		return;
	if (capture_gone(src))
		return; /* stopped by the owner, or failed and said so */
	if (src->stop_reason[0])
		capture_fail(src, "%s", src->stop_reason);
	else
		capture_fail(src, "QEMU's checkpoint stream is malformed: %s",
			     err ? err : "(no detail)");
}

static void stream_ended(struct checkpoint_source *src, const char *sys_error)
{
	uint64_t offset = colo_stream_offset(src->parser);
	const char *err = NULL;

	if (colo_stream_finish(src->parser, &err) == 0)
		capture_fail(src, "QEMU closed the checkpoint stream at offset %llu (%s%sat a "
			     "checkpoint boundary, after checkpoint %llu)",
			     (unsigned long long)offset, sys_error ? sys_error : "",
			     sys_error ? "; " : "", (unsigned long long)src->epoch);
	else
		capture_fail(src, "QEMU closed the checkpoint stream at offset %llu (%s%s%s)",
			     (unsigned long long)offset, sys_error ? sys_error : "",
			     sys_error ? "; " : "", err ? err : "truncated");
}

static void read_stream(struct checkpoint_source *src)
{
	for (int i = 0; i < MAX_READS_PER_WAKEUP; i++) {
		if (capture_gone(src) || src->conn_fd < 0)
			return;
		if (src->state == SRC_BULK && src->bulk_paused)
			return;
		size_t want = src->state == SRC_BULK ? src->bulk_chunk : READ_CHUNK;
		ssize_t n = recv(src->conn_fd, src->rbuf, want, MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				stream_ended(src, strerror(errno));
			return;
		}
		if (n == 0) {
			stream_ended(src, NULL);
			return;
		}
		bool bulk = src->state == SRC_BULK;
		feed(src, src->rbuf, (size_t)n);
		if (bulk)
			return; /* one chunk per wakeup: see bulk_chunk */
	}
}

static void on_stream_io(event_loop *loop, int fd, void *data, int ready)
{
	struct checkpoint_source *src = data;

	capture_enter(src);
	if (ready & EV_WRITABLE)
		flush_output(src);
	if ((ready & EV_READABLE) && !capture_gone(src))
		read_stream(src);
	capture_leave(src);
}

void capture_on_listen_readable(event_loop *loop, int fd, void *data, int ready)
{
	struct checkpoint_source *src = data;

	capture_enter(src);
	while (!capture_gone(src) && src->listen_fd >= 0) {
		int conn = unix_accept(src->listen_fd);

		if (conn < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			if (src->state == SRC_WAITING) {
				capture_fail(src, "cannot accept QEMU's connection on %s: %s",
					     src->path, strerror(errno));
			} else {
				/* Connected already: just stop refusing extras. */
				log_warn("vm %s: accept on %s: %s; no longer listening",
					 src->vm_name, src->path, strerror(errno));
				capture_close_listener(src);
			}
			break;
		}
		if (src->state != SRC_WAITING) {
			log_warn("vm %s: refused a second connection to the checkpoint "
				 "socket %s: QEMU is already connected", src->vm_name,
				 src->path);
			close(conn);
			continue;
		}
		src->conn_fd = conn;
		src->state = SRC_BULK;
		src->connected_us = monotonic_us();
		log_info("vm %s: QEMU connected to %s; receiving the bulk copy",
			 src->vm_name, src->path);
		capture_update_mask(src);
	}
	capture_leave(src);
}

