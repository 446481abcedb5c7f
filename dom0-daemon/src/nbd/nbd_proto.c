/* NBD wire format: parsers and encoders of the handshake and transmission messages (nbd_proto.h). */
#include "nbd/nbd_proto.h"

#include <errno.h>
#include <string.h>

#include "base/be.h"

int nbd_parse_client_flags(const uint8_t *buf, size_t len, uint32_t *flags,
			   const char **reason)
{
	if (len < NBD_CLIENT_FLAGS_SIZE)
		return NBD_PARSE_NEED_MORE;
	*flags = load_be32(buf);
	/* The spec requires closing on client flags we do not know. */
	if (*flags & ~(uint32_t)NBD_SERVER_HANDSHAKE_FLAGS) {
		*reason = "unknown client flags";
		return NBD_PARSE_MALFORMED;
	}
	/*
	 * Plain newstyle allows no error replies to options, so a client
	 * that does not speak fixed newstyle cannot be served safely.
	 */
	if (!(*flags & NBD_FLAG_C_FIXED_NEWSTYLE)) {
		*reason = "client does not support fixed newstyle negotiation";
		return NBD_PARSE_MALFORMED;
	}
	return NBD_PARSE_OK;
}

int nbd_parse_option_header(const uint8_t *buf, size_t len,
			    struct nbd_option_header *out, const char **reason)
{
	if (len < NBD_OPTION_HEADER_SIZE)
		return NBD_PARSE_NEED_MORE;
	if (load_be64(buf) != NBD_MAGIC_IHAVEOPT) {
		*reason = "bad option magic (expected IHAVEOPT)";
		return NBD_PARSE_MALFORMED;
	}
	out->option = load_be32(buf + 8);
	out->length = load_be32(buf + 12);
	if (out->length > NBD_MAX_OPTION_LENGTH) {
		*reason = "option payload longer than 8 KiB";
		return NBD_PARSE_MALFORMED;
	}
	return NBD_PARSE_OK;
}

int nbd_parse_info_request(const uint8_t *data, uint32_t len,
			   struct nbd_info_request *out, const char **reason)
{
	/* 32-bit name length, name, 16-bit count, count 16-bit types. */
	if (len < 6) {
		*reason = "option payload shorter than name length + info count";
		return NBD_PARSE_MALFORMED;
	}
	uint32_t name_length = load_be32(data);
	if (name_length > NBD_MAX_NAME_LENGTH || name_length > len - 6) {
		*reason = "export name length exceeds the option payload";
		return NBD_PARSE_MALFORMED;
	}
	uint16_t count = load_be16(data + 4 + name_length);
	if ((uint64_t)len != 6ULL + name_length + 2ULL * count) {
		*reason = "info request count does not match the option length";
		return NBD_PARSE_MALFORMED;
	}
	if (memchr(data + 4, '\0', name_length)) {
		*reason = "export name contains a NUL byte";
		return NBD_PARSE_MALFORMED;
	}
	out->name = data + 4;
	out->name_length = name_length;
	out->info_count = count;
	out->info_types = data + 6 + name_length;
	return NBD_PARSE_OK;
}

int nbd_info_requested(const struct nbd_info_request *req, uint16_t info_type)
{
	for (uint16_t i = 0; i < req->info_count; i++)
		if (load_be16(req->info_types + 2 * i) == info_type)
			return 1;
	return 0;
}

