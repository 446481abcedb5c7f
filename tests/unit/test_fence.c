/* fence_run: the operator's fencing command, its environment, failures
 * and its timeout, with real /bin/sh processes. */
#include <CUnit/CUnit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fence.h"
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

static void test_success_gets_vm_and_replaced_owner(void)
{
	char cmd[256], err[128] = "", got[64];
	double ms = -1;

	snprintf(cmd, sizeof(cmd), "echo \"$REMUSDB_VM $REMUSDB_PRIMARY\" > %s/env", dir);
	CU_ASSERT_EQUAL(fence_run(cmd, "db1", "primary", 5000, &ms, err, sizeof(err)), 0);
	CU_ASSERT_STRING_EQUAL(err, "");
	CU_ASSERT_TRUE(ms >= 0);
	read_file("env", got, sizeof(got));
	CU_ASSERT_STRING_EQUAL(got, "db1 primary\n");
}

static void test_failures_say_how(void)
{
	char err[128];
	double ms;

	CU_ASSERT_EQUAL(fence_run("exit 3", "db1", "primary", 5000, &ms, err, sizeof(err)), -1);
	CU_ASSERT_STRING_EQUAL(err, "exited with 3");
	CU_ASSERT_EQUAL(fence_run("kill -TERM $$", "db1", "primary", 5000, &ms, err,
				  sizeof(err)), -1);
	CU_ASSERT_STRING_EQUAL(err, "was killed by signal 15");
	CU_ASSERT_EQUAL(fence_run("/nonexistent/ipmi-off", "db1", "primary", 5000, &ms, err,
				  sizeof(err)), -1);
	CU_ASSERT_STRING_EQUAL(err, "exited with 127");
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

static void test_hung_fence_is_killed_with_what_it_started(void)
{
	char cmd[256], err[128], got[32];
	double ms;

	/* A fence that hangs, and a child of it that would outlive a plain kill. */
	snprintf(cmd, sizeof(cmd), "sleep 60 & echo $! > %s/child; wait", dir);
	CU_ASSERT_EQUAL(fence_run(cmd, "db1", "primary", 200, &ms, err, sizeof(err)), -1);
	CU_ASSERT_STRING_EQUAL(err, "did not finish within 200 ms and was killed");
	CU_ASSERT_TRUE(ms >= 200);
	read_file("child", got, sizeof(got));
	long child = strtol(got, NULL, 10);
	CU_ASSERT_TRUE(child > 0);
	int dead = 0;
	for (int i = 0; i < 200 && !dead; i++) { /* the kernel delivers SIGKILL at once */
		dead = child > 0 && process_dead(child);
		if (!dead)
			usleep(10000);
	}
	CU_ASSERT_TRUE(dead);
}

int register_fence_tests(void)
{
	CU_pSuite suite = CU_add_suite("fence", make_dir, remove_dir);

	if (!suite ||
	    !CU_add_test(suite, "success gets the VM and the replaced owner",
			 test_success_gets_vm_and_replaced_owner) ||
	    !CU_add_test(suite, "failures say how", test_failures_say_how) ||
	    !CU_add_test(suite, "a hung fence is killed with what it started",
			 test_hung_fence_is_killed_with_what_it_started))
		return -1;
	return 0;
}
