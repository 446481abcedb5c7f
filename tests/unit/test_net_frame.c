/* The stream netdev codec: be32 length + Ethernet frame. */
#include <CUnit/CUnit.h>
#include <string.h>

#include "relay/net_frame.h"
#include "suites.h"

static void test_encode_header_bytes(void)
{
	uint8_t header[NET_FRAME_HEADER_LEN];

	net_frame_encode_header(0x0102a3f4, header);
	CU_ASSERT_EQUAL(header[0], 0x01);
	CU_ASSERT_EQUAL(header[1], 0x02);
	CU_ASSERT_EQUAL(header[2], 0xa3);
	CU_ASSERT_EQUAL(header[3], 0xf4);
	net_frame_encode_header(60, header);
	const uint8_t expected[] = { 0, 0, 0, 60 };
	CU_ASSERT_EQUAL(memcmp(header, expected, sizeof(expected)), 0);
}

static void test_decode_several_frames_in_one_buffer(void)
{
	/* Frames of 3, 1 and 5 bytes back to back, then half a header. */
	const uint8_t stream[] = { 0, 0, 0, 3, 'a', 'b', 'c',
				   0, 0, 0, 1, 'x',
				   0, 0, 0, 5, '1', '2', '3', '4', '5',
				   0, 0 };
	const uint8_t *p = stream;
	size_t left = sizeof(stream);
	struct net_frame frame;

	CU_ASSERT_EQUAL_FATAL(net_frame_decode(p, left, &frame), NET_FRAME_OK);
	CU_ASSERT_EQUAL(frame.len, 3);
	CU_ASSERT_EQUAL(frame.consumed, 7);
	CU_ASSERT_PTR_EQUAL(frame.payload, stream + 4);
	CU_ASSERT_EQUAL(memcmp(frame.payload, "abc", 3), 0);
	p += frame.consumed;
	left -= frame.consumed;

	CU_ASSERT_EQUAL_FATAL(net_frame_decode(p, left, &frame), NET_FRAME_OK);
	CU_ASSERT_EQUAL(frame.len, 1);
	CU_ASSERT_EQUAL(frame.payload[0], 'x');
	p += frame.consumed;
	left -= frame.consumed;

	CU_ASSERT_EQUAL_FATAL(net_frame_decode(p, left, &frame), NET_FRAME_OK);
	CU_ASSERT_EQUAL(frame.len, 5);
	CU_ASSERT_EQUAL(memcmp(frame.payload, "12345", 5), 0);
	p += frame.consumed;
	left -= frame.consumed;

	CU_ASSERT_EQUAL(left, 2);
	CU_ASSERT_EQUAL(net_frame_decode(p, left, &frame), NET_FRAME_NEED_MORE);
	CU_ASSERT_EQUAL(frame.needed, NET_FRAME_HEADER_LEN);
	CU_ASSERT_EQUAL(frame.consumed, 0);
}

/* Feeds an encoded frame one byte at a time, as the slowest socket would. */
static void test_decode_frame_split_across_reads(void)
{
	uint8_t payload[100];
	uint8_t stream[NET_FRAME_HEADER_LEN + sizeof(payload)];
	struct net_frame frame;

	for (size_t i = 0; i < sizeof(payload); i++)
		payload[i] = (uint8_t)(i * 7 + 1);
	net_frame_encode_header(sizeof(payload), stream);
	memcpy(stream + NET_FRAME_HEADER_LEN, payload, sizeof(payload));

	for (size_t have = 0; have < sizeof(stream); have++) {
		CU_ASSERT_EQUAL_FATAL(net_frame_decode(stream, have, &frame),
				      NET_FRAME_NEED_MORE);
		size_t expected = have >= NET_FRAME_HEADER_LEN ?
					  sizeof(stream) : NET_FRAME_HEADER_LEN;
		CU_ASSERT_EQUAL(frame.needed, expected);
	}
	CU_ASSERT_EQUAL_FATAL(net_frame_decode(stream, sizeof(stream), &frame),
			      NET_FRAME_OK);
	CU_ASSERT_EQUAL(frame.len, sizeof(payload));
	CU_ASSERT_EQUAL(frame.consumed, sizeof(stream));
	CU_ASSERT_EQUAL(memcmp(frame.payload, payload, sizeof(payload)), 0);
}

static void test_zero_length_is_malformed(void)
{
	const uint8_t stream[] = { 0, 0, 0, 0, 'a', 'b' };
	struct net_frame frame;

	CU_ASSERT_EQUAL(net_frame_decode(stream, sizeof(stream), &frame),
			NET_FRAME_MALFORMED);
	CU_ASSERT_EQUAL(frame.len, 0);
	CU_ASSERT_PTR_NOT_NULL(frame.error);
	CU_ASSERT_EQUAL(frame.consumed, 0);
}

static void test_oversize_is_malformed_before_payload(void)
{
	uint8_t header[NET_FRAME_HEADER_LEN];
	struct net_frame frame;

	/* The largest legal length waits for its payload... */
	net_frame_encode_header(NET_FRAME_MAX_LEN, header);
	CU_ASSERT_EQUAL(net_frame_decode(header, sizeof(header), &frame),
			NET_FRAME_NEED_MORE);
	CU_ASSERT_EQUAL(frame.needed, NET_FRAME_HEADER_LEN + NET_FRAME_MAX_LEN);

	/* ...one more is rejected from the header alone. */
	net_frame_encode_header(NET_FRAME_MAX_LEN + 1, header);
	CU_ASSERT_EQUAL(net_frame_decode(header, sizeof(header), &frame),
			NET_FRAME_MALFORMED);
	CU_ASSERT_EQUAL(frame.len, NET_FRAME_MAX_LEN + 1);
	CU_ASSERT_PTR_NOT_NULL(frame.error);

	const uint8_t huge[] = { 0xff, 0xff, 0xff, 0xff };
	CU_ASSERT_EQUAL(net_frame_decode(huge, sizeof(huge), &frame),
			NET_FRAME_MALFORMED);
	CU_ASSERT_EQUAL(frame.len, 0xffffffffu);
}

static void test_max_frame_is_above_jumbo_ethernet(void)
{
	/* A 65535-byte MTU frame plus the Ethernet header must fit. */
	CU_ASSERT(NET_FRAME_MAX_LEN >= 65535 + 14);
}

int register_net_frame_tests(void)
{
	CU_pSuite suite = CU_add_suite("net_frame", NULL, NULL);

	if (!suite)
		return -1;
	if (!CU_add_test(suite, "encode header bytes", test_encode_header_bytes) ||
	    !CU_add_test(suite, "several frames in one buffer",
			 test_decode_several_frames_in_one_buffer) ||
	    !CU_add_test(suite, "frame split across reads",
			 test_decode_frame_split_across_reads) ||
	    !CU_add_test(suite, "zero length is malformed",
			 test_zero_length_is_malformed) ||
	    !CU_add_test(suite, "oversize is malformed",
			 test_oversize_is_malformed_before_payload) ||
	    !CU_add_test(suite, "max frame fits jumbo",
			 test_max_frame_is_above_jumbo_ethernet))
		return -1;
	return 0;
}
