/* fdatasync of a file on a worker thread (file_flush.h). */
#include "base/file_flush.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct file_flush {
	event_loop *loop;
	int done_read;          /* watched by the loop */
	int done_write;         /* the worker writes one byte when finished */
	bool busy;
	pthread_t worker;
	char path[PATH_MAX];    /* written before the worker starts; read only when fd < 0 */
	int fd;                 /* or a duplicate of the owner's descriptor (-1: open path) */
	int result;             /* written by the worker, read after pthread_join */
	file_flush_done done;
	void *opaque;
};

static void *run_flush(void *data)
{
	struct file_flush *f = data;
	int fd = f->fd >= 0 ? f->fd : open(f->path, O_RDONLY | O_CLOEXEC);

	pthread_setname_np(pthread_self(), "remusdb-flush"); /* ps -L, top -H */

	f->result = 0;
	if (fd < 0 || fdatasync(fd) < 0)
		f->result = errno ? errno : EIO;
	if (fd >= 0)
		close(fd);
	(void)!write(f->done_write, "x", 1);
	return NULL;
}

static void on_done(event_loop *loop, int fd, void *data, int ready)
{
	struct file_flush *f = data;
	char byte;

	/* Not busy: file_flush_finish already reported this flush. */
	if (read(fd, &byte, 1) == 1)
		file_flush_finish(f);
}

struct file_flush *file_flush_create(event_loop *loop, char *err, size_t errlen)
{
	struct file_flush *f = calloc(1, sizeof(*f));
	int fds[2];

	if (!f) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) < 0) {
		snprintf(err, errlen, "pipe: %s", strerror(errno));
		free(f);
		return NULL;
	}
	f->loop = loop;
	f->done_read = fds[0];
	f->done_write = fds[1];
	if (event_loop_watch(loop, f->done_read, EV_READABLE, on_done, f) < 0) {
		snprintf(err, errlen, "cannot watch the flush pipe: %s", strerror(errno));
		close(fds[0]);
		close(fds[1]);
		free(f);
		return NULL;
	}
	return f;
}

void file_flush_destroy(struct file_flush *f)
{
	if (!f)
		return;
	if (f->busy)
		pthread_join(f->worker, NULL);
	event_loop_unwatch(f->loop, f->done_read);
	close(f->done_read);
	close(f->done_write);
	free(f);
}

void file_flush_finish(struct file_flush *f)
{
	if (!f || !f->busy)
		return;
	pthread_join(f->worker, NULL);
	f->busy = false;
	f->done(f->opaque, f->result);
}

bool file_flush_busy(const struct file_flush *f)
{
	return f->busy;
}

static int start_worker(struct file_flush *f, file_flush_done done, void *opaque)
{
	sigset_t all, old;

	f->done = done;
	f->opaque = opaque;
	/* The daemon takes its signals through a signalfd: no thread may accept them. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	int rc = pthread_create(&f->worker, NULL, run_flush, f);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0)
		return -1;
	f->busy = true;
	return 0;
}

int file_flush_start(struct file_flush *f, const char *path, file_flush_done done,
		     void *opaque)
{
	if (f->busy || snprintf(f->path, sizeof(f->path), "%s", path) >= (int)sizeof(f->path))
		return -1;
	f->fd = -1;
	return start_worker(f, done, opaque);
}

int file_flush_start_fd(struct file_flush *f, int fd, file_flush_done done, void *opaque)
{
	if (f->busy || (f->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0)
		return -1;
	if (start_worker(f, done, opaque) < 0) {
		close(f->fd);
		f->fd = -1;
		return -1;
	}
	return 0;
}
