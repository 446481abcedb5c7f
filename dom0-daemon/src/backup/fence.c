/*
 * Runs the fencing command as a child of the event loop: the point of a
 * fence is that the old primary is off before the VM runs here, and the
 * point of its timeout is that a fence that hangs cannot keep the VM down.
 * Nothing here waits: a pidfd says when the child exited and a timer when
 * it ran too long, so the loop keeps serving every other VM meanwhile.
 * Where pidfd_open() is missing (kernels before 5.3, valgrind) a 10 ms
 * timer asks waitid() instead.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backup/fence.h"
#include "base/log.h"

extern char **environ;

/* A SIGKILLed child dies at once unless stuck in the kernel (D state). */
#define CANCEL_REAP_WAIT_MS 1000
#define EXIT_POLL_MS 10

struct fence {
	event_loop *loop;
	pid_t pid;             /* also its process group: it runs in its own session */
	int pidfd;             /* -1: no pidfd, exit_poll_timer asks instead */
	long long exit_poll_timer;
	long long timer;
	int timeout_ms;
	bool timed_out;
	int64_t started_us;
	fence_done_fn done;
	void *data;
	struct fence *next;
};

/* Fences whose child is not reaped yet (see fence_owns_child). */
static struct fence *running;

bool fence_owns_child(pid_t pid)
{
	for (const struct fence *f = running; f; f = f->next)
		if (f->pid == pid)
			return true;
	return false;
}

static void forget(struct fence *f)
{
	for (struct fence **l = &running; *l; l = &(*l)->next)
		if (*l == f) {
			*l = f->next;
			return;
		}
}

static void release(struct fence *f)
{
	forget(f);
	if (f->timer)
		event_loop_del_timer(f->loop, f->timer);
	if (f->exit_poll_timer)
		event_loop_del_timer(f->loop, f->exit_poll_timer);
	if (f->pidfd >= 0) {
		event_loop_unwatch(f->loop, f->pidfd);
		close(f->pidfd);
	}
	free(f);
}

static bool is_fence_variable(const char *entry)
{
	return !strncmp(entry, "REMUSDB_VM=", 11) || !strncmp(entry, "REMUSDB_PRIMARY=", 16);
}

/*
 * The daemon's environment plus this fence's two variables, for this
 * child alone: setenv() on the daemon would race with libcurl's resolver
 * threads reading it and would leak into every later child (QEMU).
 */
static char **fence_environment(const char *vm, const char *replaced_owner)
{
	size_t n = 0, k = 0;

	while (environ && environ[n])
		n++;
	char **env = calloc(n + 3, sizeof(char *));
	if (!env)
		return NULL;
	for (size_t i = 0; i < n; i++)
		if (!is_fence_variable(environ[i]))
			env[k++] = environ[i];
	if (asprintf(&env[k], "REMUSDB_VM=%s", vm) < 0) {
		free(env);
		return NULL;
	}
	if (asprintf(&env[k + 1], "REMUSDB_PRIMARY=%s", replaced_owner) < 0) {
		free(env[k]);
		free(env);
		return NULL;
	}
	return env;
}

static void free_fence_environment(char **env)
{
	size_t k = 0;

	while (env[k] && !is_fence_variable(env[k]))
		k++;
	free(env[k]);
	free(env[k + 1]);
	free(env);
}

static void describe_exit(const struct fence *f, const siginfo_t *info, char *msg,
			  size_t len)
{
	msg[0] = '\0';
	if (f->timed_out)
		snprintf(msg, len, "did not finish within %d ms and was killed", f->timeout_ms);
	else if (info->si_code == CLD_EXITED && info->si_status != 0)
		snprintf(msg, len, "exited with %d", info->si_status);
	else if (info->si_code == CLD_KILLED || info->si_code == CLD_DUMPED)
		snprintf(msg, len, "was killed by signal %d", info->si_status);
}

/* Reaps the child if it exited: 1 reaped (info filled), 0 still runs, -1 error. */
static int reap(struct fence *f, siginfo_t *info)
{
	memset(info, 0, sizeof(*info));
	int rc = f->pidfd >= 0 ? waitid(P_PIDFD, (id_t)f->pidfd, info, WEXITED | WNOHANG)
			       : waitid(P_PID, (id_t)f->pid, info, WEXITED | WNOHANG);
	if (rc < 0)
		return -1;
	return info->si_pid != 0;
}

/* The child exited (pidfd readable) or may have (poll timer). */
static void check_child(struct fence *f)
{
	siginfo_t info;
	char msg[128];
	int reaped = reap(f, &info);

	if (reaped == 0)
		return; /* still running: the pidfd or the poll timer comes back */
	if (reaped < 0)
		snprintf(msg, sizeof(msg), "could not be waited for: %s", strerror(errno));
	else
		describe_exit(f, &info, msg, sizeof(msg));
	double elapsed_ms = (monotonic_us() - f->started_us) / 1000.0;
	fence_done_fn done = f->done;
	void *done_data = f->data;
	/* Freed first: the callback may go on to start another fence. */
	release(f);
	done(done_data, msg[0] == '\0', elapsed_ms, msg);
}

