/* NBD wire protocol: parsers, validation and byte-exact encoders. */
#include <CUnit/CUnit.h>
#include <errno.h>
#include <string.h>

#include "base/be.h"
#include "nbd/nbd_proto.h"
#include "suites.h"

static const char *reason;

static size_t make_request(uint8_t *out, uint32_t magic, uint16_t flags,
			   uint16_t type, uint64_t handle, uint64_t offset,
			   uint32_t length)
{
	const uint8_t bytes[NBD_REQUEST_SIZE] = {
		magic >> 24, magic >> 16, magic >> 8, magic,
		flags >> 8, flags, type >> 8, type,
		handle >> 56, handle >> 48, handle >> 40, handle >> 32,
		handle >> 24, handle >> 16, handle >> 8, handle,
		offset >> 56, offset >> 48, offset >> 40, offset >> 32,
		offset >> 24, offset >> 16, offset >> 8, offset,
		length >> 24, length >> 16, length >> 8, length,
	};
	memcpy(out, bytes, sizeof(bytes));
	return sizeof(bytes);
}

static void test_parse_request(void)
{
	uint8_t buf[NBD_REQUEST_SIZE];
	struct nbd_request req;

	make_request(buf, NBD_MAGIC_REQUEST, NBD_CMD_FLAG_FUA, NBD_CMD_WRITE,
		     0x0102030405060708ULL, 0x1122334455667788ULL, 0xa0b0c0d0);
	for (size_t len = 0; len < NBD_REQUEST_SIZE; len++)
		CU_ASSERT_EQUAL(nbd_parse_request(buf, len, &req, &reason),
				NBD_PARSE_NEED_MORE);
	CU_ASSERT_EQUAL_FATAL(nbd_parse_request(buf, sizeof(buf), &req, &reason),
			      NBD_PARSE_OK);
	CU_ASSERT_EQUAL(req.flags, NBD_CMD_FLAG_FUA);
	CU_ASSERT_EQUAL(req.type, NBD_CMD_WRITE);
	CU_ASSERT_EQUAL(req.handle, 0x0102030405060708ULL);
	CU_ASSERT_EQUAL(req.offset, 0x1122334455667788ULL);
	CU_ASSERT_EQUAL(req.length, 0xa0b0c0d0U);
	CU_ASSERT_EQUAL(nbd_request_payload_length(&req), 0xa0b0c0d0U);
	req.type = NBD_CMD_READ;
	CU_ASSERT_EQUAL(nbd_request_payload_length(&req), 0);

	buf[0] ^= 0x80;
	reason = NULL;
	CU_ASSERT_EQUAL(nbd_parse_request(buf, sizeof(buf), &req, &reason),
			NBD_PARSE_MALFORMED);
	CU_ASSERT_PTR_NOT_NULL(reason);
	/* The simple-reply magic is not a request magic either. */
	make_request(buf, NBD_MAGIC_SIMPLE_REPLY, 0, 0, 0, 0, 0);
	CU_ASSERT_EQUAL(nbd_parse_request(buf, sizeof(buf), &req, &reason),
			NBD_PARSE_MALFORMED);
}

static void test_parse_option_header(void)
{
	uint8_t buf[NBD_OPTION_HEADER_SIZE] = { 'I', 'H', 'A', 'V', 'E', 'O', 'P', 'T',
						0, 0, 0, 7, 0, 0, 0x01, 0x02 };
	struct nbd_option_header opt;

	CU_ASSERT_EQUAL(nbd_parse_option_header(buf, 15, &opt, &reason),
			NBD_PARSE_NEED_MORE);
	CU_ASSERT_EQUAL_FATAL(nbd_parse_option_header(buf, 16, &opt, &reason),
			      NBD_PARSE_OK);
	CU_ASSERT_EQUAL(opt.option, NBD_OPT_GO);
	CU_ASSERT_EQUAL(opt.length, 0x102);
	/* Longest accepted payload, then one byte more. */
	buf[12] = 0; buf[13] = 0; buf[14] = 0x20; buf[15] = 0x00;
	CU_ASSERT_EQUAL(nbd_parse_option_header(buf, 16, &opt, &reason), NBD_PARSE_OK);
	buf[15] = 0x01;
	CU_ASSERT_EQUAL(nbd_parse_option_header(buf, 16, &opt, &reason),
			NBD_PARSE_MALFORMED);
	buf[12] = 0xff;
	CU_ASSERT_EQUAL(nbd_parse_option_header(buf, 16, &opt, &reason),
			NBD_PARSE_MALFORMED);
	memcpy(buf, "IHAVEOPX", 8);
	buf[12] = buf[13] = buf[14] = buf[15] = 0;
	CU_ASSERT_EQUAL(nbd_parse_option_header(buf, 16, &opt, &reason),
			NBD_PARSE_MALFORMED);
}

