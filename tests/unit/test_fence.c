/* The fencing command run by fence_start under a real event loop: its
 * environment, its failures, its timeout and cancellation, with real
 * /bin/sh processes, and the loop going on while it runs. */
#include <CUnit/CUnit.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/event_loop.h"
#include "backup/fence.h"
#include "suites.h"

static char dir[] = "/tmp/remusdb-fence-XXXXXX";

static int make_dir(void)
{
	return mkdtemp(dir) ? 0 : -1;
}

static int remove_dir(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	return system(cmd) == 0 ? 0 : -1;
}

static void read_file(const char *name, char *out, size_t len)
{
	char path[128];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	out[0] = 0;
	f = fopen(path, "r");
	if (!f)
		return;
	size_t n = fread(out, 1, len - 1, f);
	out[n] = 0;
	fclose(f);
}

struct outcome {
	bool done;
	bool ok;
	double ms;
	char message[128];
};

static void on_done(void *data, bool ok, double ms, const char *message)
{
	struct outcome *o = data;

	o->done = true;
	o->ok = ok;
	o->ms = ms;
	snprintf(o->message, sizeof(o->message), "%s", message);
}

/* Steps the loop until the fence reported, for at most limit_ms. */
static void run_until_done(event_loop *loop, struct outcome *o, int limit_ms)
{
	int64_t end = monotonic_ms() + limit_ms;

	while (!o->done && monotonic_ms() < end)
		event_loop_run_once(loop, 50);
}

/* Runs cmd as a fence to its end; the result lands in o. */
static void fence_to_end(const char *cmd, int timeout_ms, struct outcome *o)
{
	event_loop *loop = event_loop_create();
	char err[128] = "";

	memset(o, 0, sizeof(*o));
	CU_ASSERT_PTR_NOT_NULL_FATAL(loop);
	struct fence *f = fence_start(loop, cmd, "db1", "primary", timeout_ms, on_done, o,
				      err, sizeof(err));
	CU_ASSERT_PTR_NOT_NULL(f);
	CU_ASSERT_STRING_EQUAL(err, "");
	if (f)
		run_until_done(loop, o, timeout_ms + 5000);
	CU_ASSERT_TRUE(o->done);
	event_loop_destroy(loop);
}

/* No child of the test is left, not even a zombie. */
static bool no_children_left(void)
{
	return waitpid(-1, NULL, WNOHANG) < 0 && errno == ECHILD;
}

static void test_success_gets_vm_and_replaced_owner(void)
{
	char cmd[256], got[64];
	struct outcome o;

	/* A stale value in the daemon's own environment must not reach it... */
	setenv("REMUSDB_PRIMARY", "stale", 1);
	unsetenv("REMUSDB_VM");
	snprintf(cmd, sizeof(cmd), "echo \"$REMUSDB_VM $REMUSDB_PRIMARY\" > %s/env", dir);
	fence_to_end(cmd, 5000, &o);
	CU_ASSERT_TRUE(o.ok);
	CU_ASSERT_STRING_EQUAL(o.message, "");
	CU_ASSERT_TRUE(o.ms >= 0);
	read_file("env", got, sizeof(got));
	CU_ASSERT_STRING_EQUAL(got, "db1 primary\n");
	/* ...and the fence's values never enter the daemon's environment. */
	CU_ASSERT_PTR_NULL(getenv("REMUSDB_VM"));
	CU_ASSERT_STRING_EQUAL(getenv("REMUSDB_PRIMARY"), "stale");
	unsetenv("REMUSDB_PRIMARY");
	CU_ASSERT_TRUE(no_children_left());
}

static void test_no_duplicate_variables_in_its_environment(void)
{
	char cmd[256], got[64];
	struct outcome o;

	setenv("REMUSDB_VM", "stale", 1);
	snprintf(cmd, sizeof(cmd), "env | grep -c '^REMUSDB_VM=' > %s/count", dir);
	fence_to_end(cmd, 5000, &o);
	unsetenv("REMUSDB_VM");
	CU_ASSERT_TRUE(o.ok);
	read_file("count", got, sizeof(got));
	CU_ASSERT_STRING_EQUAL(got, "1\n");
}

static void test_failures_say_how(void)
{
	struct outcome o;

	fence_to_end("exit 3", 5000, &o);
	CU_ASSERT_FALSE(o.ok);
	CU_ASSERT_STRING_EQUAL(o.message, "exited with 3");
	fence_to_end("kill -TERM $$", 5000, &o);
	CU_ASSERT_FALSE(o.ok);
	CU_ASSERT_STRING_EQUAL(o.message, "was killed by signal 15");
	fence_to_end("/nonexistent/ipmi-off", 5000, &o);
	CU_ASSERT_FALSE(o.ok);
	CU_ASSERT_STRING_EQUAL(o.message, "exited with 127");
	CU_ASSERT_TRUE(no_children_left());
}

/* True when pid is gone or a zombie waiting for its new parent to reap it. */
static int process_dead(long pid)
{
	char path[64], stat[256] = "";
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
	f = fopen(path, "r");
	if (!f)
		return 1;
	size_t n = fread(stat, 1, sizeof(stat) - 1, f);
	stat[n] = 0;
	fclose(f);
	const char *state = strrchr(stat, ')');
	return state && state[1] == ' ' && state[2] == 'Z';
}

static long read_pid_file(const char *name)
{
	char got[32];

	read_file(name, got, sizeof(got));
	return strtol(got, NULL, 10);
}

