/*
 * Unit tests for base/turnstile.c: turns in arrival order, a waiter that
 * does not take its turn passing it on, give-backs from inside a wake,
 * and a turn kept too long taken away by the watch timer.
 */
#include <CUnit/CUnit.h>
#include <stdbool.h>

#include "base/event_loop.h"
#include "base/turnstile.h"
#include "suites.h"

struct vm_stub {
	const char *name;
	struct turnstile *t;
	bool takes_when_woken; /* false: as a VM whose checkpoint is no longer asked for */
	bool gives_back_when_woken;
	int woken;
	bool has_turn;
};

static void woken(void *holder)
{
	struct vm_stub *v = holder;

	v->woken++;
	if (v->takes_when_woken)
		v->has_turn = turnstile_take(v->t, v, woken);
	if (v->has_turn && v->gives_back_when_woken) {
		turnstile_give_back(v->t, v);
		v->has_turn = false;
	}
}

static const char *stub_name(void *holder)
{
	return ((struct vm_stub *)holder)->name;
}

static void test_turns_go_in_arrival_order(void)
{
	event_loop *loop = event_loop_create();
	struct turnstile *t = turnstile_create(loop, 1, 5000, stub_name);
	struct vm_stub a = { "a", t, true, false, 0, false };
	struct vm_stub b = { "b", t, true, false, 0, false };
	struct vm_stub c = { "c", t, true, false, 0, false };

	CU_ASSERT_PTR_NOT_NULL_FATAL(t);
	CU_ASSERT_TRUE(turnstile_take(t, &a, woken));
	CU_ASSERT_TRUE(turnstile_take(t, &a, woken)); /* held already */
	CU_ASSERT_FALSE(turnstile_take(t, &b, woken));
	CU_ASSERT_FALSE(turnstile_take(t, &c, woken));
	CU_ASSERT_FALSE(turnstile_take(t, &b, woken)); /* asking again does not queue twice */
	CU_ASSERT_EQUAL(turnstile_stats(t).waiting, 2);

	turnstile_give_back(t, &a);
	CU_ASSERT_EQUAL(b.woken, 1);
	CU_ASSERT_TRUE(b.has_turn);
	CU_ASSERT_EQUAL(c.woken, 0);
	/* c is first in the queue now: a newcomer waits behind it. */
	CU_ASSERT_FALSE(turnstile_take(t, &a, woken));
	turnstile_give_back(t, &b);
	CU_ASSERT_TRUE(c.has_turn);
	CU_ASSERT_FALSE(a.has_turn);
	turnstile_give_back(t, &c);
	CU_ASSERT_TRUE(turnstile_holds(t, &a));

	struct turnstile_stats s = turnstile_stats(t);
	CU_ASSERT_EQUAL(s.granted, 4);
	CU_ASSERT_EQUAL(s.waited, 3);
	CU_ASSERT_EQUAL(s.held, 1);
	CU_ASSERT_EQUAL(s.waiting, 0);
	turnstile_destroy(t);
	event_loop_destroy(loop);
}

static void test_a_waiter_that_does_not_take_passes_the_turn_on(void)
{
	event_loop *loop = event_loop_create();
	struct turnstile *t = turnstile_create(loop, 1, 5000, stub_name);
	struct vm_stub a = { "a", t, true, false, 0, false };
	struct vm_stub gone = { "gone", t, false, false, 0, false };
	struct vm_stub quick = { "quick", t, true, true, 0, false };
	struct vm_stub c = { "c", t, true, false, 0, false };

	CU_ASSERT_TRUE(turnstile_take(t, &a, woken));
	CU_ASSERT_FALSE(turnstile_take(t, &gone, woken));
	CU_ASSERT_FALSE(turnstile_take(t, &quick, woken));
	CU_ASSERT_FALSE(turnstile_take(t, &c, woken));
	turnstile_give_back(t, &a);
	/* gone declined, quick took and gave back inside its wake, c holds. */
	CU_ASSERT_EQUAL(gone.woken, 1);
	CU_ASSERT_EQUAL(quick.woken, 1);
	CU_ASSERT_TRUE(c.has_turn);
	CU_ASSERT_TRUE(turnstile_holds(t, &c));
	CU_ASSERT_EQUAL(turnstile_stats(t).waiting, 0);
	/* A waiter that leaves (its VM unprotected) is not woken. */
	CU_ASSERT_FALSE(turnstile_take(t, &a, woken));
	turnstile_give_back(t, &a);
	turnstile_give_back(t, &c);
	CU_ASSERT_EQUAL(a.woken, 0);
	CU_ASSERT_EQUAL(turnstile_stats(t).held, 0);
	turnstile_destroy(t);
	event_loop_destroy(loop);
}