int nbd_parse_meta_request(const uint8_t *data, uint32_t len,
			   struct nbd_meta_request *out, const char **reason)
{
	/* 32-bit name length, name, 32-bit query count, the queries. */
	if (len < 8) {
		*reason = "option payload shorter than name length + query count";
		return NBD_PARSE_MALFORMED;
	}
	uint32_t name_length = load_be32(data);
	if (name_length > NBD_MAX_NAME_LENGTH || name_length > len - 8) {
		*reason = "export name length exceeds the option payload";
		return NBD_PARSE_MALFORMED;
	}
	if (memchr(data + 4, '\0', name_length)) {
		*reason = "export name contains a NUL byte";
		return NBD_PARSE_MALFORMED;
	}
	uint32_t count = load_be32(data + 4 + name_length);
	uint32_t pos = 8 + name_length;
	/* Every query's framing, now: the walk below then needs no checks. */
	for (uint32_t i = 0; i < count; i++) {
		if (len - pos < 4) {
			*reason = "query count exceeds the option payload";
			return NBD_PARSE_MALFORMED;
		}
		uint32_t qlen = load_be32(data + pos);
		pos += 4;
		if (qlen > NBD_MAX_NAME_LENGTH || qlen > len - pos) {
			*reason = "query length exceeds the option payload";
			return NBD_PARSE_MALFORMED;
		}
		if (memchr(data + pos, '\0', qlen)) {
			*reason = "query contains a NUL byte";
			return NBD_PARSE_MALFORMED;
		}
		pos += qlen;
	}
	if (pos != len) {
		*reason = "bytes left over after the last query";
		return NBD_PARSE_MALFORMED;
	}
	out->name = data + 4;
	out->name_length = name_length;
	out->query_count = count;
	out->queries = data + 8 + name_length;
	out->queries_length = len - 8 - name_length;
	return NBD_PARSE_OK;
}

int nbd_meta_request_next(const struct nbd_meta_request *req, uint32_t *pos,
			  const uint8_t **query, uint32_t *length)
{
	if (req->queries_length - *pos < 4)
		return 0;
	*length = load_be32(req->queries + *pos);
	*query = req->queries + *pos + 4;
	*pos += 4 + *length;
	return 1;
}

int nbd_meta_query_selects_allocation(const uint8_t *query, uint32_t length,
				      int listing)
{
	static const char name[] = NBD_CONTEXT_BASE_ALLOCATION;
	static const char wildcard[] = "base:";

	if (length == sizeof(name) - 1 && memcmp(query, name, length) == 0)
		return 1;
	/* "base:" lists the namespace but selects nothing (the spec). */
	return listing && length == sizeof(wildcard) - 1 &&
	       memcmp(query, wildcard, length) == 0;
}

int nbd_parse_request(const uint8_t *buf, size_t len, struct nbd_request *out,
		      const char **reason)
{
	if (len < NBD_REQUEST_SIZE)
		return NBD_PARSE_NEED_MORE;
	if (load_be32(buf) != NBD_MAGIC_REQUEST) {
		*reason = "bad request magic (expected 0x25609513)";
		return NBD_PARSE_MALFORMED;
	}
	out->flags = load_be16(buf + 4);
	out->type = load_be16(buf + 6);
	out->handle = load_be64(buf + 8);
	out->offset = load_be64(buf + 16);
	out->length = load_be32(buf + 24);
	return NBD_PARSE_OK;
}

uint32_t nbd_request_payload_length(const struct nbd_request *req)
{
	return req->type == NBD_CMD_WRITE ? req->length : 0;
}

static uint16_t allowed_flags(uint16_t type, unsigned negotiated)
{
	/* FUA is accepted on every command once SEND_FUA is advertised. */
	switch (type) {
	case NBD_CMD_WRITE_ZEROES:
		return NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_NO_HOLE;
	case NBD_CMD_READ:
		/*
		 * DF: a read is always answered with one chunk, so it
		 * holds; SEND_DF is advertised only with structured replies.
		 */
		return NBD_CMD_FLAG_FUA |
		       (negotiated & NBD_NEGOTIATED_STRUCTURED ? NBD_CMD_FLAG_DF : 0);
	case NBD_CMD_BLOCK_STATUS:
		return NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_REQ_ONE;
	default:
		return NBD_CMD_FLAG_FUA;
	}
}

static enum nbd_verdict refuse(uint32_t *error, const char **reason,
			       uint32_t nbd_error, const char *why)
{
	*error = nbd_error;
	*reason = why;
	return NBD_VERDICT_ERROR;
}