static void test_parse_client_flags(void)
{
	const uint8_t fixed_nozero[] = { 0, 0, 0, 3 };
	const uint8_t fixed[] = { 0, 0, 0, 1 };
	const uint8_t plain[] = { 0, 0, 0, 0 };
	const uint8_t unknown[] = { 0, 0, 0x80, 1 };
	uint32_t flags;

	CU_ASSERT_EQUAL(nbd_parse_client_flags(fixed_nozero, 3, &flags, &reason),
			NBD_PARSE_NEED_MORE);
	CU_ASSERT_EQUAL(nbd_parse_client_flags(fixed_nozero, 4, &flags, &reason), NBD_PARSE_OK);
	CU_ASSERT_EQUAL(flags, 3);
	CU_ASSERT_EQUAL(nbd_parse_client_flags(fixed, 4, &flags, &reason), NBD_PARSE_OK);
	CU_ASSERT_EQUAL(nbd_parse_client_flags(plain, 4, &flags, &reason), NBD_PARSE_MALFORMED);
	CU_ASSERT_EQUAL(nbd_parse_client_flags(unknown, 4, &flags, &reason), NBD_PARSE_MALFORMED);
}

static void test_parse_info_request(void)
{
	/* name "vm1", two requests: BLOCK_SIZE and NAME */
	const uint8_t ok[] = { 0, 0, 0, 3, 'v', 'm', '1', 0, 2, 0, 3, 0, 1 };
	const uint8_t empty[] = { 0, 0, 0, 0, 0, 0 };
	const uint8_t name_too_long[] = { 0, 0, 0, 9, 'v', 'm', '1', 0, 0 };
	const uint8_t count_mismatch[] = { 0, 0, 0, 1, 'v', 0, 2, 0, 3 };
	const uint8_t huge_name[] = { 0xff, 0xff, 0xff, 0xff, 0, 0 };
	const uint8_t nul_in_name[] = { 0, 0, 0, 2, 'a', 0, 0, 0 };
	struct nbd_info_request req;

	CU_ASSERT_EQUAL_FATAL(nbd_parse_info_request(ok, sizeof(ok), &req, &reason),
			      NBD_PARSE_OK);
	CU_ASSERT_EQUAL(req.name_length, 3);
	CU_ASSERT_EQUAL(memcmp(req.name, "vm1", 3), 0);
	CU_ASSERT_EQUAL(req.info_count, 2);
	CU_ASSERT_TRUE(nbd_info_requested(&req, NBD_INFO_BLOCK_SIZE));
	CU_ASSERT_TRUE(nbd_info_requested(&req, NBD_INFO_NAME));
	CU_ASSERT_FALSE(nbd_info_requested(&req, NBD_INFO_DESCRIPTION));
	CU_ASSERT_EQUAL(nbd_parse_info_request(empty, sizeof(empty), &req, &reason),
			NBD_PARSE_OK);
	CU_ASSERT_EQUAL(req.name_length, 0);
	CU_ASSERT_EQUAL(req.info_count, 0);
	CU_ASSERT_EQUAL(nbd_parse_info_request(empty, 5, &req, &reason), NBD_PARSE_MALFORMED);
	CU_ASSERT_EQUAL(nbd_parse_info_request(name_too_long, sizeof(name_too_long),
					       &req, &reason), NBD_PARSE_MALFORMED);
	CU_ASSERT_EQUAL(nbd_parse_info_request(count_mismatch, sizeof(count_mismatch),
					       &req, &reason), NBD_PARSE_MALFORMED);
	CU_ASSERT_EQUAL(nbd_parse_info_request(huge_name, sizeof(huge_name), &req,
					       &reason), NBD_PARSE_MALFORMED);
	CU_ASSERT_EQUAL(nbd_parse_info_request(nul_in_name, sizeof(nul_in_name), &req,
					       &reason), NBD_PARSE_MALFORMED);
}

