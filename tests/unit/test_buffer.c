/* The growable byte buffer used by every connection. */
#include <CUnit/CUnit.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "base/buffer.h"
#include "suites.h"

static void test_append_consume_keeps_order(void)
{
	struct buffer b;

	buffer_init(&b);
	CU_ASSERT_EQUAL(buffer_len(&b), 0);
	CU_ASSERT_EQUAL(buffer_append(&b, "hello ", 6), 0);
	CU_ASSERT_EQUAL(buffer_append(&b, "world", 5), 0);
	CU_ASSERT_EQUAL(buffer_len(&b), 11);
	CU_ASSERT_EQUAL(memcmp(buffer_head(&b), "hello world", 11), 0);
	buffer_consume(&b, 6);
	CU_ASSERT_EQUAL(buffer_len(&b), 5);
	CU_ASSERT_EQUAL(memcmp(buffer_head(&b), "world", 5), 0);
	buffer_consume(&b, 5);
	CU_ASSERT_EQUAL(buffer_len(&b), 0);
	/* Fully consumed: the cursor rewinds instead of creeping forward. */
	CU_ASSERT_EQUAL(b.start, 0);
	CU_ASSERT_EQUAL(b.end, 0);
	buffer_free(&b);
	CU_ASSERT_PTR_NULL(b.data);
}

static void test_growth_preserves_unread_bytes(void)
{
	struct buffer b;
	uint8_t chunk[1000];

	buffer_init(&b);
	for (int i = 0; i < 100; i++) {
		memset(chunk, i, sizeof(chunk));
		CU_ASSERT_EQUAL_FATAL(buffer_append(&b, chunk, sizeof(chunk)), 0);
		if (i % 3 == 0)
			buffer_consume(&b, 500); /* forces compaction on growth */
	}
	size_t expected = 100 * 1000 - 34 * 500;
	CU_ASSERT_EQUAL(buffer_len(&b), expected);
	/* The last chunk written must be intact at the tail. */
	CU_ASSERT_EQUAL(buffer_head(&b)[buffer_len(&b) - 1], 99);
	CU_ASSERT_EQUAL(buffer_head(&b)[buffer_len(&b) - 1000], 99);
	/* After consuming 17000 of chunk 0..33 bytes, the head is chunk 17's. */
	CU_ASSERT_EQUAL(buffer_head(&b)[0], 17);
	buffer_free(&b);
}

static void test_reserve_commit(void)
{
	struct buffer b;

	buffer_init(&b);
	uint8_t *dst = buffer_reserve(&b, 10000);
	CU_ASSERT_PTR_NOT_NULL_FATAL(dst);
	CU_ASSERT(b.capacity >= 10000);
	memcpy(dst, "abc", 3);
	buffer_commit(&b, 3);
	CU_ASSERT_EQUAL(buffer_len(&b), 3);
	CU_ASSERT_EQUAL(memcmp(buffer_head(&b), "abc", 3), 0);
	buffer_clear(&b);
	CU_ASSERT_EQUAL(buffer_len(&b), 0);
	buffer_free(&b);
}

static void test_fd_round_trip(void)
{
	struct buffer out, in;
	int fds[2];

	CU_ASSERT_EQUAL_FATAL(pipe(fds), 0);
	buffer_init(&out);
	buffer_init(&in);
	buffer_append(&out, "through a pipe", 14);
	CU_ASSERT_EQUAL(buffer_write_fd(&out, fds[1]), 0);
	CU_ASSERT_EQUAL(buffer_len(&out), 0);
	CU_ASSERT_EQUAL(buffer_read_fd(&in, fds[0], 4), 4);
	CU_ASSERT_EQUAL(buffer_read_fd(&in, fds[0], 100), 10);
	CU_ASSERT_EQUAL(buffer_len(&in), 14);
	CU_ASSERT_EQUAL(memcmp(buffer_head(&in), "through a pipe", 14), 0);
	close(fds[1]);
	CU_ASSERT_EQUAL(buffer_read_fd(&in, fds[0], 100), 0); /* EOF */
	close(fds[0]);
	buffer_free(&out);
	buffer_free(&in);
}

/* A share of a large queue goes out; the rest waits, in order. */
static void test_write_upto_leaves_the_rest(void)
{
	struct buffer out, in;
	int p[2];

	buffer_init(&out);
	buffer_init(&in);
	CU_ASSERT_EQUAL_FATAL(pipe(p), 0);
	CU_ASSERT_EQUAL(buffer_append(&out, "0123456789", 10), 0);
	CU_ASSERT_EQUAL(buffer_write_fd_upto(&out, p[1], 4), 0);
	CU_ASSERT_EQUAL(buffer_len(&out), 6);
	CU_ASSERT_EQUAL(buffer_write_fd_upto(&out, p[1], 0), 0); /* nothing */
	CU_ASSERT_EQUAL(buffer_len(&out), 6);
	CU_ASSERT_EQUAL(buffer_write_fd_upto(&out, p[1], 100), 0);
	CU_ASSERT_EQUAL(buffer_len(&out), 0);
	CU_ASSERT_EQUAL(buffer_read_fd(&in, p[0], 64), 10);
	CU_ASSERT_EQUAL(memcmp(buffer_head(&in), "0123456789", 10), 0);
	close(p[0]);
	close(p[1]);
	buffer_free(&out);
	buffer_free(&in);
}

int register_buffer_tests(void)
{
	CU_pSuite suite = CU_add_suite("buffer", NULL, NULL);

	if (!suite ||
	    !CU_add_test(suite, "append and consume keep order", test_append_consume_keeps_order) ||
	    !CU_add_test(suite, "growth preserves unread bytes", test_growth_preserves_unread_bytes) ||
	    !CU_add_test(suite, "reserve and commit", test_reserve_commit) ||
	    !CU_add_test(suite, "fd round trip", test_fd_round_trip) ||
	    !CU_add_test(suite, "write up to a share leaves the rest",
			 test_write_upto_leaves_the_rest))
		return -1;
	return 0;
}
