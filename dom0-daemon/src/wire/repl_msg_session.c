/*
 * The session's messages: HELLO, AUTH, ERROR, VM_CONFIG, RAM_LAYOUT, and
 * the epoch's bracket EPOCH_END / EPOCH_ACK, HEARTBEAT and BYE
 * (docs/protocol.md, section 2).
 */
#include "wire/repl_proto.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "base/be.h"
#include "wire/repl_fields.h"
#include "wire/repl_proto_internal.h"

/* ---- HELLO, AUTH, ERROR, VM_CONFIG ------------------------------------- */

int repl_put_hello(struct buffer *b, const struct repl_hello *h)
{
	size_t name_len;

	if (!repl_field_string_ok(h->name, sizeof(h->name), &name_len))
		return repl_invalid();
	uint8_t *p = repl_begin_fields(b, &repl_hello_layout, h, name_len);
	if (!p)
		return -1;
	uint8_t *payload = p - REPL_HELLO_FIXED;
	memcpy(payload + REPL_HELLO_AT_magic, REPL_HELLO_MAGIC, REPL_HELLO_MAGIC_SIZE);
	payload[REPL_HELLO_AT_name_len] = (uint8_t)name_len;
	memcpy(p, h->name, name_len);
	repl_end_frame(b, REPL_HELLO_FIXED + name_len);
	return 0;
}

int repl_decode_hello(const struct repl_frame *f, struct repl_hello *out, const char **err)
{
	const uint8_t *p = f->payload;

	/* Magic and version are where every version keeps them. */
	if (repl_expect_at_least(f, REPL_HELLO, REPL_HELLO_AT_version + 2, err) < 0)
		return -1;
	if (memcmp(p + REPL_HELLO_AT_magic, REPL_HELLO_MAGIC, REPL_HELLO_MAGIC_SIZE) != 0)
		return repl_fail(err, "HELLO: bad magic (the peer does not speak the remusdb "
				 "replication protocol)");
	memset(out, 0, sizeof(*out));
	out->version = load_be16(p + REPL_HELLO_AT_version);
	/*
	 * Versions 1..REPL_PROTOCOL_MAX share this layout; a later one may lay
	 * out the rest differently: let the caller answer with our range.
	 * Version 0 never existed: the table's range check refuses it below.
	 */
	if (out->version > REPL_PROTOCOL_MAX)
		return 0;
	if (f->length < REPL_HELLO_FIXED)
		return repl_fail(err, repl_errf("HELLO: payload of %u bytes is shorter than its "
						"%u-byte header", f->length, REPL_HELLO_FIXED));
	if (repl_fields_load(&repl_hello_layout, p, out, err) < 0)
		return -1;
	uint8_t name_len = p[REPL_HELLO_AT_name_len];
	if (f->length != REPL_HELLO_FIXED + (uint32_t)name_len)
		return repl_fail(err, repl_errf("HELLO: payload of %u bytes for a %u-byte host name",
						f->length, name_len));
	if (!repl_is_printable_ascii(p + REPL_HELLO_FIXED, name_len))
		return repl_fail(err, "HELLO: host name is not printable ASCII");
	memcpy(out->name, p + REPL_HELLO_FIXED, name_len);
	out->name[name_len] = '\0';
	return 0;
}

int repl_put_auth(struct buffer *b, uint16_t type, const uint8_t mac[32])
{
	struct repl_layout l = repl_auth_layout; /* AUTH and AUTH_OK share it */

	if (type != REPL_AUTH && type != REPL_AUTH_OK)
		return repl_invalid();
	l.type = type;
	return repl_put_fields(b, &l, &mac);
}

int repl_decode_auth(const struct repl_frame *f, const uint8_t **mac, const char **err)
{
	struct repl_layout l = repl_auth_layout;

	l.type = f->type == REPL_AUTH_OK ? REPL_AUTH_OK : REPL_AUTH;
	return repl_decode_fields(f, &l, mac, err);
}

