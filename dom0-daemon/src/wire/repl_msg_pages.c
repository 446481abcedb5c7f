/*
 * The epoch's page and device messages: PAGES and its page encodings,
 * PAGE_REQUEST, PAGE_RESEND, DEVICE and DEVICE_DELTA (docs/protocol.md,
 * messages 7, 8, 18-20).  PAGES_CODED has a file of its own (repl_coded.c).
 */
#include "wire/repl_proto.h"

#include <errno.h>
#include <string.h>

#include "base/be.h"
#include "wire/repl_proto_internal.h"

#define PAGES_FIXED_SIZE 15  /* be64 epoch, be16 block, u8 encoding, be32 count */
#define DEVICE_FIXED_SIZE 24 /* be64 epoch, be64 total, be64 offset */
/* be64 epoch, be64 total, be64 base length, be64 base XXH3-64, be64 XXH3-64 */
#define DEVICE_DELTA_FIXED_SIZE 40
#define PAGE_REQUEST_SIZE 19 /* be64 epoch, be16 block, be64 index, u8 reason */
#define PAGE_RESEND_FIXED 18 /* be64 epoch, be16 block, be64 index */

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
			return repl_fail(err, repl_errf("PAGES: %zu bytes of RAW data for %u pages "
					      "(expected %zu)", data_len, count,
					      (size_t)count * REPL_PAGE_SIZE));
		return 0;
	case REPL_ENCODING_ZERO:
		if (data_len != 0)
			return repl_fail(err, repl_errf("PAGES: %zu bytes of data after ZERO pages",
					      data_len));
		return 0;
	default:
		return repl_fail(err, repl_errf("PAGES: unknown page encoding %u", encoding));
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
		return repl_fail(err, "PAGES: count 0");
	if (count > REPL_MAX_PAGES_PER_FRAME)
		return repl_fail(err, repl_errf("PAGES: count %u exceeds %d", count,
				      REPL_MAX_PAGES_PER_FRAME));
	if (block >= REPL_MAX_BLOCKS)
		return repl_fail(err, repl_errf("PAGES: block index %u is beyond the %d blocks a "
				      "RAM_LAYOUT can have", block, REPL_MAX_BLOCKS));
	return 0;
}

