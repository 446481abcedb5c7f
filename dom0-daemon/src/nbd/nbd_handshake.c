/*
 * NBD handshake (fixed newstyle): client flags, then options until
 * NBD_OPT_GO or NBD_OPT_EXPORT_NAME enters transmission.
 *
 * Structured replies are offered (NBD_OPT_STRUCTURED_REPLY), and with
 * them one metadata context, base:allocation (NBD_OPT_LIST_META_CONTEXT,
 * NBD_OPT_SET_META_CONTEXT): where the image has holes, so that sparse-
 * aware clients (nbdcopy, qemu-img convert, nbdinfo --map) skip them.  A
 * client that does not ask for structured replies gets simple ones.
 */
#include <stdlib.h>
#include <string.h>

#include "nbd/nbd_conn_internal.h"
#include "nbd/nbd_proto.h"

/* A handshake that keeps sending options is a client bug or an attack. */
#define MAX_OPTIONS 64

static int option_reply(struct nbd_conn *c, uint32_t option, uint32_t type,
			const void *data, uint32_t len)
{
	uint8_t header[NBD_OPTION_REPLY_HEADER_SIZE];

	nbd_encode_option_reply_header(header, option, type, len);
	if (nbd_conn_queue(c, header, sizeof(header)) < 0)
		return -1;
	return len ? nbd_conn_queue(c, data, len) : 0;
}

/* Error replies carry a human-readable message, which QEMU prints. */
static int option_error(struct nbd_conn *c, uint32_t option, uint32_t type,
			const char *message)
{
	/* Unsupported options are routine (QEMU probes structured replies). */
	nbd_conn_log(c, type == NBD_REP_ERR_UNSUP ? LOG_DEBUG : LOG_INFO,
		     "refusing option %s (%u): %s",
		     nbd_option_name(option), option, message);
	return option_reply(c, option, type, message, (uint32_t)strlen(message));
}

static int name_selects_export(const struct nbd_export *export,
			       const uint8_t *name, uint32_t len)
{
	/* The empty name means "the default export": ours. */
	return len == 0 || (len == strlen(export->name) &&
			    memcmp(name, export->name, len) == 0);
}

static int enter_transmission(struct nbd_conn *c)
{
	c->phase = PHASE_TRANSMISSION;
	nbd_conn_log(c, LOG_INFO, "handshake done, serving %llu bytes",
		     (unsigned long long)c->export->disk.size);
	return 0;
}

static int handle_export_name(struct nbd_conn *c, const uint8_t *data, uint32_t len)
{
	uint8_t reply[NBD_EXPORT_NAME_REPLY_SIZE];

	/* No error reply exists for this option: the spec says disconnect. */
	if (!name_selects_export(c->export, data, len))
		return nbd_conn_protocol_error(c, "NBD_OPT_EXPORT_NAME asked for an unknown export");
	size_t n = nbd_encode_export_name_reply(reply, c->export->disk.size,
						nbd_conn_transmission_flags(c),
						c->no_zeroes);
	if (nbd_conn_queue(c, reply, n) < 0)
		return -1;
	return enter_transmission(c);
}

static int handle_info_or_go(struct nbd_conn *c, uint32_t option,
			     const uint8_t *data, uint32_t len)
{
	struct nbd_info_request req;
	const char *reason;
	uint8_t info[NBD_INFO_BLOCK_SIZE_SIZE];

	if (nbd_parse_info_request(data, len, &req, &reason) != NBD_PARSE_OK)
		return option_error(c, option, NBD_REP_ERR_INVALID, reason);
	if (!name_selects_export(c->export, req.name, req.name_length))
		return option_error(c, option, NBD_REP_ERR_UNKNOWN,
				    "no export of that name on this socket");
	nbd_encode_info_export(info, c->export->disk.size,
			       nbd_conn_transmission_flags(c));
	if (option_reply(c, option, NBD_REP_INFO, info, NBD_INFO_EXPORT_SIZE) < 0)
		return -1;
	/* Other info types (NAME, DESCRIPTION) are optional: ignored. */
	if (nbd_info_requested(&req, NBD_INFO_BLOCK_SIZE)) {
		nbd_encode_info_block_size(info, 1, NBD_PREFERRED_BLOCK_SIZE,
					   NBD_MAX_PAYLOAD);
		if (option_reply(c, option, NBD_REP_INFO, info,
				 NBD_INFO_BLOCK_SIZE_SIZE) < 0)
			return -1;
	}
	if (option_reply(c, option, NBD_REP_ACK, NULL, 0) < 0)
		return -1;
	return option == NBD_OPT_GO ? enter_transmission(c) : 0;
}

static int handle_list(struct nbd_conn *c, uint32_t len)
{
	uint32_t name_len = (uint32_t)strlen(c->export->name);
	uint8_t *entry;

	if (len != 0)
		return option_error(c, NBD_OPT_LIST, NBD_REP_ERR_INVALID,
				    "NBD_OPT_LIST takes no data");
	entry = malloc(4 + (size_t)name_len);
	if (!entry)
		return -1;
	nbd_encode_rep_server(entry, c->export->name, name_len);
	int err = option_reply(c, NBD_OPT_LIST, NBD_REP_SERVER, entry, 4 + name_len);
	free(entry);
	if (err < 0)
		return -1;
	return option_reply(c, NBD_OPT_LIST, NBD_REP_ACK, NULL, 0);
}

static int meta_context_reply(struct nbd_conn *c, uint32_t option, uint32_t id)
{
	static const char name[] = NBD_CONTEXT_BASE_ALLOCATION;
	uint8_t payload[4 + sizeof(name)];

	size_t n = nbd_encode_meta_context(payload, id, name, sizeof(name) - 1);
	return option_reply(c, option, NBD_REP_META_CONTEXT, payload, (uint32_t)n);
}