/* What the judged connection negotiated (NBD_NEGOTIATED_*). */
static unsigned negotiated;

static enum nbd_verdict judge(uint16_t type, uint16_t flags, uint64_t offset,
			      uint32_t length, uint64_t size, uint32_t *error)
{
	struct nbd_request req = { .flags = flags, .type = type, .handle = 1,
				   .offset = offset, .length = length };
	return nbd_validate_request(&req, size, negotiated, error, &reason);
}

static void test_parse_meta_request(void)
{
	/* "vm1", 2 queries: "base:allocation", "x:y". */
	const uint8_t ok[] = { 0, 0, 0, 3, 'v', 'm', '1', 0, 0, 0, 2,
			       0, 0, 0, 15, 'b', 'a', 's', 'e', ':', 'a', 'l', 'l', 'o',
			       'c', 'a', 't', 'i', 'o', 'n', 0, 0, 0, 3, 'x', ':', 'y' };
	const uint8_t none[] = { 0, 0, 0, 0, 0, 0, 0, 0 };
	const uint8_t count_too_big[] = { 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 'a' };
	const uint8_t query_too_long[] = { 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 9, 'a' };
	const uint8_t left_over[] = { 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 'a', 'b' };
	const uint8_t nul_query[] = { 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0 };
	const uint8_t huge_count[] = { 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff };
	struct nbd_meta_request req;
	const uint8_t *q;
	uint32_t qlen, pos = 0;

	CU_ASSERT_EQUAL(nbd_parse_meta_request(ok, sizeof(ok), &req, &reason), NBD_PARSE_OK);
	CU_ASSERT_EQUAL(req.name_length, 3);
	CU_ASSERT_EQUAL(memcmp(req.name, "vm1", 3), 0);
	CU_ASSERT_EQUAL(req.query_count, 2);
	CU_ASSERT_EQUAL(nbd_meta_request_next(&req, &pos, &q, &qlen), 1);
	CU_ASSERT_EQUAL(qlen, 15);
	CU_ASSERT_TRUE(nbd_meta_query_selects_allocation(q, qlen, 0));
	CU_ASSERT_EQUAL(nbd_meta_request_next(&req, &pos, &q, &qlen), 1);
	CU_ASSERT_EQUAL(qlen, 3);
	CU_ASSERT_FALSE(nbd_meta_query_selects_allocation(q, qlen, 1));
	CU_ASSERT_EQUAL(nbd_meta_request_next(&req, &pos, &q, &qlen), 0);
	CU_ASSERT_EQUAL(nbd_parse_meta_request(none, sizeof(none), &req, &reason), NBD_PARSE_OK);
	CU_ASSERT_EQUAL(req.query_count, 0);
	pos = 0;
	CU_ASSERT_EQUAL(nbd_meta_request_next(&req, &pos, &q, &qlen), 0);
	CU_ASSERT_EQUAL(nbd_parse_meta_request(none, 7, &req, &reason), NBD_PARSE_MALFORMED);
	CU_ASSERT_EQUAL(nbd_parse_meta_request(ok, sizeof(ok) - 1, &req, &reason), NBD_PARSE_MALFORMED);
	CU_ASSERT_EQUAL(nbd_parse_meta_request(count_too_big, sizeof(count_too_big), &req, &reason),
			NBD_PARSE_MALFORMED);
	CU_ASSERT_EQUAL(nbd_parse_meta_request(query_too_long, sizeof(query_too_long), &req, &reason),
			NBD_PARSE_MALFORMED);
	CU_ASSERT_EQUAL(nbd_parse_meta_request(left_over, sizeof(left_over), &req, &reason),
			NBD_PARSE_MALFORMED);
	CU_ASSERT_EQUAL(nbd_parse_meta_request(nul_query, sizeof(nul_query), &req, &reason),
			NBD_PARSE_MALFORMED);
	CU_ASSERT_EQUAL(nbd_parse_meta_request(huge_count, sizeof(huge_count), &req, &reason),
			NBD_PARSE_MALFORMED);
	/* "base:" lists but never selects; near misses do neither. */
	CU_ASSERT_TRUE(nbd_meta_query_selects_allocation((const uint8_t *)"base:", 5, 1));
	CU_ASSERT_FALSE(nbd_meta_query_selects_allocation((const uint8_t *)"base:", 5, 0));
	CU_ASSERT_FALSE(nbd_meta_query_selects_allocation((const uint8_t *)"base:allocatio", 14, 1));
	CU_ASSERT_FALSE(nbd_meta_query_selects_allocation((const uint8_t *)"base:allocationX", 16, 1));
}

