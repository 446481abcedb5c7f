/*
 * The disk's messages: DISK_WRITE, DISK_ZERO, DISK_SYNC, DISK_SYNC_DONE,
 * DISK_BASE and DISK_PLAN (docs/protocol.md, messages 9-12, 23, 24).
 */
#include "wire/repl_proto.h"

#include <errno.h>
#include <string.h>

#include "base/be.h"
#include "wire/repl_proto_internal.h"

#define DISK_WRITE_FIXED_SIZE 16
#define DISK_SYNC_FIXED_SIZE 8

/* DISK_WRITE, DISK_SYNC: a range that must not wrap around. */
static bool range_ok(uint64_t offset, uint64_t len)
{
	return len > 0 && offset <= UINT64_MAX - len;
}

int repl_put_disk_write(struct buffer *b, uint64_t epoch, uint64_t offset,
			const uint8_t *d, size_t n)
{
	if (!d || !range_ok(offset, n))
		return repl_invalid();
	size_t length = DISK_WRITE_FIXED_SIZE + n;
	uint8_t *p = repl_begin_frame(b, REPL_DISK_WRITE, length);
	if (!p)
		return -1;
	store_be64(p, epoch);
	store_be64(p + 8, offset);
	memcpy(p + DISK_WRITE_FIXED_SIZE, d, n);
	repl_end_frame(b, length);
	return 0;
}

int repl_decode_disk_write(const struct repl_frame *f, struct repl_disk_write *out,
			   const char **err)
{
	if (repl_expect_at_least(f, REPL_DISK_WRITE, DISK_WRITE_FIXED_SIZE, err) < 0)
		return -1;
	out->epoch = load_be64(f->payload);
	out->offset = load_be64(f->payload + 8);
	out->data = f->payload + DISK_WRITE_FIXED_SIZE;
	out->len = f->length - DISK_WRITE_FIXED_SIZE;
	if (out->len == 0)
		return repl_fail(err, "DISK_WRITE: no data");
	if (!range_ok(out->offset, out->len))
		return repl_fail(err, repl_errf("DISK_WRITE: offset %llu + %zu bytes overflows",
				      (unsigned long long)out->offset, out->len));
	return 0;
}

int repl_put_disk_zero(struct buffer *b, uint64_t epoch, uint64_t offset, uint64_t length)
{
	const uint64_t v[] = { epoch, offset, length };

	if (!range_ok(offset, length))
		return repl_invalid();
	return repl_put_u64s(b, REPL_DISK_ZERO, v, 3);
}

int repl_decode_disk_zero(const struct repl_frame *f, struct repl_disk_zero *out,
			  const char **err)
{
	if (repl_expect_length(f, REPL_DISK_ZERO, 24, err) < 0)
		return -1;
	out->epoch = load_be64(f->payload);
	out->offset = load_be64(f->payload + 8);
	out->length = load_be64(f->payload + 16);
	if (out->length == 0)
		return repl_fail(err, "DISK_ZERO: length 0");
	if (!range_ok(out->offset, out->length))
		return repl_fail(err, repl_errf("DISK_ZERO: offset %llu + %llu bytes overflows",
				      (unsigned long long)out->offset,
				      (unsigned long long)out->length));
	return 0;
}

int repl_put_disk_sync(struct buffer *b, uint64_t offset, const uint8_t *d, size_t n)
{
	if (!d || !range_ok(offset, n))
		return repl_invalid();
	size_t length = DISK_SYNC_FIXED_SIZE + n;
	uint8_t *p = repl_begin_frame(b, REPL_DISK_SYNC, length);
	if (!p)
		return -1;
	store_be64(p, offset);
	memcpy(p + DISK_SYNC_FIXED_SIZE, d, n);
	repl_end_frame(b, length);
	return 0;
}

int repl_decode_disk_sync(const struct repl_frame *f, struct repl_disk_sync *out,
			  const char **err)
{
	if (repl_expect_at_least(f, REPL_DISK_SYNC, DISK_SYNC_FIXED_SIZE, err) < 0)
		return -1;
	out->offset = load_be64(f->payload);
	out->data = f->payload + DISK_SYNC_FIXED_SIZE;
	out->len = f->length - DISK_SYNC_FIXED_SIZE;
	if (out->len == 0)
		return repl_fail(err, "DISK_SYNC: no data");
	if (!range_ok(out->offset, out->len))
		return repl_fail(err, repl_errf("DISK_SYNC: offset %llu + %zu bytes overflows",
				      (unsigned long long)out->offset, out->len));
	return 0;
}

