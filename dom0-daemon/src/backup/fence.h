/*
 * The operator's fencing command (--fence-command): run by the backup
 * after it won the VM in etcd and before it starts the VM, to power off or
 * isolate the old primary (IPMI, a switch port, a cloud API).
 *
 * It runs as a child watched by the event loop (a pidfd and a timer), so
 * heartbeats to every other primary go on while it runs.
 */
#ifndef REMUSDB_FENCE_H
#define REMUSDB_FENCE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "base/event_loop.h"

#define FENCE_TIMEOUT_MS 10000

struct fence;

/*
 * Called once when the fence is over: ok when it exited with 0, else
 * message says how it failed ("exited with 3", "did not finish within
 * 200 ms and was killed", ...).  elapsed_ms is its run time.  The fence
 * is already freed when this runs.
 */
typedef void (*fence_done_fn)(void *data, bool ok, double elapsed_ms,
			      const char *message);

/*
 * Starts cmd with /bin/sh -c in its own session and process group, with
 * the daemon's environment plus REMUSDB_VM=vm and
 * REMUSDB_PRIMARY=replaced_owner (built for this child only: the daemon's
 * own environment is never changed).  After timeout_ms its whole process
 * group is killed.  Returns the running fence, or NULL with the reason in
 * err (then done is never called).
 */
struct fence *fence_start(event_loop *loop, const char *cmd, const char *vm,
			  const char *replaced_owner, int timeout_ms,
			  fence_done_fn done, void *data, char *err, size_t errlen);

/*
 * Stops a fence that is still running (shutdown, replica destroyed):
 * kills its process group, reaps it and frees it; done is not called.
 * NULL is a no-op.
 */
void fence_cancel(struct fence *fence);

/*
 * True when pid is a fence child that its fence will reap itself: the
 * daemon's reaper of other children must leave it alone, or the fence
 * would lose its exit status.
 */
bool fence_owns_child(pid_t pid);

#endif