static void on_pidfd_readable(event_loop *loop, int fd, void *data, int ready)
{
	check_child(data);
}

static long poll_child(event_loop *loop, long long id, void *data)
{
	/*
	 * When check_child frees the fence, release() has deleted this
	 * timer, and a deleted timer stays deleted whatever we return.
	 */
	check_child(data);
	return EXIT_POLL_MS;
}

static long on_timeout(event_loop *loop, long long id, void *data)
{
	struct fence *f = data;

	/* Timers count whole milliseconds: never kill a fence a bit early. */
	if (monotonic_us() - f->started_us < (int64_t)f->timeout_ms * 1000)
		return 1;
	f->timer = 0;
	f->timed_out = true;
	/* The whole group: a plain kill of the shell would leave what it started. */
	if (kill(-f->pid, SIGKILL) < 0)
		log_warn("fence: cannot kill process group %d: %s", (int)f->pid,
			 strerror(errno));
	return TIMER_DONE; /* the pidfd reports the death, and we reap there */
}

struct fence *fence_start(event_loop *loop, const char *cmd, const char *vm,
			  const char *replaced_owner, int timeout_ms,
			  fence_done_fn done, void *data, char *err, size_t errlen)
{
	char *argv[] = { "/bin/sh", "-c", (char *)cmd, NULL };
	posix_spawnattr_t attr;
	struct fence *f = calloc(1, sizeof(*f));
	char **env = fence_environment(vm, replaced_owner);

	if (!f || !env) {
		snprintf(err, errlen, "out of memory");
		free(f);
		if (env)
			free_fence_environment(env);
		return NULL;
	}
	f->loop = loop;
	f->pidfd = -1;
	f->timeout_ms = timeout_ms;
	f->done = done;
	f->data = data;
	f->started_us = monotonic_us();
	posix_spawnattr_init(&attr);
	/* Its own session and process group: a timeout kills all it started. */
	posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
	int rc = posix_spawn(&f->pid, argv[0], NULL, &attr, argv, env);
	posix_spawnattr_destroy(&attr);
	free_fence_environment(env);
	if (rc != 0) {
		snprintf(err, errlen, "cannot start /bin/sh: %s", strerror(rc));
		free(f);
		return NULL;
	}
	f->next = running;
	running = f;
	f->pidfd = (int)syscall(SYS_pidfd_open, f->pid, 0);
	if (f->pidfd >= 0) {
		if (event_loop_watch(loop, f->pidfd, EV_READABLE, on_pidfd_readable, f) < 0) {
			snprintf(err, errlen, "cannot watch the fencing command: epoll: %s",
				 strerror(errno));
			goto kill_it;
		}
	} else {
		f->exit_poll_timer = event_loop_add_timer(loop, EXIT_POLL_MS, poll_child, f);
		if (f->exit_poll_timer < 0) {
			f->exit_poll_timer = 0;
			snprintf(err, errlen, "cannot watch the fencing command: out of memory");
			goto kill_it;
		}
	}
	f->timer = event_loop_add_timer(loop, timeout_ms, on_timeout, f);
	if (f->timer < 0) {
		f->timer = 0;
		snprintf(err, errlen, "cannot time the fencing command: out of memory");
		goto kill_it;
	}
	return f;
kill_it:
	fence_cancel(f);
	return NULL;
}

void fence_cancel(struct fence *f)
{
	if (!f)
		return;
	siginfo_t info;
	int64_t give_up = monotonic_us() + CANCEL_REAP_WAIT_MS * 1000LL;
	int reaped;

	kill(-f->pid, SIGKILL);
	/*
	 * Reaped here so that no zombie outlives the fence; the wait is
	 * bounded for a child stuck in the kernel, which the daemon's
	 * reaper of strays then collects once it dies.
	 */
	while ((reaped = reap(f, &info)) == 0 && monotonic_us() < give_up) {
		if (f->pidfd >= 0)
			poll(&(struct pollfd){ .fd = f->pidfd, .events = POLLIN }, 1,
			     CANCEL_REAP_WAIT_MS);
		else
			nanosleep(&(struct timespec){ .tv_nsec = 1000000 }, NULL);
	}
	if (reaped == 0)
		log_warn("fence: the fencing command (pid %d) did not die within %d ms of "
			 "SIGKILL; it is reaped later", (int)f->pid, CANCEL_REAP_WAIT_MS);
	release(f);
}
