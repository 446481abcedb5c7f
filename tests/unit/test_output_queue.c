/* The primary's output commit buffer: frames held per epoch, released in order. */
#include <CUnit/CUnit.h>
#include <stdlib.h>
#include <string.h>

#include "primary/output_queue.h"
#include "suites.h"

/*
 * Frames carry their sequence number in the first 4 bytes and a pattern
 * derived from it after that, so a sink can check order and content.
 */
static void make_frame(uint8_t *f, size_t len, uint32_t seq)
{
	for (size_t i = 0; i < len; i++)
		f[i] = (uint8_t)(seq * 31 + i * 7);
	if (len >= 4)
		memcpy(f, &seq, 4);
}

struct sink_log {
	uint32_t next_seq;   /* sequence expected next */
	size_t calls;
	size_t bad;          /* frames out of order or corrupted */
	size_t stop_at_call; /* return nonzero on this call (1-based), 0 never */
	uint64_t bytes;
};

static int checking_sink(void *opaque, const uint8_t *frame, size_t len)
{
	struct sink_log *log = opaque;
	static uint8_t expect[256 * 1024];
	uint32_t seq;

	log->calls++;
	if (log->stop_at_call && log->calls == log->stop_at_call)
		return 1;
	if (len < 4 || len > sizeof(expect)) {
		log->bad++;
		return 0;
	}
	memcpy(&seq, frame, 4);
	make_frame(expect, len, seq);
	if (seq != log->next_seq || memcmp(expect, frame, len) != 0)
		log->bad++;
	log->next_seq = seq + 1;
	log->bytes += len;
	return 0;
}

static int push_seq(struct output_queue *q, uint64_t epoch, size_t len,
		    uint32_t seq)
{
	static uint8_t f[256 * 1024];

	make_frame(f, len, seq);
	return output_queue_push(q, epoch, f, len);
}

static void test_order_across_epochs(void)
{
	struct output_queue *q = output_queue_create(1 << 20);
	struct sink_log log = { 0 };
	struct output_queue_stats st;

	CU_ASSERT_PTR_NOT_NULL_FATAL(q);
	CU_ASSERT_EQUAL(push_seq(q, 1, 60, 0), 0);
	CU_ASSERT_EQUAL(push_seq(q, 1, 1514, 1), 0);
	CU_ASSERT_EQUAL(push_seq(q, 2, 5, 2), 0);
	CU_ASSERT_EQUAL(push_seq(q, 3, 99, 3), 0);
	output_queue_get_stats(q, &st);
	CU_ASSERT_EQUAL(st.frames_held, 4);
	CU_ASSERT_EQUAL(st.bytes_held, 60 + 1514 + 5 + 99);
	CU_ASSERT_EQUAL(output_queue_release(q, 3, checking_sink, &log), 4);
	CU_ASSERT_EQUAL(log.bad, 0);
	CU_ASSERT_EQUAL(log.next_seq, 4);
	output_queue_get_stats(q, &st);
	CU_ASSERT_EQUAL(st.frames_held, 0);
	CU_ASSERT_EQUAL(st.bytes_held, 0);
	CU_ASSERT_EQUAL(st.frames_released, 4);
	CU_ASSERT_EQUAL(st.max_bytes_held, 60 + 1514 + 5 + 99);
	output_queue_destroy(q);
}

static void test_partial_release(void)
{
	struct output_queue *q = output_queue_create(1 << 20);
	struct sink_log log = { 0 };
	struct output_queue_stats st;

	CU_ASSERT_PTR_NOT_NULL_FATAL(q);
	for (uint32_t i = 0; i < 30; i++)
		CU_ASSERT_EQUAL(push_seq(q, 10 + i / 10, 100 + i, i), 0);
	/* Epoch 10 only: frames 0..9 leave, epochs 11 and 12 stay. */
	CU_ASSERT_EQUAL(output_queue_release(q, 10, checking_sink, &log), 10);
	CU_ASSERT_EQUAL(log.next_seq, 10);
	output_queue_get_stats(q, &st);
	CU_ASSERT_EQUAL(st.frames_held, 20);
	/* Releasing the same epoch again releases nothing more. */
	CU_ASSERT_EQUAL(output_queue_release(q, 10, checking_sink, &log), 0);
	/* Pushes may continue between releases. */
	CU_ASSERT_EQUAL(push_seq(q, 12, 70, 30), 0);
	CU_ASSERT_EQUAL(output_queue_release(q, 11, checking_sink, &log), 10);
	CU_ASSERT_EQUAL(output_queue_release(q, 12, checking_sink, &log), 11);
	CU_ASSERT_EQUAL(log.next_seq, 31);
	CU_ASSERT_EQUAL(log.bad, 0);
	output_queue_destroy(q);
}