/*
 * ERROR and BYE: fixed fields, then text to the end of the payload (cut
 * to REPL_TEXT_MAX when encoding, checked when decoding).
 */
static int put_with_text(struct buffer *b, const struct repl_layout *l, const void *host,
			 const char *text)
{
	size_t n;

	if (repl_text_wire_length(text, &n) < 0)
		return repl_invalid();
	uint8_t *p = repl_begin_fields(b, l, host, n);
	if (!p)
		return -1;
	if (n)
		memcpy(p, text, n);
	repl_end_frame(b, l->fixed + n);
	return 0;
}

static int decode_with_text(const struct repl_frame *f, const struct repl_layout *l,
			    void *host, const char **text, size_t *len, const char **err)
{
	if (repl_decode_prefix(f, l, host, err) < 0 ||
	    repl_check_text(f->payload + l->fixed, f->length - l->fixed, l->type, err) < 0)
		return -1;
	*text = (const char *)f->payload + l->fixed;
	*len = f->length - l->fixed;
	return 0;
}

int repl_put_error(struct buffer *b, uint16_t code, const char *reason)
{
	const struct repl_error e = { .code = code };

	return put_with_text(b, &repl_error_layout, &e, reason);
}

int repl_decode_error(const struct repl_frame *f, struct repl_error *out, const char **err)
{
	return decode_with_text(f, &repl_error_layout, out, &out->reason, &out->reason_len, err);
}

int repl_put_vm_config(struct buffer *b, const char *json, size_t len)
{
	if (!json || len == 0 || len > REPL_VM_CONFIG_MAX ||
	    repl_utf8_valid_prefix((const uint8_t *)json, len) != len)
		return repl_invalid();
	uint8_t *p = repl_begin_frame(b, REPL_VM_CONFIG, len);
	if (!p)
		return -1;
	memcpy(p, json, len);
	repl_end_frame(b, len);
	return 0;
}

