/*
 * Runs the fencing command to completion, but never for longer than its
 * timeout: the point of a fence is that the old primary is off before the
 * VM runs here, and the point of the timeout is that a fence that hangs
 * cannot keep the VM down.  It blocks the caller; the takeover that calls
 * it has nothing else to do until the fence is done.
 */
#include <errno.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "event_loop.h"
#include "fence.h"

extern char **environ;

#define FENCE_POLL_MS 10

int fence_run(const char *cmd, const char *vm, const char *replaced_owner,
	      int timeout_ms, double *elapsed_ms, char *err, size_t errlen)
{
	char *argv[] = { "/bin/sh", "-c", (char *)cmd, NULL };
	posix_spawnattr_t attr;
	pid_t pid, done;
	int status = 0;
	int64_t t0 = monotonic_us();

	*elapsed_ms = 0;
	setenv("REMUSDB_VM", vm, 1);
	setenv("REMUSDB_PRIMARY", replaced_owner, 1);
	posix_spawnattr_init(&attr);
	/* Its own session and process group: a timeout kills all it started. */
	posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
	int rc = posix_spawn(&pid, argv[0], NULL, &attr, argv, environ);
	posix_spawnattr_destroy(&attr);
	if (rc != 0) {
		snprintf(err, errlen, "cannot start /bin/sh: %s", strerror(rc));
		return -1;
	}
	while ((done = waitpid(pid, &status, WNOHANG)) == 0 &&
	       monotonic_us() - t0 < (int64_t)timeout_ms * 1000)
		nanosleep(&(struct timespec){ .tv_nsec = FENCE_POLL_MS * 1000000L }, NULL);
	int wait_errno = errno;
	if (done == 0) {
		kill(-pid, SIGKILL);
		waitpid(pid, &status, 0);
	}
	*elapsed_ms = (monotonic_us() - t0) / 1000.0;
	if (done == 0)
		snprintf(err, errlen, "did not finish within %d ms and was killed", timeout_ms);
	else if (done < 0)
		snprintf(err, errlen, "could not be waited for: %s", strerror(wait_errno));
	else if (WIFSIGNALED(status))
		snprintf(err, errlen, "was killed by signal %d", WTERMSIG(status));
	else if (WEXITSTATUS(status) != 0)
		snprintf(err, errlen, "exited with %d", WEXITSTATUS(status));
	else
		return 0;
	return -1;
}
