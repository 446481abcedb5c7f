/* The etcd witness on a worker thread for the event loop (witness_async.h). */
#include "witness/witness_async.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/thread_start.h"
#include "witness/witness_proto.h"

enum witness_job { JOB_GET, JOB_CLAIM, JOB_CAS };

struct witness_async {
	event_loop *loop;
	struct witness *client; /* the worker's while busy, else the loop's */
	int done_read;          /* watched by the loop */
	int done_write;         /* the worker writes one byte when finished */
	bool busy;
	bool worker_started;    /* false when the job was refused up front */
	pthread_t worker;

	/* The job: written before the worker starts, read only by it. */
	enum witness_job job;
	char vm[WITNESS_VM_MAX + 1];
	char owner[WITNESS_OWNER_MAX + 1];
	struct witness_ownership expected;
	witness_done_cb cb;
	void *opaque;

	/* The answer: written by the worker, read after pthread_join(). */
	enum witness_result result;
	struct witness_ownership now;
	char err[512];
};

static void *run_job(void *data)
{
	struct witness_async *wa = data;

	pthread_setname_np(pthread_self(), "remusdb-etcd"); /* ps -L, top -H */

	switch (wa->job) {
	case JOB_GET:
		wa->result = witness_get(wa->client, wa->vm, &wa->now, wa->err,
					 sizeof(wa->err));
		break;
	case JOB_CLAIM:
		wa->result = witness_claim(wa->client, wa->vm, wa->owner, &wa->now,
					   wa->err, sizeof(wa->err));
		break;
	case JOB_CAS:
		wa->result = witness_cas(wa->client, wa->vm, &wa->expected, wa->owner,
					 &wa->now, wa->err, sizeof(wa->err));
		break;
	}
	/*
	 * The pipe never fills: one byte per job, read before the next.  A
	 * one-byte pipe write is atomic (at most PIPE_BUF): whole or failed.
	 */
	(void)!write(wa->done_write, "x", 1);
	return NULL;
}

static void on_done(event_loop *loop, int fd, void *data, int ready)
{
	struct witness_async *wa = data;
	char byte;

	if (read(fd, &byte, 1) != 1 || !wa->busy)
		return;
	if (wa->worker_started)
		pthread_join(wa->worker, NULL);
	wa->worker_started = false;
	wa->busy = false;

	/* Copy everything out: the callback may destroy the handle. */
	enum witness_result result = wa->result;
	struct witness_ownership now = wa->now;
	char err[sizeof(wa->err)];
	witness_done_cb cb = wa->cb;
	void *opaque = wa->opaque;
	memcpy(err, wa->err, sizeof(err));
	cb(opaque, result, &now, err[0] ? err : NULL);
}

struct witness_async *witness_async_create(event_loop *loop,
					   const struct witness_config *cfg,
					   char *err, size_t n)
{
	struct witness_async *wa = calloc(1, sizeof(*wa));
	int fds[2];

	if (!wa) {
		snprintf(err, n, "out of memory");
		return NULL;
	}
	wa->client = witness_create(cfg, err, n);
	if (!wa->client) {
		free(wa);
		return NULL;
	}
	if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) < 0) {
		snprintf(err, n, "pipe: %s", strerror(errno));
		witness_destroy(wa->client);
		free(wa);
		return NULL;
	}
	wa->done_read = fds[0];
	wa->done_write = fds[1];
	wa->loop = loop;
	if (event_loop_watch(loop, wa->done_read, EV_READABLE, on_done, wa) < 0) {
		snprintf(err, n, "cannot watch the witness pipe: %s", strerror(errno));
		close(fds[0]);
		close(fds[1]);
		witness_destroy(wa->client);
		free(wa);
		return NULL;
	}
	return wa;
}

void witness_async_destroy(struct witness_async *wa)
{
	if (!wa)
		return;
	if (wa->worker_started) {
		witness_cancel(wa->client);
		pthread_join(wa->worker, NULL);
	}
	event_loop_unwatch(wa->loop, wa->done_read);
	close(wa->done_read);
	close(wa->done_write);
	witness_destroy(wa->client);
	free(wa);
}

bool witness_async_busy(const struct witness_async *wa)
{
	return wa->busy;
}

/* Refuses the job through the callback, as the worker would have. */
static int refuse(struct witness_async *wa)
{
	memset(&wa->now, 0, sizeof(wa->now));
	wa->result = WITNESS_ERROR;
	wa->worker_started = false;
	wa->busy = true;
	(void)!write(wa->done_write, "x", 1);
	return 0;
}

static int start(struct witness_async *wa, enum witness_job job, const char *vm,
		 const char *owner, const struct witness_ownership *expected,
		 witness_done_cb cb, void *opaque)
{
	if (wa->busy)
		return -1;
	wa->job = job;
	wa->cb = cb;
	wa->opaque = opaque;
	wa->err[0] = '\0';
	/* Check here what would not survive the copy into fixed buffers. */
	if (witness_check_vm_name(vm, wa->err, sizeof(wa->err)) < 0 ||
	    (job != JOB_GET && witness_check_owner(owner, wa->err, sizeof(wa->err)) < 0))
		return refuse(wa);
	snprintf(wa->vm, sizeof(wa->vm), "%s", vm);
	snprintf(wa->owner, sizeof(wa->owner), "%s", job != JOB_GET ? owner : "");
	if (expected)
		wa->expected = *expected;
	else
		memset(&wa->expected, 0, sizeof(wa->expected));
	if (thread_start_without_signals(&wa->worker, run_job, wa) != 0)
		return -1;
	wa->worker_started = true;
	wa->busy = true;
	return 0;
}

int witness_async_get(struct witness_async *wa, const char *vm, witness_done_cb cb,
		      void *opaque)
{
	return start(wa, JOB_GET, vm, NULL, NULL, cb, opaque);
}

int witness_async_claim(struct witness_async *wa, const char *vm, const char *owner,
			witness_done_cb cb, void *opaque)
{
	return start(wa, JOB_CLAIM, vm, owner, NULL, cb, opaque);
}

int witness_async_cas(struct witness_async *wa, const char *vm,
		      const struct witness_ownership *expected, const char *new_owner,
		      witness_done_cb cb, void *opaque)
{
	return start(wa, JOB_CAS, vm, new_owner, expected, cb, opaque);
}
