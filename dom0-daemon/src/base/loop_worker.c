/* A kept worker thread running an owner's jobs one at a time (loop_worker.h). */
#include "base/loop_worker.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/thread_start.h"

/*
 * The loop posts a job under `lock` and the worker answers through the
 * pipe; the result is read under `lock`.  The pipe's byte only wakes the
 * loop: whether a job is done is job_done's to say, so a byte left over
 * from a job that loop_worker_finish already reported never makes the
 * loop wait for the next one.
 */
struct loop_worker {
	event_loop *loop;
	int done_read;          /* watched by the loop */
	int done_write;         /* the worker writes one byte per finished job */
	char thread_name[16];
	bool busy;              /* the loop's: a job posted and not yet reported */
	bool worker_started;
	pthread_t worker;
	pthread_mutex_t lock;
	pthread_cond_t changed; /* a job posted, a job done, or stop */
	/* under lock */
	bool job_posted;
	bool job_done;
	bool stop;
	loop_worker_job job;
	void *arg;
	int result;
	/* the loop's */
	loop_worker_done done;
	void *opaque;
};

static void *run_jobs(void *data)
{
	struct loop_worker *w = data;

	pthread_setname_np(pthread_self(), w->thread_name);
	pthread_mutex_lock(&w->lock);
	for (;;) {
		while (!w->job_posted && !w->stop)
			pthread_cond_wait(&w->changed, &w->lock);
		if (!w->job_posted)
			break; /* stopped, and nothing left to run */
		loop_worker_job job = w->job;
		void *arg = w->arg;
		w->job_posted = false;
		pthread_mutex_unlock(&w->lock);
		int result = job(arg);
		pthread_mutex_lock(&w->lock);
		w->result = result;
		w->job_done = true;
		pthread_cond_broadcast(&w->changed);
		(void)!write(w->done_write, "x", 1);
	}
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

/* Reports the posted job when it is done (or, with wait, once it is). */
static void report(struct loop_worker *w, bool wait)
{
	pthread_mutex_lock(&w->lock);
	while (wait && !w->job_done)
		pthread_cond_wait(&w->changed, &w->lock);
	bool done = w->job_done;
	int result = w->result;
	w->job_done = false;
	pthread_mutex_unlock(&w->lock);
	if (!done)
		return;
	w->busy = false;
	/* Last: done may post the next job, or destroy w. */
	w->done(w->opaque, result);
}

static void on_done(event_loop *loop, int fd, void *data, int ready)
{
	struct loop_worker *w = data;
	char bytes[16];

	(void)loop;
	(void)ready;
	/* Every byte there: several jobs may have ended since the last turn. */
	if (read(fd, bytes, sizeof(bytes)) > 0 && w->busy)
		report(w, false);
}

struct loop_worker *loop_worker_create(event_loop *loop, const char *thread_name,
				       char *err, size_t errlen)
{
	struct loop_worker *w = calloc(1, sizeof(*w));
	int fds[2];

	if (!w) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) < 0) {
		snprintf(err, errlen, "pipe: %s", strerror(errno));
		free(w);
		return NULL;
	}
	w->loop = loop;
	w->done_read = fds[0];
	w->done_write = fds[1];
	snprintf(w->thread_name, sizeof(w->thread_name), "%s", thread_name);
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->changed, NULL);
	if (event_loop_watch(loop, w->done_read, EV_READABLE, on_done, w) < 0) {
		snprintf(err, errlen, "cannot watch the worker's pipe: %s", strerror(errno));
		close(fds[0]);
		close(fds[1]);
		pthread_mutex_destroy(&w->lock);
		pthread_cond_destroy(&w->changed);
		free(w);
		return NULL;
	}
	return w;
}

void loop_worker_destroy(struct loop_worker *w)
{
	if (!w)
		return;
	if (w->worker_started) {
		/* The worker finishes a posted job before it sees stop. */
		pthread_mutex_lock(&w->lock);
		w->stop = true;
		pthread_cond_broadcast(&w->changed);
		pthread_mutex_unlock(&w->lock);
		pthread_join(w->worker, NULL);
	}
	event_loop_unwatch(w->loop, w->done_read);
	close(w->done_read);
	close(w->done_write);
	pthread_mutex_destroy(&w->lock);
	pthread_cond_destroy(&w->changed);
	free(w);
}

void loop_worker_finish(struct loop_worker *w)
{
	if (!w || !w->busy)
		return;
	report(w, true);
}

bool loop_worker_busy(const struct loop_worker *w)
{
	return w->busy;
}

int loop_worker_post(struct loop_worker *w, loop_worker_job job, void *arg,
		     loop_worker_done done, void *opaque)
{
	if (w->busy)
		return -1;
	if (!w->worker_started) {
		if (thread_start_without_signals(&w->worker, run_jobs, w) != 0)
			return -1;
		w->worker_started = true;
	}
	w->done = done;
	w->opaque = opaque;
	w->busy = true;
	pthread_mutex_lock(&w->lock);
	w->job = job;
	w->arg = arg;
	w->job_posted = true;
	w->job_done = false;
	pthread_cond_broadcast(&w->changed);
	pthread_mutex_unlock(&w->lock);
	return 0;
}