static void test_release_of_absent_epoch(void)
{
	struct output_queue *q = output_queue_create(1 << 20);
	struct sink_log log = { .next_seq = 0 };

	CU_ASSERT_PTR_NOT_NULL_FATAL(q);
	CU_ASSERT_EQUAL(output_queue_release(q, 100, checking_sink, &log), 0);
	CU_ASSERT_EQUAL(push_seq(q, 5, 64, 0), 0);
	CU_ASSERT_EQUAL(push_seq(q, 8, 64, 1), 0);
	/* Nothing was tagged 3 or 4, and epoch 5 is not covered yet. */
	CU_ASSERT_EQUAL(output_queue_release(q, 3, checking_sink, &log), 0);
	CU_ASSERT_EQUAL(output_queue_release(q, 4, checking_sink, &log), 0);
	CU_ASSERT_EQUAL(log.calls, 0);
	/* An ack of 6 (no frames of its own) covers epoch 5, not 8. */
	CU_ASSERT_EQUAL(output_queue_release(q, 6, checking_sink, &log), 1);
	CU_ASSERT_EQUAL(output_queue_release(q, 7, checking_sink, &log), 0);
	CU_ASSERT_EQUAL(output_queue_release(q, UINT64_MAX, checking_sink, &log), 1);
	CU_ASSERT_EQUAL(log.bad, 0);
	output_queue_destroy(q);
}

static void test_overflow_drops(void)
{
	struct output_queue *q = output_queue_create(1000);
	struct sink_log log = { 0 };
	struct output_queue_stats st;

	CU_ASSERT_PTR_NOT_NULL_FATAL(q);
	CU_ASSERT_EQUAL(push_seq(q, 1, 600, 0), 0);
	CU_ASSERT_EQUAL(push_seq(q, 1, 401, 99), 1); /* 1001 > 1000: dropped */
	CU_ASSERT_EQUAL(push_seq(q, 1, 400, 1), 0);  /* exactly 1000 fits */
	CU_ASSERT_EQUAL(push_seq(q, 2, 1, 99), 1);
	CU_ASSERT_EQUAL(push_seq(q, 2, 5000, 99), 1); /* larger than the bound */
	output_queue_get_stats(q, &st);
	CU_ASSERT_EQUAL(st.frames_held, 2);
	CU_ASSERT_EQUAL(st.bytes_held, 1000);
	CU_ASSERT_EQUAL(st.frames_dropped_overflow, 3);
	CU_ASSERT_EQUAL(st.max_bytes_held, 1000);
	CU_ASSERT_EQUAL(output_queue_release(q, 1, checking_sink, &log), 2);
	CU_ASSERT_EQUAL(log.bad, 0);
	/* Space came back. */
	CU_ASSERT_EQUAL(push_seq(q, 2, 1000, 2), 0);
	CU_ASSERT_EQUAL(output_queue_release(q, 2, checking_sink, &log), 1);
	CU_ASSERT_EQUAL(log.bad, 0);
	output_queue_destroy(q);
}

static void test_drop_all(void)
{
	struct output_queue *q = output_queue_create(10 << 20);
	struct sink_log log = { 0 };
	struct output_queue_stats st;

	CU_ASSERT_PTR_NOT_NULL_FATAL(q);
	/* Enough to span several chunks, one frame larger than a chunk. */
	for (uint32_t i = 0; i < 500; i++)
		CU_ASSERT_EQUAL(push_seq(q, 7 + i / 100, 1500, i), 0);
	CU_ASSERT_EQUAL(push_seq(q, 20, 200 * 1024, 500), 0);
	CU_ASSERT_EQUAL(output_queue_drop_all(q), 501);
	output_queue_get_stats(q, &st);
	CU_ASSERT_EQUAL(st.frames_held, 0);
	CU_ASSERT_EQUAL(st.bytes_held, 0);
	CU_ASSERT_EQUAL(st.frames_discarded, 501);
	CU_ASSERT_EQUAL(st.frames_released, 0);
	CU_ASSERT_EQUAL(output_queue_release(q, UINT64_MAX, checking_sink, &log), 0);
	CU_ASSERT_EQUAL(output_queue_drop_all(q), 0);
	/* A new protection run counts epochs from 1 again. */
	CU_ASSERT_EQUAL(push_seq(q, 1, 80, 0), 0);
	CU_ASSERT_EQUAL(output_queue_release(q, 1, checking_sink, &log), 1);
	CU_ASSERT_EQUAL(log.bad, 0);
	output_queue_destroy(q);
}