static bool dies_soon(long pid)
{
	for (int i = 0; i < 200; i++) { /* the kernel delivers SIGKILL at once */
		if (pid > 0 && process_dead(pid))
			return true;
		usleep(10000);
	}
	return false;
}

static void test_hung_fence_is_killed_with_what_it_started(void)
{
	char cmd[256];
	struct outcome o;

	/* A fence that hangs, and a child of it that would outlive a plain kill. */
	snprintf(cmd, sizeof(cmd), "sleep 60 & echo $! > %s/child; wait", dir);
	fence_to_end(cmd, 200, &o);
	CU_ASSERT_FALSE(o.ok);
	CU_ASSERT_STRING_EQUAL(o.message, "did not finish within 200 ms and was killed");
	CU_ASSERT_TRUE(o.ms >= 200 && o.ms < 5000);
	long child = read_pid_file("child");
	CU_ASSERT_TRUE(child > 0);
	CU_ASSERT_TRUE(dies_soon(child));
	CU_ASSERT_TRUE(no_children_left());
}

struct ticks {
	int count;
	struct outcome *fence;
};

static long tick(event_loop *loop, long long id, void *data)
{
	struct ticks *t = data;

	if (!t->fence->done)
		t->count++;
	return 20;
}

/* The reason the fence is asynchronous: heartbeats are timers. */
static void test_loop_runs_timers_while_it_fences(void)
{
	event_loop *loop = event_loop_create();
	struct outcome o = { 0 };
	struct ticks t = { .fence = &o };
	char err[128];

	CU_ASSERT_PTR_NOT_NULL_FATAL(loop);
	CU_ASSERT_TRUE(event_loop_add_timer(loop, 20, tick, &t) > 0);
	int64_t t0 = monotonic_ms();
	CU_ASSERT_PTR_NOT_NULL(fence_start(loop, "sleep 0.6", "db1", "primary", 5000,
					   on_done, &o, err, sizeof(err)));
	run_until_done(loop, &o, 5000);
	CU_ASSERT_TRUE(o.ok);
	CU_ASSERT_TRUE(monotonic_ms() - t0 >= 600);
	/* 600 ms of 20 ms ticks: most of 30 ran while the fence ran. */
	CU_ASSERT_TRUE(t.count >= 20);
	event_loop_destroy(loop);
	CU_ASSERT_TRUE(no_children_left());
}

static void test_cancel_kills_and_reaps(void)
{
	event_loop *loop = event_loop_create();
	struct outcome o = { 0 };
	char cmd[512], err[128], path[100];

	CU_ASSERT_PTR_NOT_NULL_FATAL(loop);
	snprintf(path, sizeof(path), "%s/cancel-child", dir);
	snprintf(cmd, sizeof(cmd), "sleep 60 & echo $! > %s.tmp; mv %s.tmp %s; wait",
		 path, path, path);
	struct fence *f = fence_start(loop, cmd, "db1", "primary", 60000, on_done, &o,
				      err, sizeof(err));
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	for (int i = 0; i < 500 && access(path, F_OK) != 0; i++)
		event_loop_run_once(loop, 10);
	long child = read_pid_file("cancel-child");
	CU_ASSERT_TRUE(child > 0);
	fence_cancel(f);
	CU_ASSERT_TRUE(no_children_left());
	CU_ASSERT_TRUE(dies_soon(child));
	/* Nothing fires after a cancel: the loop runs on with no trace of it. */
	for (int i = 0; i < 5; i++)
		event_loop_run_once(loop, 10);
	CU_ASSERT_FALSE(o.done);
	event_loop_destroy(loop);
}

static void test_reaper_leaves_fence_children_alone(void)
{
	event_loop *loop = event_loop_create();
	struct outcome o = { 0 };
	char err[128];

	CU_ASSERT_PTR_NOT_NULL_FATAL(loop);
	struct fence *f = fence_start(loop, "exit 0", "db1", "primary", 5000, on_done, &o,
				      err, sizeof(err));
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	/* Only fences know their pids; a pid of no fence is not theirs. */
	CU_ASSERT_FALSE(fence_owns_child(getpid()));
	siginfo_t info;
	memset(&info, 0, sizeof(info));
	for (int i = 0; i < 500 && info.si_pid == 0; i++) {
		waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT);
		if (info.si_pid == 0)
			usleep(2000);
	}
	CU_ASSERT_TRUE(info.si_pid > 0 && fence_owns_child(info.si_pid));
	run_until_done(loop, &o, 5000);
	CU_ASSERT_TRUE(o.ok);
	CU_ASSERT_FALSE(fence_owns_child(info.si_pid));
	event_loop_destroy(loop);
}

int register_fence_tests(void)
{
	CU_pSuite suite = CU_add_suite("fence", make_dir, remove_dir);

	if (!suite ||
	    !CU_add_test(suite, "success gets the VM and the replaced owner",
			 test_success_gets_vm_and_replaced_owner) ||
	    !CU_add_test(suite, "no duplicate variables in its environment",
			 test_no_duplicate_variables_in_its_environment) ||
	    !CU_add_test(suite, "failures say how", test_failures_say_how) ||
	    !CU_add_test(suite, "a hung fence is killed with what it started",
			 test_hung_fence_is_killed_with_what_it_started) ||
	    !CU_add_test(suite, "the loop runs timers while it fences",
			 test_loop_runs_timers_while_it_fences) ||
	    !CU_add_test(suite, "cancel kills and reaps", test_cancel_kills_and_reaps) ||
	    !CU_add_test(suite, "the reaper leaves fence children alone",
			 test_reaper_leaves_fence_children_alone))
		return -1;
	return 0;
}
