/*
 * Unit tests for base/file_flush.c: a flush reports its result once, on
 * the loop; one worker serves flush after flush; finish reports at once,
 * and the flush after it, with the first one's byte still in the pipe, is
 * reported once; destroy waits for a posted flush.
 */
#include <CUnit/CUnit.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/event_loop.h"
#include "base/file_flush.h"
#include "suites.h"

struct outcome {
	int calls;
	int err;
};

static void count_done(void *opaque, int err)
{
	struct outcome *o = opaque;

	o->calls++;
	o->err = err;
}

/* Turns the loop until the callback ran (at most 5 s). */
static void run_until_reported(event_loop *loop, const struct outcome *o, int calls)
{
	for (int i = 0; i < 500 && o->calls < calls; i++)
		event_loop_run_once(loop, 10);
}

/* This process's threads named remusdb-flush. */
static int flush_threads(void)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d))) {
		char path[300], name[32] = "";
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
		FILE *f = fopen(path, "r");
		if (f) {
			if (fgets(name, sizeof(name), f) && !strncmp(name, "remusdb-flush", 13))
				n++;
			fclose(f);
		}
	}
	closedir(d);
	return n;
}

/* A loop, a flusher on it, and a small file to flush. */
struct fixture {
	event_loop *loop;
	struct file_flush *f;
	char path[64];
	int fd;
};

static void set_up(struct fixture *x)
{
	char err[128];

	x->loop = event_loop_create();
	CU_ASSERT_FATAL(x->loop != NULL);
	snprintf(x->path, sizeof(x->path), "/tmp/file-flush-test-XXXXXX");
	x->fd = mkstemp(x->path);
	CU_ASSERT_FATAL(x->fd >= 0);
	CU_ASSERT_FATAL(write(x->fd, "data", 4) == 4);
	x->f = file_flush_create(x->loop, err, sizeof(err));
	CU_ASSERT_FATAL(x->f != NULL);
}

static void tear_down(struct fixture *x)
{
	file_flush_destroy(x->f);
	close(x->fd);
	unlink(x->path);
	event_loop_destroy(x->loop);
}

static void test_one_worker_serves_flush_after_flush(void)
{
	struct outcome o = {0, -1};
	struct fixture x;

	set_up(&x);
	CU_ASSERT_EQUAL(flush_threads(), 0); /* none before the first flush */
	for (int i = 1; i <= 20; i++) {
		CU_ASSERT_EQUAL_FATAL(i % 2 ? file_flush_start_fd(x.f, x.fd, count_done, &o)
					    : file_flush_start(x.f, x.path, count_done, &o), 0);
		CU_ASSERT_TRUE(file_flush_busy(x.f));
		CU_ASSERT_EQUAL(file_flush_start(x.f, x.path, count_done, &o), -1); /* one at a time */
		run_until_reported(x.loop, &o, i);
		CU_ASSERT_EQUAL(o.calls, i);
		CU_ASSERT_EQUAL(o.err, 0);
		CU_ASSERT_FALSE(file_flush_busy(x.f));
		CU_ASSERT_EQUAL(flush_threads(), 1);
	}
	event_loop_run_once(x.loop, 20); /* nothing more to report */
	CU_ASSERT_EQUAL(o.calls, 20);
	/* a path that is not there: its errno, on the same worker */
	CU_ASSERT_EQUAL(file_flush_start(x.f, "/nonexistent/file-flush-test", count_done, &o), 0);
	run_until_reported(x.loop, &o, 21);
	CU_ASSERT_EQUAL(o.err, ENOENT);
	tear_down(&x);
	CU_ASSERT_EQUAL(flush_threads(), 0);
}

static void test_finish_reports_once_and_the_next_flush_once(void)
{
	struct outcome o = {0, -1};
	struct fixture x;

	set_up(&x);
	CU_ASSERT_EQUAL_FATAL(file_flush_start_fd(x.f, x.fd, count_done, &o), 0);
	file_flush_finish(x.f); /* waits, and reports now */
	CU_ASSERT_EQUAL(o.calls, 1);
	CU_ASSERT_FALSE(file_flush_busy(x.f));
	file_flush_finish(x.f); /* idle: nothing */
	CU_ASSERT_EQUAL(o.calls, 1);
	/* the next flush, with the first one's byte still in the pipe */
	CU_ASSERT_EQUAL_FATAL(file_flush_start(x.f, x.path, count_done, &o), 0);
	run_until_reported(x.loop, &o, 2);
	CU_ASSERT_EQUAL(o.calls, 2);
	event_loop_run_once(x.loop, 20);
	CU_ASSERT_EQUAL(o.calls, 2);
	CU_ASSERT_FALSE(file_flush_busy(x.f));
	tear_down(&x);
}

static void test_destroy_waits_for_a_posted_flush(void)
{
	event_loop *loop = event_loop_create();
	char err[128];
	struct outcome o = {0, -1};

	CU_ASSERT_FATAL(loop != NULL);
	struct file_flush *f = file_flush_create(loop, err, sizeof(err));
	CU_ASSERT_FATAL(f != NULL);
	CU_ASSERT_EQUAL_FATAL(file_flush_start(f, "/", count_done, &o), 0);
	file_flush_destroy(f); /* joins the worker: no callback, no leak */
	CU_ASSERT_EQUAL(o.calls, 0);
	CU_ASSERT_EQUAL(flush_threads(), 0);
	file_flush_destroy(file_flush_create(loop, err, sizeof(err))); /* never used */
	event_loop_destroy(loop);
}

int register_file_flush_tests(void)
{
	CU_pSuite suite = CU_add_suite("file_flush", NULL, NULL);

	if (!suite)
		return -1;
	if (!CU_add_test(suite, "one worker serves flush after flush",
			 test_one_worker_serves_flush_after_flush) ||
	    !CU_add_test(suite, "finish reports once, and the next flush once",
			 test_finish_reports_once_and_the_next_flush_once) ||
	    !CU_add_test(suite, "destroy waits for a posted flush",
			 test_destroy_waits_for_a_posted_flush))
		return -1;
	return 0;
}