static void test_epochs_must_not_decrease(void)
{
	struct output_queue *q = output_queue_create(1 << 20);
	struct sink_log log = { 0 };
	struct output_queue_stats st;
	uint8_t byte = 0;

	CU_ASSERT_PTR_NOT_NULL_FATAL(q);
	CU_ASSERT_EQUAL(push_seq(q, 5, 64, 0), 0);
	CU_ASSERT_EQUAL(push_seq(q, 4, 64, 99), -1);
	CU_ASSERT_EQUAL(push_seq(q, 5, 64, 1), 0); /* equal is fine */
	CU_ASSERT_EQUAL(output_queue_push(q, 6, &byte, 0), -1); /* empty frame */
	/* Releasing does not reset the order: epoch 5 is still the floor. */
	CU_ASSERT_EQUAL(output_queue_release(q, 5, checking_sink, &log), 2);
	CU_ASSERT_EQUAL(push_seq(q, 3, 64, 99), -1);
	output_queue_get_stats(q, &st);
	CU_ASSERT_EQUAL(st.frames_held, 0);
	CU_ASSERT_EQUAL(st.frames_dropped_overflow, 0);
	CU_ASSERT_EQUAL(log.bad, 0);
	output_queue_destroy(q);
}

static void test_sink_can_stop_release(void)
{
	struct output_queue *q = output_queue_create(1 << 20);
	struct sink_log log = { .stop_at_call = 3 };

	CU_ASSERT_PTR_NOT_NULL_FATAL(q);
	for (uint32_t i = 0; i < 5; i++)
		CU_ASSERT_EQUAL(push_seq(q, 1, 100, i), 0);
	/* The third frame is refused and stays at the head. */
	CU_ASSERT_EQUAL(output_queue_release(q, 1, checking_sink, &log), 2);
	CU_ASSERT_EQUAL(log.next_seq, 2);
	CU_ASSERT_EQUAL(output_queue_release(q, 1, checking_sink, &log), 3);
	CU_ASSERT_EQUAL(log.next_seq, 5);
	CU_ASSERT_EQUAL(log.bad, 0);
	output_queue_destroy(q);
}

static void test_large_volume(void)
{
	const uint32_t frames = 100000;
	struct output_queue *q = output_queue_create(64u << 20);
	struct sink_log log = { 0 };
	struct output_queue_stats st;
	uint64_t pushed_bytes = 0, epoch = 1;
	size_t released = 0;

	CU_ASSERT_PTR_NOT_NULL_FATAL(q);
	srand(42);
	for (uint32_t i = 0; i < frames; i++) {
		/* Mostly small and MTU-sized frames, now and then a 64 KiB one. */
		size_t len = i % 997 == 0 ? 65536 + (size_t)(rand() % 4096)
					  : 4 + (size_t)(rand() % 1511);

		if (rand() % 50 == 0)
			epoch++;
		if (push_seq(q, epoch, len, i) != 0) {
			CU_FAIL("push failed");
			break;
		}
		pushed_bytes += len;
		/* Acks lag a couple of epochs behind, like the real pipeline. */
		if (i % 37 == 0 && epoch > 2)
			released += output_queue_release(q, epoch - 2, checking_sink,
							 &log);
	}
	released += output_queue_release(q, epoch, checking_sink, &log);
	CU_ASSERT_EQUAL(released, frames);
	CU_ASSERT_EQUAL(log.next_seq, frames);
	CU_ASSERT_EQUAL(log.bytes, pushed_bytes);
	CU_ASSERT_EQUAL(log.bad, 0);
	output_queue_get_stats(q, &st);
	CU_ASSERT_EQUAL(st.frames_held, 0);
	CU_ASSERT_EQUAL(st.bytes_held, 0);
	CU_ASSERT_EQUAL(st.frames_released, frames);
	CU_ASSERT_EQUAL(st.frames_dropped_overflow, 0);
	CU_ASSERT(st.max_bytes_held > 0 && st.max_bytes_held < pushed_bytes);
	output_queue_destroy(q);
}

int register_output_queue_tests(void)
{
	CU_pSuite suite = CU_add_suite("output_queue", NULL, NULL);

	if (!suite)
		return -1;
	if (!CU_add_test(suite, "order across epochs", test_order_across_epochs) ||
	    !CU_add_test(suite, "partial release", test_partial_release) ||
	    !CU_add_test(suite, "release of an absent epoch",
			 test_release_of_absent_epoch) ||
	    !CU_add_test(suite, "overflow drops", test_overflow_drops) ||
	    !CU_add_test(suite, "drop all", test_drop_all) ||
	    !CU_add_test(suite, "epochs must not decrease",
			 test_epochs_must_not_decrease) ||
	    !CU_add_test(suite, "sink can stop a release",
			 test_sink_can_stop_release) ||
	    !CU_add_test(suite, "100k frames", test_large_volume))
		return -1;
	return 0;
}
