/*
 * The rules of a planned switchover on the primary (primary/switchover.h):
 * the VM is handed over only after its held checkpoint was acknowledged;
 * a cancel or the deadline resumes it only while the link to the backup
 * is up (afterwards etcd decides); etcd naming the backup stops QEMU only
 * after that consent; the negative control hands the backup the epoch
 * before the one whose output it lets out.
 */
#include <CUnit/CUnit.h>
#include <string.h>

#include "primary/switchover.h"
#include "suites.h"

#define MS 1000 /* us */

static struct switchover started(bool unsafe)
{
	struct switchover s;
	char err[200];

	memset(&s, 0, sizeof(s));
	CU_ASSERT_EQUAL_FATAL(switchover_begin(&s, true, true, 5000, unsafe, 100 * MS, err,
					       sizeof(err)), 0);
	return s;
}

static void test_ready_only_after_the_held_checkpoint_is_acked(void)
{
	struct switchover s = started(false);

	CU_ASSERT_EQUAL(s.state, SWITCHOVER_STOPPING);
	CU_ASSERT_TRUE(switchover_active(&s));
	/* an ack of an earlier epoch while stopping changes nothing */
	switchover_acked(&s, 40, 110 * MS);
	CU_ASSERT_EQUAL(s.state, SWITCHOVER_STOPPING);
	CU_ASSERT_EQUAL(switchover_checkpoint_held(&s, 42, 40, 150 * MS), SWITCHOVER_NOTHING);
	CU_ASSERT_EQUAL(s.state, SWITCHOVER_STOPPED);
	CU_ASSERT_EQUAL(s.epoch, 42);
	CU_ASSERT_EQUAL(s.held_epoch, 42);
	switchover_acked(&s, 41, 160 * MS); /* the epoch before: not yet */
	CU_ASSERT_EQUAL(s.state, SWITCHOVER_STOPPED);
	switchover_acked(&s, 42, 170 * MS);
	CU_ASSERT_EQUAL(s.state, SWITCHOVER_READY);
	CU_ASSERT_EQUAL(s.stopped_us, 150 * MS);
	CU_ASSERT_EQUAL(s.acked_us, 170 * MS);
	/* a second checkpoint end (none should come) does not move it */
	CU_ASSERT_EQUAL(switchover_checkpoint_held(&s, 43, 42, 180 * MS), SWITCHOVER_NOTHING);
	CU_ASSERT_EQUAL(s.epoch, 42);
}

static void test_handed_over_stops_qemu_only_after_consent(void)
{
	struct switchover s = started(false);

	switchover_checkpoint_held(&s, 7, 6, 120 * MS);
	switchover_acked(&s, 7, 130 * MS);
	CU_ASSERT_EQUAL(switchover_owner_moved(&s, "backup", 3, 140 * MS), SWITCHOVER_STOP_QEMU);
	CU_ASSERT_EQUAL(s.state, SWITCHOVER_HANDED_OVER);
	CU_ASSERT_STRING_EQUAL(s.owner, "backup");
	CU_ASSERT_EQUAL(s.generation, 3);
	CU_ASSERT_FALSE(switchover_active(&s));
	/* and it cannot be started again or cancelled */
	char err[200];
	CU_ASSERT_EQUAL(switchover_begin(&s, true, true, 5000, false, 150 * MS, err, sizeof(err)),
			-1);
	CU_ASSERT_EQUAL(switchover_cancel(&s, true, "x", 150 * MS, err, sizeof(err)),
			SWITCHOVER_NOTHING);
	CU_ASSERT_EQUAL(s.state, SWITCHOVER_HANDED_OVER);
}

static void test_a_takeover_before_the_ack_is_a_failover(void)
{
	struct switchover s = started(false);

	switchover_checkpoint_held(&s, 7, 6, 120 * MS);
	/* the backup won etcd on its own (a real failure): QEMU stays as a fence leaves it */
	CU_ASSERT_EQUAL(switchover_owner_moved(&s, "backup", 3, 140 * MS), SWITCHOVER_NOTHING);
	CU_ASSERT_EQUAL(s.state, SWITCHOVER_FAILED);
	CU_ASSERT_PTR_NOT_NULL(strstr(s.error, "before checkpoint 7 was acknowledged"));
}

static void test_cancel_resumes_only_while_the_link_is_up(void)
{
	char err[200];
	struct switchover s = started(false);

	switchover_checkpoint_held(&s, 9, 9, 120 * MS);
	CU_ASSERT_EQUAL(s.state, SWITCHOVER_READY);
	/* the backup dropped the link: etcd decides, the VM must stay paused */
	CU_ASSERT_EQUAL(switchover_cancel(&s, false, "by the operator", 130 * MS, err,
					  sizeof(err)), SWITCHOVER_NOTHING);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "etcd decides"));
	CU_ASSERT_EQUAL(s.state, SWITCHOVER_READY);
	CU_ASSERT_EQUAL(switchover_cancel(&s, true, "by the operator", 140 * MS, err,
					  sizeof(err)), SWITCHOVER_RESUME);
	CU_ASSERT_EQUAL(s.state, SWITCHOVER_CANCELLED);
	CU_ASSERT_PTR_NOT_NULL(strstr(s.error, "still protected"));
	/* a cancelled switchover can be asked for again */
	CU_ASSERT_EQUAL(switchover_begin(&s, true, true, 5000, false, 150 * MS, err, sizeof(err)),
			0);
	CU_ASSERT_EQUAL(s.state, SWITCHOVER_STOPPING);
	CU_ASSERT_EQUAL(s.error[0], '\0');
}

