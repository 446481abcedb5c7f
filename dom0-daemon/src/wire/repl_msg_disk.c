/*
 * The disk's messages: DISK_WRITE, DISK_ZERO, DISK_SYNC, DISK_SYNC_DONE,
 * DISK_BASE and DISK_PLAN (docs/protocol.md, messages 9-12, 23, 24).
 */
#include "wire/repl_proto.h"

#include <errno.h>
#include <string.h>

#include "base/be.h"
#include "wire/repl_fields.h"
#include "wire/repl_proto_internal.h"

/* DISK_WRITE, DISK_ZERO, DISK_SYNC: a range that must not wrap around. */
static bool range_ok(uint64_t offset, uint64_t len)
{
	return len > 0 && offset <= UINT64_MAX - len;
}

/* DISK_WRITE and DISK_SYNC: the fixed fields, then the data. */
static int put_with_data(struct buffer *b, const struct repl_layout *l, const void *host,
			 uint64_t offset, const uint8_t *d, size_t n)
{
	if (!d || !range_ok(offset, n))
		return repl_invalid();
	uint8_t *p = repl_begin_fields(b, l, host, n);
	if (!p)
		return -1;
	memcpy(p, d, n);
	repl_end_frame(b, l->fixed + n);
	return 0;
}

/* The data after a DISK_WRITE's or DISK_SYNC's fixed fields: 0, or -1 with *err. */
static int check_data(const struct repl_frame *f, const struct repl_layout *l, uint64_t offset,
		      const uint8_t **data, size_t *len, const char **err)
{
	const char *name = repl_type_name(l->type);

	*data = f->payload + l->fixed;
	*len = f->length - l->fixed;
	if (*len == 0)
		return repl_fail(err, repl_errf("%s: no data", name));
	if (!range_ok(offset, *len))
		return repl_fail(err, repl_errf("%s: offset %llu + %zu bytes overflows", name,
						(unsigned long long)offset, *len));
	return 0;
}

int repl_put_disk_write(struct buffer *b, uint64_t epoch, uint64_t offset,
			const uint8_t *d, size_t n)
{
	const struct repl_disk_write w = { .epoch = epoch, .offset = offset };

	return put_with_data(b, &repl_disk_write_layout, &w, offset, d, n);
}

int repl_decode_disk_write(const struct repl_frame *f, struct repl_disk_write *out,
			   const char **err)
{
	if (repl_decode_prefix(f, &repl_disk_write_layout, out, err) < 0)
		return -1;
	return check_data(f, &repl_disk_write_layout, out->offset, &out->data, &out->len, err);
}

int repl_put_disk_zero(struct buffer *b, uint64_t epoch, uint64_t offset, uint64_t length)
{
	const struct repl_disk_zero z = { .epoch = epoch, .offset = offset, .length = length };

	if (!range_ok(offset, length))
		return repl_invalid();
	return repl_put_fields(b, &repl_disk_zero_layout, &z);
}

int repl_decode_disk_zero(const struct repl_frame *f, struct repl_disk_zero *out,
			  const char **err)
{
	if (repl_decode_fields(f, &repl_disk_zero_layout, out, err) < 0)
		return -1;
	if (!range_ok(out->offset, out->length))
		return repl_fail(err, repl_errf("DISK_ZERO: offset %llu + %llu bytes overflows",
						(unsigned long long)out->offset,
						(unsigned long long)out->length));
	return 0;
}

int repl_put_disk_sync(struct buffer *b, uint64_t offset, const uint8_t *d, size_t n)
{
	const struct repl_disk_sync s = { .offset = offset };

	return put_with_data(b, &repl_disk_sync_layout, &s, offset, d, n);
}

int repl_decode_disk_sync(const struct repl_frame *f, struct repl_disk_sync *out,
			  const char **err)
{
	if (repl_decode_prefix(f, &repl_disk_sync_layout, out, err) < 0)
		return -1;
	return check_data(f, &repl_disk_sync_layout, out->offset, &out->data, &out->len, err);
}