/*
 * LIST_META_CONTEXT and SET_META_CONTEXT share their payload.  We have
 * one context, base:allocation: listed for no query, "base:" or its name;
 * selected only by its name.  Queries of other namespaces are ignored,
 * as the spec asks.
 */
static int handle_meta_context(struct nbd_conn *c, uint32_t option,
			       const uint8_t *data, uint32_t len)
{
	int listing = option == NBD_OPT_LIST_META_CONTEXT;
	struct nbd_meta_request req;
	const char *reason;
	const uint8_t *query;
	uint32_t query_length, pos = 0;
	int found = 0;

	/* A SET replaces the selection even when it fails (the spec). */
	if (!listing)
		c->meta_allocation = false;
	/* Block status answers in chunks: no contexts without them. */
	if (!c->structured)
		return option_error(c, option, NBD_REP_ERR_INVALID,
				    "negotiate NBD_OPT_STRUCTURED_REPLY first");
	if (nbd_parse_meta_request(data, len, &req, &reason) != NBD_PARSE_OK)
		return option_error(c, option, NBD_REP_ERR_INVALID, reason);
	if (!name_selects_export(c->export, req.name, req.name_length))
		return option_error(c, option, NBD_REP_ERR_UNKNOWN,
				    "no export of that name on this socket");
	if (listing && req.query_count == 0)
		found = 1; /* no query lists everything */
	while (!found && nbd_meta_request_next(&req, &pos, &query, &query_length))
		found = nbd_meta_query_selects_allocation(query, query_length, listing);
	if (found) {
		/* The spec reserves the id of a listing: zero. */
		if (meta_context_reply(c, option,
				       listing ? 0 : NBD_CONTEXT_ID_ALLOCATION) < 0)
			return -1;
		if (!listing)
			c->meta_allocation = true;
	}
	nbd_conn_log(c, LOG_DEBUG, "%s: base:allocation %s", nbd_option_name(option),
		     found ? (listing ? "listed" : "selected") : "not asked for");
	return option_reply(c, option, NBD_REP_ACK, NULL, 0);
}

static int dispatch_option(struct nbd_conn *c, uint32_t option,
			   const uint8_t *data, uint32_t len)
{
	switch (option) {
	case NBD_OPT_EXPORT_NAME:
		return handle_export_name(c, data, len);
	case NBD_OPT_ABORT:
		nbd_conn_log(c, LOG_INFO, "client aborted the handshake");
		c->phase = PHASE_CLOSING;
		return option_reply(c, option, NBD_REP_ACK, NULL, 0);
	case NBD_OPT_LIST:
		return handle_list(c, len);
	case NBD_OPT_INFO:
	case NBD_OPT_GO:
		return handle_info_or_go(c, option, data, len);
	case NBD_OPT_STRUCTURED_REPLY:
		if (len != 0)
			return option_error(c, option, NBD_REP_ERR_INVALID,
					    "NBD_OPT_STRUCTURED_REPLY takes no data");
		c->structured = true;
		return option_reply(c, option, NBD_REP_ACK, NULL, 0);
	case NBD_OPT_LIST_META_CONTEXT:
	case NBD_OPT_SET_META_CONTEXT:
		return handle_meta_context(c, option, data, len);
	case NBD_OPT_STARTTLS:
		return option_error(c, option, NBD_REP_ERR_UNSUP,
				    "TLS is not supported on this local socket");
	default:
		return option_error(c, option, NBD_REP_ERR_UNSUP,
				    "option not supported by remusdbd");
	}
}

static int step_client_flags(struct nbd_conn *c)
{
	uint32_t flags;
	const char *reason;
	int r = nbd_parse_client_flags(buffer_head(&c->in), buffer_len(&c->in),
				       &flags, &reason);

	if (r == NBD_PARSE_NEED_MORE)
		return 0;
	if (r == NBD_PARSE_MALFORMED)
		return nbd_conn_protocol_error(c, reason);
	buffer_consume(&c->in, NBD_CLIENT_FLAGS_SIZE);
	c->no_zeroes = !!(flags & NBD_FLAG_C_NO_ZEROES);
	c->phase = PHASE_OPTIONS;
	return 1;
}

static int step_option(struct nbd_conn *c)
{
	struct nbd_option_header opt;
	const char *reason;
	int r = nbd_parse_option_header(buffer_head(&c->in), buffer_len(&c->in),
					&opt, &reason);

	if (r == NBD_PARSE_NEED_MORE)
		return 0;
	if (r == NBD_PARSE_MALFORMED)
		return nbd_conn_protocol_error(c, reason);
	if (buffer_len(&c->in) < NBD_OPTION_HEADER_SIZE + (size_t)opt.length)
		return 0;
	if (++c->options_seen > MAX_OPTIONS)
		return nbd_conn_protocol_error(c, "more than 64 options in one handshake");
	nbd_conn_log(c, LOG_DEBUG, "option %s (%u), %u bytes",
		     nbd_option_name(opt.option), opt.option, opt.length);
	if (dispatch_option(c, opt.option,
			    buffer_head(&c->in) + NBD_OPTION_HEADER_SIZE,
			    opt.length) < 0)
		return -1;
	buffer_consume(&c->in, NBD_OPTION_HEADER_SIZE + (size_t)opt.length);
	return 1;
}

int nbd_handshake_step(struct nbd_conn *c)
{
	return c->phase == PHASE_CLIENT_FLAGS ? step_client_flags(c) : step_option(c);
}