static void test_validate_negotiated(void)
{
	const uint64_t size = 1 << 20;
	uint32_t error;

	negotiated = NBD_NEGOTIATED_STRUCTURED;
	/* Structured replies alone: DF on READ, but no BLOCK_STATUS yet. */
	CU_ASSERT_EQUAL(judge(NBD_CMD_READ, NBD_CMD_FLAG_DF, 0, 512, size, &error), NBD_VERDICT_OK);
	CU_ASSERT_EQUAL(judge(NBD_CMD_BLOCK_STATUS, 0, 0, 512, size, &error), NBD_VERDICT_ERROR);
	CU_ASSERT_EQUAL(error, NBD_EINVAL);
	negotiated |= NBD_NEGOTIATED_BLOCK_STATUS;
	CU_ASSERT_EQUAL(judge(NBD_CMD_BLOCK_STATUS, 0, 0, size, size, &error), NBD_VERDICT_OK);
	CU_ASSERT_EQUAL(judge(NBD_CMD_BLOCK_STATUS, NBD_CMD_FLAG_REQ_ONE, 0, 512, size, &error),
			NBD_VERDICT_OK);
	/* A 4 GiB - 1 query of a big export is fine: the length is a hint. */
	CU_ASSERT_EQUAL(judge(NBD_CMD_BLOCK_STATUS, 0, 0, UINT32_MAX, 1ULL << 40, &error),
			NBD_VERDICT_OK);
	CU_ASSERT_EQUAL(judge(NBD_CMD_BLOCK_STATUS, 0, size - 511, 512, size, &error),
			NBD_VERDICT_ERROR);
	CU_ASSERT_EQUAL(error, NBD_EINVAL);
	CU_ASSERT_EQUAL(judge(NBD_CMD_BLOCK_STATUS, 0, 0, 0, size, &error), NBD_VERDICT_ERROR);
	CU_ASSERT_EQUAL(judge(NBD_CMD_BLOCK_STATUS, NBD_CMD_FLAG_DF, 0, 512, size, &error),
			NBD_VERDICT_ERROR);
	CU_ASSERT_EQUAL(judge(NBD_CMD_WRITE, NBD_CMD_FLAG_REQ_ONE, 0, 512, size, &error),
			NBD_VERDICT_ERROR);
	negotiated = 0;
}

static void test_encode_structured(void)
{
	uint8_t out[NBD_STRUCTURED_REPLY_HEADER_SIZE + NBD_ERROR_CHUNK_FIXED_SIZE +
		    NBD_MAX_ERROR_MESSAGE];
	const uint8_t header[] = { 0x66, 0x8e, 0x33, 0xef, 0, 1, 0, 5,
				   0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 12 };
	const uint8_t error[] = { 0x66, 0x8e, 0x33, 0xef, 0, 1, 0x80, 1,
				  0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 8,
				  0, 0, 0, 22, 0, 2, 'h', 'i' };
	char long_message[600];

	CU_ASSERT_EQUAL(nbd_encode_structured_header(out, NBD_REPLY_FLAG_DONE,
						     NBD_REPLY_TYPE_BLOCK_STATUS, 9, 12), 20);
	CU_ASSERT_EQUAL(memcmp(out, header, sizeof(header)), 0);
	CU_ASSERT_EQUAL(nbd_encode_error_chunk(out, 9, NBD_EINVAL, "hi"), sizeof(error));
	CU_ASSERT_EQUAL(memcmp(out, error, sizeof(error)), 0);
	/* A long message is cut; a zero error still goes as a nonzero one. */
	memset(long_message, 'a', sizeof(long_message) - 1);
	long_message[sizeof(long_message) - 1] = '\0';
	CU_ASSERT_EQUAL(nbd_encode_error_chunk(out, 9, 0, long_message), sizeof(out));
	CU_ASSERT_EQUAL(load_be32(out + 20), NBD_EIO);
	CU_ASSERT_EQUAL(load_be16(out + 24), NBD_MAX_ERROR_MESSAGE);
	CU_ASSERT_EQUAL(nbd_encode_block_descriptor(out, 4096, NBD_STATE_HOLE | NBD_STATE_ZERO), 8);
	CU_ASSERT_EQUAL(load_be32(out), 4096);
	CU_ASSERT_EQUAL(load_be32(out + 4), 3);
	CU_ASSERT_EQUAL(nbd_encode_meta_context(out, 1, "base:allocation", 15), 19);
	CU_ASSERT_EQUAL(load_be32(out), 1);
	CU_ASSERT_EQUAL(memcmp(out + 4, "base:allocation", 15), 0);
}

