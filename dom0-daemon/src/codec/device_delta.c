/* The device state blob coded against the previous epoch's (device_delta.h). */
#include "codec/device_delta.h"

#include <string.h>

#include "base/be.h"
#include "codec/page_delta.h"

_Static_assert(DEVICE_DELTA_CHUNK == PAGE_DELTA_PAGE, "a blob chunk is coded like a page");

/* Chunk i of a blob as a full page: its bytes, then zeros. */
static void chunk_page(const uint8_t *blob, size_t len, size_t i, uint8_t page[PAGE_DELTA_PAGE])
{
	size_t at = i * DEVICE_DELTA_CHUNK;
	size_t n = at >= len ? 0 : len - at;

	if (n > DEVICE_DELTA_CHUNK)
		n = DEVICE_DELTA_CHUNK;
	if (n)
		memcpy(page, blob + at, n);
	memset(page + n, 0, PAGE_DELTA_PAGE - n);
}

static size_t chunk_count(size_t len)
{
	return (len + DEVICE_DELTA_CHUNK - 1) / DEVICE_DELTA_CHUNK;
}

int device_delta_encode(const uint8_t *cur, size_t cur_len, const uint8_t *base,
			size_t base_len, struct buffer *out)
{
	uint8_t cur_page[PAGE_DELTA_PAGE], base_page[PAGE_DELTA_PAGE];
	uint8_t delta[PAGE_ENCODED_MAX];

	if (cur_len == 0 || cur_len > DEVICE_DELTA_MAX_BLOB)
		return -1;
	for (size_t i = 0; i < chunk_count(cur_len); i++) {
		size_t at = i * DEVICE_DELTA_CHUNK;
		size_t n = cur_len - at < DEVICE_DELTA_CHUNK ? cur_len - at : DEVICE_DELTA_CHUNK;
		int d;

		/*
		 * A short last chunk is padded with the base's bytes, not
		 * zeros: the padding is never decoded into the blob, and
		 * this way it costs nothing in the delta.
		 */
		chunk_page(base, base_len, i, base_page);
		memcpy(cur_page, base_page, PAGE_DELTA_PAGE);
		memcpy(cur_page, cur + at, n);
		d = page_delta_encode(cur_page, base_page, delta, sizeof(delta));
		/* A delta no shorter than the chunk itself is not worth decoding. */
		if (d >= 0 && (size_t)d + 2 < n) {
			uint8_t *p = buffer_reserve(out, 3 + (size_t)d);
			if (!p)
				return -1;
			p[0] = DEVICE_DELTA_XOR_RLE;
			store_be16(p + 1, (uint16_t)d);
			memcpy(p + 3, delta, (size_t)d);
			buffer_commit(out, 3 + (size_t)d);
		} else {
			uint8_t *p = buffer_reserve(out, 1 + n);
			if (!p)
				return -1;
			p[0] = DEVICE_DELTA_RAW;
			memcpy(p + 1, cur + at, n);
			buffer_commit(out, 1 + n);
		}
	}
	return 0;
}

int device_delta_decode(const uint8_t *rec, size_t rec_len, const uint8_t *base,
			size_t base_len, uint8_t *out, size_t total, const char **err)
{
	uint8_t base_page[PAGE_DELTA_PAGE], page[PAGE_DELTA_PAGE];
	size_t pos = 0;

	if (total == 0 || total > DEVICE_DELTA_MAX_BLOB) {
		*err = "device state delta: blob length out of range";
		return -1;
	}
	for (size_t i = 0; i < chunk_count(total); i++) {
		size_t at = i * DEVICE_DELTA_CHUNK;
		size_t n = total - at < DEVICE_DELTA_CHUNK ? total - at : DEVICE_DELTA_CHUNK;

		if (pos >= rec_len) {
			*err = "device state delta: fewer records than chunks";
			return -1;
		}
		switch (rec[pos++]) {
		case DEVICE_DELTA_RAW:
			if (rec_len - pos < n) {
				*err = "device state delta: a RAW chunk is cut short";
				return -1;
			}
			memcpy(out + at, rec + pos, n);
			pos += n;
			break;
		case DEVICE_DELTA_XOR_RLE: {
			if (rec_len - pos < 2) {
				*err = "device state delta: an XOR_RLE record is cut short";
				return -1;
			}
			size_t d = load_be16(rec + pos);
			pos += 2;
			if (d > PAGE_ENCODED_MAX || rec_len - pos < d) {
				*err = "device state delta: an XOR_RLE record's length is wrong";
				return -1;
			}
			chunk_page(base, base_len, i, base_page);
			if (page_delta_decode(rec + pos, d, base_page, page, err) < 0)
				return -1;
			memcpy(out + at, page, n);
			pos += d;
			break;
		}
		default:
			*err = "device state delta: unknown record kind";
			return -1;
		}
	}
	if (pos != rec_len) {
		*err = "device state delta: bytes after the last chunk";
		return -1;
	}
	return 0;
}
