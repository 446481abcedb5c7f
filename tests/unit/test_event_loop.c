/* The epoll event loop, driven one iteration at a time. */
#include <CUnit/CUnit.h>
#include <time.h>
#include <unistd.h>

#include "base/event_loop.h"
#include "base/loop_turns.h"
#include "suites.h"

struct fd_record {
	int calls;
	int last_ready;
	int fd_to_unwatch; /* unwatched (and closed) from inside the handler */
};

static void record_handler(event_loop *loop, int fd, void *data, int ready)
{
	struct fd_record *r = data;
	char byte;

	r->calls++;
	r->last_ready = ready;
	if (ready & EV_READABLE)
		(void)!read(fd, &byte, 1);
	if (r->fd_to_unwatch >= 0) {
		event_loop_unwatch(loop, r->fd_to_unwatch);
		r->fd_to_unwatch = -1;
	}
}

static void test_fd_readiness_via_pipe(void)
{
	event_loop *loop = event_loop_create();
	struct fd_record r = { .fd_to_unwatch = -1 };
	int p[2];

	CU_ASSERT_PTR_NOT_NULL_FATAL(loop);
	CU_ASSERT_EQUAL_FATAL(pipe(p), 0);
	CU_ASSERT_EQUAL(event_loop_watch(loop, p[0], EV_READABLE, record_handler, &r), 0);
	CU_ASSERT_EQUAL(event_loop_mask(loop, p[0]), EV_READABLE);
	/* Nothing written: nothing happens. */
	CU_ASSERT_EQUAL(event_loop_run_once(loop, 0), 0);
	CU_ASSERT_EQUAL(r.calls, 0);
	CU_ASSERT_EQUAL(write(p[1], "x", 1), 1);
	CU_ASSERT_EQUAL(event_loop_run_once(loop, 100), 1);
	CU_ASSERT_EQUAL(r.calls, 1);
	CU_ASSERT_EQUAL(r.last_ready, EV_READABLE);
	/* The byte was consumed: level-triggered epoll stays quiet. */
	CU_ASSERT_EQUAL(event_loop_run_once(loop, 0), 0);
	CU_ASSERT_EQUAL(r.calls, 1);
	/* Writable side. */
	CU_ASSERT_EQUAL(event_loop_watch(loop, p[1], EV_WRITABLE, record_handler, &r), 0);
	CU_ASSERT_EQUAL(event_loop_run_once(loop, 100), 1);
	CU_ASSERT_EQUAL(r.last_ready, EV_WRITABLE);
	CU_ASSERT_EQUAL(event_loop_set_mask(loop, p[1], EV_NONE), 0);
	CU_ASSERT_EQUAL(event_loop_mask(loop, p[1]), EV_NONE);
	event_loop_unwatch(loop, p[0]);
	close(p[0]);
	close(p[1]);
	event_loop_destroy(loop);
}

static void test_unwatch_during_dispatch(void)
{
	event_loop *loop = event_loop_create();
	struct fd_record a = { .fd_to_unwatch = -1 }, b = { .fd_to_unwatch = -1 };
	int pa[2], pb[2];

	CU_ASSERT_EQUAL_FATAL(pipe(pa), 0);
	CU_ASSERT_EQUAL_FATAL(pipe(pb), 0);
	/* Whichever handler runs first unwatches the other fd. */
	a.fd_to_unwatch = pb[0];
	b.fd_to_unwatch = pa[0];
	event_loop_watch(loop, pa[0], EV_READABLE, record_handler, &a);
	event_loop_watch(loop, pb[0], EV_READABLE, record_handler, &b);
	CU_ASSERT_EQUAL(write(pa[1], "x", 1), 1);
	CU_ASSERT_EQUAL(write(pb[1], "y", 1), 1);
	int n = event_loop_run_once(loop, 100);
	CU_ASSERT_EQUAL(n, 2); /* both were ready in the same batch */
	/* Only one handler may have run: the other fd was unwatched. */
	CU_ASSERT_EQUAL(a.calls + b.calls, 1);
	event_loop_unwatch(loop, pa[0]);
	event_loop_unwatch(loop, pb[0]);
	close(pa[0]);
	close(pa[1]);
	close(pb[0]);
	close(pb[1]);
	event_loop_destroy(loop);
}

struct timer_record {
	int fired;
	int repeat;      /* runs to do before TIMER_DONE */
	long long other; /* a timer to delete from inside the handler */
};

static long timer_handler_fn(event_loop *loop, long long id, void *data)
{
	struct timer_record *t = data;

	t->fired++;
	if (t->other) {
		event_loop_del_timer(loop, t->other);
		t->other = 0;
	}
	return t->fired < t->repeat ? 1 : TIMER_DONE;
}

static void run_for_ms(event_loop *loop, int ms)
{
	int64_t end = monotonic_ms() + ms;

	while (monotonic_ms() < end)
		event_loop_run_once(loop, 5);
}

