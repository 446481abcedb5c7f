/*
 * PAGES_CODED: the record check shared by the decoder and the builder,
 * the decoder, the iterator over a decoded frame's records, and the
 * builder that appends one record at a time (docs/protocol.md, message 17).
 */
#include "wire/repl_proto.h"

#include <errno.h>
#include <string.h>

#include "base/be.h"
#include "wire/repl_fields.h"
#include "wire/repl_proto_internal.h"

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
		repl_fail(err, repl_errf("PAGES_CODED: record %u: %zu bytes left, shorter than a "
					 "record header", i, left));
		return 0;
	}
	uint64_t index = load_be64(p + REPL_CODED_AT_index);
	uint8_t kind = p[REPL_CODED_AT_kind];
	uint32_t len = load_be32(p + REPL_CODED_AT_len);

	if (index > REPL_MAX_PAGE_INDEX) {
		repl_fail(err, repl_errf("PAGES_CODED: page index %llu is out of range",
					 (unsigned long long)index));
		return 0;
	}
	if (!first && index <= prev) {
		repl_fail(err, repl_errf("PAGES_CODED: page index %llu follows %llu (indexes must be "
					 "strictly increasing)", (unsigned long long)index,
					 (unsigned long long)prev));
		return 0;
	}
	if (kind >= REPL_KIND_COUNT) {
		repl_fail(err, repl_errf("PAGES_CODED: page %llu has unknown kind %u",
					 (unsigned long long)index, kind));
		return 0;
	}
	if (!repl_coded_kind_length_ok(kind, len)) {
		repl_fail(err, repl_errf("PAGES_CODED: page %llu: %u bytes of %s data", (unsigned long long)index,
					 len, repl_page_kind_name(kind)));
		return 0;
	}
	if (left - REPL_CODED_RECORD_HEADER < len) {
		repl_fail(err, repl_errf("PAGES_CODED: page %llu: %u bytes of data run past the payload",
					 (unsigned long long)index, len));
		return 0;
	}
	return REPL_CODED_RECORD_HEADER + (size_t)len;
}

int repl_decode_pages_coded(const struct repl_frame *f, struct repl_pages_coded *out,
			    const char **err)
{
	const uint8_t *p = f->payload;

	memset(out, 0, sizeof(*out));
	if (repl_decode_prefix(f, &repl_pages_coded_layout, out, err) < 0)
		return -1;
	out->records = p + REPL_PAGES_CODED_FIXED;
	out->records_len = f->length - REPL_PAGES_CODED_FIXED;
	size_t pos = 0;
	uint64_t prev = 0;
	for (uint32_t i = 0; i < out->count; i++) {
		size_t n = check_record(out->records + pos, out->records_len - pos, i == 0,
					prev, i, err);
		if (!n)
			return -1;
		prev = load_be64(out->records + pos + REPL_CODED_AT_index);
		pos += n;
	}
	if (pos != out->records_len)
		return repl_fail(err, repl_errf("PAGES_CODED: %zu bytes after the last of %u records",
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
	out->index = load_be64(it->p + REPL_CODED_AT_index);
	out->kind = it->p[REPL_CODED_AT_kind];
	out->checksum = load_be64(it->p + REPL_CODED_AT_checksum);
	out->len = load_be32(it->p + REPL_CODED_AT_len);
	out->data = it->p + REPL_CODED_RECORD_HEADER;
	it->p += REPL_CODED_RECORD_HEADER + (size_t)out->len;
	it->left--;
	return true;
}

int repl_coded_begin(struct repl_coded_builder *cb, struct buffer *b, uint64_t epoch,
		     uint16_t block)
{
	if (block >= REPL_MAX_BLOCKS)
		return repl_invalid();
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
	/* The count and the length are written when the frame ends. */
	const struct repl_pages_coded hdr = { .epoch = epoch, .block = block };
	repl_encode_header(p, REPL_PAGES_CODED, 0);
	repl_fields_store(&repl_pages_coded_layout, p + REPL_HEADER_SIZE, &hdr);
	buffer_commit(b, REPL_HEADER_SIZE + REPL_PAGES_CODED_FIXED);
	return 0;
}

int repl_put_coded_page(struct buffer *b, uint64_t index, uint8_t kind, uint64_t checksum,
			const uint8_t *data, uint32_t len)
{
	if (index > REPL_MAX_PAGE_INDEX || !repl_coded_kind_length_ok(kind, len) ||
	    (len && !data))
		return repl_invalid();
	uint8_t *p = buffer_reserve(b, REPL_CODED_RECORD_HEADER + (size_t)len);
	if (!p) {
		errno = ENOMEM;
		return -1;
	}
	store_be64(p + REPL_CODED_AT_index, index);
	p[REPL_CODED_AT_kind] = kind;
	store_be64(p + REPL_CODED_AT_checksum, checksum);
	store_be32(p + REPL_CODED_AT_len, len);
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
		return repl_invalid();
	}
	cb->last_index = load_be64(rec + REPL_CODED_AT_index);
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
	store_be32(frame + REPL_HEADER_SIZE + REPL_PAGES_CODED_AT_count, cb->count);
}

_Static_assert(REPL_PAGES_CODED_AT_count + 4 == REPL_PAGES_CODED_FIXED,
	       "PAGES_CODED's fixed fields end where its records start");
_Static_assert(REPL_CODED_AT_len + 4 == REPL_CODED_RECORD_HEADER,
	       "a record's data follows its length");
