/*
 * Unit tests for base/sched_group.c: /proc/PID/autogroup's text parsed,
 * malformed text refused, and a process in a session of its own, started
 * at nice 5, finds its session's group at nice 5 afterwards.
 */
#include <CUnit/CUnit.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/sched_group.h"
#include "suites.h"

static void test_parses_the_kernels_text(void)
{
	int nice = 99;

	CU_ASSERT_EQUAL(sched_group_parse_nice("/autogroup-25 nice -10\n", &nice), 0);
	CU_ASSERT_EQUAL(nice, -10);
	CU_ASSERT_EQUAL(sched_group_parse_nice("/autogroup-4020 nice 0", &nice), 0);
	CU_ASSERT_EQUAL(nice, 0);
	CU_ASSERT_EQUAL(sched_group_parse_nice("/autogroup-1 nice 19\n", &nice), 0);
	CU_ASSERT_EQUAL(nice, 19);
}

static void test_refuses_other_text(void)
{
	int nice = 7;

	CU_ASSERT_EQUAL(sched_group_parse_nice("", &nice), -1);
	CU_ASSERT_EQUAL(sched_group_parse_nice("/autogroup-25 nice\n", &nice), -1);
	CU_ASSERT_EQUAL(sched_group_parse_nice("/autogroup-25 nice x\n", &nice), -1);
	CU_ASSERT_EQUAL(sched_group_parse_nice("/autogroup-25 nice 3x\n", &nice), -1);
	CU_ASSERT_EQUAL(sched_group_parse_nice("/autogroup-25 nice 20\n", &nice), -1);
	CU_ASSERT_EQUAL(sched_group_parse_nice("/autogroup-25 nice -21\n", &nice), -1);
	CU_ASSERT_EQUAL(sched_group_parse_nice("/cgroup-25 nice 1\n", &nice), -1);
	CU_ASSERT_EQUAL(nice, 7); /* untouched on refusal */
}

static void test_finds_a_cpu_cgroup(void)
{
	char path[64] = "";

	/* this machine's: cgroup v1, everything at the root */
	CU_ASSERT_EQUAL(sched_group_parse_cpu_cgroup("9:name=systemd:/\n2:cpuacct:/\n1:cpu:/\n0::/\n",
						     false, path, sizeof(path)), 0);
	/* libvirt's scope under v1, cpu mounted with cpuacct */
	CU_ASSERT_EQUAL(sched_group_parse_cpu_cgroup("5:cpu,cpuacct:/machine.slice/vm.scope\n",
						     false, path, sizeof(path)), 1);
	CU_ASSERT_STRING_EQUAL(path, "/machine.slice/vm.scope");
	/* cpuacct alone, or cpuset, is not the cpu controller */
	CU_ASSERT_EQUAL(sched_group_parse_cpu_cgroup("2:cpuacct:/a\n3:cpuset:/b\n1:cpu:/\n",
						     false, path, sizeof(path)), 0);
	/* v2: a unit's cgroup counts only where the root delegates cpu */
	CU_ASSERT_EQUAL(sched_group_parse_cpu_cgroup("0::/system.slice/remusdbd.service\n",
						     false, path, sizeof(path)), 0);
	CU_ASSERT_EQUAL(sched_group_parse_cpu_cgroup("0::/system.slice/remusdbd.service\n",
						     true, path, sizeof(path)), 1);
	CU_ASSERT_STRING_EQUAL(path, "/system.slice/remusdbd.service");
	CU_ASSERT_EQUAL(sched_group_parse_cpu_cgroup("0::/\n", true, path, sizeof(path)), 0);
	/* neither kind of line */
	CU_ASSERT_EQUAL(sched_group_parse_cpu_cgroup("", true, path, sizeof(path)), -1);
	CU_ASSERT_EQUAL(sched_group_parse_cpu_cgroup("hello\n", true, path, sizeof(path)), -1);
}

static int autogroup_on(void)
{
	char c = '0';
	int fd = open("/proc/sys/kernel/sched_autogroup_enabled", O_RDONLY);

	if (fd >= 0) {
		if (read(fd, &c, 1) != 1)
			c = '0';
		close(fd);
	}
	return c == '1';
}

/*
 * In a child: a session of its own (a new autogroup, at nice 0), nice 5
 * (raising needs no privilege), then the call.  Its exit status: 0 when
 * the group ended at 5, 1 when the call did nothing, 2 on its error, 3
 * when the group is at another value, 4 when the setup failed.
 */
static int child_follows(void)
{
	char said[256], text[64] = "";
	int nice = 0, fd, rc;
	ssize_t n;

	if (setsid() < 0 || setpriority(PRIO_PROCESS, 0, 5) < 0)
		return 4;
	rc = sched_group_follow_nice(said, sizeof(said));
	if (rc == 0)
		return 1;
	if (rc < 0)
		return 2;
	fd = open("/proc/self/autogroup", O_RDONLY);
	if (fd < 0)
		return 4;
	n = read(fd, text, sizeof(text) - 1);
	close(fd);
	if (n <= 0 || sched_group_parse_nice(text, &nice) < 0)
		return 4;
	return nice == 5 ? 0 : 3;
}

static void test_a_session_group_takes_the_daemons_nice(void)
{
	int status = 0;
	pid_t pid;

	if (!autogroup_on())
		return; /* nothing to follow: the kernel weighs every thread alone */
	pid = fork();
	CU_ASSERT_FATAL(pid >= 0);
	if (pid == 0)
		_exit(child_follows());
	CU_ASSERT_EQUAL_FATAL(waitpid(pid, &status, 0), pid);
	CU_ASSERT_TRUE(WIFEXITED(status));
	CU_ASSERT_EQUAL(WEXITSTATUS(status), 0);
}

int register_sched_group_tests(void)
{
	CU_pSuite suite = CU_add_suite("sched_group", NULL, NULL);

	if (!suite)
		return -1;
	if (!CU_add_test(suite, "parses the kernel's text", test_parses_the_kernels_text) ||
	    !CU_add_test(suite, "refuses other text", test_refuses_other_text) ||
	    !CU_add_test(suite, "finds a cpu cgroup", test_finds_a_cpu_cgroup) ||
	    !CU_add_test(suite, "a session group takes the daemon's nice",
			 test_a_session_group_takes_the_daemons_nice))
		return -1;
	return 0;
}
