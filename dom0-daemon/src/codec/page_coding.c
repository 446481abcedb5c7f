/* The default page coding steps (page_coding.h): ZERO or RAW out, XOR_RLE and LZ4 in. */
#include "codec/page_coding.h"
#include "codec/page_delta.h"

#include <string.h>
#include <xxhash.h>

uint64_t page_checksum(const uint8_t *page)
{
	static const uint8_t zeros[REPL_PAGE_SIZE];

	return XXH3_64bits(page ? page : zeros, REPL_PAGE_SIZE);
}

bool page_is_zero(const uint8_t *page)
{
	static const uint8_t zeros[REPL_PAGE_SIZE];

	return memcmp(page, zeros, REPL_PAGE_SIZE) == 0;
}

static int encode_default(void *ctx, uint64_t epoch, unsigned block, uint64_t page_index,
			  const uint8_t *page, struct buffer *out)
{
	if (!page)
		return repl_put_coded_page(out, page_index, REPL_KIND_ZERO, page_checksum(NULL),
					   NULL, 0);
	return repl_put_coded_page(out, page_index, REPL_KIND_RAW, page_checksum(page), page,
				   REPL_PAGE_SIZE);
}

_Static_assert((int)REPL_KIND_XOR_RLE == (int)PAGE_CODEC_XOR_RLE, "one number per codec");
_Static_assert((int)REPL_KIND_LZ4 == (int)PAGE_CODEC_LZ4, "one number per codec");

static int decode_codec(void *ctx, uint8_t kind, const uint8_t *base, const uint8_t *data,
			uint32_t len, uint8_t out[REPL_PAGE_SIZE])
{
	const char *err;

	if (kind != REPL_KIND_XOR_RLE && kind != REPL_KIND_LZ4)
		return -1;
	return page_decode((enum page_codec)kind, data, len, base, out, &err);
}

const struct page_encoder page_encoder_default = { .encode_page = encode_default };
const struct page_decoder page_decoder_default = { .decode_page = decode_codec };
