/*
 * A kept worker thread that runs one job at a time for an owner on the
 * event loop, and reports each job's result back on the loop.  Why:
 * every VM of the host shares the loop that checkpoints, acknowledges
 * and answers heartbeats, so a call that may block for as long as the
 * disk takes (an fdatasync, a pread that misses the page cache, a
 * pwrite the kernel throttles) is handed to a thread of the owner's own
 * instead.  The thread starts at the first job and stays until destroy:
 * a busy guest posts hundreds of jobs a second, and creating a thread
 * for each cost the loop more than the work (file_flush.c).
 *
 * The loop's side is single-threaded like the rest of the daemon: post,
 * busy, finish and destroy are called on the loop, and done runs there.
 * What a job reads and writes is the owner's business; the usual rule is
 * that the owner leaves it alone until done has run.
 */
#ifndef REMUSDB_LOOP_WORKER_H
#define REMUSDB_LOOP_WORKER_H

#include <stdbool.h>
#include <stddef.h>

#include "base/event_loop.h"

/* Runs on the worker thread; its return value goes to the done callback. */
typedef int (*loop_worker_job)(void *arg);
/* Runs on the loop with the job's result. */
typedef void (*loop_worker_done)(void *opaque, int result);

struct loop_worker;

/*
 * A worker whose thread will be called thread_name (at most 15
 * characters; ps -L and top -H show it).  NULL with err filled (no pipe,
 * or out of memory).
 */
struct loop_worker *loop_worker_create(event_loop *loop, const char *thread_name,
				       char *err, size_t errlen);
/* Waits for a running job (without its callback), then frees.  NULL is a no-op. */
void loop_worker_destroy(struct loop_worker *w);
/* A job posted whose done has not run yet. */
bool loop_worker_busy(const struct loop_worker *w);
/*
 * Waits for a running job and runs its done now, for an owner that is
 * going away and must not lose the result.  No-op when idle.
 */
void loop_worker_finish(struct loop_worker *w);
/*
 * Runs job(arg) on the worker, then done(opaque, result) on the loop.
 * -1 when a job is already posted or the thread cannot start.
 */
int loop_worker_post(struct loop_worker *w, loop_worker_job job, void *arg,
		     loop_worker_done done, void *opaque);

#endif
