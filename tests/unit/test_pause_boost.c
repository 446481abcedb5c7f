/*
 * Unit tests for primary/pause_boost.c: a stand-in for QEMU, a child in a
 * session of its own, has its group raised for a pause and put back after
 * it; a process that shares its session, or a boost that is off,
 * is never touched.
 */
#include <CUnit/CUnit.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/sched_group.h"
#include "primary/pause_boost.h"
#include "suites.h"

/* A child that sleeps until killed, in a session of its own or not. */
static pid_t stand_in(int own_session)
{
	int ready[2];
	char c = 0;
	pid_t pid;

	if (pipe(ready) < 0)
		return -1;
	pid = fork();
	if (pid == 0) {
		if (own_session && setsid() < 0)
			_exit(1);
		if (write(ready[1], "x", 1) != 1)
			_exit(1);
		for (;;)
			pause();
	}
	close(ready[1]);
	if (pid < 0 || read(ready[0], &c, 1) != 1)
		pid = -1;
	close(ready[0]);
	return pid;
}

static void end_stand_in(pid_t pid)
{
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
}

static int group_nice(pid_t pid)
{
	char why[160];
	int nice = 99;

	CU_ASSERT_EQUAL(sched_group_get(pid, &nice, why, sizeof(why)), 0);
	return nice;
}

/* /proc/PID/autogroup as the kernel prints it: empty in the init session. */
static void group_text(pid_t pid, char *text, size_t len)
{
	char path[48];
	ssize_t n = -1;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/autogroup", (int)pid);
	fd = open(path, O_RDONLY);
	if (fd >= 0) {
		n = read(fd, text, len - 1);
		close(fd);
	}
	CU_ASSERT_TRUE(n >= 0);
	text[n > 0 ? n : 0] = '\0';
}

static int autogroup_on(void)
{
	char why[160];
	int nice;

	return sched_group_check_own(getpid(), &nice, why, sizeof(why)) == 0 ||
	       strcmp(why, "autogroup is off") != 0;
}

static void test_a_pause_raises_the_group_and_its_end_puts_it_back(void)
{
	struct pause_boost b;
	pid_t qemu;

	if (!autogroup_on() || geteuid() != 0)
		return; /* nothing to raise, or no right to raise it */
	qemu = stand_in(1);
	CU_ASSERT_FATAL(qemu > 0);
	pause_boost_init(&b, 10);
	CU_ASSERT_EQUAL(group_nice(qemu), 0);
	pause_boost_begin(&b, qemu, "test");
	CU_ASSERT_TRUE(b.boosted);
	CU_ASSERT_EQUAL(group_nice(qemu), -10);
	pause_boost_begin(&b, qemu, "test"); /* already boosted: no second count */
	CU_ASSERT_EQUAL(b.boosts, 1);
	pause_boost_end(&b, "test");
	CU_ASSERT_FALSE(b.boosted);
	CU_ASSERT_EQUAL(group_nice(qemu), 0);
	pause_boost_end(&b, "test"); /* ended already: nothing */
	CU_ASSERT_EQUAL(group_nice(qemu), 0);
	json_t *st = pause_boost_json(&b);
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(st, "state")), "ready");
	json_decref(st);
	end_stand_in(qemu);
}

/* A daemon killed mid-pause left QEMU at -10: the next protection puts it at 0. */
static void test_a_boost_left_behind_is_taken_for_one(void)
{
	struct pause_boost b;
	char why[160];
	pid_t qemu;

	if (!autogroup_on() || geteuid() != 0)
		return;
	qemu = stand_in(1);
	CU_ASSERT_FATAL(qemu > 0);
	CU_ASSERT_EQUAL(sched_group_set(qemu, -10, why, sizeof(why)), 0);
	pause_boost_init(&b, 10);
	pause_boost_begin(&b, qemu, "test");
	CU_ASSERT_EQUAL(group_nice(qemu), -10);
	pause_boost_end(&b, "test");
	CU_ASSERT_EQUAL(group_nice(qemu), 0);
	end_stand_in(qemu);
}

/*
 * In our session, raising its group raises us.  Run from a session of our
 * own, the scan finds us beside it; run in the init session (a container's
 * init that never called setsid, as CI's), its group is the root, which
 * has none to raise.  Either way it is refused and left as it was.
 */
static void test_a_process_sharing_its_session_is_never_raised(void)
{
	char before[64], after[64], ours[64];
	struct pause_boost b;
	pid_t child;

	if (!autogroup_on())
		return;
	child = stand_in(0);
	CU_ASSERT_FATAL(child > 0);
	group_text(getpid(), ours, sizeof(ours));
	group_text(child, before, sizeof(before));
	pause_boost_init(&b, 10);
	pause_boost_begin(&b, child, "test");
	CU_ASSERT_FALSE(b.boosted);
	CU_ASSERT_TRUE(b.unusable);
	CU_ASSERT_PTR_NOT_NULL(strstr(b.why, ours[0] ? "shares its session" : "no autogroup"));
	group_text(child, after, sizeof(after));
	CU_ASSERT_STRING_EQUAL(after, before);
	json_t *st = pause_boost_json(&b);
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(st, "state")), "unavailable");
	json_decref(st);
	end_stand_in(child);
}

static void test_off_touches_nothing(void)
{
	struct pause_boost b;
	pid_t qemu;

	if (!autogroup_on())
		return;
	qemu = stand_in(1);
	CU_ASSERT_FATAL(qemu > 0);
	pause_boost_init(&b, 0);
	pause_boost_begin(&b, qemu, "test");
	CU_ASSERT_FALSE(b.boosted);
	CU_ASSERT_EQUAL(group_nice(qemu), 0);
	pause_boost_begin(&b, 0, "test"); /* QEMU not known yet: nothing either */
	CU_ASSERT_EQUAL(b.boosts, 0);
	end_stand_in(qemu);
}

int register_pause_boost_tests(void)
{
	CU_pSuite suite = CU_add_suite("pause_boost", NULL, NULL);

	if (!suite)
		return -1;
	if (!CU_add_test(suite, "a pause raises the group and its end puts it back",
			 test_a_pause_raises_the_group_and_its_end_puts_it_back) ||
	    !CU_add_test(suite, "a boost left behind is taken for one",
			 test_a_boost_left_behind_is_taken_for_one) ||
	    !CU_add_test(suite, "a process sharing its session is never raised",
			 test_a_process_sharing_its_session_is_never_raised) ||
	    !CU_add_test(suite, "off touches nothing", test_off_touches_nothing))
		return -1;
	return 0;
}