int repl_put_disk_sync_done(struct buffer *b, uint64_t size)
{
	return repl_put_u64s(b, REPL_DISK_SYNC_DONE, &size, 1);
}

int repl_decode_disk_sync_done(const struct repl_frame *f, uint64_t *size, const char **err)
{
	if (repl_expect_length(f, REPL_DISK_SYNC_DONE, 8, err) < 0)
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
		return repl_invalid();
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
	repl_end_frame(b, length);
	return 0;
}

int repl_decode_disk_base(const struct repl_frame *f, struct repl_disk_base *out,
			  const char **err)
{
	if (repl_expect_at_least(f, REPL_DISK_BASE, DISK_BASE_FIXED_SIZE, err) < 0)
		return -1;
	const uint8_t *p = f->payload;
	out->generation = load_be64(p);
	out->base_generation = load_be64(p + 8);
	out->flags = load_be32(p + 20);
	out->extent_count = load_be64(p + 24);
	out->bits = p + DISK_BASE_FIXED_SIZE;
	if (out->generation == 0)
		return repl_fail(err, "DISK_BASE: generation 0");
	if (load_be32(p + 16) != REPL_DISK_EXTENT_SHIFT)
		return repl_fail(err, repl_errf("DISK_BASE: extents of 2^%u bytes, not 2^%u",
				      load_be32(p + 16), REPL_DISK_EXTENT_SHIFT));
	if (out->flags & ~REPL_DISK_BASE_FULL_ASKED)
		return repl_fail(err, repl_errf("DISK_BASE: unknown flags 0x%x", out->flags));
	if (out->extent_count == 0 || out->extent_count > DISK_MAX_EXTENTS ||
	    f->length != DISK_BASE_FIXED_SIZE + bitmap_bytes(out->extent_count))
		return repl_fail(err, repl_errf("DISK_BASE: %llu extents do not match a payload of %u "
				      "bytes", (unsigned long long)out->extent_count, f->length));
	return 0;
}

int repl_put_disk_plan(struct buffer *b, const struct repl_disk_plan *d)
{
	size_t n;

	if (d->extent_count == 0 || d->extent_count > DISK_MAX_EXTENTS ||
	    (d->resync && !d->bits) || repl_text_wire_length(d->reason, &n) < 0)
		return repl_invalid();
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
	repl_end_frame(b, length);
	return 0;
}

int repl_decode_disk_plan(const struct repl_frame *f, struct repl_disk_plan *out,
			  const char **err)
{
	if (repl_expect_at_least(f, REPL_DISK_PLAN, DISK_PLAN_FIXED_SIZE, err) < 0)
		return -1;
	const uint8_t *p = f->payload;
	if (p[0] > 1 || p[1] != 0)
		return repl_fail(err, repl_errf("DISK_PLAN: unknown mode %u", p[0]));
	if (load_be32(p + 4) != REPL_DISK_EXTENT_SHIFT)
		return repl_fail(err, repl_errf("DISK_PLAN: extents of 2^%u bytes, not 2^%u",
				      load_be32(p + 4), REPL_DISK_EXTENT_SHIFT));
	out->resync = p[0] == 1;
	out->reason_len = load_be16(p + 2);
	out->extent_count = load_be64(p + 8);
	if (out->extent_count == 0 || out->extent_count > DISK_MAX_EXTENTS)
		return repl_fail(err, repl_errf("DISK_PLAN: %llu extents",
				      (unsigned long long)out->extent_count));
	size_t nb = out->resync ? bitmap_bytes(out->extent_count) : 0;
	if ((uint64_t)f->length != DISK_PLAN_FIXED_SIZE + out->reason_len + nb)
		return repl_fail(err, repl_errf("DISK_PLAN: a payload of %u bytes does not hold its "
				      "reason and bitmap", f->length));
	if (repl_check_text(p + DISK_PLAN_FIXED_SIZE, out->reason_len, REPL_DISK_PLAN, err) < 0)
		return -1;
	out->reason = (const char *)p + DISK_PLAN_FIXED_SIZE;
	out->bits = nb ? p + DISK_PLAN_FIXED_SIZE + out->reason_len : NULL;
	return 0;
}