static int check_page_index(uint64_t index, uint64_t prev, uint32_t i, const char **err)
{
	if (index > REPL_MAX_PAGE_INDEX)
		return repl_fail(err, repl_errf("PAGES: page index %llu is out of range",
				      (unsigned long long)index));
	if (i > 0 && index <= prev)
		return repl_fail(err, repl_errf("PAGES: page index %llu follows %llu (indexes must be "
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
		return repl_invalid();
	for (uint32_t i = 0; i < count; i++)
		if (check_page_index(page_indexes[i], i ? page_indexes[i - 1] : 0, i, NULL) < 0)
			return repl_invalid();
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
	repl_end_frame(b, length);
	return 0;
}

int repl_decode_pages(const struct repl_frame *f, struct repl_pages *out, const char **err)
{
	const uint8_t *p = f->payload;

	if (repl_expect_at_least(f, REPL_PAGES, PAGES_FIXED_SIZE, err) < 0)
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
		return repl_fail(err, repl_errf("PAGES: payload of %u bytes cannot hold %u page indexes",
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

int repl_put_page_request(struct buffer *b, const struct repl_page_request *r)
{
	if (r->block >= REPL_MAX_BLOCKS || r->index > REPL_MAX_PAGE_INDEX ||
	    r->reason < REPL_REQ_CHECKSUM || r->reason > REPL_REQ_UNDECODABLE)
		return repl_invalid();
	uint8_t *p = repl_begin_frame(b, REPL_PAGE_REQUEST, PAGE_REQUEST_SIZE);
	if (!p)
		return -1;
	store_be64(p, r->epoch);
	store_be16(p + 8, r->block);
	store_be64(p + 10, r->index);
	p[18] = r->reason;
	repl_end_frame(b, PAGE_REQUEST_SIZE);
	return 0;
}

int repl_decode_page_request(const struct repl_frame *f, struct repl_page_request *out,
			     const char **err)
{
	if (repl_expect_length(f, REPL_PAGE_REQUEST, PAGE_REQUEST_SIZE, err) < 0)
		return -1;
	out->epoch = load_be64(f->payload);
	out->block = load_be16(f->payload + 8);
	out->index = load_be64(f->payload + 10);
	out->reason = f->payload[18];
	if (out->block >= REPL_MAX_BLOCKS)
		return repl_fail(err, repl_errf("PAGE_REQUEST: block index %u is out of range", out->block));
	if (out->index > REPL_MAX_PAGE_INDEX)
		return repl_fail(err, repl_errf("PAGE_REQUEST: page index %llu is out of range",
				      (unsigned long long)out->index));
	if (out->reason < REPL_REQ_CHECKSUM || out->reason > REPL_REQ_UNDECODABLE)
		return repl_fail(err, repl_errf("PAGE_REQUEST: unknown reason %u", out->reason));
	return 0;
}

int repl_put_page_resend(struct buffer *b, uint64_t epoch, uint16_t block, uint64_t index,
			 const uint8_t page[REPL_PAGE_SIZE])
{
	if (block >= REPL_MAX_BLOCKS || index > REPL_MAX_PAGE_INDEX || !page)
		return repl_invalid();
	uint8_t *p = repl_begin_frame(b, REPL_PAGE_RESEND, PAGE_RESEND_FIXED + REPL_PAGE_SIZE);
	if (!p)
		return -1;
	store_be64(p, epoch);
	store_be16(p + 8, block);
	store_be64(p + 10, index);
	memcpy(p + PAGE_RESEND_FIXED, page, REPL_PAGE_SIZE);
	repl_end_frame(b, PAGE_RESEND_FIXED + REPL_PAGE_SIZE);
	return 0;
}

int repl_decode_page_resend(const struct repl_frame *f, struct repl_page_resend *out,
			    const char **err)
{
	if (repl_expect_length(f, REPL_PAGE_RESEND, PAGE_RESEND_FIXED + REPL_PAGE_SIZE, err) < 0)
		return -1;
	out->epoch = load_be64(f->payload);
	out->block = load_be16(f->payload + 8);
	out->index = load_be64(f->payload + 10);
	out->data = f->payload + PAGE_RESEND_FIXED;
	if (out->block >= REPL_MAX_BLOCKS)
		return repl_fail(err, repl_errf("PAGE_RESEND: block index %u is out of range", out->block));
	if (out->index > REPL_MAX_PAGE_INDEX)
		return repl_fail(err, repl_errf("PAGE_RESEND: page index %llu is out of range",
				      (unsigned long long)out->index));
	return 0;
}

/* ---- DEVICE and disk messages ------------------------------------------ */

int repl_put_device(struct buffer *b, uint64_t epoch, uint64_t total, uint64_t offset,
		    const uint8_t *d, size_t n)
{
	if (n == 0 || !d || offset > total || n > total - offset)
		return repl_invalid();
	size_t length = DEVICE_FIXED_SIZE + n;
	uint8_t *p = repl_begin_frame(b, REPL_DEVICE, length);
	if (!p)
		return -1;
	store_be64(p, epoch);
	store_be64(p + 8, total);
	store_be64(p + 16, offset);
	memcpy(p + DEVICE_FIXED_SIZE, d, n);
	repl_end_frame(b, length);
	return 0;
}

int repl_decode_device(const struct repl_frame *f, struct repl_device *out, const char **err)
{
	const uint8_t *p = f->payload;

	if (repl_expect_at_least(f, REPL_DEVICE, DEVICE_FIXED_SIZE, err) < 0)
		return -1;
	out->epoch = load_be64(p);
	out->total = load_be64(p + 8);
	out->offset = load_be64(p + 16);
	out->data = p + DEVICE_FIXED_SIZE;
	out->len = f->length - DEVICE_FIXED_SIZE;
	if (out->len == 0)
		return repl_fail(err, "DEVICE: empty chunk");
	if (out->offset > out->total || out->len > out->total - out->offset)
		return repl_fail(err, repl_errf("DEVICE: chunk at %llu (+%zu) is beyond the blob's "
				      "%llu bytes", (unsigned long long)out->offset,
				      out->len, (unsigned long long)out->total));
	return 0;
}

int repl_put_device_delta(struct buffer *b, const struct repl_device_delta *d)
{
	if (d->total == 0 || d->records_len == 0 || !d->records ||
	    d->records_len > REPL_MAX_PAYLOAD - DEVICE_DELTA_FIXED_SIZE)
		return repl_invalid();
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
	repl_end_frame(b, length);
	return 0;
}

int repl_decode_device_delta(const struct repl_frame *f, struct repl_device_delta *out,
			     const char **err)
{
	const uint8_t *p = f->payload;

	if (repl_expect_at_least(f, REPL_DEVICE_DELTA, DEVICE_DELTA_FIXED_SIZE + 1, err) < 0)
		return -1;
	out->epoch = load_be64(p);
	out->total = load_be64(p + 8);
	out->base_len = load_be64(p + 16);
	out->base_sum = load_be64(p + 24);
	out->sum = load_be64(p + 32);
	out->records = p + DEVICE_DELTA_FIXED_SIZE;
	out->records_len = f->length - DEVICE_DELTA_FIXED_SIZE;
	if (out->total == 0)
		return repl_fail(err, "DEVICE_DELTA: empty blob");
	return 0;
}