enum nbd_verdict nbd_validate_request(const struct nbd_request *req,
				      uint64_t export_size, unsigned negotiated,
				      uint32_t *error, const char **reason)
{
	*error = 0;
	*reason = NULL;
	/*
	 * A write whose payload we will not buffer cannot be skipped
	 * reliably either, so the stream is lost: close (the spec allows
	 * a hard disconnect for requests over the maximum block size).
	 */
	if (req->type == NBD_CMD_WRITE && req->length > NBD_MAX_PAYLOAD) {
		*reason = "write payload larger than 32 MiB";
		return NBD_VERDICT_CLOSE;
	}
	switch (req->type) {
	case NBD_CMD_READ:
	case NBD_CMD_WRITE:
	case NBD_CMD_TRIM:
	case NBD_CMD_WRITE_ZEROES:
	case NBD_CMD_FLUSH:
	case NBD_CMD_DISC:
		break;
	case NBD_CMD_BLOCK_STATUS:
		/* The spec asks for EINVAL when no context was selected. */
		if (!(negotiated & NBD_NEGOTIATED_BLOCK_STATUS))
			return refuse(error, reason, NBD_EINVAL,
				      "BLOCK_STATUS without a metadata context selected");
		break;
	default:
		/* Also CACHE, RESIZE: never advertised. */
		return refuse(error, reason, NBD_EINVAL, "unsupported command");
	}
	if (req->flags & ~allowed_flags(req->type, negotiated))
		return refuse(error, reason, NBD_EINVAL,
			      "command flags not valid for this command");
	if (req->type == NBD_CMD_FLUSH || req->type == NBD_CMD_DISC)
		return NBD_VERDICT_OK; /* offset and length are reserved */
	if (req->length == 0)
		return refuse(error, reason, NBD_EINVAL, "zero-length request");
	if (req->type == NBD_CMD_READ && req->length > NBD_MAX_PAYLOAD)
		return refuse(error, reason, NBD_EINVAL,
			      "read longer than 32 MiB");
	/* Written so that offset + length cannot overflow. */
	if (req->length > export_size || req->offset > export_size - req->length) {
		int writes = req->type == NBD_CMD_WRITE ||
			     req->type == NBD_CMD_WRITE_ZEROES;
		/* The spec asks for ENOSPC on writes past the end. */
		return refuse(error, reason, writes ? NBD_ENOSPC : NBD_EINVAL,
			      "request beyond the end of the export");
	}
	return NBD_VERDICT_OK;
}

const char *nbd_command_name(uint16_t type)
{
	static const char *const names[] = {
		"READ", "WRITE", "DISC", "FLUSH", "TRIM",
		"CACHE", "WRITE_ZEROES", "BLOCK_STATUS", "RESIZE",
	};

	return type < sizeof(names) / sizeof(names[0]) ? names[type] : "unknown";
}

const char *nbd_option_name(uint32_t option)
{
	static const char *const names[] = {
		"?", "EXPORT_NAME", "ABORT", "LIST", "PEEK_EXPORT", "STARTTLS",
		"INFO", "GO", "STRUCTURED_REPLY", "LIST_META_CONTEXT",
		"SET_META_CONTEXT",
	};

	return option >= 1 && option < sizeof(names) / sizeof(names[0])
		       ? names[option]
		       : "unknown";
}

size_t nbd_encode_greeting(uint8_t out[NBD_GREETING_SIZE])
{
	store_be64(out, NBD_MAGIC_NBDMAGIC);
	store_be64(out + 8, NBD_MAGIC_IHAVEOPT);
	store_be16(out + 16, NBD_SERVER_HANDSHAKE_FLAGS);
	return NBD_GREETING_SIZE;
}

size_t nbd_encode_option_reply_header(uint8_t out[NBD_OPTION_REPLY_HEADER_SIZE],
				      uint32_t option, uint32_t reply_type,
				      uint32_t length)
{
	store_be64(out, NBD_MAGIC_OPTION_REPLY);
	store_be32(out + 8, option);
	store_be32(out + 12, reply_type);
	store_be32(out + 16, length);
	return NBD_OPTION_REPLY_HEADER_SIZE;
}

size_t nbd_encode_rep_server(uint8_t *out, const char *name, uint32_t name_length)
{
	store_be32(out, name_length);
	memcpy(out + 4, name, name_length);
	return 4 + (size_t)name_length;
}

size_t nbd_encode_info_export(uint8_t out[NBD_INFO_EXPORT_SIZE], uint64_t size,
			      uint16_t transmission_flags)
{
	store_be16(out, NBD_INFO_EXPORT);
	store_be64(out + 2, size);
	store_be16(out + 10, transmission_flags);
	return NBD_INFO_EXPORT_SIZE;
}