static void test_validate_ranges(void)
{
	const uint64_t size = 1 << 20;
	uint32_t error;

	CU_ASSERT_EQUAL(judge(NBD_CMD_READ, 0, 0, 512, size, &error), NBD_VERDICT_OK);
	CU_ASSERT_EQUAL(judge(NBD_CMD_READ, 0, size - 512, 512, size, &error), NBD_VERDICT_OK);
	CU_ASSERT_EQUAL(judge(NBD_CMD_READ, 0, size - 511, 512, size, &error), NBD_VERDICT_ERROR);
	CU_ASSERT_EQUAL(error, NBD_EINVAL);
	CU_ASSERT_EQUAL(judge(NBD_CMD_READ, 0, size, 1, size, &error), NBD_VERDICT_ERROR);
	CU_ASSERT_EQUAL(judge(NBD_CMD_WRITE, 0, size, 1, size, &error), NBD_VERDICT_ERROR);
	CU_ASSERT_EQUAL(error, NBD_ENOSPC);
	CU_ASSERT_EQUAL(judge(NBD_CMD_WRITE_ZEROES, 0, size - 1, 2, size, &error), NBD_VERDICT_ERROR);
	CU_ASSERT_EQUAL(error, NBD_ENOSPC);
	CU_ASSERT_EQUAL(judge(NBD_CMD_TRIM, 0, size - 1, 2, size, &error), NBD_VERDICT_ERROR);
	CU_ASSERT_EQUAL(error, NBD_EINVAL);
	/* offset + length wraps around 2^64: must not look in range. */
	CU_ASSERT_EQUAL(judge(NBD_CMD_READ, 0, UINT64_MAX - 10, 512, UINT64_MAX,
			      &error), NBD_VERDICT_ERROR);
	CU_ASSERT_EQUAL(judge(NBD_CMD_READ, 0, UINT64_MAX, 1, size, &error), NBD_VERDICT_ERROR);
	CU_ASSERT_EQUAL(judge(NBD_CMD_TRIM, 0, 0, 0xffffffff, size, &error), NBD_VERDICT_ERROR);
	/* Big trims and zeroing within a big disk are fine (no payload cap). */
	CU_ASSERT_EQUAL(judge(NBD_CMD_TRIM, 0, 0, 0xffffffff, 1ULL << 40, &error), NBD_VERDICT_OK);
	CU_ASSERT_EQUAL(judge(NBD_CMD_WRITE_ZEROES, 0, 0, 0xffffffff, 1ULL << 40, &error),
			NBD_VERDICT_OK);
	CU_ASSERT_EQUAL(judge(NBD_CMD_READ, 0, 0, 0, size, &error), NBD_VERDICT_ERROR);
	CU_ASSERT_EQUAL(judge(NBD_CMD_READ, 0, 0, 1, 0, &error), NBD_VERDICT_ERROR);
}

