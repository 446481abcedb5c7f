/*
 * Replication protocol v1 framing: the 8-byte frame header, the payload
 * limit, type names, and the checks every encoder and decoder starts with
 * (see repl_proto.h and docs/protocol.md, section 1).
 */
#include "wire/repl_proto.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/be.h"
#include "wire/repl_proto_internal.h"

/*
 * Messages with numbers in them: one buffer per thread, so that *err
 * stays valid until the next call without anybody freeing it.
 */
static _Thread_local char err_text[256];

__attribute__((format(printf, 1, 2)))
const char *repl_errf(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err_text, sizeof(err_text), fmt, ap);
	va_end(ap);
	return err_text;
}

int repl_fail(const char **err, const char *msg)
{
	if (err)
		*err = msg;
	return -1;
}

int repl_invalid(void)
{
	errno = EINVAL;
	return -1;
}


/* ---- framing --------------------------------------------------------- */

static const char *const type_names[] = {
	[REPL_HELLO] = "HELLO",
	[REPL_AUTH] = "AUTH",
	[REPL_AUTH_OK] = "AUTH_OK",
	[REPL_ERROR] = "ERROR",
	[REPL_VM_CONFIG] = "VM_CONFIG",
	[REPL_RAM_LAYOUT] = "RAM_LAYOUT",
	[REPL_PAGES] = "PAGES",
	[REPL_DEVICE] = "DEVICE",
	[REPL_DISK_WRITE] = "DISK_WRITE",
	[REPL_DISK_ZERO] = "DISK_ZERO",
	[REPL_DISK_SYNC] = "DISK_SYNC",
	[REPL_DISK_SYNC_DONE] = "DISK_SYNC_DONE",
	[REPL_EPOCH_END] = "EPOCH_END",
	[REPL_EPOCH_ACK] = "EPOCH_ACK",
	[REPL_HEARTBEAT] = "HEARTBEAT",
	[REPL_BYE] = "BYE",
	[REPL_PAGES_CODED] = "PAGES_CODED",
	[REPL_PAGE_REQUEST] = "PAGE_REQUEST",
	[REPL_PAGE_RESEND] = "PAGE_RESEND",
	[REPL_DEVICE_DELTA] = "DEVICE_DELTA",
	[REPL_FLOW_STATE] = "FLOW_STATE",
	[REPL_FLOW_AHEAD] = "FLOW_AHEAD",
	[REPL_DISK_BASE] = "DISK_BASE",
	[REPL_DISK_PLAN] = "DISK_PLAN",
};

const char *repl_type_name(uint16_t type)
{
	if (type < REPL_TYPE_MIN || type > REPL_TYPE_MAX)
		return "UNKNOWN";
	return type_names[type];
}

const char *repl_page_kind_name(uint8_t kind)
{
	switch (kind) {
	case REPL_KIND_RAW: return "raw";
	case REPL_KIND_ZERO: return "zero";
	case REPL_KIND_XOR_RLE: return "xor_rle";
	case REPL_KIND_LZ4: return "lz4";
	case REPL_KIND_DISK_REF: return "disk_ref";
	default: return "unknown";
	}
}

const char *repl_error_code_name(uint16_t code)
{
	switch (code) {
	case REPL_ERR_VERSION: return "bad version";
	case REPL_ERR_AUTH: return "authentication failed";
	case REPL_ERR_PROTOCOL: return "protocol error";
	case REPL_ERR_BUSY: return "busy";
	case REPL_ERR_INTERNAL: return "internal error";
	case REPL_ERR_REFUSED: return "refused";
	default: return "unknown";
	}
}

void repl_encode_header(uint8_t header[REPL_HEADER_SIZE], uint16_t type, uint32_t length)
{
	store_be16(header, type);
	store_be16(header + 2, 0);
	store_be32(header + 4, length);
}

ssize_t repl_frame_parse(const uint8_t *data, size_t len, struct repl_frame *out,
			 const char **err)
{
	if (len < REPL_HEADER_SIZE)
		return 0;
	uint16_t type = load_be16(data);
	uint16_t flags = load_be16(data + 2);
	uint32_t length = load_be32(data + 4);

	if (type < REPL_TYPE_MIN || type > REPL_TYPE_MAX)
		return repl_fail(err, repl_errf("unknown frame type %u", type));
	if (flags != 0)
		return repl_fail(err, repl_errf("%s frame with flags 0x%04x (must be 0 in every "
						"protocol version so far)", repl_type_name(type),
						flags));
	if (length > REPL_MAX_PAYLOAD)
		return repl_fail(err, repl_errf("%s frame payload of %u bytes exceeds the limit of "
						"%u", repl_type_name(type), length, REPL_MAX_PAYLOAD));
	if (len - REPL_HEADER_SIZE < length)
		return 0;
	out->type = type;
	out->flags = flags;
	out->length = length;
	out->payload = data + REPL_HEADER_SIZE;
	return (ssize_t)(REPL_HEADER_SIZE + (size_t)length);
}

/*
 * Reserves a whole frame in b and writes its header; the caller fills the
 * payload and calls buffer_commit(b, REPL_HEADER_SIZE + length).  NULL
 * (errno set) leaves b unchanged.
 */
uint8_t *repl_begin_frame(struct buffer *b, uint16_t type, size_t length)
{
	if (length > REPL_MAX_PAYLOAD) {
		errno = EINVAL;
		return NULL;
	}
	uint8_t *p = buffer_reserve(b, REPL_HEADER_SIZE + length);
	if (!p) {
		errno = ENOMEM;
		return NULL;
	}
	repl_encode_header(p, type, (uint32_t)length);
	return p + REPL_HEADER_SIZE;
}

void repl_end_frame(struct buffer *b, size_t length)
{
	buffer_commit(b, REPL_HEADER_SIZE + length);
}

/* Every decoder starts here: right type, sane frame. */
int repl_expect_type(const struct repl_frame *f, uint16_t type, const char **err)
{
	if (f->type != type)
		return repl_fail(err, repl_errf("%s frame given to the %s decoder",
						repl_type_name(f->type), repl_type_name(type)));
	if (f->flags != 0 || f->length > REPL_MAX_PAYLOAD || (f->length && !f->payload))
		return repl_fail(err, repl_errf("%s: malformed frame", repl_type_name(type)));
	return 0;
}

int repl_expect_length(const struct repl_frame *f, uint16_t type, uint32_t length,
			 const char **err)
{
	if (repl_expect_type(f, type, err) < 0)
		return -1;
	if (f->length != length)
		return repl_fail(err, repl_errf("%s: payload of %u bytes, expected %u",
						repl_type_name(type), f->length, length));
	return 0;
}

int repl_expect_at_least(const struct repl_frame *f, uint16_t type, uint32_t length,
			   const char **err)
{
	if (repl_expect_type(f, type, err) < 0)
		return -1;
	if (f->length < length)
		return repl_fail(err, repl_errf("%s: payload of %u bytes is shorter than its "
						"%u-byte header", repl_type_name(type), f->length,
						length));
	return 0;
}