int repl_decode_vm_config(const struct repl_frame *f, const char **json, size_t *len,
			  const char **err)
{
	if (repl_expect_type(f, REPL_VM_CONFIG, err) < 0)
		return -1;
	if (f->length == 0)
		return repl_fail(err, "VM_CONFIG: empty");
	if (f->length > REPL_VM_CONFIG_MAX)
		return repl_fail(err, repl_errf("VM_CONFIG: %u bytes exceed the limit of %u",
						f->length, REPL_VM_CONFIG_MAX));
	if (repl_utf8_valid_prefix(f->payload, f->length) != f->length)
		return repl_fail(err, "VM_CONFIG: not valid UTF-8");
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

	if (l->block_count == 0 || l->block_count > REPL_MAX_BLOCKS ||
	    !repl_field_string_ok(l->machine_type, sizeof(l->machine_type), &mt_len))
		return repl_invalid();
	length = 1 + mt_len + 2;
	for (unsigned i = 0; i < l->block_count; i++) {
		const struct repl_ram_block *blk = &l->blocks[i];
		if (!repl_field_string_ok(blk->name, sizeof(blk->name), &name_len[i]) ||
		    blk->length == 0 || blk->length % REPL_PAGE_SIZE != 0 ||
		    duplicate_block(l, i))
			return repl_invalid();
		length += 1 + name_len[i] + 8;
	}
	uint8_t *p = repl_begin_fields(b, &repl_ram_layout_layout, l, length);
	if (!p)
		return -1;
	*p++ = (uint8_t)mt_len;
	memcpy(p, l->machine_type, mt_len);
	p += mt_len;
	store_be16(p, l->block_count);
	p += 2;
	for (unsigned i = 0; i < l->block_count; i++) {
		*p++ = (uint8_t)name_len[i];
		memcpy(p, l->blocks[i].name, name_len[i]);
		p += name_len[i];
		store_be64(p, l->blocks[i].length);
		p += 8;
	}
	repl_end_frame(b, REPL_RAM_LAYOUT_FIXED + length);
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
		repl_fail(err, repl_errf("RAM_LAYOUT: payload ends before the %s", what));
		return 0;
	}
	size_t n = p[0];
	if (n == 0) {
		repl_fail(err, repl_errf("RAM_LAYOUT: %s is empty", what));
		return 0;
	}
	if (left - 1 < n) {
		repl_fail(err, repl_errf("RAM_LAYOUT: %s of %zu bytes runs past the payload", what, n));
		return 0;
	}
	if (!repl_is_printable_ascii(p + 1, n)) {
		repl_fail(err, repl_errf("RAM_LAYOUT: %s is not printable ASCII", what));
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

	memset(out, 0, sizeof(*out));
	if (repl_decode_prefix(f, &repl_ram_layout_layout, out, err) < 0)
		return -1;
	p += REPL_RAM_LAYOUT_FIXED;
	left -= REPL_RAM_LAYOUT_FIXED;
	n = read_short_string(p, left, out->machine_type, "machine type", err);
	if (!n)
		return -1;
	p += n;
	left -= n;
	if (left < 2)
		return repl_fail(err, "RAM_LAYOUT: payload ends before the block count");
	out->block_count = load_be16(p);
	p += 2;
	left -= 2;
	if (out->block_count == 0 || out->block_count > REPL_MAX_BLOCKS)
		return repl_fail(err, repl_errf("RAM_LAYOUT: block count %u is not 1..%d",
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
			return repl_fail(err, repl_errf("RAM_LAYOUT: payload ends before the length "
							"of block %u", i));
		blk->length = load_be64(p);
		p += 8;
		left -= 8;
		if (blk->length == 0 || blk->length % REPL_PAGE_SIZE != 0)
			return repl_fail(err, repl_errf("RAM_LAYOUT: block %u length %llu is not a "
							"positive multiple of %d", i,
							(unsigned long long)blk->length,
							REPL_PAGE_SIZE));
		if (duplicate_block(out, i))
			return repl_fail(err, repl_errf("RAM_LAYOUT: block %u repeats the name %s", i,
							blk->name));
	}
	if (left != 0)
		return repl_fail(err, repl_errf("RAM_LAYOUT: %zu bytes after the last block", left));
	return 0;
}

/* ---- epochs, heartbeats, BYE ------------------------------------------- */

int repl_put_epoch_end(struct buffer *b, const struct repl_epoch_end *e)
{
	return repl_put_fields(b, &repl_epoch_end_layout, e);
}

int repl_decode_epoch_end(const struct repl_frame *f, struct repl_epoch_end *out,
			  const char **err)
{
	return repl_decode_fields(f, &repl_epoch_end_layout, out, err);
}

int repl_put_epoch_ack(struct buffer *b, uint64_t epoch)
{
	return repl_put_fields(b, &repl_epoch_ack_layout, &epoch);
}

int repl_decode_epoch_ack(const struct repl_frame *f, uint64_t *epoch, const char **err)
{
	return repl_decode_fields(f, &repl_epoch_ack_layout, epoch, err);
}

int repl_put_heartbeat(struct buffer *b, uint64_t now_us, uint64_t epoch)
{
	const struct repl_heartbeat h = { .now_us = now_us, .epoch = epoch };

	return repl_put_fields(b, &repl_heartbeat_layout, &h);
}

int repl_decode_heartbeat(const struct repl_frame *f, struct repl_heartbeat *out,
			  const char **err)
{
	return repl_decode_fields(f, &repl_heartbeat_layout, out, err);
}

int repl_put_bye(struct buffer *b, uint8_t reason, const char *text)
{
	const struct repl_bye bye = { .reason = reason };

	return put_with_text(b, &repl_bye_layout, &bye, text);
}

int repl_decode_bye(const struct repl_frame *f, struct repl_bye *out, const char **err)
{
	return decode_with_text(f, &repl_bye_layout, out, &out->text, &out->text_len, err);
}