static void test_validate_lengths_commands_flags(void)
{
	const uint64_t big = 1ULL << 40;
	uint32_t error;

	CU_ASSERT_EQUAL(judge(NBD_CMD_READ, 0, 0, NBD_MAX_PAYLOAD, big, &error), NBD_VERDICT_OK);
	CU_ASSERT_EQUAL(judge(NBD_CMD_READ, 0, 0, NBD_MAX_PAYLOAD + 1, big, &error),
			NBD_VERDICT_ERROR);
	CU_ASSERT_EQUAL(error, NBD_EINVAL);
	CU_ASSERT_EQUAL(judge(NBD_CMD_WRITE, 0, 0, NBD_MAX_PAYLOAD, big, &error), NBD_VERDICT_OK);
	/* An oversized write payload cannot be skipped: close. */
	CU_ASSERT_EQUAL(judge(NBD_CMD_WRITE, 0, 0, NBD_MAX_PAYLOAD + 1, big, &error),
			NBD_VERDICT_CLOSE);
	CU_ASSERT_EQUAL(judge(NBD_CMD_WRITE, 0, big, 0xffffffff, big, &error),
			NBD_VERDICT_CLOSE);
	/* FLUSH and DISC ignore offset and length. */
	CU_ASSERT_EQUAL(judge(NBD_CMD_FLUSH, 0, 0, 0, 1, &error), NBD_VERDICT_OK);
	CU_ASSERT_EQUAL(judge(NBD_CMD_DISC, 0, 0, 0, 1, &error), NBD_VERDICT_OK);
	/* Commands never advertised, and unknown ones: EINVAL. */
	CU_ASSERT_EQUAL(judge(NBD_CMD_CACHE, 0, 0, 512, big, &error), NBD_VERDICT_ERROR);
	CU_ASSERT_EQUAL(error, NBD_EINVAL);
	CU_ASSERT_EQUAL(judge(NBD_CMD_BLOCK_STATUS, 0, 0, 512, big, &error), NBD_VERDICT_ERROR);
	CU_ASSERT_EQUAL(judge(0xffff, 0, 0, 512, big, &error), NBD_VERDICT_ERROR);
	CU_ASSERT_EQUAL(error, NBD_EINVAL);
	/* Flags. */
	CU_ASSERT_EQUAL(judge(NBD_CMD_WRITE, NBD_CMD_FLAG_FUA, 0, 512, big, &error), NBD_VERDICT_OK);
	CU_ASSERT_EQUAL(judge(NBD_CMD_READ, NBD_CMD_FLAG_FUA, 0, 512, big, &error), NBD_VERDICT_OK);
	CU_ASSERT_EQUAL(judge(NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_NO_HOLE | NBD_CMD_FLAG_FUA,
			      0, 512, big, &error), NBD_VERDICT_OK);
	CU_ASSERT_EQUAL(judge(NBD_CMD_WRITE, NBD_CMD_FLAG_NO_HOLE, 0, 512, big, &error),
			NBD_VERDICT_ERROR);
	CU_ASSERT_EQUAL(judge(NBD_CMD_READ, NBD_CMD_FLAG_DF, 0, 512, big, &error),
			NBD_VERDICT_ERROR);
	CU_ASSERT_EQUAL(judge(NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_FAST_ZERO, 0, 512, big,
			      &error), NBD_VERDICT_ERROR);
	CU_ASSERT_EQUAL(judge(NBD_CMD_FLUSH, 0x8000, 0, 0, big, &error), NBD_VERDICT_ERROR);
	CU_ASSERT_EQUAL(error, NBD_EINVAL);
}

static void test_encode_greeting_and_option_replies(void)
{
	uint8_t out[NBD_EXPORT_NAME_REPLY_SIZE];
	const uint8_t greeting[] = { 'N', 'B', 'D', 'M', 'A', 'G', 'I', 'C',
				     'I', 'H', 'A', 'V', 'E', 'O', 'P', 'T', 0, 3 };
	const uint8_t unsup[] = { 0, 0x03, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9,
				  0, 0, 0, 8, 0x80, 0, 0, 1, 0, 0, 0, 0 };
	const uint8_t info_export[] = { 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0x6d };
	const uint8_t block_size[] = { 0, 3, 0, 0, 0, 1, 0, 0, 0x10, 0, 0x02, 0, 0, 0 };
	const uint8_t server[] = { 0, 0, 0, 3, 'v', 'm', '1' };

	CU_ASSERT_EQUAL(nbd_encode_greeting(out), sizeof(greeting));
	CU_ASSERT_EQUAL(memcmp(out, greeting, sizeof(greeting)), 0);
	CU_ASSERT_EQUAL(nbd_encode_option_reply_header(out, NBD_OPT_STRUCTURED_REPLY,
						       NBD_REP_ERR_UNSUP, 0), sizeof(unsup));
	CU_ASSERT_EQUAL(memcmp(out, unsup, sizeof(unsup)), 0);
	/* 1 MiB export with HAS_FLAGS|SEND_FLUSH|SEND_FUA|SEND_TRIM|SEND_WRITE_ZEROES */
	CU_ASSERT_EQUAL(NBD_SERVER_TRANSMISSION_FLAGS, 0x6d);
	CU_ASSERT_EQUAL(nbd_encode_info_export(out, 1 << 20, NBD_SERVER_TRANSMISSION_FLAGS),
			sizeof(info_export));
	CU_ASSERT_EQUAL(memcmp(out, info_export, sizeof(info_export)), 0);
	CU_ASSERT_EQUAL(nbd_encode_info_block_size(out, 1, 4096, 32 << 20), sizeof(block_size));
	CU_ASSERT_EQUAL(memcmp(out, block_size, sizeof(block_size)), 0);
	CU_ASSERT_EQUAL(nbd_encode_rep_server(out, "vm1", 3), sizeof(server));
	CU_ASSERT_EQUAL(memcmp(out, server, sizeof(server)), 0);
}

