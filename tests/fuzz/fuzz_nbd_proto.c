/*
 * libFuzzer harness for the NBD wire parsers.  The input is replayed as
 * one client's byte stream: client flags, options until one enters
 * transmission, then requests with their payloads.  Beyond the sanitizers'
 * checks, it aborts when a parser accepts something that breaks the
 * invariants the server relies on.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nbd_proto.h"

static void check(int condition)
{
	if (!condition)
		abort();
}

/* Returns the bytes consumed by the handshake, or 0 to stop. */
static size_t replay_options(const uint8_t *data, size_t size)
{
	const char *reason = NULL;
	uint32_t flags;
	size_t pos = NBD_CLIENT_FLAGS_SIZE;

	if (nbd_parse_client_flags(data, size, &flags, &reason) != NBD_PARSE_OK)
		return 0;
	for (;;) {
		struct nbd_option_header opt;
		int r = nbd_parse_option_header(data + pos, size - pos, &opt, &reason);
		if (r != NBD_PARSE_OK) {
			check(r == NBD_PARSE_NEED_MORE || reason != NULL);
			return 0;
		}
		check(opt.length <= NBD_MAX_OPTION_LENGTH);
		pos += NBD_OPTION_HEADER_SIZE;
		if (size - pos < opt.length)
			return 0;
		const uint8_t *payload = data + pos;
		pos += opt.length;
		if (opt.option == NBD_OPT_EXPORT_NAME)
			return pos;
		if (opt.option != NBD_OPT_GO && opt.option != NBD_OPT_INFO)
			continue;
		struct nbd_info_request info;
		if (nbd_parse_info_request(payload, opt.length, &info, &reason) != NBD_PARSE_OK)
			continue;
		check(6ULL + info.name_length + 2ULL * info.info_count == opt.length);
		check(info.name_length <= NBD_MAX_NAME_LENGTH);
		check(!memchr(info.name, '\0', info.name_length));
		(void)nbd_info_requested(&info, NBD_INFO_BLOCK_SIZE);
		uint8_t *entry = malloc(4 + (size_t)info.name_length);
		check(entry != NULL);
		check(nbd_encode_rep_server(entry, (const char *)info.name,
					    info.name_length) == 4 + (size_t)info.name_length);
		free(entry);
		if (opt.option == NBD_OPT_GO)
			return pos;
	}
}

static void replay_requests(const uint8_t *data, size_t size, uint64_t export_size)
{
	const char *reason;
	size_t pos = 0;

	while (pos < size) {
		struct nbd_request req;
		uint32_t error;
		uint8_t reply[NBD_SIMPLE_REPLY_SIZE];

		if (nbd_parse_request(data + pos, size - pos, &req, &reason) != NBD_PARSE_OK)
			return;
		enum nbd_verdict v = nbd_validate_request(&req, export_size, &error,
							  &reason);
		if (v == NBD_VERDICT_CLOSE)
			return;
		if (v == NBD_VERDICT_ERROR)
			check(error != 0 && reason != NULL);
		if (v == NBD_VERDICT_OK && req.type != NBD_CMD_FLUSH &&
		    req.type != NBD_CMD_DISC) {
			check(req.length > 0);
			check(req.offset <= export_size &&
			      req.length <= export_size - req.offset);
			if (req.type == NBD_CMD_READ || req.type == NBD_CMD_WRITE)
				check(req.length <= NBD_MAX_PAYLOAD);
		}
		nbd_encode_simple_reply(reply, error, req.handle);
		size_t payload = nbd_request_payload_length(&req);
		if (size - pos - NBD_REQUEST_SIZE < payload)
			return;
		pos += NBD_REQUEST_SIZE + payload;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	/* The first byte picks the export size, including the extremes. */
	uint64_t export_size = data[0] & 0x80 ? UINT64_MAX - (data[0] & 0x7f)
					      : (uint64_t)data[0] << 20;
	data++;
	size--;
	size_t handshake = replay_options(data, size);
	if (handshake)
		replay_requests(data + handshake, size - handshake, export_size);
	/* Requests alone too, so the fuzzer need not solve the handshake. */
	replay_requests(data, size, export_size);
	return 0;
}
