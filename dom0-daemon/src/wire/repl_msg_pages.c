/*
 * Replication protocol v1: framing, messages, page encodings and the
 * epoch checksum (see repl_proto.h and docs/protocol.md).
 *
 * Every decoder follows the same shape: check the frame's type and size,
 * read the fixed fields, then check each variable part against what is
 * left, so that no read can go past the payload whatever the bytes say.
 * Encoders validate their arguments with the same rules before reserving
 * space, so a refused call leaves the buffer as it was.
 */
#include "wire/repl_proto.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/be.h"

#define PAGES_FIXED_SIZE 15  /* be64 epoch, be16 block, u8 encoding, be32 count */
#define DEVICE_FIXED_SIZE 24 /* be64 epoch, be64 total, be64 offset */
/* be64 epoch, be64 total, be64 base length, be64 base XXH3-64, be64 XXH3-64 */
#define DEVICE_DELTA_FIXED_SIZE 40
#define DISK_WRITE_FIXED_SIZE 16
#define DISK_SYNC_FIXED_SIZE 8
#define HELLO_FIXED_SIZE (REPL_HELLO_MAGIC_SIZE + 2u + 1 + 32 + 1)
#define EPOCH_END_SIZE 40

/* ---- helpers ------------------------------------------------------------- */

/*
 * Messages with numbers in them: one buffer per thread, so that *err
 * stays valid until the next call without anybody freeing it.
 */
static _Thread_local char err_text[256];

__attribute__((format(printf, 1, 2)))
static const char *errf(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err_text, sizeof(err_text), fmt, ap);
	va_end(ap);
	return err_text;
}

static int fail(const char **err, const char *msg)
{
	if (err)
		*err = msg;
	return -1;
}

static int invalid(void)
{
	errno = EINVAL;
	return -1;
}

/*
 * Length of the longest prefix of s made of complete, well-formed UTF-8
 * characters (no overlong forms, surrogates or code points > U+10FFFF).
 */
static size_t utf8_valid_prefix(const uint8_t *s, size_t n)
{
	size_t i = 0;

	while (i < n) {
		uint8_t c = s[i];
		size_t need;
		uint8_t lo = 0x80, hi = 0xbf; /* range of the second byte */

		if (c < 0x80) {
			i++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf) {
			need = 1;
		} else if (c >= 0xe0 && c <= 0xef) {
			need = 2;
			if (c == 0xe0)
				lo = 0xa0;
			else if (c == 0xed)
				hi = 0x9f;
		} else if (c >= 0xf0 && c <= 0xf4) {
			need = 3;
			if (c == 0xf0)
				lo = 0x90;
			else if (c == 0xf4)
				hi = 0x8f;
		} else {
			return i;
		}
		if (n - i - 1 < need)
			return i;
		if (s[i + 1] < lo || s[i + 1] > hi)
			return i;
		for (size_t k = 2; k <= need; k++)
			if ((s[i + k] & 0xc0) != 0x80)
				return i;
		i += need + 1;
	}
	return n;
}

static bool is_printable_ascii(const uint8_t *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (s[i] < 0x20 || s[i] > 0x7e)
			return false;
	return true;
}

/*
 * Wire length of an ERROR reason or BYE text: valid UTF-8 or -1, cut to
 * REPL_TEXT_MAX at a character boundary.
 */
static int text_wire_length(const char *text, size_t *len)
{
	if (!text) {
		*len = 0;
		return 0;
	}
	size_t n = strlen(text);
	if (utf8_valid_prefix((const uint8_t *)text, n) != n)
		return -1;
	if (n > REPL_TEXT_MAX)
		n = utf8_valid_prefix((const uint8_t *)text, REPL_TEXT_MAX);
	*len = n;
	return 0;
}

