/*
 * The epoch's page and device messages: PAGES and its page encodings,
 * PAGE_REQUEST, PAGE_RESEND, DEVICE and DEVICE_DELTA (docs/protocol.md,
 * messages 7, 8, 18-20).  PAGES_CODED has a file of its own (repl_coded.c).
 */
#include "wire/repl_proto.h"

#include <errno.h>
#include <string.h>

#include "base/be.h"
#include "wire/repl_fields.h"
#include "wire/repl_proto_internal.h"

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
	const struct repl_pages hdr = {
		.epoch = epoch, .block = block, .encoding = encoding, .count = count,
	};

	/* The count first: the loop below trusts it. */
	if (repl_fields_check(&repl_pages_layout, &hdr) < 0 || !page_indexes ||
	    check_encoded_data(encoding, count, data_len, NULL) < 0 ||
	    (data_len && !data))
		return repl_invalid();
	for (uint32_t i = 0; i < count; i++)
		if (check_page_index(page_indexes[i], i ? page_indexes[i - 1] : 0, i, NULL) < 0)
			return repl_invalid();
	size_t tail = (size_t)count * 8 + data_len;
	uint8_t *p = repl_begin_fields(b, &repl_pages_layout, &hdr, tail);
	if (!p)
		return -1;
	for (uint32_t i = 0; i < count; i++, p += 8)
		store_be64(p, page_indexes[i]);
	if (data_len)
		memcpy(p, data, data_len);
	repl_end_frame(b, REPL_PAGES_FIXED + tail);
	return 0;
}

int repl_decode_pages(const struct repl_frame *f, struct repl_pages *out, const char **err)
{
	const uint8_t *p = f->payload;

	memset(out, 0, sizeof(*out));
	if (repl_decode_prefix(f, &repl_pages_layout, out, err) < 0)
		return -1;
	size_t indexes_len = (size_t)out->count * 8;
	if (f->length - REPL_PAGES_FIXED < indexes_len)
		return repl_fail(err, repl_errf("PAGES: payload of %u bytes cannot hold %u page indexes",
						f->length, out->count));
	out->page_indexes_be = p + REPL_PAGES_FIXED;
	uint64_t prev = 0;
	for (uint32_t i = 0; i < out->count; i++) {
		uint64_t index = repl_pages_index(out, i);
		if (check_page_index(index, prev, i, err) < 0)
			return -1;
		prev = index;
	}
	out->data = out->page_indexes_be + indexes_len;
	out->data_len = f->length - REPL_PAGES_FIXED - indexes_len;
	return check_encoded_data(out->encoding, out->count, out->data_len, err);
}

int repl_put_page_request(struct buffer *b, const struct repl_page_request *r)
{
	return repl_put_fields(b, &repl_page_request_layout, r);
}

int repl_decode_page_request(const struct repl_frame *f, struct repl_page_request *out,
			     const char **err)
{
	return repl_decode_fields(f, &repl_page_request_layout, out, err);
}

int repl_put_page_resend(struct buffer *b, uint64_t epoch, uint16_t block, uint64_t index,
			 const uint8_t page[REPL_PAGE_SIZE])
{
	const struct repl_page_resend r = {
		.epoch = epoch, .block = block, .index = index, .data = page,
	};

	return repl_put_fields(b, &repl_page_resend_layout, &r);
}

int repl_decode_page_resend(const struct repl_frame *f, struct repl_page_resend *out,
			    const char **err)
{
	return repl_decode_fields(f, &repl_page_resend_layout, out, err);
}

/* ---- DEVICE, DEVICE_DELTA ------------------------------------------------- */

int repl_put_device(struct buffer *b, uint64_t epoch, uint64_t total, uint64_t offset,
		    const uint8_t *d, size_t n)
{
	const struct repl_device dev = { .epoch = epoch, .total = total, .offset = offset };

	if (n == 0 || !d || offset > total || n > total - offset)
		return repl_invalid();
	uint8_t *p = repl_begin_fields(b, &repl_device_layout, &dev, n);
	if (!p)
		return -1;
	memcpy(p, d, n);
	repl_end_frame(b, REPL_DEVICE_FIXED + n);
	return 0;
}

int repl_decode_device(const struct repl_frame *f, struct repl_device *out, const char **err)
{
	const uint8_t *p = f->payload;

	if (repl_decode_prefix(f, &repl_device_layout, out, err) < 0)
		return -1;
	out->data = p + REPL_DEVICE_FIXED;
	out->len = f->length - REPL_DEVICE_FIXED;
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
	if (d->records_len == 0 || !d->records)
		return repl_invalid();
	uint8_t *p = repl_begin_fields(b, &repl_device_delta_layout, d, d->records_len);
	if (!p)
		return -1;
	memcpy(p, d->records, d->records_len);
	repl_end_frame(b, REPL_DEVICE_DELTA_FIXED + d->records_len);
	return 0;
}

int repl_decode_device_delta(const struct repl_frame *f, struct repl_device_delta *out,
			     const char **err)
{
	/* At least one record after the fixed fields. */
	if (repl_expect_at_least(f, REPL_DEVICE_DELTA, REPL_DEVICE_DELTA_FIXED + 1, err) < 0 ||
	    repl_fields_load(&repl_device_delta_layout, f->payload, out, err) < 0)
		return -1;
	out->records = f->payload + REPL_DEVICE_DELTA_FIXED;
	out->records_len = f->length - REPL_DEVICE_DELTA_FIXED;
	return 0;
}