static void test_deadline(void)
{
	char err[200];
	struct switchover s = started(false); /* at 100 ms, 5 s */

	CU_ASSERT_FALSE(switchover_overdue(&s, 5099 * MS));
	CU_ASSERT_TRUE(switchover_overdue(&s, 5100 * MS));
	CU_ASSERT_EQUAL(switchover_cancel(&s, true, NULL, 5100 * MS, err, sizeof(err)),
			SWITCHOVER_RESUME);
	CU_ASSERT_PTR_NOT_NULL(strstr(s.error, "nobody took the VM over within 5 s (stopping)"));
	CU_ASSERT_FALSE(switchover_overdue(&s, 9000 * MS));
}

static void test_begin_refusals(void)
{
	struct switchover s;
	char err[200];

	memset(&s, 0, sizeof(s));
	CU_ASSERT_EQUAL(switchover_begin(&s, false, true, 5000, false, 0, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "not protected"));
	CU_ASSERT_EQUAL(switchover_begin(&s, true, false, 5000, false, 0, err, sizeof(err)), -1);
	CU_ASSERT_EQUAL(switchover_begin(&s, true, true, 999, false, 0, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "out of range"));
	CU_ASSERT_EQUAL(switchover_begin(&s, true, true, 600001, false, 0, err, sizeof(err)), -1);
	CU_ASSERT_EQUAL(s.state, SWITCHOVER_IDLE);
	CU_ASSERT_EQUAL(switchover_begin(&s, true, true, 1000, false, 0, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(switchover_begin(&s, true, true, 1000, false, 0, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "stopping already"));
}

static void test_protection_ending_fails_it(void)
{
	struct switchover s = started(false);

	switchover_checkpoint_held(&s, 5, 4, 120 * MS);
	switchover_protection_ended(&s, "backup lost; RUNNING UNPROTECTED", 130 * MS);
	CU_ASSERT_EQUAL(s.state, SWITCHOVER_FAILED);
	CU_ASSERT_PTR_NOT_NULL(strstr(s.error, "RUNNING UNPROTECTED"));
	/* an ending after the end changes nothing */
	switchover_protection_ended(&s, "other", 140 * MS);
	CU_ASSERT_PTR_NOT_NULL(strstr(s.error, "RUNNING UNPROTECTED"));
}

/* The negative control: the backup gets the epoch before the one let out. */
static void test_unsafe_hands_over_the_epoch_before(void)
{
	struct switchover s = started(true);

	CU_ASSERT_EQUAL(switchover_checkpoint_held(&s, 12, 10, 120 * MS),
			SWITCHOVER_WITHHOLD_AND_RELEASE);
	CU_ASSERT_EQUAL(s.held_epoch, 12);
	CU_ASSERT_EQUAL(s.epoch, 11);
	CU_ASSERT_EQUAL(s.state, SWITCHOVER_STOPPED);
	switchover_acked(&s, 11, 130 * MS); /* no ack of 12 can come: it never left */
	CU_ASSERT_EQUAL(s.state, SWITCHOVER_READY);

	struct switchover t = started(true);
	switchover_checkpoint_held(&t, 12, 11, 120 * MS); /* 11 was acked already */
	CU_ASSERT_EQUAL(t.state, SWITCHOVER_READY);
}

int register_switchover_tests(void)
{
	CU_pSuite s = CU_add_suite("switchover", NULL, NULL);

	if (!s ||
	    !CU_add_test(s, "ready only after the held checkpoint is acked",
			 test_ready_only_after_the_held_checkpoint_is_acked) ||
	    !CU_add_test(s, "handed over stops QEMU only after consent",
			 test_handed_over_stops_qemu_only_after_consent) ||
	    !CU_add_test(s, "a takeover before the ack is a failover",
			 test_a_takeover_before_the_ack_is_a_failover) ||
	    !CU_add_test(s, "cancel resumes only while the link is up",
			 test_cancel_resumes_only_while_the_link_is_up) ||
	    !CU_add_test(s, "deadline", test_deadline) ||
	    !CU_add_test(s, "begin refusals", test_begin_refusals) ||
	    !CU_add_test(s, "protection ending fails it", test_protection_ending_fails_it) ||
	    !CU_add_test(s, "unsafe hands over the epoch before",
			 test_unsafe_hands_over_the_epoch_before))
		return -1;
	return 0;
}
