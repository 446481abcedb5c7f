/*
 * The primary's output commit as protection.c wires it: the guest's
 * frames enter through output_commit_hold (the NIC's output hook), a
 * checkpoint's begin cuts them with output_commit_cut, and the backup's
 * ack releases them with output_commit_ack.  Frames of epoch N+1 never
 * leave on N's ack; with unsafe_release_early (the drill's negative
 * control) they do.
 */
#include <CUnit/CUnit.h>
#include <string.h>

#include "primary/output_commit.h"
#include "suites.h"

struct released {
	uint8_t tags[64]; /* first byte of each frame released, in order */
	size_t count;
};

static int record(void *opaque, const uint8_t *frame, size_t len)
{
	struct released *r = opaque;

	if (r->count < sizeof(r->tags) && len > 0)
		r->tags[r->count++] = frame[0];
	return 0;
}

/* A frame from the guest, tagged with the epoch it was sent in. */
static void guest_sends(struct output_commit *oc, uint8_t tag)
{
	uint8_t frame[60];

	memset(frame, tag, sizeof(frame));
	CU_ASSERT_EQUAL(output_commit_hold(oc, frame, sizeof(frame)), 1);
}

/*
 * The sequence of protection_epochs.c: epoch 1 opens at the start of
 * replication (cut 0), checkpoint N begins (cut N) while N is acked later.
 */
static struct output_commit *run_two_epochs(bool unsafe, struct released *out)
{
	struct output_commit *oc = output_commit_create(1 << 20, unsafe, record, out);

	CU_ASSERT_PTR_NOT_NULL_FATAL(oc);
	output_commit_cut(oc, 0);
	CU_ASSERT_EQUAL(output_commit_open_epoch(oc), 1);
	guest_sends(oc, 1);
	guest_sends(oc, 1);
	output_commit_cut(oc, 1); /* checkpoint 1 begins: later frames are epoch 2's */
	CU_ASSERT_EQUAL(output_commit_open_epoch(oc), 2);
	guest_sends(oc, 2);
	output_commit_cut(oc, 2);
	guest_sends(oc, 3);
	return oc;
}

static void test_next_epoch_waits_for_its_own_ack(void)
{
	struct released r = { 0 };
	struct output_commit *oc = run_two_epochs(false, &r);

	CU_ASSERT_EQUAL(r.count, 0); /* nothing acknowledged: nothing out */
	output_commit_ack(oc, 1);
	CU_ASSERT_EQUAL(r.count, 2);
	CU_ASSERT_EQUAL(r.tags[0], 1);
	CU_ASSERT_EQUAL(r.tags[1], 1);
	/* Epoch 2's frame was sent after checkpoint 1 began: it stays. */
	struct output_queue_stats st;
	output_commit_get_stats(oc, &st);
	CU_ASSERT_EQUAL(st.frames_held, 2);
	output_commit_ack(oc, 2);
	CU_ASSERT_EQUAL(r.count, 3);
	CU_ASSERT_EQUAL(r.tags[2], 2);
	/* Epoch 3 is open: what the guest sends now waits for ack 3. */
	guest_sends(oc, 3);
	CU_ASSERT_EQUAL(r.count, 3);
	CU_ASSERT_FALSE(output_commit_unsafe(oc));
	output_commit_destroy(oc);
}

static void test_unsafe_release_early_releases_one_epoch_early(void)
{
	struct released r = { 0 };
	struct output_commit *oc = run_two_epochs(true, &r);

	CU_ASSERT(output_commit_unsafe(oc));
	output_commit_ack(oc, 1);
	/* The negative control: epoch 2's frame leaves on epoch 1's ack. */
	CU_ASSERT_EQUAL(r.count, 3);
	CU_ASSERT_EQUAL(r.tags[2], 2);
	/* Still only one epoch early: epoch 3's frame waits. */
	struct output_queue_stats st;
	output_commit_get_stats(oc, &st);
	CU_ASSERT_EQUAL(st.frames_held, 1);
	output_commit_ack(oc, 2);
	CU_ASSERT_EQUAL(r.count, 4);
	/* Epoch 3 is open and epoch 2 acknowledged: its later frames leave at once. */
	guest_sends(oc, 3);
	CU_ASSERT_EQUAL(r.count, 5);
	CU_ASSERT_EQUAL(r.tags[4], 3);
	/* status counts the frame that skipped the queue as released too */
	output_commit_get_stats(oc, &st);
	CU_ASSERT_EQUAL(st.frames_released, r.count);
	/* Epoch 4 is two ahead of the last ack: held. */
	output_commit_cut(oc, 3);
	guest_sends(oc, 4);
	CU_ASSERT_EQUAL(r.count, 5);
	output_commit_destroy(oc);
}

static void test_fenced_output_goes_nowhere(void)
{
	struct released r = { 0 };
	struct output_commit *oc = run_two_epochs(false, &r);
	struct output_queue_stats st;

	output_commit_drop_all(oc);
	guest_sends(oc, 4);
	output_commit_ack(oc, 3);
	output_commit_release_all(oc);
	CU_ASSERT_EQUAL(r.count, 0);
	output_commit_get_stats(oc, &st);
	CU_ASSERT_EQUAL(st.frames_held, 0);
	CU_ASSERT_EQUAL(st.frames_discarded, 4);
	output_commit_destroy(oc);
}

static void test_unprotected_releases_everything(void)
{
	struct released r = { 0 };
	struct output_commit *oc = run_two_epochs(false, &r);

	output_commit_release_all(oc);
	CU_ASSERT_EQUAL(r.count, 4);
	output_commit_destroy(oc);
	output_commit_destroy(NULL);
}

int register_output_commit_tests(void)
{
	CU_pSuite suite = CU_add_suite("output_commit", NULL, NULL);

	if (!suite ||
	    !CU_add_test(suite, "epoch N+1 never leaves on N's ack",
			 test_next_epoch_waits_for_its_own_ack) ||
	    !CU_add_test(suite, "unsafe_release_early releases N+1 on N's ack",
			 test_unsafe_release_early_releases_one_epoch_early) ||
	    !CU_add_test(suite, "fenced output goes nowhere", test_fenced_output_goes_nowhere) ||
	    !CU_add_test(suite, "unprotected releases everything",
			 test_unprotected_releases_everything))
		return -1;
	return 0;
}
