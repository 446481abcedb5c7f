/*
 * Unit tests for base/loop_worker.c: a job runs on the worker thread,
 * named as asked, while the loop goes on turning; its result reaches done
 * on the loop's thread, once; done may post the next job.
 */
#include <CUnit/CUnit.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "base/event_loop.h"
#include "base/loop_worker.h"
#include "suites.h"

struct job_state {
	atomic_int release;   /* the job waits for it (at most 5 s) */
	atomic_int finished;
	pthread_t ran_on;
	char thread_name[16];
	int done_calls;
	int result;
	pthread_t done_on;
	int chain;            /* jobs done posts after the first */
	struct loop_worker *w;
};

static int blocking_job(void *arg)
{
	struct job_state *s = arg;

	s->ran_on = pthread_self();
	pthread_getname_np(pthread_self(), s->thread_name, sizeof(s->thread_name));
	for (int i = 0; i < 5000 && !atomic_load(&s->release); i++)
		usleep(1000);
	atomic_store(&s->finished, 1);
	return 42;
}

static void record_done(void *opaque, int result)
{
	struct job_state *s = opaque;

	s->done_calls++;
	s->result = result;
	s->done_on = pthread_self();
	if (s->chain > 0) {
		s->chain--;
		CU_ASSERT_EQUAL(loop_worker_post(s->w, blocking_job, s, record_done, s), 0);
	}
}

static void run_until(event_loop *loop, const struct job_state *s, int calls)
{
	for (int i = 0; i < 500 && s->done_calls < calls; i++)
		event_loop_run_once(loop, 10);
}

/* A loop and a worker on it, in s.w. */
static event_loop *set_up(struct job_state *s)
{
	event_loop *loop = event_loop_create();
	char err[128];

	CU_ASSERT_FATAL(loop != NULL);
	s->w = loop_worker_create(loop, "remusdb-test", err, sizeof(err));
	CU_ASSERT_FATAL(s->w != NULL);
	return loop;
}

static void test_the_loop_turns_while_a_job_blocks(void)
{
	struct job_state s = {0};
	event_loop *loop = set_up(&s);

	CU_ASSERT_EQUAL_FATAL(loop_worker_post(s.w, blocking_job, &s, record_done, &s), 0);
	CU_ASSERT_TRUE(loop_worker_busy(s.w));
	CU_ASSERT_EQUAL(loop_worker_post(s.w, blocking_job, &s, record_done, &s), -1);
	/* The loop turns, and reports nothing, while the job still waits. */
	for (int i = 0; i < 10; i++)
		event_loop_run_once(loop, 5);
	CU_ASSERT_EQUAL(atomic_load(&s.finished), 0);
	CU_ASSERT_EQUAL(s.done_calls, 0);
	atomic_store(&s.release, 1);
	run_until(loop, &s, 1);
	CU_ASSERT_EQUAL(s.done_calls, 1);
	CU_ASSERT_EQUAL(s.result, 42);
	CU_ASSERT_FALSE(loop_worker_busy(s.w));
	CU_ASSERT_FALSE(pthread_equal(s.ran_on, pthread_self()));
	CU_ASSERT_TRUE(pthread_equal(s.done_on, pthread_self()));
	CU_ASSERT_STRING_EQUAL(s.thread_name, "remusdb-test");
	event_loop_run_once(loop, 20); /* nothing more to report */
	CU_ASSERT_EQUAL(s.done_calls, 1);
	loop_worker_destroy(s.w);
	event_loop_destroy(loop);
}

static void test_done_may_post_the_next_job(void)
{
	struct job_state s = {0};
	event_loop *loop = set_up(&s);

	atomic_store(&s.release, 1);
	s.chain = 3;
	CU_ASSERT_EQUAL_FATAL(loop_worker_post(s.w, blocking_job, &s, record_done, &s), 0);
	run_until(loop, &s, 4);
	CU_ASSERT_EQUAL(s.done_calls, 4);
	CU_ASSERT_FALSE(loop_worker_busy(s.w));
	/* finish on an idle worker, and on a busy one: done at once, once. */
	loop_worker_finish(s.w);
	CU_ASSERT_EQUAL(s.done_calls, 4);
	CU_ASSERT_EQUAL_FATAL(loop_worker_post(s.w, blocking_job, &s, record_done, &s), 0);
	loop_worker_finish(s.w);
	CU_ASSERT_EQUAL(s.done_calls, 5);
	event_loop_run_once(loop, 20);
	CU_ASSERT_EQUAL(s.done_calls, 5);
	loop_worker_destroy(s.w);
	event_loop_destroy(loop);
}

int register_loop_worker_tests(void)
{
	CU_pSuite suite = CU_add_suite("loop_worker", NULL, NULL);

	if (!suite)
		return -1;
	if (!CU_add_test(suite, "the loop turns while a job blocks",
			 test_the_loop_turns_while_a_job_blocks) ||
	    !CU_add_test(suite, "done may post the next job", test_done_may_post_the_next_job))
		return -1;
	return 0;
}
