/*
 * libFuzzer harness for the NBD wire parsers.  The input is replayed as
 * one client's byte stream: client flags, options until one enters
 * transmission (NBD_OPT_LIST_META_CONTEXT / SET_META_CONTEXT payloads
 * parsed and every query walked), then requests with their payloads,
 * judged with what the options negotiated (structured replies, a
 * selected base:allocation), and their replies encoded as the server
 * would: simple, error chunk, OFFSET_DATA or BLOCK_STATUS header.  Beyond the sanitizers'
 * checks, it aborts when a parser accepts something that breaks the
 * invariants the server relies on.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/be.h"
#include "nbd/nbd_proto.h"

static void check(int condition)
{
	if (!condition)
		abort();
}

/* A meta context payload: parse, then walk every query within bounds. */
static void replay_meta(const uint8_t *payload, uint32_t length, int listing,
			unsigned *negotiated)
{
	struct nbd_meta_request meta;
	const char *reason = NULL;
	const uint8_t *query;
	uint32_t query_length, pos = 0, seen = 0;

	if (!listing)
		*negotiated &= ~NBD_NEGOTIATED_BLOCK_STATUS;
	if (nbd_parse_meta_request(payload, length, &meta, &reason) != NBD_PARSE_OK) {
		check(reason != NULL);
		return;
	}
	check(meta.name_length <= NBD_MAX_NAME_LENGTH);
	check(meta.name + meta.name_length <= payload + length);
	check(!memchr(meta.name, '\0', meta.name_length));
	while (nbd_meta_request_next(&meta, &pos, &query, &query_length)) {
		check(query >= meta.queries &&
		      query + query_length <= meta.queries + meta.queries_length);
		check(!memchr(query, '\0', query_length));
		seen++;
		if (nbd_meta_query_selects_allocation(query, query_length, listing) &&
		    !listing && (*negotiated & NBD_NEGOTIATED_STRUCTURED))
			*negotiated |= NBD_NEGOTIATED_BLOCK_STATUS;
	}
	/* The walk sees exactly the queries the parser counted. */
	check(seen == meta.query_count && pos == meta.queries_length);
}

/*
 * Returns the bytes consumed by the handshake, or 0 to stop; what the
 * options negotiated goes to *negotiated.
 */
static size_t replay_options(const uint8_t *data, size_t size, unsigned *negotiated)
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
		if (opt.option == NBD_OPT_STRUCTURED_REPLY && opt.length == 0)
			*negotiated |= NBD_NEGOTIATED_STRUCTURED;
		if (opt.option == NBD_OPT_LIST_META_CONTEXT ||
		    opt.option == NBD_OPT_SET_META_CONTEXT)
			replay_meta(payload, opt.length,
				    opt.option == NBD_OPT_LIST_META_CONTEXT, negotiated);
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

static void replay_requests(const uint8_t *data, size_t size, uint64_t export_size,
			    unsigned negotiated)
{
	const char *reason;
	size_t pos = 0;

	while (pos < size) {
		struct nbd_request req;
		uint32_t error;
		uint8_t reply[NBD_STRUCTURED_REPLY_HEADER_SIZE + NBD_ERROR_CHUNK_FIXED_SIZE +
			      NBD_MAX_ERROR_MESSAGE];

		if (nbd_parse_request(data + pos, size - pos, &req, &reason) != NBD_PARSE_OK)
			return;
		enum nbd_verdict v = nbd_validate_request(&req, export_size, negotiated,
							  &error, &reason);
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
			/* Never accepted without what they depend on. */
			if (req.type == NBD_CMD_BLOCK_STATUS)
				check(negotiated & NBD_NEGOTIATED_BLOCK_STATUS);
			if (req.flags & NBD_CMD_FLAG_DF)
				check(req.type == NBD_CMD_READ &&
				      (negotiated & NBD_NEGOTIATED_STRUCTURED));
			if (req.flags & NBD_CMD_FLAG_REQ_ONE)
				check(req.type == NBD_CMD_BLOCK_STATUS);
		}
		if (!(negotiated & NBD_NEGOTIATED_STRUCTURED)) {
			nbd_encode_simple_reply(reply, error, req.handle);
		} else if (v == NBD_VERDICT_ERROR) {
			size_t n = nbd_encode_error_chunk(reply, req.handle, error, reason);
			check(n <= sizeof(reply));
			check(load_be16(reply + NBD_STRUCTURED_REPLY_HEADER_SIZE + 4) ==
			      n - NBD_STRUCTURED_REPLY_HEADER_SIZE - NBD_ERROR_CHUNK_FIXED_SIZE);
		} else {
			nbd_encode_structured_header(reply, NBD_REPLY_FLAG_DONE,
						     req.type == NBD_CMD_BLOCK_STATUS
							     ? NBD_REPLY_TYPE_BLOCK_STATUS
							     : NBD_REPLY_TYPE_OFFSET_DATA,
						     req.handle, 8 + req.length);
		}
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
	unsigned negotiated = 0;
	size_t handshake = replay_options(data, size, &negotiated);
	if (handshake)
		replay_requests(data + handshake, size - handshake, export_size,
				negotiated);
	/*
	 * Requests alone too, so the fuzzer need not solve the handshake,
	 * under every combination of what a handshake may have negotiated.
	 */
	replay_requests(data, size, export_size, 0);
	replay_requests(data, size, export_size, NBD_NEGOTIATED_STRUCTURED);
	replay_requests(data, size, export_size,
			NBD_NEGOTIATED_STRUCTURED | NBD_NEGOTIATED_BLOCK_STATUS);
	return 0;
}