size_t nbd_encode_info_block_size(uint8_t out[NBD_INFO_BLOCK_SIZE_SIZE],
				  uint32_t minimum, uint32_t preferred,
				  uint32_t maximum)
{
	store_be16(out, NBD_INFO_BLOCK_SIZE);
	store_be32(out + 2, minimum);
	store_be32(out + 6, preferred);
	store_be32(out + 10, maximum);
	return NBD_INFO_BLOCK_SIZE_SIZE;
}

size_t nbd_encode_export_name_reply(uint8_t out[NBD_EXPORT_NAME_REPLY_SIZE],
				    uint64_t size, uint16_t transmission_flags,
				    int no_zeroes)
{
	store_be64(out, size);
	store_be16(out + 8, transmission_flags);
	if (no_zeroes)
		return 10;
	memset(out + 10, 0, NBD_EXPORT_NAME_REPLY_SIZE - 10);
	return NBD_EXPORT_NAME_REPLY_SIZE;
}

size_t nbd_encode_simple_reply(uint8_t out[NBD_SIMPLE_REPLY_SIZE], uint32_t error,
			       uint64_t handle)
{
	store_be32(out, NBD_MAGIC_SIMPLE_REPLY);
	store_be32(out + 4, error);
	store_be64(out + 8, handle);
	return NBD_SIMPLE_REPLY_SIZE;
}

size_t nbd_encode_structured_header(uint8_t out[NBD_STRUCTURED_REPLY_HEADER_SIZE],
				    uint16_t flags, uint16_t type, uint64_t handle,
				    uint32_t length)
{
	store_be32(out, NBD_MAGIC_STRUCTURED_REPLY);
	store_be16(out + 4, flags);
	store_be16(out + 6, type);
	store_be64(out + 8, handle);
	store_be32(out + 16, length);
	return NBD_STRUCTURED_REPLY_HEADER_SIZE;
}

size_t nbd_encode_error_chunk(uint8_t *out, uint64_t handle, uint32_t error,
			      const char *message)
{
	size_t n = message ? strlen(message) : 0;

	if (n > NBD_MAX_ERROR_MESSAGE)
		n = NBD_MAX_ERROR_MESSAGE;
	nbd_encode_structured_header(out, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_ERROR,
				     handle, (uint32_t)(NBD_ERROR_CHUNK_FIXED_SIZE + n));
	out += NBD_STRUCTURED_REPLY_HEADER_SIZE;
	/* An error chunk must carry a nonzero error. */
	store_be32(out, error ? error : NBD_EIO);
	store_be16(out + 4, (uint16_t)n);
	if (n)
		memcpy(out + NBD_ERROR_CHUNK_FIXED_SIZE, message, n);
	return NBD_STRUCTURED_REPLY_HEADER_SIZE + NBD_ERROR_CHUNK_FIXED_SIZE + n;
}

size_t nbd_encode_block_descriptor(uint8_t out[NBD_BLOCK_DESCRIPTOR_SIZE],
				   uint32_t length, uint32_t status)
{
	store_be32(out, length);
	store_be32(out + 4, status);
	return NBD_BLOCK_DESCRIPTOR_SIZE;
}

size_t nbd_encode_meta_context(uint8_t *out, uint32_t context_id,
			       const char *name, uint32_t name_length)
{
	store_be32(out, context_id);
	memcpy(out + 4, name, name_length);
	return 4 + (size_t)name_length;
}

uint32_t nbd_error_from_errno(int err)
{
	switch (err < 0 ? -err : err) {
	case 0:
		return 0;
	case EPERM:
	case EACCES:
	case EROFS:
		return NBD_EPERM;
	case ENOMEM:
		return NBD_ENOMEM;
	case EINVAL:
		return NBD_EINVAL;
	case ENOSPC:
	case EDQUOT:
	case EFBIG:
		return NBD_ENOSPC;
	case EOVERFLOW:
		return NBD_EOVERFLOW;
	case EOPNOTSUPP:
		return NBD_ENOTSUP;
	case ESHUTDOWN:
		return NBD_ESHUTDOWN;
	default:
		return NBD_EIO;
	}
}