int repl_put_disk_sync_done(struct buffer *b, uint64_t size)
{
	return repl_put_fields(b, &repl_disk_sync_done_layout, &size);
}

int repl_decode_disk_sync_done(const struct repl_frame *f, uint64_t *size, const char **err)
{
	return repl_decode_fields(f, &repl_disk_sync_done_layout, size, err);
}

/* ---- DISK_BASE, DISK_PLAN --------------------------------------------- */

static size_t bitmap_bytes(uint64_t extent_count)
{
	return (size_t)((extent_count + 7) / 8);
}

int repl_put_disk_base(struct buffer *b, const struct repl_disk_base *d)
{
	if (d->extent_count == 0 || d->extent_count > REPL_DISK_MAX_EXTENTS || !d->bits)
		return repl_invalid();
	size_t nb = bitmap_bytes(d->extent_count);
	uint8_t *p = repl_begin_fields(b, &repl_disk_base_layout, d, nb);
	if (!p)
		return -1;
	memcpy(p, d->bits, nb);
	repl_end_frame(b, REPL_DISK_BASE_FIXED + nb);
	return 0;
}

int repl_decode_disk_base(const struct repl_frame *f, struct repl_disk_base *out,
			  const char **err)
{
	if (repl_decode_prefix(f, &repl_disk_base_layout, out, err) < 0)
		return -1;
	out->bits = f->payload + REPL_DISK_BASE_FIXED;
	if (out->extent_count == 0 || out->extent_count > REPL_DISK_MAX_EXTENTS ||
	    f->length != REPL_DISK_BASE_FIXED + bitmap_bytes(out->extent_count))
		return repl_fail(err, repl_errf("DISK_BASE: %llu extents do not match a payload "
						"of %u bytes",
						(unsigned long long)out->extent_count, f->length));
	return 0;
}

int repl_put_disk_plan(struct buffer *b, const struct repl_disk_plan *d)
{
	size_t n;

	if ((d->resync && !d->bits) || repl_text_wire_length(d->reason, &n) < 0)
		return repl_invalid();
	size_t nb = d->resync ? bitmap_bytes(d->extent_count) : 0;
	uint8_t *p = repl_begin_fields(b, &repl_disk_plan_layout, d, n + nb);
	if (!p)
		return -1;
	uint8_t *payload = p - REPL_DISK_PLAN_FIXED;
	payload[REPL_DISK_PLAN_AT_mode] = d->resync ? 1 : 0;
	store_be16(payload + REPL_DISK_PLAN_AT_reason_len, (uint16_t)n);
	memcpy(p, d->reason, n);
	if (nb)
		memcpy(p + n, d->bits, nb);
	repl_end_frame(b, REPL_DISK_PLAN_FIXED + n + nb);
	return 0;
}

int repl_decode_disk_plan(const struct repl_frame *f, struct repl_disk_plan *out,
			  const char **err)
{
	const uint8_t *p = f->payload;

	if (repl_decode_prefix(f, &repl_disk_plan_layout, out, err) < 0)
		return -1;
	out->resync = p[REPL_DISK_PLAN_AT_mode] == 1;
	out->reason_len = load_be16(p + REPL_DISK_PLAN_AT_reason_len);
	size_t nb = out->resync ? bitmap_bytes(out->extent_count) : 0;
	if ((uint64_t)f->length != REPL_DISK_PLAN_FIXED + out->reason_len + nb)
		return repl_fail(err, repl_errf("DISK_PLAN: a payload of %u bytes does not hold "
						"its reason and bitmap", f->length));
	if (repl_check_text(p + REPL_DISK_PLAN_FIXED, out->reason_len, REPL_DISK_PLAN, err) < 0)
		return -1;
	out->reason = (const char *)p + REPL_DISK_PLAN_FIXED;
	out->bits = nb ? p + REPL_DISK_PLAN_FIXED + out->reason_len : NULL;
	return 0;
}