static void test_timers_fire_repeat_and_delete(void)
{
	event_loop *loop = event_loop_create();
	struct timer_record once = { .repeat = 1 }, thrice = { .repeat = 3 };
	struct timer_record deleted = { .repeat = 1 }, later = { .repeat = 1 };

	event_loop_add_timer(loop, 1, timer_handler_fn, &once);
	event_loop_add_timer(loop, 1, timer_handler_fn, &thrice);
	long long id = event_loop_add_timer(loop, 30, timer_handler_fn, &deleted);
	CU_ASSERT(id > 0);
	event_loop_add_timer(loop, 10000, timer_handler_fn, &later);
	/* A timer deleted by another timer's handler never fires. */
	once.other = id;
	int64_t start = monotonic_ms();
	event_loop_run_once(loop, -1); /* sleeps until the 1 ms timers are due */
	CU_ASSERT(monotonic_ms() - start < 1000);
	run_for_ms(loop, 60);
	CU_ASSERT_EQUAL(once.fired, 1);
	CU_ASSERT_EQUAL(thrice.fired, 3);
	CU_ASSERT_EQUAL(deleted.fired, 0);
	CU_ASSERT_EQUAL(later.fired, 0);
	event_loop_destroy(loop); /* frees the pending 10 s timer */
}

static void stop_from_handler(event_loop *loop, int fd, void *data, int ready)
{
	char byte;

	(void)!read(fd, &byte, 1);
	(*(int *)data)++;
	event_loop_stop(loop);
}

/* A handler that holds the loop 3 ms, as a long checkpoint read would. */
static void slow_handler(event_loop *loop, int fd, void *data, int ready)
{
	struct timespec hold = { 0, 3 * 1000 * 1000 };
	char c;

	(void)loop;
	(void)data;
	(void)ready;
	if (read(fd, &c, 1) != 1)
		return;
	nanosleep(&hold, NULL);
}

static void test_turns_count_how_long_the_loop_was_held(void)
{
	event_loop *loop = event_loop_create();
	int p[2];

	CU_ASSERT_PTR_NOT_NULL_FATAL(loop);
	CU_ASSERT_EQUAL_FATAL(pipe(p), 0);
	const struct loop_turns *t = event_loop_turns(loop);
	CU_ASSERT_EQUAL(t->count, 0);
	CU_ASSERT_EQUAL(event_loop_watch(loop, p[0], EV_READABLE, slow_handler, NULL), 0);
	/* a turn with nothing ready is counted, and short */
	CU_ASSERT_EQUAL(event_loop_run_once(loop, 0), 0);
	CU_ASSERT_EQUAL(t->count, 1);
	CU_ASSERT(t->max_us < 2500);
	CU_ASSERT_EQUAL(write(p[1], "x", 1), 1);
	CU_ASSERT_EQUAL(event_loop_run_once(loop, 100), 1);
	CU_ASSERT_EQUAL(t->count, 2);
	CU_ASSERT(t->busy_us >= 3000);
	CU_ASSERT(t->max_us >= 3000);
	/* the held turn is past the 2.5 ms bound: at most one turn within it */
	uint64_t within = 0;
	for (unsigned i = 0; i < LOOP_TURN_BUCKETS && loop_turn_bounds_ms[i] <= 2.5; i++)
		within += t->le[i];
	CU_ASSERT_EQUAL(within, 1);
	event_loop_unwatch(loop, p[0]);
	close(p[0]);
	close(p[1]);
	event_loop_destroy(loop);
}

static void test_run_until_stop(void)
{
	event_loop *loop = event_loop_create();
	int calls = 0;
	int p[2];

	CU_ASSERT_EQUAL_FATAL(pipe(p), 0);
	event_loop_watch(loop, p[0], EV_READABLE, stop_from_handler, &calls);
	CU_ASSERT_EQUAL(write(p[1], "x", 1), 1);
	CU_ASSERT_EQUAL(event_loop_run(loop), 0);
	CU_ASSERT_EQUAL(calls, 1);
	event_loop_unwatch(loop, p[0]);
	close(p[0]);
	close(p[1]);
	event_loop_destroy(loop);
}

int register_event_loop_tests(void)
{
	CU_pSuite suite = CU_add_suite("event_loop", NULL, NULL);

	if (!suite ||
	    !CU_add_test(suite, "fd readiness via a pipe", test_fd_readiness_via_pipe) ||
	    !CU_add_test(suite, "unwatch during dispatch", test_unwatch_during_dispatch) ||
	    !CU_add_test(suite, "timers fire, repeat, delete", test_timers_fire_repeat_and_delete) ||
	    !CU_add_test(suite, "turns count how long the loop was held",
			 test_turns_count_how_long_the_loop_was_held) ||
	    !CU_add_test(suite, "run until stop", test_run_until_stop))
		return -1;
	return 0;
}