static void test_encode_export_name_and_simple_reply(void)
{
	uint8_t out[NBD_EXPORT_NAME_REPLY_SIZE];
	const uint8_t head[] = { 0, 0, 0, 1, 0, 0, 0, 0, 0, 0x6d };
	const uint8_t reply[] = { 0x67, 0x44, 0x66, 0x98, 0, 0, 0, 22,
				  0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 1 };

	memset(out, 0xaa, sizeof(out));
	CU_ASSERT_EQUAL(nbd_encode_export_name_reply(out, 1ULL << 32, 0x6d, 1), 10);
	CU_ASSERT_EQUAL(memcmp(out, head, sizeof(head)), 0);
	CU_ASSERT_EQUAL(out[10], 0xaa); /* nothing beyond the 10 bytes */
	CU_ASSERT_EQUAL(nbd_encode_export_name_reply(out, 1ULL << 32, 0x6d, 0), 134);
	CU_ASSERT_EQUAL(memcmp(out, head, sizeof(head)), 0);
	for (int i = 10; i < 134; i++)
		CU_ASSERT_EQUAL(out[i], 0);
	CU_ASSERT_EQUAL(nbd_encode_simple_reply(out, NBD_EINVAL, 0xdeadbeef00000001ULL), 16);
	CU_ASSERT_EQUAL(memcmp(out, reply, sizeof(reply)), 0);
}

static void test_error_mapping(void)
{
	CU_ASSERT_EQUAL(nbd_error_from_errno(0), 0);
	CU_ASSERT_EQUAL(nbd_error_from_errno(-ENOSPC), NBD_ENOSPC);
	CU_ASSERT_EQUAL(nbd_error_from_errno(EDQUOT), NBD_ENOSPC);
	CU_ASSERT_EQUAL(nbd_error_from_errno(EFBIG), NBD_ENOSPC);
	CU_ASSERT_EQUAL(nbd_error_from_errno(EROFS), NBD_EPERM);
	CU_ASSERT_EQUAL(nbd_error_from_errno(EBADF), NBD_EIO);
	CU_ASSERT_STRING_EQUAL(nbd_command_name(NBD_CMD_WRITE_ZEROES), "WRITE_ZEROES");
	CU_ASSERT_STRING_EQUAL(nbd_command_name(200), "unknown");
	CU_ASSERT_STRING_EQUAL(nbd_option_name(NBD_OPT_GO), "GO");
	CU_ASSERT_STRING_EQUAL(nbd_option_name(0), "unknown");
}

int register_nbd_proto_tests(void)
{
	CU_pSuite suite = CU_add_suite("nbd_proto", NULL, NULL);

	if (!suite ||
	    !CU_add_test(suite, "parse request", test_parse_request) ||
	    !CU_add_test(suite, "parse option header", test_parse_option_header) ||
	    !CU_add_test(suite, "parse client flags", test_parse_client_flags) ||
	    !CU_add_test(suite, "parse info request", test_parse_info_request) ||
	    !CU_add_test(suite, "validate ranges", test_validate_ranges) ||
	    !CU_add_test(suite, "validate lengths, commands, flags", test_validate_lengths_commands_flags) ||
	    !CU_add_test(suite, "encode greeting and option replies", test_encode_greeting_and_option_replies) ||
	    !CU_add_test(suite, "encode export-name and simple reply", test_encode_export_name_and_simple_reply) ||
	    !CU_add_test(suite, "error mapping and names", test_error_mapping) ||
	    !CU_add_test(suite, "parse meta context request", test_parse_meta_request) ||
	    !CU_add_test(suite, "validate with negotiated options", test_validate_negotiated) ||
	    !CU_add_test(suite, "encode structured chunks", test_encode_structured))
		return -1;
	return 0;
}
