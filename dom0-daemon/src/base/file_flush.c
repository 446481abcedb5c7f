/*
 * fdatasync of a file on the owner's kept worker (file_flush.h,
 * loop_worker.h).  A guest that flushes a hundred times a second or more
 * (the scale bench's busy VM did 97-240) had the loop create and join a
 * thread for each, 4-5% of the primary's loop time in clone3 alone
 * (tools/remusdb-bench scale --loop-profile); the worker is kept.
 */
#include "base/file_flush.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/loop_worker.h"

struct file_flush {
	struct loop_worker *worker;
	/* The job's, written before the post and left alone until it is reported. */
	char path[PATH_MAX];    /* read only when fd < 0 */
	int fd;                 /* or a duplicate of the owner's descriptor (-1: open path) */
	file_flush_done done;
	void *opaque;
};

static int flush_one(void *arg)
{
	struct file_flush *f = arg;
	int fd = f->fd >= 0 ? f->fd : open(f->path, O_RDONLY | O_CLOEXEC);
	int result = 0;

	if (fd < 0 || fdatasync(fd) < 0)
		result = errno ? errno : EIO;
	if (fd >= 0)
		close(fd);
	return result;
}

static void flushed(void *opaque, int result)
{
	struct file_flush *f = opaque;

	f->fd = -1; /* closed by the job */
	f->done(f->opaque, result);
}

struct file_flush *file_flush_create(event_loop *loop, char *err, size_t errlen)
{
	struct file_flush *f = calloc(1, sizeof(*f));

	if (!f) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	f->fd = -1;
	f->worker = loop_worker_create(loop, "remusdb-flush", err, errlen);
	if (!f->worker) {
		free(f);
		return NULL;
	}
	return f;
}

void file_flush_destroy(struct file_flush *f)
{
	if (!f)
		return;
	bool busy = loop_worker_busy(f->worker);
	loop_worker_destroy(f->worker); /* waits for a running flush */
	if (!busy && f->fd >= 0)
		close(f->fd);
	free(f);
}

void file_flush_finish(struct file_flush *f)
{
	if (f)
		loop_worker_finish(f->worker);
}

bool file_flush_busy(const struct file_flush *f)
{
	return loop_worker_busy(f->worker);
}

int file_flush_start(struct file_flush *f, const char *path, file_flush_done done,
		     void *opaque)
{
	if (loop_worker_busy(f->worker) ||
	    snprintf(f->path, sizeof(f->path), "%s", path) >= (int)sizeof(f->path))
		return -1;
	f->fd = -1;
	f->done = done;
	f->opaque = opaque;
	return loop_worker_post(f->worker, flush_one, f, flushed, f);
}

int file_flush_start_fd(struct file_flush *f, int fd, file_flush_done done, void *opaque)
{
	if (loop_worker_busy(f->worker) || (f->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0)
		return -1;
	f->done = done;
	f->opaque = opaque;
	if (loop_worker_post(f->worker, flush_one, f, flushed, f) < 0) {
		close(f->fd);
		f->fd = -1;
		return -1;
	}
	return 0;
}
