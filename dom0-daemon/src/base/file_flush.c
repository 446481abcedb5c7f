/* fdatasync of a file on a worker thread (file_flush.h). */
#include "base/file_flush.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/thread_start.h"

/*
 * One worker per owner, started at its first flush and kept: a guest
 * that flushes a hundred times a second or more (the scale bench's busy
 * VM did 97-240) had the loop create and join a thread for each, 4-5% of
 * the primary's loop time in clone3 alone (tools/remusdb-bench scale
 * --loop-profile).  The loop posts a job under `lock` and the worker
 * answers through the pipe; the result is read under `lock`.
 */
struct file_flush {
	event_loop *loop;
	int done_read;          /* watched by the loop */
	int done_write;         /* the worker writes one byte per finished job */
	bool busy;              /* the loop's: a job posted and not yet reported */
	bool worker_started;
	pthread_t worker;
	pthread_mutex_t lock;
	pthread_cond_t changed; /* a job posted, a job done, or stop */
	/* under lock */
	bool job_posted;
	bool job_done;
	bool stop;
	char path[PATH_MAX];    /* read only when fd < 0 */
	int fd;                 /* or a duplicate of the owner's descriptor (-1: open path) */
	int result;
	/* the loop's */
	file_flush_done done;
	void *opaque;
};

static int flush_one(const char *path, int fd)
{
	int result = 0;

	if (fd < 0)
		fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fdatasync(fd) < 0)
		result = errno ? errno : EIO;
	if (fd >= 0)
		close(fd);
	return result;
}

static void *run_flushes(void *data)
{
	struct file_flush *f = data;
	char path[PATH_MAX];

	pthread_setname_np(pthread_self(), "remusdb-flush"); /* ps -L, top -H */
	pthread_mutex_lock(&f->lock);
	for (;;) {
		while (!f->job_posted && !f->stop)
			pthread_cond_wait(&f->changed, &f->lock);
		if (!f->job_posted)
			break; /* stopped, and nothing left to flush */
		int fd = f->fd;
		if (fd < 0)
			memcpy(path, f->path, sizeof(path));
		f->job_posted = false;
		pthread_mutex_unlock(&f->lock);
		int result = flush_one(path, fd);
		pthread_mutex_lock(&f->lock);
		f->fd = -1;
		f->result = result;
		f->job_done = true;
		pthread_cond_broadcast(&f->changed);
		(void)!write(f->done_write, "x", 1);
	}
	pthread_mutex_unlock(&f->lock);
	return NULL;
}

/* Reports the posted job when it is done (or, with wait, once it is). */
static void report(struct file_flush *f, bool wait)
{
	pthread_mutex_lock(&f->lock);
	while (wait && !f->job_done)
		pthread_cond_wait(&f->changed, &f->lock);
	bool done = f->job_done;
	int result = f->result;
	f->job_done = false;
	pthread_mutex_unlock(&f->lock);
	if (!done)
		return;
	f->busy = false;
	f->done(f->opaque, result);
}

static void on_done(event_loop *loop, int fd, void *data, int ready)
{
	struct file_flush *f = data;
	char byte;

	/*
	 * A byte whose job file_flush_finish already reported may be read
	 * after the next job started: report() then finds that job not done
	 * and returns instead of waiting for its fdatasync.
	 */
	if (read(fd, &byte, 1) == 1 && f->busy)
		report(f, false);
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
	f->fd = -1;
	pthread_mutex_init(&f->lock, NULL);
	pthread_cond_init(&f->changed, NULL);
	if (event_loop_watch(loop, f->done_read, EV_READABLE, on_done, f) < 0) {
		snprintf(err, errlen, "cannot watch the flush pipe: %s", strerror(errno));
		close(fds[0]);
		close(fds[1]);
		pthread_mutex_destroy(&f->lock);
		pthread_cond_destroy(&f->changed);
		free(f);
		return NULL;
	}
	return f;
}

void file_flush_destroy(struct file_flush *f)
{
	if (!f)
		return;
	if (f->worker_started) {
		/* The worker finishes a posted job before it sees stop. */
		pthread_mutex_lock(&f->lock);
		f->stop = true;
		pthread_cond_broadcast(&f->changed);
		pthread_mutex_unlock(&f->lock);
		pthread_join(f->worker, NULL);
	}
	event_loop_unwatch(f->loop, f->done_read);
	close(f->done_read);
	close(f->done_write);
	if (f->fd >= 0)
		close(f->fd);
	pthread_mutex_destroy(&f->lock);
	pthread_cond_destroy(&f->changed);
	free(f);
}

void file_flush_finish(struct file_flush *f)
{
	if (!f || !f->busy)
		return;
	report(f, true);
}

bool file_flush_busy(const struct file_flush *f)
{
	return f->busy;
}

/* Posts the job set in f->path or f->fd; the worker starts at the first. */
static int post(struct file_flush *f, file_flush_done done, void *opaque)
{
	if (!f->worker_started) {
		if (thread_start_without_signals(&f->worker, run_flushes, f) != 0)
			return -1;
		f->worker_started = true;
	}
	f->done = done;
	f->opaque = opaque;
	f->busy = true;
	pthread_mutex_lock(&f->lock);
	f->job_posted = true;
	f->job_done = false;
	pthread_cond_broadcast(&f->changed);
	pthread_mutex_unlock(&f->lock);
	return 0;
}

/*
 * path and fd are written while the worker waits for a job (not busy) and
 * read by it only after the post, under lock.
 */
int file_flush_start(struct file_flush *f, const char *path, file_flush_done done,
		     void *opaque)
{
	if (f->busy || snprintf(f->path, sizeof(f->path), "%s", path) >= (int)sizeof(f->path))
		return -1;
	f->fd = -1;
	return post(f, done, opaque);
}

int file_flush_start_fd(struct file_flush *f, int fd, file_flush_done done, void *opaque)
{
	if (f->busy || (f->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0)
		return -1;
	if (post(f, done, opaque) < 0) {
		close(f->fd);
		f->fd = -1;
		return -1;
	}
	return 0;
}
