/*
 * A takeover's eager restore: the committed image, as a migration stream
 * (restore_stream.h), written into QEMU's -incoming a bounded chunk per
 * writable event, so that the loop goes on with other VMs meanwhile.  The
 * VM may run only once every page is in.
 */
#include "backup/eager_restore.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"
#include "backup/failover_qemu.h"
#include "backup/replica.h"
#include "backup/restore_stream.h"

#define RESTORE_CHUNK EAGER_RESTORE_CHUNK

void eager_restore_init(struct replica *r)
{
	r->eager.incoming_fd = -1;
	buffer_init(&r->eager.out);
}

static void restore_finished(struct replica *r)
{
	struct replica_eager_restore *e = &r->eager;

	event_loop_unwatch(r->loop, e->incoming_fd);
	close(e->incoming_fd);
	e->incoming_fd = -1;
	int64_t done_us = monotonic_us();
	r->failover.stream_bytes = restore_stream_bytes(e->stream);
	log_info("vm %s: restore stream written (%.1f MiB in %.1f ms)", r->name,
		 (double)restore_stream_bytes(e->stream) / (1 << 20),
		 (done_us - failover_qemu_spawned_us(r)) / 1000.0);
	restore_stream_destroy(e->stream);
	e->stream = NULL;
	buffer_free(&e->out);
	failover_wait_for_resume(r, done_us);
}

static void on_incoming_writable(event_loop *loop, int fd, void *data, int ready)
{
	struct replica *r = data;
	struct replica_eager_restore *e = &r->eager;

	for (;;) {
		if (buffer_len(&e->out) == 0) {
			if (e->produced) {
				restore_finished(r);
				return;
			}
			int more = restore_stream_produce(e->stream, &e->out, RESTORE_CHUNK);
			if (more < 0) {
				failover_failed(r, "out of memory producing the restore stream");
				return;
			}
			e->produced = more == 0;
			continue;
		}
		if (buffer_write_fd(&e->out, fd) < 0) {
			failover_failed(r, "QEMU stopped reading the restore stream: %s "
					"(see %s/qemu.log)", strerror(errno), failover_run_dir(r));
			return;
		}
		if (buffer_len(&e->out) > 0)
			return; /* EAGAIN: wait for writability */
	}
}

/*
 * A unix socket's default send buffer (wmem_default, about 208 KiB) makes
 * the stream a ping-pong: we wait while QEMU drains 208 KiB, QEMU waits
 * while we produce the next.  With room for a whole chunk, QEMU loads one
 * chunk while we produce the next, on the other core.  Root may exceed
 * wmem_max (SO_SNDBUFFORCE); without it the kernel caps SO_SNDBUF there.
 */
int eager_restore_widen_send_buffer(int fd)
{
	int size = RESTORE_CHUNK;

	if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof(size)) == 0 ||
	    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size)) == 0)
		return 0;
	return -1;
}

void eager_restore_start(struct replica *r, int fd)
{
	struct replica_eager_restore *e = &r->eager;
	char err[256];

	e->incoming_fd = fd;
	if (eager_restore_widen_send_buffer(fd) < 0)
		log_warn("vm %s: the restore stream keeps the default socket buffer (%s): it "
			 "may take longer", r->name, strerror(errno));
	/* A RAM block QEMU maps from the image needs no page in the stream. */
	e->stream = restore_stream_create(r->image, r->failover.ram_shared ?
					  FAILOVER_SHARED_RAM_BLOCK : NULL, err, sizeof(err));
	if (!e->stream) {
		failover_failed(r, "cannot restore the image: %s", err);
		return;
	}
	buffer_init(&e->out);
	e->produced = false;
	if (event_loop_watch(r->loop, fd, EV_WRITABLE, on_incoming_writable, r) < 0)
		failover_failed(r, "epoll: %s", strerror(errno));
}

bool eager_restore_streaming(const struct replica *r)
{
	return r->eager.incoming_fd >= 0;
}

void eager_restore_stop(struct replica *r)
{
	struct replica_eager_restore *e = &r->eager;

	if (e->incoming_fd >= 0) {
		event_loop_unwatch(r->loop, e->incoming_fd);
		close(e->incoming_fd);
		e->incoming_fd = -1;
	}
	restore_stream_destroy(e->stream);
	e->stream = NULL;
	buffer_free(&e->out);
}
