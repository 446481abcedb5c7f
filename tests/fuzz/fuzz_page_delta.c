/*
 * libFuzzer harness for the page decoders of checkpoint compression
 * (page_delta.c), which the backup runs on bytes from the network: the
 * XOR_RLE delta and the LZ4 page must be decoded or refused, never read or
 * written out of bounds, and a refusal must leave the page alone.
 *
 * The same input also drives the encoders: two pages built from it (an
 * edit script applied to a page made of its bytes) must survive
 * encode -> decode unchanged, within the size bound, through the SSE2 or
 * the AVX2 comparison (the input's first bit picks).
 *
 * Build: make -C dom0-daemon build/fuzz_page_delta
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec/page_delta.h"

#define PG PAGE_DELTA_PAGE

static void check(int ok)
{
	if (!ok)
		abort();
}

/* Decoding as the backup would: out of place, then in place. */
static void fuzz_decoders(const uint8_t *data, size_t size)
{
	static uint8_t base[PG], out[PG], copy[PG];
	const char *err;

	for (int i = 0; i < PG; i++)
		base[i] = (uint8_t)(i * 31 + 7);
	for (int codec = 0; codec < 4; codec++) {
		memset(out, 0xcc, PG);
		int rc = page_decode((enum page_codec)codec, data, size, base, out, &err);

		if (rc != 0)
			for (int i = 0; i < PG; i++)
				check(out[i] == 0xcc);
		memcpy(copy, base, PG);
		int rc2 = page_decode((enum page_codec)codec, data, size, copy, copy, &err);

		check(rc == rc2);
		check(memcmp(copy, rc == 0 ? out : base, PG) == 0);
	}
}

/*
 * prev: the input's bytes, repeated to fill a page.  cur: prev with an
 * edit script from the input applied (each 4-byte step: be16 offset, a
 * length up to 255 and a byte to write), so the changes come in runs of
 * every length and spacing, as in real pages.
 */
static void fuzz_round_trip(const uint8_t *data, size_t size)
{
	static uint8_t prev[PG], cur[PG], enc[PG], out[PG];
	const char *err;
	size_t len;

	if (size == 0)
		return;
	for (int i = 0; i < PG; i++)
		prev[i] = data[(size_t)i % size];
	memcpy(cur, prev, PG);
	for (size_t i = 0; i + 4 <= size; i += 4) {
		unsigned at = ((unsigned)data[i] << 8 | data[i + 1]) % PG;
		unsigned n = data[i + 2];

		for (unsigned k = 0; k < n && at + k < PG; k++)
			cur[at + k] = (uint8_t)(data[i + 3] + k * (data[i] & 1));
	}
	/* Both comparisons, whichever the CPU would pick. */
	page_delta_force_sse2(data[0] & 1);
	int n = page_delta_encode(cur, prev, enc, sizeof(enc));

	check(n >= -1 && n <= PAGE_ENCODED_MAX);
	if (n >= 0) {
		check(page_decode(PAGE_CODEC_XOR_RLE, enc, (size_t)n, prev, out, &err) == 0);
		check(memcmp(out, cur, PG) == 0);
	}
	enum page_codec codec = page_encode_miss(cur, enc, sizeof(enc), &len);

	if (codec == PAGE_CODEC_LZ4) {
		check(len <= PAGE_ENCODED_MAX);
		check(page_decode(codec, enc, len, NULL, out, &err) == 0);
		check(memcmp(out, cur, PG) == 0);
	} else {
		check(codec == PAGE_CODEC_RAW && len == PG);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_decoders(data, size);
	fuzz_round_trip(data, size);
	return 0;
}