/* A string for a fixed char[cap] field: 1..cap-1 printable ASCII bytes. */
static bool field_string_ok(const char *s, size_t cap, size_t *len)
{
	size_t n = strnlen(s, cap);

	if (n == 0 || n == cap || !is_printable_ascii((const uint8_t *)s, n))
		return false;
	*len = n;
	return true;
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
		return fail(err, errf("unknown frame type %u", type));
	if (flags != 0)
		return fail(err, errf("%s frame with flags 0x%04x (must be 0 in protocol "
				      "version %d)", repl_type_name(type), flags,
				      REPL_PROTOCOL_VERSION));
	if (length > REPL_MAX_PAYLOAD)
		return fail(err, errf("%s frame payload of %u bytes exceeds the limit of "
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

static void end_frame(struct buffer *b, size_t length)
{
	buffer_commit(b, REPL_HEADER_SIZE + length);
}

/* An encoder's fixed-size frame of be64 fields. */
static int put_u64s(struct buffer *b, uint16_t type, const uint64_t *v, size_t n)
{
	uint8_t *p = repl_begin_frame(b, type, n * 8);

	if (!p)
		return -1;
	for (size_t i = 0; i < n; i++)
		store_be64(p + 8 * i, v[i]);
	end_frame(b, n * 8);
	return 0;
}

/* Every decoder starts here: right type, sane frame. */
static int expect_type(const struct repl_frame *f, uint16_t type, const char **err)
{
	if (f->type != type)
		return fail(err, errf("%s frame given to the %s decoder",
				      repl_type_name(f->type), repl_type_name(type)));
	if (f->flags != 0 || f->length > REPL_MAX_PAYLOAD || (f->length && !f->payload))
		return fail(err, errf("%s: malformed frame", repl_type_name(type)));
	return 0;
}

static int expect_length(const struct repl_frame *f, uint16_t type, uint32_t length,
			 const char **err)
{
	if (expect_type(f, type, err) < 0)
		return -1;
	if (f->length != length)
		return fail(err, errf("%s: payload of %u bytes, expected %u",
				      repl_type_name(type), f->length, length));
	return 0;
}

static int expect_at_least(const struct repl_frame *f, uint16_t type, uint32_t length,
			   const char **err)
{
	if (expect_type(f, type, err) < 0)
		return -1;
	if (f->length < length)
		return fail(err, errf("%s: payload of %u bytes is shorter than its "
				      "%u-byte header", repl_type_name(type), f->length,
				      length));
	return 0;
}

/* ---- HELLO, AUTH, ERROR, VM_CONFIG ------------------------------------- */

int repl_put_hello(struct buffer *b, const struct repl_hello *h)
{
	size_t name_len;

	if ((h->role != REPL_ROLE_PRIMARY && h->role != REPL_ROLE_BACKUP) ||
	    !field_string_ok(h->name, sizeof(h->name), &name_len))
		return invalid();
	size_t length = HELLO_FIXED_SIZE + name_len;
	uint8_t *p = repl_begin_frame(b, REPL_HELLO, length);
	if (!p)
		return -1;
	memcpy(p, REPL_HELLO_MAGIC, REPL_HELLO_MAGIC_SIZE);
	store_be16(p + 8, h->version);
	p[10] = h->role;
	memcpy(p + 11, h->nonce, sizeof(h->nonce));
	p[43] = (uint8_t)name_len;
	memcpy(p + 44, h->name, name_len);
	end_frame(b, length);
	return 0;
}

int repl_decode_hello(const struct repl_frame *f, struct repl_hello *out, const char **err)
{
	const uint8_t *p = f->payload;

	if (expect_at_least(f, REPL_HELLO, REPL_HELLO_MAGIC_SIZE + 2, err) < 0)
		return -1;
	if (memcmp(p, REPL_HELLO_MAGIC, REPL_HELLO_MAGIC_SIZE) != 0)
		return fail(err, "HELLO: bad magic (the peer does not speak the remusdb "
			    "replication protocol)");
	memset(out, 0, sizeof(*out));
	out->version = load_be16(p + 8);
	/* Another version may lay out the rest differently: let the caller say so. */
	if (out->version != REPL_PROTOCOL_VERSION)
		return 0;
	if (f->length < HELLO_FIXED_SIZE)
		return fail(err, errf("HELLO: payload of %u bytes is shorter than its "
				      "%u-byte header", f->length, HELLO_FIXED_SIZE));
	uint8_t role = p[10];
	if (role != REPL_ROLE_PRIMARY && role != REPL_ROLE_BACKUP)
		return fail(err, errf("HELLO: unknown role %u", role));
	uint8_t name_len = p[43];
	if (name_len == 0 || name_len > REPL_NAME_MAX)
		return fail(err, errf("HELLO: host name length %u is not 1..%d", name_len,
				      REPL_NAME_MAX));
	if (f->length != HELLO_FIXED_SIZE + (uint32_t)name_len)
		return fail(err, errf("HELLO: payload of %u bytes for a %u-byte host name",
				      f->length, name_len));
	if (!is_printable_ascii(p + 44, name_len))
		return fail(err, "HELLO: host name is not printable ASCII");
	out->role = role;
	memcpy(out->nonce, p + 11, sizeof(out->nonce));
	memcpy(out->name, p + 44, name_len);
	out->name[name_len] = '\0';
	return 0;
}

int repl_put_auth(struct buffer *b, uint16_t type, const uint8_t mac[32])
{
	if (type != REPL_AUTH && type != REPL_AUTH_OK)
		return invalid();
	uint8_t *p = repl_begin_frame(b, type, 32);
	if (!p)
		return -1;
	memcpy(p, mac, 32);
	end_frame(b, 32);
	return 0;
}

int repl_decode_auth(const struct repl_frame *f, const uint8_t **mac, const char **err)
{
	uint16_t type = f->type == REPL_AUTH_OK ? REPL_AUTH_OK : REPL_AUTH;

	if (expect_length(f, type, 32, err) < 0)
		return -1;
	*mac = f->payload;
	return 0;
}

int repl_put_error(struct buffer *b, uint16_t code, const char *reason)
{
	size_t n;

	if (code < REPL_ERR_VERSION || code > REPL_ERR_REFUSED ||
	    text_wire_length(reason, &n) < 0)
		return invalid();
	uint8_t *p = repl_begin_frame(b, REPL_ERROR, 2 + n);
	if (!p)
		return -1;
	store_be16(p, code);
	if (n)
		memcpy(p + 2, reason, n);
	end_frame(b, 2 + n);
	return 0;
}

/* ERROR reason and BYE text: <= REPL_TEXT_MAX bytes of UTF-8 without NUL. */
static int check_text(const uint8_t *s, size_t n, uint16_t type, const char **err)
{
	if (n > REPL_TEXT_MAX)
		return fail(err, errf("%s: text of %zu bytes exceeds %d", repl_type_name(type),
				      n, REPL_TEXT_MAX));
	if (utf8_valid_prefix(s, n) != n || memchr(s, '\0', n))
		return fail(err, errf("%s: text is not valid UTF-8", repl_type_name(type)));
	return 0;
}

int repl_decode_error(const struct repl_frame *f, struct repl_error *out, const char **err)
{
	if (expect_at_least(f, REPL_ERROR, 2, err) < 0)
		return -1;
	uint16_t code = load_be16(f->payload);
	if (code < REPL_ERR_VERSION || code > REPL_ERR_REFUSED)
		return fail(err, errf("ERROR: unknown error code %u", code));
	if (check_text(f->payload + 2, f->length - 2, REPL_ERROR, err) < 0)
		return -1;
	out->code = code;
	out->reason = (const char *)f->payload + 2;
	out->reason_len = f->length - 2;
	return 0;
}

int repl_put_vm_config(struct buffer *b, const char *json, size_t len)
{
	if (!json || len == 0 || len > REPL_VM_CONFIG_MAX ||
	    utf8_valid_prefix((const uint8_t *)json, len) != len)
		return invalid();
	uint8_t *p = repl_begin_frame(b, REPL_VM_CONFIG, len);
	if (!p)
		return -1;
	memcpy(p, json, len);
	end_frame(b, len);
	return 0;
}

int repl_decode_vm_config(const struct repl_frame *f, const char **json, size_t *len,
			  const char **err)
{
	if (expect_type(f, REPL_VM_CONFIG, err) < 0)
		return -1;
	if (f->length == 0)
		return fail(err, "VM_CONFIG: empty");
	if (f->length > REPL_VM_CONFIG_MAX)
		return fail(err, errf("VM_CONFIG: %u bytes exceed the limit of %u",
				      f->length, REPL_VM_CONFIG_MAX));
	if (utf8_valid_prefix(f->payload, f->length) != f->length)
		return fail(err, "VM_CONFIG: not valid UTF-8");
	*json = (const char *)f->payload;
	*len = f->length;
	return 0;
}

/* ---- RAM_LAYOUT ---------------------------------------------------------- */

static bool duplicate_block(const struct repl_ram_layout *l, unsigned upto)
{
	for (unsigned i = 0; i < upto; i++)
		if (strcmp(l->blocks[i].name, l->blocks[upto].name) == 0)
			return true;
	return false;
}

int repl_put_ram_layout(struct buffer *b, const struct repl_ram_layout *l)
{
	size_t mt_len, name_len[REPL_MAX_BLOCKS];
	size_t length;

	if (l->ram_section_id == 0 || l->block_count == 0 ||
	    l->block_count > REPL_MAX_BLOCKS ||
	    !field_string_ok(l->machine_type, sizeof(l->machine_type), &mt_len))
		return invalid();
	length = 4 + 1 + mt_len + 2;
	for (unsigned i = 0; i < l->block_count; i++) {
		const struct repl_ram_block *blk = &l->blocks[i];
		if (!field_string_ok(blk->name, sizeof(blk->name), &name_len[i]) ||
		    blk->length == 0 || blk->length % REPL_PAGE_SIZE != 0 ||
		    duplicate_block(l, i))
			return invalid();
		length += 1 + name_len[i] + 8;
	}
	uint8_t *p = repl_begin_frame(b, REPL_RAM_LAYOUT, length);
	if (!p)
		return -1;
	store_be32(p, l->ram_section_id);
	p[4] = (uint8_t)mt_len;
	memcpy(p + 5, l->machine_type, mt_len);
	p += 5 + mt_len;
	store_be16(p, l->block_count);
	p += 2;
	for (unsigned i = 0; i < l->block_count; i++) {
		*p++ = (uint8_t)name_len[i];
		memcpy(p, l->blocks[i].name, name_len[i]);
		p += name_len[i];
		store_be64(p, l->blocks[i].length);
		p += 8;
	}
	end_frame(b, length);
	return 0;
}

/*
 * Reads a u8-length-prefixed printable string of 1..255 bytes into dst
 * (char[256]).  Returns the bytes taken from p, or 0 with *err set.
 */
static size_t read_short_string(const uint8_t *p, size_t left, char dst[256],
				const char *what, const char **err)
{
	if (left < 1) {
		fail(err, errf("RAM_LAYOUT: payload ends before the %s", what));
		return 0;
	}
	size_t n = p[0];
	if (n == 0) {
		fail(err, errf("RAM_LAYOUT: %s is empty", what));
		return 0;
	}
	if (left - 1 < n) {
		fail(err, errf("RAM_LAYOUT: %s of %zu bytes runs past the payload", what, n));
		return 0;
	}
	if (!is_printable_ascii(p + 1, n)) {
		fail(err, errf("RAM_LAYOUT: %s is not printable ASCII", what));
		return 0;
	}
	memcpy(dst, p + 1, n);
	dst[n] = '\0';
	return 1 + n;
}

int repl_decode_ram_layout(const struct repl_frame *f, struct repl_ram_layout *out,
			   const char **err)
{
	const uint8_t *p = f->payload;
	size_t left = f->length;
	size_t n;

	if (expect_at_least(f, REPL_RAM_LAYOUT, 4, err) < 0)
		return -1;
	memset(out, 0, sizeof(*out));
	out->ram_section_id = load_be32(p);
	if (out->ram_section_id == 0)
		return fail(err, "RAM_LAYOUT: ram section id 0 (QEMU would match it to "
			    "another section on restore)");
	p += 4;
	left -= 4;
	n = read_short_string(p, left, out->machine_type, "machine type", err);
	if (!n)
		return -1;
	p += n;
	left -= n;
	if (left < 2)
		return fail(err, "RAM_LAYOUT: payload ends before the block count");
	out->block_count = load_be16(p);
	p += 2;
	left -= 2;
	if (out->block_count == 0 || out->block_count > REPL_MAX_BLOCKS)
		return fail(err, errf("RAM_LAYOUT: block count %u is not 1..%d",
				      out->block_count, REPL_MAX_BLOCKS));
	for (unsigned i = 0; i < out->block_count; i++) {
		struct repl_ram_block *blk = &out->blocks[i];
		char what[32];

		snprintf(what, sizeof(what), "name of block %u", i);
		n = read_short_string(p, left, blk->name, what, err);
		if (!n)
			return -1;
		p += n;
		left -= n;
		if (left < 8)
			return fail(err, errf("RAM_LAYOUT: payload ends before the length "
					      "of block %u", i));
		blk->length = load_be64(p);
		p += 8;
		left -= 8;
		if (blk->length == 0 || blk->length % REPL_PAGE_SIZE != 0)
			return fail(err, errf("RAM_LAYOUT: block %u length %llu is not a "
					      "positive multiple of %d", i,
					      (unsigned long long)blk->length,
					      REPL_PAGE_SIZE));
		if (duplicate_block(out, i))
			return fail(err, errf("RAM_LAYOUT: block %u repeats the name %s", i,
					      blk->name));
	}
	if (left != 0)
		return fail(err, errf("RAM_LAYOUT: %zu bytes after the last block", left));
	return 0;
}

/* ---- PAGES and page encodings ---------------------------------------- */

/*
 * The one place that knows how much data each encoding carries for count
 * pages.  A variable-length encoding will check its own framing here.
 */
static int check_encoded_data(uint8_t encoding, uint32_t count, size_t data_len,
			      const char **err)
{
	switch (encoding) {
	case REPL_ENCODING_RAW:
		if (data_len != (size_t)count * REPL_PAGE_SIZE)
			return fail(err, errf("PAGES: %zu bytes of RAW data for %u pages "
					      "(expected %zu)", data_len, count,
					      (size_t)count * REPL_PAGE_SIZE));
		return 0;
	case REPL_ENCODING_ZERO:
		if (data_len != 0)
			return fail(err, errf("PAGES: %zu bytes of data after ZERO pages",
					      data_len));
		return 0;
	default:
		return fail(err, errf("PAGES: unknown page encoding %u", encoding));
	}
}

int repl_pages_decode_page(const struct repl_pages *p, uint32_t i,
			   uint8_t out[REPL_PAGE_SIZE])
{
	if (i >= p->count)
		return -1;
	switch (p->encoding) {
	case REPL_ENCODING_RAW:
		memcpy(out, p->data + (size_t)i * REPL_PAGE_SIZE, REPL_PAGE_SIZE);
		return 0;
	case REPL_ENCODING_ZERO:
		memset(out, 0, REPL_PAGE_SIZE);
		return 0;
	default:
		return -1;
	}
}

uint64_t repl_pages_index(const struct repl_pages *p, uint32_t i)
{
	return load_be64(p->page_indexes_be + (size_t)i * 8);
}

/* Count, block and indexes: the rules both directions share. */
static int check_pages_header(uint16_t block, uint32_t count, const char **err)
{
	if (count == 0)
		return fail(err, "PAGES: count 0");
	if (count > REPL_MAX_PAGES_PER_FRAME)
		return fail(err, errf("PAGES: count %u exceeds %d", count,
				      REPL_MAX_PAGES_PER_FRAME));
	if (block >= REPL_MAX_BLOCKS)
		return fail(err, errf("PAGES: block index %u is beyond the %d blocks a "
				      "RAM_LAYOUT can have", block, REPL_MAX_BLOCKS));
	return 0;
}

static int check_page_index(uint64_t index, uint64_t prev, uint32_t i, const char **err)
{
	if (index > REPL_MAX_PAGE_INDEX)
		return fail(err, errf("PAGES: page index %llu is out of range",
				      (unsigned long long)index));
	if (i > 0 && index <= prev)
		return fail(err, errf("PAGES: page index %llu follows %llu (indexes must be "
				      "strictly increasing)", (unsigned long long)index,
				      (unsigned long long)prev));
	return 0;
}

int repl_put_pages(struct buffer *b, uint64_t epoch, uint16_t block, uint8_t encoding,
		   uint32_t count, const uint64_t *page_indexes, const uint8_t *data,
		   size_t data_len)
{
	if (check_pages_header(block, count, NULL) < 0 || !page_indexes ||
	    check_encoded_data(encoding, count, data_len, NULL) < 0 ||
	    (data_len && !data))
		return invalid();
	for (uint32_t i = 0; i < count; i++)
		if (check_page_index(page_indexes[i], i ? page_indexes[i - 1] : 0, i, NULL) < 0)
			return invalid();
	size_t length = PAGES_FIXED_SIZE + (size_t)count * 8 + data_len;
	uint8_t *p = repl_begin_frame(b, REPL_PAGES, length);
	if (!p)
		return -1;
	store_be64(p, epoch);
	store_be16(p + 8, block);
	p[10] = encoding;
	store_be32(p + 11, count);
	p += PAGES_FIXED_SIZE;
	for (uint32_t i = 0; i < count; i++, p += 8)
		store_be64(p, page_indexes[i]);
	if (data_len)
		memcpy(p, data, data_len);
	end_frame(b, length);
	return 0;
}

int repl_decode_pages(const struct repl_frame *f, struct repl_pages *out, const char **err)
{
	const uint8_t *p = f->payload;

	if (expect_at_least(f, REPL_PAGES, PAGES_FIXED_SIZE, err) < 0)
		return -1;
	memset(out, 0, sizeof(*out));
	out->epoch = load_be64(p);
	out->block = load_be16(p + 8);
	out->encoding = p[10];
	out->count = load_be32(p + 11);
	if (check_pages_header(out->block, out->count, err) < 0)
		return -1;
	size_t indexes_len = (size_t)out->count * 8;
	if (f->length - PAGES_FIXED_SIZE < indexes_len)
		return fail(err, errf("PAGES: payload of %u bytes cannot hold %u page indexes",
				      f->length, out->count));
	out->page_indexes_be = p + PAGES_FIXED_SIZE;
	uint64_t prev = 0;
	for (uint32_t i = 0; i < out->count; i++) {
		uint64_t index = repl_pages_index(out, i);
		if (check_page_index(index, prev, i, err) < 0)
			return -1;
		prev = index;
	}
	out->data = out->page_indexes_be + indexes_len;
	out->data_len = f->length - PAGES_FIXED_SIZE - indexes_len;
	return check_encoded_data(out->encoding, out->count, out->data_len, err);
}

/* ---- PAGES_CODED, PAGE_REQUEST, PAGE_RESEND ----------------------------- */

#define PAGE_REQUEST_SIZE 19 /* be64 epoch, be16 block, be64 index, u8 reason */
#define PAGE_RESEND_FIXED 18 /* be64 epoch, be16 block, be64 index */

bool repl_coded_kind_length_ok(uint8_t kind, uint32_t len)
{
	switch (kind) {
	case REPL_KIND_RAW: return len == REPL_PAGE_SIZE;
	case REPL_KIND_ZERO: return len == 0;
	/* an empty delta: the page was rewritten with what it held (page_delta.h) */
	case REPL_KIND_XOR_RLE: return len <= REPL_CODED_MAX;
	case REPL_KIND_LZ4: return len >= 1 && len <= REPL_CODED_MAX;
	case REPL_KIND_DISK_REF: return len == REPL_DISK_REF_SIZE;
	default: return false;
	}
}

/*
 * One record at p with `left` bytes: its size, or 0 with *err.  The index
 * must be above prev unless first.  Shared by the decoder and by
 * repl_coded_note, so what an encoder hook appends obeys the same rules.
 */
static size_t check_record(const uint8_t *p, size_t left, bool first, uint64_t prev,
			   uint32_t i, const char **err)
{
	if (left < REPL_CODED_RECORD_HEADER) {
		fail(err, errf("PAGES_CODED: record %u: %zu bytes left, shorter than a "
			       "record header", i, left));
		return 0;
	}
	uint64_t index = load_be64(p);
	uint8_t kind = p[8];
	uint32_t len = load_be32(p + 17);

	if (index > REPL_MAX_PAGE_INDEX) {
		fail(err, errf("PAGES_CODED: page index %llu is out of range",
			       (unsigned long long)index));
		return 0;
	}
	if (!first && index <= prev) {
		fail(err, errf("PAGES_CODED: page index %llu follows %llu (indexes must be "
			       "strictly increasing)", (unsigned long long)index,
			       (unsigned long long)prev));
		return 0;
	}
	if (kind >= REPL_KIND_COUNT) {
		fail(err, errf("PAGES_CODED: page %llu has unknown kind %u",
			       (unsigned long long)index, kind));
		return 0;
	}
	if (!repl_coded_kind_length_ok(kind, len)) {
		fail(err, errf("PAGES_CODED: page %llu: %u bytes of %s data", (unsigned long long)index,
			       len, repl_page_kind_name(kind)));
		return 0;
	}
	if (left - REPL_CODED_RECORD_HEADER < len) {
		fail(err, errf("PAGES_CODED: page %llu: %u bytes of data run past the payload",
			       (unsigned long long)index, len));
		return 0;
	}
	return REPL_CODED_RECORD_HEADER + (size_t)len;
}

int repl_decode_pages_coded(const struct repl_frame *f, struct repl_pages_coded *out,
			    const char **err)
{
	const uint8_t *p = f->payload;

	if (expect_at_least(f, REPL_PAGES_CODED, REPL_PAGES_CODED_FIXED, err) < 0)
		return -1;
	memset(out, 0, sizeof(*out));
	out->epoch = load_be64(p);
	out->block = load_be16(p + 8);
	out->count = load_be32(p + 10);
	if (out->count == 0)
		return fail(err, "PAGES_CODED: count 0");
	if (out->count > REPL_MAX_PAGES_PER_FRAME)
		return fail(err, errf("PAGES_CODED: count %u exceeds %d", out->count,
				      REPL_MAX_PAGES_PER_FRAME));
	if (out->block >= REPL_MAX_BLOCKS)
		return fail(err, errf("PAGES_CODED: block index %u is beyond the %d blocks a "
				      "RAM_LAYOUT can have", out->block, REPL_MAX_BLOCKS));
	out->records = p + REPL_PAGES_CODED_FIXED;
	out->records_len = f->length - REPL_PAGES_CODED_FIXED;
	size_t pos = 0;
	uint64_t prev = 0;
	for (uint32_t i = 0; i < out->count; i++) {
		size_t n = check_record(out->records + pos, out->records_len - pos, i == 0,
					prev, i, err);
		if (!n)
			return -1;
		prev = load_be64(out->records + pos);
		pos += n;
	}
	if (pos != out->records_len)
		return fail(err, errf("PAGES_CODED: %zu bytes after the last of %u records",
				      out->records_len - pos, out->count));
	return 0;
}

void repl_coded_iter_init(struct repl_coded_iter *it, const struct repl_pages_coded *pc)
{
	it->p = pc->records;
	it->left = pc->count;
}

bool repl_coded_iter_next(struct repl_coded_iter *it, struct repl_coded_page *out)
{
	if (it->left == 0)
		return false;
	out->index = load_be64(it->p);
	out->kind = it->p[8];
	out->checksum = load_be64(it->p + 9);
	out->len = load_be32(it->p + 17);
	out->data = it->p + REPL_CODED_RECORD_HEADER;
	it->p += REPL_CODED_RECORD_HEADER + (size_t)out->len;
	it->left--;
	return true;
}

int repl_coded_begin(struct repl_coded_builder *cb, struct buffer *b, uint64_t epoch,
		     uint16_t block)
{
	if (block >= REPL_MAX_BLOCKS)
		return invalid();
	memset(cb, 0, sizeof(*cb));
	cb->b = b;
	cb->frame_at = buffer_len(b);
	cb->epoch = epoch;
	cb->block = block;
	uint8_t *p = buffer_reserve(b, REPL_HEADER_SIZE + REPL_PAGES_CODED_FIXED);
	if (!p) {
		errno = ENOMEM;
		return -1;
	}
	repl_encode_header(p, REPL_PAGES_CODED, 0);
	store_be64(p + REPL_HEADER_SIZE, epoch);
	store_be16(p + REPL_HEADER_SIZE + 8, block);
	store_be32(p + REPL_HEADER_SIZE + 10, 0);
	buffer_commit(b, REPL_HEADER_SIZE + REPL_PAGES_CODED_FIXED);
	return 0;
}

int repl_put_coded_page(struct buffer *b, uint64_t index, uint8_t kind, uint64_t checksum,
			const uint8_t *data, uint32_t len)
{
	if (index > REPL_MAX_PAGE_INDEX || !repl_coded_kind_length_ok(kind, len) ||
	    (len && !data))
		return invalid();
	uint8_t *p = buffer_reserve(b, REPL_CODED_RECORD_HEADER + (size_t)len);
	if (!p) {
		errno = ENOMEM;
		return -1;
	}
	store_be64(p, index);
	p[8] = kind;
	store_be64(p + 9, checksum);
	store_be32(p + 17, len);
	if (len)
		memcpy(p + REPL_CODED_RECORD_HEADER, data, len);
	buffer_commit(b, REPL_CODED_RECORD_HEADER + (size_t)len);
	return 0;
}

size_t repl_coded_payload_len(const struct repl_coded_builder *cb)
{
	return buffer_len(cb->b) - cb->frame_at - REPL_HEADER_SIZE;
}

int repl_coded_note(struct repl_coded_builder *cb, size_t before)
{
	size_t len = buffer_len(cb->b);
	const uint8_t *rec = buffer_head(cb->b) + before;

	if (before < cb->frame_at + REPL_HEADER_SIZE + REPL_PAGES_CODED_FIXED || before > len ||
	    cb->count >= REPL_MAX_PAGES_PER_FRAME ||
	    check_record(rec, len - before, cb->count == 0, cb->last_index, cb->count,
			 NULL) != len - before ||
	    repl_coded_payload_len(cb) > REPL_MAX_PAYLOAD) {
		if (before <= len)
			cb->b->end -= len - before;
		return invalid();
	}
	cb->last_index = load_be64(rec);
	cb->count++;
	return 0;
}

void repl_coded_end(struct repl_coded_builder *cb)
{
	uint8_t *frame = buffer_head(cb->b) + cb->frame_at;

	if (cb->count == 0) {
		cb->b->end -= buffer_len(cb->b) - cb->frame_at;
		return;
	}
	repl_encode_header(frame, REPL_PAGES_CODED, (uint32_t)repl_coded_payload_len(cb));
	store_be32(frame + REPL_HEADER_SIZE + 10, cb->count);
}

int repl_put_page_request(struct buffer *b, const struct repl_page_request *r)
{
	if (r->block >= REPL_MAX_BLOCKS || r->index > REPL_MAX_PAGE_INDEX ||
	    r->reason < REPL_REQ_CHECKSUM || r->reason > REPL_REQ_UNDECODABLE)
		return invalid();
	uint8_t *p = repl_begin_frame(b, REPL_PAGE_REQUEST, PAGE_REQUEST_SIZE);
	if (!p)
		return -1;
	store_be64(p, r->epoch);
	store_be16(p + 8, r->block);
	store_be64(p + 10, r->index);
	p[18] = r->reason;
	end_frame(b, PAGE_REQUEST_SIZE);
	return 0;
}

int repl_decode_page_request(const struct repl_frame *f, struct repl_page_request *out,
			     const char **err)
{
	if (expect_length(f, REPL_PAGE_REQUEST, PAGE_REQUEST_SIZE, err) < 0)
		return -1;
	out->epoch = load_be64(f->payload);
	out->block = load_be16(f->payload + 8);
	out->index = load_be64(f->payload + 10);
	out->reason = f->payload[18];
	if (out->block >= REPL_MAX_BLOCKS)
		return fail(err, errf("PAGE_REQUEST: block index %u is out of range", out->block));
	if (out->index > REPL_MAX_PAGE_INDEX)
		return fail(err, errf("PAGE_REQUEST: page index %llu is out of range",
				      (unsigned long long)out->index));
	if (out->reason < REPL_REQ_CHECKSUM || out->reason > REPL_REQ_UNDECODABLE)
		return fail(err, errf("PAGE_REQUEST: unknown reason %u", out->reason));
	return 0;
}

int repl_put_page_resend(struct buffer *b, uint64_t epoch, uint16_t block, uint64_t index,
			 const uint8_t page[REPL_PAGE_SIZE])
{
	if (block >= REPL_MAX_BLOCKS || index > REPL_MAX_PAGE_INDEX || !page)
		return invalid();
	uint8_t *p = repl_begin_frame(b, REPL_PAGE_RESEND, PAGE_RESEND_FIXED + REPL_PAGE_SIZE);
	if (!p)
		return -1;
	store_be64(p, epoch);
	store_be16(p + 8, block);
	store_be64(p + 10, index);
	memcpy(p + PAGE_RESEND_FIXED, page, REPL_PAGE_SIZE);
	end_frame(b, PAGE_RESEND_FIXED + REPL_PAGE_SIZE);
	return 0;
}

int repl_decode_page_resend(const struct repl_frame *f, struct repl_page_resend *out,
			    const char **err)
{
	if (expect_length(f, REPL_PAGE_RESEND, PAGE_RESEND_FIXED + REPL_PAGE_SIZE, err) < 0)
		return -1;
	out->epoch = load_be64(f->payload);
	out->block = load_be16(f->payload + 8);
	out->index = load_be64(f->payload + 10);
	out->data = f->payload + PAGE_RESEND_FIXED;
	if (out->block >= REPL_MAX_BLOCKS)
		return fail(err, errf("PAGE_RESEND: block index %u is out of range", out->block));
	if (out->index > REPL_MAX_PAGE_INDEX)
		return fail(err, errf("PAGE_RESEND: page index %llu is out of range",
				      (unsigned long long)out->index));
	return 0;
}

/* ---- DEVICE and disk messages ------------------------------------------ */

int repl_put_device(struct buffer *b, uint64_t epoch, uint64_t total, uint64_t offset,
		    const uint8_t *d, size_t n)
{
	if (n == 0 || !d || offset > total || n > total - offset)
		return invalid();
	size_t length = DEVICE_FIXED_SIZE + n;
	uint8_t *p = repl_begin_frame(b, REPL_DEVICE, length);
	if (!p)
		return -1;
	store_be64(p, epoch);
	store_be64(p + 8, total);
	store_be64(p + 16, offset);
	memcpy(p + DEVICE_FIXED_SIZE, d, n);
	end_frame(b, length);
	return 0;
}

int repl_decode_device(const struct repl_frame *f, struct repl_device *out, const char **err)
{
	const uint8_t *p = f->payload;

	if (expect_at_least(f, REPL_DEVICE, DEVICE_FIXED_SIZE, err) < 0)
		return -1;
	out->epoch = load_be64(p);
	out->total = load_be64(p + 8);
	out->offset = load_be64(p + 16);
	out->data = p + DEVICE_FIXED_SIZE;
	out->len = f->length - DEVICE_FIXED_SIZE;
	if (out->len == 0)
		return fail(err, "DEVICE: empty chunk");
	if (out->offset > out->total || out->len > out->total - out->offset)
		return fail(err, errf("DEVICE: chunk at %llu (+%zu) is beyond the blob's "
				      "%llu bytes", (unsigned long long)out->offset,
				      out->len, (unsigned long long)out->total));
	return 0;
}

int repl_put_device_delta(struct buffer *b, const struct repl_device_delta *d)
{
	if (d->total == 0 || d->records_len == 0 || !d->records ||
	    d->records_len > REPL_MAX_PAYLOAD - DEVICE_DELTA_FIXED_SIZE)
		return invalid();
	size_t length = DEVICE_DELTA_FIXED_SIZE + d->records_len;
	uint8_t *p = repl_begin_frame(b, REPL_DEVICE_DELTA, length);
	if (!p)
		return -1;
	store_be64(p, d->epoch);
	store_be64(p + 8, d->total);
	store_be64(p + 16, d->base_len);
	store_be64(p + 24, d->base_sum);
	store_be64(p + 32, d->sum);
	memcpy(p + DEVICE_DELTA_FIXED_SIZE, d->records, d->records_len);
	end_frame(b, length);
	return 0;
}

int repl_decode_device_delta(const struct repl_frame *f, struct repl_device_delta *out,
			     const char **err)
{
	const uint8_t *p = f->payload;

	if (expect_at_least(f, REPL_DEVICE_DELTA, DEVICE_DELTA_FIXED_SIZE + 1, err) < 0)
		return -1;
	out->epoch = load_be64(p);
	out->total = load_be64(p + 8);
	out->base_len = load_be64(p + 16);
	out->base_sum = load_be64(p + 24);
	out->sum = load_be64(p + 32);
	out->records = p + DEVICE_DELTA_FIXED_SIZE;
	out->records_len = f->length - DEVICE_DELTA_FIXED_SIZE;
	if (out->total == 0)
		return fail(err, "DEVICE_DELTA: empty blob");
	return 0;
}

/* DISK_WRITE, DISK_SYNC: a range that must not wrap around. */
static bool range_ok(uint64_t offset, uint64_t len)
{
	return len > 0 && offset <= UINT64_MAX - len;
}

int repl_put_disk_write(struct buffer *b, uint64_t epoch, uint64_t offset,
			const uint8_t *d, size_t n)
{
	if (!d || !range_ok(offset, n))
		return invalid();
	size_t length = DISK_WRITE_FIXED_SIZE + n;
	uint8_t *p = repl_begin_frame(b, REPL_DISK_WRITE, length);
	if (!p)
		return -1;
	store_be64(p, epoch);
	store_be64(p + 8, offset);
	memcpy(p + DISK_WRITE_FIXED_SIZE, d, n);
	end_frame(b, length);
	return 0;
}

int repl_decode_disk_write(const struct repl_frame *f, struct repl_disk_write *out,
			   const char **err)
{
	if (expect_at_least(f, REPL_DISK_WRITE, DISK_WRITE_FIXED_SIZE, err) < 0)
		return -1;
	out->epoch = load_be64(f->payload);
	out->offset = load_be64(f->payload + 8);
	out->data = f->payload + DISK_WRITE_FIXED_SIZE;
	out->len = f->length - DISK_WRITE_FIXED_SIZE;
	if (out->len == 0)
		return fail(err, "DISK_WRITE: no data");
	if (!range_ok(out->offset, out->len))
		return fail(err, errf("DISK_WRITE: offset %llu + %zu bytes overflows",
				      (unsigned long long)out->offset, out->len));
	return 0;
}

int repl_put_disk_zero(struct buffer *b, uint64_t epoch, uint64_t offset, uint64_t length)
{
	const uint64_t v[] = { epoch, offset, length };

	if (!range_ok(offset, length))
		return invalid();
	return put_u64s(b, REPL_DISK_ZERO, v, 3);
}

int repl_decode_disk_zero(const struct repl_frame *f, struct repl_disk_zero *out,
			  const char **err)
{
	if (expect_length(f, REPL_DISK_ZERO, 24, err) < 0)
		return -1;
	out->epoch = load_be64(f->payload);
	out->offset = load_be64(f->payload + 8);
	out->length = load_be64(f->payload + 16);
	if (out->length == 0)
		return fail(err, "DISK_ZERO: length 0");
	if (!range_ok(out->offset, out->length))
		return fail(err, errf("DISK_ZERO: offset %llu + %llu bytes overflows",
				      (unsigned long long)out->offset,
				      (unsigned long long)out->length));
	return 0;
}

int repl_put_disk_sync(struct buffer *b, uint64_t offset, const uint8_t *d, size_t n)
{
	if (!d || !range_ok(offset, n))
		return invalid();
	size_t length = DISK_SYNC_FIXED_SIZE + n;
	uint8_t *p = repl_begin_frame(b, REPL_DISK_SYNC, length);
	if (!p)
		return -1;
	store_be64(p, offset);
	memcpy(p + DISK_SYNC_FIXED_SIZE, d, n);
	end_frame(b, length);
	return 0;
}

int repl_decode_disk_sync(const struct repl_frame *f, struct repl_disk_sync *out,
			  const char **err)
{
	if (expect_at_least(f, REPL_DISK_SYNC, DISK_SYNC_FIXED_SIZE, err) < 0)
		return -1;
	out->offset = load_be64(f->payload);
	out->data = f->payload + DISK_SYNC_FIXED_SIZE;
	out->len = f->length - DISK_SYNC_FIXED_SIZE;
	if (out->len == 0)
		return fail(err, "DISK_SYNC: no data");
	if (!range_ok(out->offset, out->len))
		return fail(err, errf("DISK_SYNC: offset %llu + %zu bytes overflows",
				      (unsigned long long)out->offset, out->len));
	return 0;
}

int repl_put_disk_sync_done(struct buffer *b, uint64_t size)
{
	return put_u64s(b, REPL_DISK_SYNC_DONE, &size, 1);
}

int repl_decode_disk_sync_done(const struct repl_frame *f, uint64_t *size, const char **err)
{
	if (expect_length(f, REPL_DISK_SYNC_DONE, 8, err) < 0)
		return -1;
	*size = load_be64(f->payload);
	return 0;
}

/* ---- DISK_BASE, DISK_PLAN --------------------------------------------- */

#define DISK_BASE_FIXED_SIZE 32
#define DISK_PLAN_FIXED_SIZE 16
/* A bitmap that fits one frame: 16 MiB of bits is a 128 TiB disk at 1 MiB. */
#define DISK_MAX_EXTENTS ((uint64_t)(REPL_MAX_PAYLOAD - DISK_BASE_FIXED_SIZE - REPL_TEXT_MAX) * 8)

static size_t bitmap_bytes(uint64_t extent_count)
{
	return (size_t)((extent_count + 7) / 8);
}

int repl_put_disk_base(struct buffer *b, const struct repl_disk_base *d)
{
	if (d->generation == 0 || d->extent_count == 0 || d->extent_count > DISK_MAX_EXTENTS ||
	    !d->bits)
		return invalid();
	size_t nb = bitmap_bytes(d->extent_count), length = DISK_BASE_FIXED_SIZE + nb;
	uint8_t *p = repl_begin_frame(b, REPL_DISK_BASE, length);
	if (!p)
		return -1;
	store_be64(p, d->generation);
	store_be64(p + 8, d->base_generation);
	store_be32(p + 16, REPL_DISK_EXTENT_SHIFT);
	store_be32(p + 20, d->flags);
	store_be64(p + 24, d->extent_count);
	memcpy(p + DISK_BASE_FIXED_SIZE, d->bits, nb);
	end_frame(b, length);
	return 0;
}

int repl_decode_disk_base(const struct repl_frame *f, struct repl_disk_base *out,
			  const char **err)
{
	if (expect_at_least(f, REPL_DISK_BASE, DISK_BASE_FIXED_SIZE, err) < 0)
		return -1;
	const uint8_t *p = f->payload;
	out->generation = load_be64(p);
	out->base_generation = load_be64(p + 8);
	out->flags = load_be32(p + 20);
	out->extent_count = load_be64(p + 24);
	out->bits = p + DISK_BASE_FIXED_SIZE;
	if (out->generation == 0)
		return fail(err, "DISK_BASE: generation 0");
	if (load_be32(p + 16) != REPL_DISK_EXTENT_SHIFT)
		return fail(err, errf("DISK_BASE: extents of 2^%u bytes, not 2^%u",
				      load_be32(p + 16), REPL_DISK_EXTENT_SHIFT));
	if (out->flags & ~REPL_DISK_BASE_FULL_ASKED)
		return fail(err, errf("DISK_BASE: unknown flags 0x%x", out->flags));
	if (out->extent_count == 0 || out->extent_count > DISK_MAX_EXTENTS ||
	    f->length != DISK_BASE_FIXED_SIZE + bitmap_bytes(out->extent_count))
		return fail(err, errf("DISK_BASE: %llu extents do not match a payload of %u "
				      "bytes", (unsigned long long)out->extent_count, f->length));
	return 0;
}

int repl_put_disk_plan(struct buffer *b, const struct repl_disk_plan *d)
{
	size_t n;

	if (d->extent_count == 0 || d->extent_count > DISK_MAX_EXTENTS ||
	    (d->resync && !d->bits) || text_wire_length(d->reason, &n) < 0)
		return invalid();
	size_t nb = d->resync ? bitmap_bytes(d->extent_count) : 0;
	size_t length = DISK_PLAN_FIXED_SIZE + n + nb;
	uint8_t *p = repl_begin_frame(b, REPL_DISK_PLAN, length);
	if (!p)
		return -1;
	p[0] = d->resync ? 1 : 0;
	p[1] = 0;
	store_be16(p + 2, (uint16_t)n);
	store_be32(p + 4, REPL_DISK_EXTENT_SHIFT);
	store_be64(p + 8, d->extent_count);
	memcpy(p + DISK_PLAN_FIXED_SIZE, d->reason, n);
	if (nb)
		memcpy(p + DISK_PLAN_FIXED_SIZE + n, d->bits, nb);
	end_frame(b, length);
	return 0;
}

int repl_decode_disk_plan(const struct repl_frame *f, struct repl_disk_plan *out,
			  const char **err)
{
	if (expect_at_least(f, REPL_DISK_PLAN, DISK_PLAN_FIXED_SIZE, err) < 0)
		return -1;
	const uint8_t *p = f->payload;
	if (p[0] > 1 || p[1] != 0)
		return fail(err, errf("DISK_PLAN: unknown mode %u", p[0]));
	if (load_be32(p + 4) != REPL_DISK_EXTENT_SHIFT)
		return fail(err, errf("DISK_PLAN: extents of 2^%u bytes, not 2^%u",
				      load_be32(p + 4), REPL_DISK_EXTENT_SHIFT));
	out->resync = p[0] == 1;
	out->reason_len = load_be16(p + 2);
	out->extent_count = load_be64(p + 8);
	if (out->extent_count == 0 || out->extent_count > DISK_MAX_EXTENTS)
		return fail(err, errf("DISK_PLAN: %llu extents",
				      (unsigned long long)out->extent_count));
	size_t nb = out->resync ? bitmap_bytes(out->extent_count) : 0;
	if ((uint64_t)f->length != DISK_PLAN_FIXED_SIZE + out->reason_len + nb)
		return fail(err, errf("DISK_PLAN: a payload of %u bytes does not hold its "
				      "reason and bitmap", f->length));
	if (check_text(p + DISK_PLAN_FIXED_SIZE, out->reason_len, REPL_DISK_PLAN, err) < 0)
		return -1;
	out->reason = (const char *)p + DISK_PLAN_FIXED_SIZE;
	out->bits = nb ? p + DISK_PLAN_FIXED_SIZE + out->reason_len : NULL;
	return 0;
}

/* ---- epochs, heartbeats, BYE ------------------------------------------- */

int repl_put_epoch_end(struct buffer *b, const struct repl_epoch_end *e)
{
	const uint64_t v[] = { e->epoch, e->pages, e->bytes, e->checksum, e->timestamp_us };

	return put_u64s(b, REPL_EPOCH_END, v, 5);
}

int repl_decode_epoch_end(const struct repl_frame *f, struct repl_epoch_end *out,
			  const char **err)
{
	if (expect_length(f, REPL_EPOCH_END, EPOCH_END_SIZE, err) < 0)
		return -1;
	out->epoch = load_be64(f->payload);
	out->pages = load_be64(f->payload + 8);
	out->bytes = load_be64(f->payload + 16);
	out->checksum = load_be64(f->payload + 24);
	out->timestamp_us = load_be64(f->payload + 32);
	return 0;
}

int repl_put_epoch_ack(struct buffer *b, uint64_t epoch)
{
	return put_u64s(b, REPL_EPOCH_ACK, &epoch, 1);
}

int repl_decode_epoch_ack(const struct repl_frame *f, uint64_t *epoch, const char **err)
{
	if (expect_length(f, REPL_EPOCH_ACK, 8, err) < 0)
		return -1;
	*epoch = load_be64(f->payload);
	return 0;
}

int repl_put_heartbeat(struct buffer *b, uint64_t now_us, uint64_t epoch)
{
	const uint64_t v[] = { now_us, epoch };

	return put_u64s(b, REPL_HEARTBEAT, v, 2);
}

int repl_decode_heartbeat(const struct repl_frame *f, struct repl_heartbeat *out,
			  const char **err)
{
	if (expect_length(f, REPL_HEARTBEAT, 16, err) < 0)
		return -1;
	out->now_us = load_be64(f->payload);
	out->epoch = load_be64(f->payload + 8);
	return 0;
}

int repl_put_bye(struct buffer *b, uint8_t reason, const char *text)
{
	size_t n;

	if (reason < REPL_BYE_UNPROTECT || reason > REPL_BYE_TAKEOVER ||
	    text_wire_length(text, &n) < 0)
		return invalid();
	uint8_t *p = repl_begin_frame(b, REPL_BYE, 1 + n);
	if (!p)
		return -1;
	p[0] = reason;
	if (n)
		memcpy(p + 1, text, n);
	end_frame(b, 1 + n);
	return 0;
}

int repl_decode_bye(const struct repl_frame *f, struct repl_bye *out, const char **err)
{
	if (expect_at_least(f, REPL_BYE, 1, err) < 0)
		return -1;
	uint8_t reason = f->payload[0];
	if (reason < REPL_BYE_UNPROTECT || reason > REPL_BYE_TAKEOVER)
		return fail(err, errf("BYE: unknown reason %u", reason));
	if (check_text(f->payload + 1, f->length - 1, REPL_BYE, err) < 0)
		return -1;
	out->reason = reason;
	out->text = (const char *)f->payload + 1;
	out->text_len = f->length - 1;
	return 0;
}

/* ---- epoch checksum ---------------------------------------------------- */

bool repl_type_is_covered(uint16_t type)
{
	switch (type) {
	case REPL_RAM_LAYOUT:
	case REPL_PAGES:
	case REPL_PAGES_CODED:
	case REPL_DEVICE:
	case REPL_DEVICE_DELTA:
	case REPL_DISK_WRITE:
	case REPL_DISK_ZERO:
	case REPL_DISK_SYNC:
	case REPL_DISK_SYNC_DONE:
	case REPL_FLOW_STATE:
		return true;
	default:
		return false;
	}
}

int repl_digest_init(struct repl_digest *d)
{
	memset(d, 0, sizeof(*d));
	d->state = XXH3_createState();
	if (!d->state) {
		errno = ENOMEM;
		return -1;
	}
	repl_digest_reset(d);
	return 0;
}

void repl_digest_free(struct repl_digest *d)
{
	XXH3_freeState(d->state);
	memset(d, 0, sizeof(*d));
}

void repl_digest_reset(struct repl_digest *d)
{
	if (d->state)
		XXH3_64bits_reset(d->state);
	d->bytes = 0;
	d->frames = 0;
}

void repl_digest_add(struct repl_digest *d, const uint8_t *header8, const uint8_t *payload,
		     uint32_t len)
{
	if (!d->state)
		return;
	XXH3_64bits_update(d->state, header8, REPL_HEADER_SIZE);
	if (len)
		XXH3_64bits_update(d->state, payload, len);
	d->bytes += REPL_HEADER_SIZE + (uint64_t)len;
	d->frames++;
}

bool repl_digest_add_frame(struct repl_digest *d, const struct repl_frame *f)
{
	uint8_t header[REPL_HEADER_SIZE];

	if (!repl_type_is_covered(f->type))
		return false;
	repl_encode_header(header, f->type, f->length);
	repl_digest_add(d, header, f->payload, f->length);
	return true;
}

int repl_digest_add_buffered(struct repl_digest *d, const struct buffer *b, size_t start)
{
	size_t len = buffer_len(b);
	struct repl_frame f;

	if (start > len)
		return -1;
	if (start == len)
		return 0; /* nothing appended (and an empty buffer may have no data) */
	const uint8_t *data = buffer_head(b);
	/* Check first, so that a bad call adds nothing. */
	for (size_t pos = start; pos < len;) {
		ssize_t n = repl_frame_parse(data + pos, len - pos, &f, NULL);
		if (n <= 0)
			return -1;
		pos += (size_t)n;
	}
	for (size_t pos = start; pos < len;) {
		ssize_t n = repl_frame_parse(data + pos, len - pos, &f, NULL);
		repl_digest_add_frame(d, &f);
		pos += (size_t)n;
	}
	return 0;
}

uint64_t repl_digest_value(const struct repl_digest *d)
{
	return d->state ? XXH3_64bits_digest(d->state) : 0;
}
