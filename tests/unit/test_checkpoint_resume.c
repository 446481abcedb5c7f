/*
 * Which RESUME ends which checkpoint's pause, and the part it measures
 * (primary/checkpoint_resume.h).
 */
#include <CUnit/CUnit.h>

#include "primary/checkpoint_resume.h"
#include "suites.h"

static void test_a_resume_ends_the_pause_it_follows(void)
{
	struct checkpoint_resume r = { 0 };
	int64_t part = -1, guest = -1;

	/* No checkpoint's LOADED went: a RESUME is someone else's (a cont). */
	CU_ASSERT_EQUAL(checkpoint_resume_seen(&r, 5000000, &part, &guest), 0);
	checkpoint_resume_expect(&r, 10000000, 4200);
	CU_ASSERT_EQUAL(checkpoint_resume_seen(&r, 10006500, &part, &guest), 1);
	CU_ASSERT_EQUAL(part, 6500);
	CU_ASSERT_EQUAL(guest, 4200 + 6500);
	/* Once: a second RESUME is not this checkpoint's. */
	CU_ASSERT_EQUAL(checkpoint_resume_seen(&r, 10007000, &part, &guest), 0);
	CU_ASSERT_EQUAL(r.seen, 1);
	CU_ASSERT_FALSE(checkpoint_resume_missed(&r));
	CU_ASSERT_EQUAL(r.missed, 0);
}

static void test_a_stamp_that_does_not_fit_is_not_measured(void)
{
	struct checkpoint_resume r = { 0 };
	int64_t part = -1, guest = -1;

	checkpoint_resume_expect(&r, 10000000, 3000);
	/* No stamp: it ends the pause, unmeasured. */
	CU_ASSERT_EQUAL(checkpoint_resume_seen(&r, 0, &part, &guest), -1);
	checkpoint_resume_expect(&r, 10000000, 3000);
	/* Stamped 2 ms before our LOADED: a clock step, not a part. */
	CU_ASSERT_EQUAL(checkpoint_resume_seen(&r, 9998000, &part, &guest), -1);
	checkpoint_resume_expect(&r, 10000000, 3000);
	CU_ASSERT_EQUAL(checkpoint_resume_seen(&r, 10000000 + CHECKPOINT_RESUME_MAX_US + 1,
					       &part, &guest), -1);
	/* Before ours by a little: still a step (ours is read before the send). */
	checkpoint_resume_expect(&r, 10000000, 3000);
	CU_ASSERT_EQUAL(checkpoint_resume_seen(&r, 9999600, &part, &guest), -1);
	CU_ASSERT_EQUAL(r.unmeasured, 4);
	CU_ASSERT_EQUAL(part, -1);
	/* At the same microsecond: a part of 0. */
	checkpoint_resume_expect(&r, 10000000, 3000);
	CU_ASSERT_EQUAL(checkpoint_resume_seen(&r, 10000000, &part, &guest), 1);
	CU_ASSERT_EQUAL(part, 0);
	CU_ASSERT_EQUAL(guest, 3000);
	CU_ASSERT_EQUAL(r.seen, 1);
}

static void test_a_lost_resume_is_counted_at_the_next_checkpoint(void)
{
	struct checkpoint_resume r = { 0 };
	int64_t part = -1, guest = -1;

	checkpoint_resume_expect(&r, 10000000, 3000);
	CU_ASSERT_TRUE(checkpoint_resume_missed(&r));
	CU_ASSERT_FALSE(checkpoint_resume_missed(&r));
	CU_ASSERT_EQUAL(r.missed, 1);
	/* A late RESUME after that is no checkpoint's. */
	CU_ASSERT_EQUAL(checkpoint_resume_seen(&r, 10100000, &part, &guest), 0);
	checkpoint_resume_expect(&r, 20000000, 3000);
	checkpoint_resume_forget(&r);
	CU_ASSERT_FALSE(checkpoint_resume_missed(&r));
	CU_ASSERT_EQUAL(checkpoint_resume_seen(&r, 20001000, &part, &guest), 0);
	CU_ASSERT_EQUAL(r.seen, 0);
}

int register_checkpoint_resume_tests(void)
{
	CU_pSuite suite = CU_add_suite("checkpoint_resume", NULL, NULL);

	if (!suite)
		return -1;
	if (!CU_add_test(suite, "a resume ends the pause it follows",
			 test_a_resume_ends_the_pause_it_follows) ||
	    !CU_add_test(suite, "a stamp that does not fit is not measured",
			 test_a_stamp_that_does_not_fit_is_not_measured) ||
	    !CU_add_test(suite, "a lost resume is counted at the next checkpoint",
			 test_a_lost_resume_is_counted_at_the_next_checkpoint))
		return -1;
	return 0;
}
