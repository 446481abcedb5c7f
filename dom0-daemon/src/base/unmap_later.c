/*
 * munmap and close on detached threads (unmap_later.h says why).  One
 * thread per mapping: takeovers are rare and each frees one image, so a
 * pool would idle.  The jobs in flight are listed under a mutex: the
 * daemon's exit waits for the list to empty, and a process fork()ed
 * meanwhile (a page source) inherits the jobs without their threads,
 * still reachable from the list rather than lost.
 */
#include "base/unmap_later.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/log.h"

struct unmap_job {
	void *addr;
	size_t len;
	int fd;
	struct unmap_job *prev, *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t all_done = PTHREAD_COND_INITIALIZER;
static struct unmap_job *in_flight;

/* Under lock. */
static void unlist(struct unmap_job *job)
{
	if (job->prev)
		job->prev->next = job->next;
	else
		in_flight = job->next;
	if (job->next)
		job->next->prev = job->prev;
}

static void unmap_now(void *addr, size_t len, int fd)
{
	if (addr && len)
		munmap(addr, len);
	if (fd >= 0)
		close(fd);
}

static void *unmap_thread(void *arg)
{
	struct unmap_job *job = arg;

	pthread_setname_np(pthread_self(), "remusdb-unmap"); /* ps -L, top -H */

	unmap_now(job->addr, job->len, job->fd);
	pthread_mutex_lock(&lock);
	unlist(job);
	if (!in_flight)
		pthread_cond_broadcast(&all_done);
	pthread_mutex_unlock(&lock);
	free(job);
	return NULL;
}

void unmap_later(void *addr, size_t len, int fd)
{
	struct unmap_job *job = NULL;
	pthread_attr_t attr;
	pthread_t thread;

	if (len < UNMAP_LATER_MIN_BYTES || !(job = calloc(1, sizeof(*job))))
		goto now;
	job->addr = addr;
	job->len = len;
	job->fd = fd;
	if (pthread_attr_init(&attr) != 0)
		goto now;
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_mutex_lock(&lock);
	job->next = in_flight;
	if (in_flight)
		in_flight->prev = job;
	in_flight = job;
	int rc = pthread_create(&thread, &attr, unmap_thread, job);
	if (rc != 0)
		unlist(job);
	pthread_mutex_unlock(&lock);
	pthread_attr_destroy(&attr);
	if (rc == 0)
		return;
	log_warn("cannot start a thread to unmap %zu MiB; unmapping on the loop", len >> 20);
now:
	free(job);
	unmap_now(addr, len, fd);
}

void unmap_later_drain(void)
{
	pthread_mutex_lock(&lock);
	while (in_flight)
		pthread_cond_wait(&all_done, &lock);
	pthread_mutex_unlock(&lock);
}

unsigned unmap_later_running(void)
{
	unsigned n = 0;

	pthread_mutex_lock(&lock);
	for (const struct unmap_job *job = in_flight; job; job = job->next)
		n++;
	pthread_mutex_unlock(&lock);
	return n;
}