static void test_a_turn_kept_too_long_is_taken_away(void)
{
	event_loop *loop = event_loop_create();
	struct turnstile *t = turnstile_create(loop, 1, 30, stub_name);
	struct vm_stub stuck = { "stuck", t, true, false, 0, false };
	struct vm_stub next = { "next", t, true, false, 0, false };

	CU_ASSERT_TRUE(turnstile_take(t, &stuck, woken));
	CU_ASSERT_FALSE(turnstile_take(t, &next, woken));
	for (int i = 0; i < 100 && !next.has_turn; i++)
		event_loop_run_once(loop, 10);
	CU_ASSERT_TRUE(next.has_turn);
	CU_ASSERT_FALSE(turnstile_holds(t, &stuck));
	CU_ASSERT_EQUAL(turnstile_stats(t).taken_away, 1);
	/* The late give-back of the turn it lost changes nothing. */
	turnstile_give_back(t, &stuck);
	CU_ASSERT_TRUE(turnstile_holds(t, &next));
	turnstile_give_back(t, &next);
	turnstile_destroy(t);
	event_loop_destroy(loop);
}

static void test_without_slots_nobody_waits(void)
{
	event_loop *loop = event_loop_create();
	struct turnstile *t = turnstile_create(loop, 0, 30, stub_name);
	struct vm_stub a = { "a", t, true, false, 0, false };
	struct vm_stub b = { "b", t, true, false, 0, false };

	CU_ASSERT_TRUE(turnstile_take(t, &a, woken));
	CU_ASSERT_TRUE(turnstile_take(t, &b, woken));
	turnstile_give_back(t, &a);
	CU_ASSERT_EQUAL(turnstile_stats(t).granted, 2);
	CU_ASSERT_EQUAL(turnstile_stats(t).waited, 0);
	turnstile_destroy(t);
	event_loop_destroy(loop);
}

static void test_two_slots_hold_two(void)
{
	event_loop *loop = event_loop_create();
	struct turnstile *t = turnstile_create(loop, 2, 5000, stub_name);
	struct vm_stub a = { "a", t, true, false, 0, false };
	struct vm_stub b = { "b", t, true, false, 0, false };
	struct vm_stub c = { "c", t, true, false, 0, false };

	CU_ASSERT_TRUE(turnstile_take(t, &a, woken));
	CU_ASSERT_TRUE(turnstile_take(t, &b, woken));
	CU_ASSERT_FALSE(turnstile_take(t, &c, woken));
	turnstile_give_back(t, &b);
	CU_ASSERT_TRUE(c.has_turn);
	CU_ASSERT_TRUE(turnstile_holds(t, &a));
	turnstile_give_back(t, &a);
	turnstile_give_back(t, &c);
	turnstile_destroy(t);
	event_loop_destroy(loop);
}

int register_turnstile_tests(void)
{
	CU_pSuite suite = CU_add_suite("turnstile", NULL, NULL);

	if (!suite)
		return -1;
	if (!CU_add_test(suite, "turns go in arrival order", test_turns_go_in_arrival_order) ||
	    !CU_add_test(suite, "a waiter that does not take passes the turn on",
			 test_a_waiter_that_does_not_take_passes_the_turn_on) ||
	    !CU_add_test(suite, "a turn kept too long is taken away",
			 test_a_turn_kept_too_long_is_taken_away) ||
	    !CU_add_test(suite, "without slots nobody waits", test_without_slots_nobody_waits) ||
	    !CU_add_test(suite, "two slots hold two", test_two_slots_hold_two))
		return -1;
	return 0;
}
