/*
 * Page encodings (page_delta.c) and page trace files (page_trace.c).
 *
 * The XOR_RLE encoder is checked against a byte-at-a-time reference that
 * implements the documented format directly (docs/protocol.md, "Page
 * encodings"): the SIMD bitmap, gap folding and size bound must give the
 * same bytes, and every encoding must decode back to the page.
 */
#include <CUnit/CUnit.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lz4.h>
#include <xxhash.h>

#include "codec/page_coding.h"
#include "codec/page_delta.h"
#include "codec/page_trace.h"
#include "suites.h"

#define PG PAGE_DELTA_PAGE

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static uint64_t rnd(void)
{
	/* xorshift64*: deterministic, so a failure repeats. */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 2685821657736338717ULL;
}

static void random_page(uint8_t *p)
{
	for (int i = 0; i < PG; i++)
		p[i] = (uint8_t)rnd();
}

/* The format straight from its documentation: -1 when it exceeds 4095. */
static int reference_encode(const uint8_t *cur, const uint8_t *prev, uint8_t *out)
{
	bool changed[PG], run[PG];
	int o = 0, pos = 0;

	for (int i = 0; i < PG; i++)
		changed[i] = cur[i] != prev[i];
	/* A gap of one or two unchanged bytes between changed ones is sent. */
	for (int i = 0; i < PG; i++) {
		bool left1 = i >= 1 && changed[i - 1], left2 = i >= 2 && changed[i - 2];
		bool right1 = i + 1 < PG && changed[i + 1], right2 = i + 2 < PG && changed[i + 2];

		run[i] = changed[i] || (left1 && (right1 || right2)) || (left2 && right1);
	}
	for (int i = 0; i < PG;) {
		if (!run[i]) {
			i++;
			continue;
		}
		int end = i;

		while (end < PG && run[end])
			end++;
		int lens[2] = { i - pos, end - i };

		for (int k = 0; k < 2; k++) {
			if (o + 2 > PAGE_ENCODED_MAX)
				return -1;
			if (lens[k] < 0x80) {
				out[o++] = (uint8_t)lens[k];
			} else {
				out[o++] = (uint8_t)(0x80 | (lens[k] & 0x7f));
				out[o++] = (uint8_t)(lens[k] >> 7);
			}
		}
		if (o + (end - i) > PAGE_ENCODED_MAX)
			return -1;
		memcpy(out + o, cur + i, (size_t)(end - i));
		o += end - i;
		pos = i = end;
	}
	return o;
}

/*
 * Encodes cur against prev, compares with the reference, decodes both out
 * of place and in place.  Returns the encoded length (-1: not smaller).
 */
static int check_round_trip(const uint8_t *cur, const uint8_t *prev)
{
	static uint8_t enc[PG], ref[PG], out[PG], inplace[PG];
	const char *err = NULL;
	int n = page_delta_encode(cur, prev, enc, sizeof(enc));
	int r = reference_encode(cur, prev, ref);

	CU_ASSERT_EQUAL(n, r);
	if (n >= 0 && n == r)
		CU_ASSERT_EQUAL(memcmp(enc, ref, (size_t)n), 0);
	if (n < 0)
		return n;
	CU_ASSERT(n <= PAGE_ENCODED_MAX);
	memset(out, 0xa5, sizeof(out));
	CU_ASSERT_EQUAL(page_delta_decode(enc, (size_t)n, prev, out, &err), 0);
	CU_ASSERT_EQUAL(memcmp(out, cur, PG), 0);
	memcpy(inplace, prev, PG);
	CU_ASSERT_EQUAL(page_decode(PAGE_CODEC_XOR_RLE, enc, (size_t)n, inplace, inplace, &err), 0);
	CU_ASSERT_EQUAL(memcmp(inplace, cur, PG), 0);
	return n;
}

static void test_identical_and_zero_pages(void)
{
	static uint8_t a[PG], b[PG];

	memset(a, 0, PG);
	memset(b, 0, PG);
	CU_ASSERT_EQUAL(check_round_trip(a, b), 0); /* all zero */
	random_page(a);
	memcpy(b, a, PG);
	CU_ASSERT_EQUAL(check_round_trip(a, b), 0);
	/* A page that became all zeros is as dense as it gets. */
	memset(b, 0, PG);
	CU_ASSERT_EQUAL(check_round_trip(b, a), -1);
}

static void test_every_byte_changed_is_not_smaller(void)
{
	static uint8_t a[PG], b[PG], enc[2 * PG];

	random_page(a);
	for (int i = 0; i < PG; i++)
		b[i] = a[i] ^ 0xff;
	CU_ASSERT_EQUAL(check_round_trip(b, a), -1);
	/* A bigger buffer does not lift the bound: never a page or more. */
	CU_ASSERT_EQUAL(page_delta_encode(b, a, enc, sizeof(enc)), -1);
}

static void test_alternating_bytes(void)
{
	static uint8_t a[PG], b[PG];

	for (int phase = 0; phase < 2; phase++) {
		random_page(a);
		memcpy(b, a, PG);
		for (int i = phase; i < PG; i += 2)
			b[i] ^= 0x5a;
		CU_ASSERT_EQUAL(check_round_trip(b, a), -1);
	}
	/* Every fourth byte: 1024 one-byte runs, 3 bytes each. */
	memcpy(b, a, PG);
	for (int i = 0; i < PG; i += 4)
		b[i] ^= 1;
	CU_ASSERT_EQUAL(check_round_trip(b, a), 3 * 1024);
	/* Every third byte (0 to 4095): the gaps of two fold into one whole-page run. */
	memcpy(b, a, PG);
	for (int i = 0; i < PG; i += 3)
		b[i] ^= 1;
	CU_ASSERT_EQUAL(check_round_trip(b, a), -1);
}

static void test_single_byte_at_page_ends(void)
{
	static uint8_t a[PG], b[PG], enc[PG];

	random_page(a);
	memcpy(b, a, PG);
	b[0] ^= 0x80;
	CU_ASSERT_EQUAL(check_round_trip(b, a), 3);
	CU_ASSERT_EQUAL(page_delta_encode(b, a, enc, sizeof(enc)), 3);
	CU_ASSERT(enc[0] == 0 && enc[1] == 1 && enc[2] == b[0]);
	memcpy(b, a, PG);
	b[PG - 1] ^= 1;
	CU_ASSERT_EQUAL(check_round_trip(b, a), 4);
	CU_ASSERT_EQUAL(page_delta_encode(b, a, enc, sizeof(enc)), 4);
	/* zero run 4095 = 0xff 0x1f, changed run 1, the byte */
	CU_ASSERT(enc[0] == 0xff && enc[1] == 0x1f && enc[2] == 1 && enc[3] == b[PG - 1]);
	b[0] ^= 1;
	CU_ASSERT_EQUAL(check_round_trip(b, a), 3 + 4);
	/* Bytes 63/64 and 127/128 straddle bitmap words. */
	memcpy(b, a, PG);
	b[63] ^= 1;
	b[64] ^= 1;
	b[127] ^= 1;
	b[130] ^= 1;
	CU_ASSERT_EQUAL(check_round_trip(b, a), 2 + 2 + 2 + 4);
}

static void test_random_sparse_changes(void)
{
	static uint8_t a[PG], b[PG];

	for (int iter = 0; iter < 3000; iter++) {
		random_page(a);
		memcpy(b, a, PG);
		int runs = (int)(rnd() % 64);

		for (int r = 0; r < runs; r++) {
			int at = (int)(rnd() % PG), len = 1 + (int)(rnd() % 40);

			for (int i = at; i < at + len && i < PG; i++)
				b[i] = (uint8_t)rnd();
		}
		int n = check_round_trip(b, a);

		CU_ASSERT(n >= -1 && n <= PAGE_ENCODED_MAX);
	}
}

/* Each byte changed with probability p: the size bound around its edge. */
static void test_random_densities(void)
{
	static uint8_t a[PG], b[PG];
	int smaller = 0, not_smaller = 0;

	for (int iter = 0; iter < 400; iter++) {
		unsigned per_mille = (unsigned)(iter * 1000 / 400);

		random_page(a);
		memcpy(b, a, PG);
		for (int i = 0; i < PG; i++)
			if (rnd() % 1000 < per_mille)
				b[i] ^= (uint8_t)(1 + rnd() % 255);
		if (check_round_trip(b, a) >= 0)
			smaller++;
		else
			not_smaller++;
	}
	CU_ASSERT(smaller > 0 && not_smaller > 0);
}

/* The same checks through the SSE2 comparison, which AVX2 machines skip. */
static void test_sse2_path(void)
{
	page_delta_force_sse2(true);
	test_identical_and_zero_pages();
	test_every_byte_changed_is_not_smaller();
	test_alternating_bytes();
	test_single_byte_at_page_ends();
	test_random_sparse_changes();
	test_random_densities();
	page_delta_force_sse2(false);
}

/* A small output buffer is a bound like the page: -1, never an overrun. */
static void test_output_capacity_respected(void)
{
	static uint8_t a[PG], b[PG];
	uint8_t *enc = malloc(64); /* exact size, so ASan sees any overrun */

	random_page(a);
	memcpy(b, a, PG);
	for (int i = 0; i < 20; i++)
		b[i * 200] ^= 1; /* 20 runs, 3 or 4 bytes each: about 70 bytes */
	CU_ASSERT_EQUAL(page_delta_encode(b, a, enc, 64), -1);
	CU_ASSERT(page_delta_encode(b, a, enc, 0) == -1);
	memcpy(b, a, PG);
	b[5] ^= 1;
	CU_ASSERT_EQUAL(page_delta_encode(b, a, enc, 3), 3);
	CU_ASSERT_EQUAL(page_delta_encode(b, a, enc, 2), -1);
	CU_ASSERT_EQUAL(page_delta_encode(a, a, enc, 0), 0);
	free(enc);
}

static void expect_rejected(const uint8_t *in, size_t len)
{
	static uint8_t base[PG], out[PG], copy[PG];
	const char *err = NULL;

	memset(base, 7, PG);
	memset(out, 0xee, PG);
	CU_ASSERT_EQUAL(page_delta_decode(in, len, base, out, &err), -1);
	CU_ASSERT_PTR_NOT_NULL(err);
	for (int i = 0; i < PG; i++)
		if (out[i] != 0xee) {
			CU_FAIL("a rejected delta wrote the output page");
			break;
		}
	memcpy(copy, base, PG);
	CU_ASSERT_EQUAL(page_delta_decode(in, len, copy, copy, &err), -1);
	CU_ASSERT_EQUAL(memcmp(copy, base, PG), 0);
}

static void test_decoder_rejects_malformed(void)
{
	const uint8_t truncated_len[] = { 0x80 };
	const uint8_t overlong[] = { 0x81, 0x00, 1, 9 };
	const uint8_t three_bytes[] = { 0x80, 0x80, 0x01, 1, 9 };
	const uint8_t no_changed_run[] = { 5 };
	const uint8_t empty_changed[] = { 5, 0 };
	const uint8_t empty_gap_later[] = { 0, 1, 9, 0, 1, 9 };
	const uint8_t past_end[] = { 0xff, 0x1f, 2, 9, 9 };
	const uint8_t huge_len[] = { 0, 0xff, 0x7f };
	const uint8_t short_run[] = { 0, 5, 1, 2 };

	expect_rejected(truncated_len, sizeof(truncated_len));
	expect_rejected(overlong, sizeof(overlong));
	expect_rejected(three_bytes, sizeof(three_bytes));
	expect_rejected(no_changed_run, sizeof(no_changed_run));
	expect_rejected(empty_changed, sizeof(empty_changed));
	expect_rejected(empty_gap_later, sizeof(empty_gap_later));
	expect_rejected(past_end, sizeof(past_end));
	expect_rejected(huge_len, sizeof(huge_len));
	expect_rejected(short_run, sizeof(short_run));
}

/* Every prefix of a valid delta either ends on a record or is rejected. */
static void test_decoder_truncations(void)
{
	static uint8_t a[PG], b[PG], enc[PG], out[PG];
	const char *err;

	random_page(a);
	memcpy(b, a, PG);
	for (int i = 100; i < 400; i++)
		b[i] ^= 1;
	b[3000] ^= 1;
	int n = page_delta_encode(b, a, enc, sizeof(enc));

	CU_ASSERT_FATAL(n > 300);
	for (int len = 0; len < n; len++) {
		uint8_t *copy = malloc((size_t)len + 1); /* exact-size heap copy for ASan */

		memcpy(copy, enc, (size_t)len);
		int rc = page_delta_decode(copy, (size_t)len, a, out, &err);

		/* The first record (0x64, 0xac 0x02, 300 bytes) ends at 303. */
		CU_ASSERT_EQUAL(rc, len == 0 || len == 303 ? 0 : -1);
		free(copy);
	}
}

/* Garbage must be rejected or decoded, never read or written out of bounds. */
static void test_decoder_survives_garbage(void)
{
	static uint8_t base[PG], out[PG];
	const char *err;
	int accepted = 0;

	for (int iter = 0; iter < 5000; iter++) {
		size_t len = rnd() % 64;
		uint8_t *in = malloc(len + 1);

		for (size_t i = 0; i < len; i++)
			in[i] = (uint8_t)(rnd() % 4 ? rnd() % 8 : rnd());
		accepted += page_delta_decode(in, len, base, out, &err) == 0;
		free(in);
	}
	CU_ASSERT(accepted > 0);
}

static void test_lz4_or_raw_for_a_miss(void)
{
	static uint8_t page[PG], enc[PG], out[PG];
	const char *err = NULL;
	size_t len;

	/* A zero page compresses to a few bytes. */
	memset(page, 0, PG);
	CU_ASSERT_EQUAL(page_encode_miss(page, enc, sizeof(enc), &len), PAGE_CODEC_LZ4);
	CU_ASSERT(len > 0 && len < 64);
	memset(out, 1, PG);
	CU_ASSERT_EQUAL(page_decode(PAGE_CODEC_LZ4, enc, len, NULL, out, &err), 0);
	CU_ASSERT_EQUAL(memcmp(out, page, PG), 0);
	/* Text-like content. */
	for (int i = 0; i < PG; i++)
		page[i] = (uint8_t)("customer_name=alice;balance="[i % 28] + (i / 512));
	CU_ASSERT_EQUAL(page_encode_miss(page, enc, sizeof(enc), &len), PAGE_CODEC_LZ4);
	CU_ASSERT(len < PG / 2);
	CU_ASSERT_EQUAL(page_decode(PAGE_CODEC_LZ4, enc, len, NULL, out, &err), 0);
	CU_ASSERT_EQUAL(memcmp(out, page, PG), 0);
	/* Random bytes do not compress: RAW, and the page itself is the data. */
	random_page(page);
	CU_ASSERT_EQUAL(page_encode_miss(page, enc, sizeof(enc), &len), PAGE_CODEC_RAW);
	CU_ASSERT_EQUAL(len, PG);
	CU_ASSERT_EQUAL(page_decode(PAGE_CODEC_RAW, page, len, NULL, out, &err), 0);
	CU_ASSERT_EQUAL(memcmp(out, page, PG), 0);
	/* A small output buffer turns LZ4 into RAW, not an overrun. */
	memset(page, 0, PG);
	CU_ASSERT_EQUAL(page_encode_miss(page, enc, 4, &len), PAGE_CODEC_RAW);
}

static void test_page_decode_rejects(void)
{
	static uint8_t page[PG], enc[PG], out[PG], small[100];
	const char *err = NULL;
	size_t len;

	memset(out, 0x33, PG);
	CU_ASSERT_EQUAL(page_decode(PAGE_CODEC_RAW, page, PG - 1, NULL, out, &err), -1);
	CU_ASSERT_EQUAL(page_decode(PAGE_CODEC_XOR_RLE, enc, 0, NULL, out, &err), -1);
	CU_ASSERT_EQUAL(page_decode((enum page_codec)1, enc, 0, NULL, out, &err), -1);
	CU_ASSERT_EQUAL(page_decode(PAGE_CODEC_LZ4, enc, 0, NULL, out, &err), -1);
	CU_ASSERT_EQUAL(page_decode(PAGE_CODEC_LZ4, enc, PG, NULL, out, &err), -1);
	/* A valid LZ4 block of less than a page. */
	memset(small, 'x', sizeof(small));
	int n = LZ4_compress_default((const char *)small, (char *)enc, sizeof(small), PG);

	CU_ASSERT_FATAL(n > 0);
	CU_ASSERT_EQUAL(page_decode(PAGE_CODEC_LZ4, enc, (size_t)n, NULL, out, &err), -1);
	/* Garbage and truncated blocks. */
	memset(page, 0, PG);
	CU_ASSERT_EQUAL(page_encode_miss(page, enc, sizeof(enc), &len), PAGE_CODEC_LZ4);
	for (size_t cut = 1; cut < len; cut++)
		CU_ASSERT_EQUAL(page_decode(PAGE_CODEC_LZ4, enc, cut, NULL, out, &err), -1);
	memset(enc, 0xff, 40);
	CU_ASSERT_EQUAL(page_decode(PAGE_CODEC_LZ4, enc, 40, NULL, out, &err), -1);
	for (int i = 0; i < PG; i++)
		if (out[i] != 0x33) {
			CU_FAIL("a rejected page wrote its output");
			break;
		}
}

static void test_checksum(void)
{
	static uint8_t page[PG];

	random_page(page);
	uint64_t sum = page_checksum(page);

	CU_ASSERT_EQUAL(sum, XXH3_64bits(page, PG));
	page[4095] ^= 1;
	CU_ASSERT_NOT_EQUAL(page_checksum(page), sum);
}

static void test_trace_round_trip(void)
{
	char path[] = "/tmp/remusdb-trace-XXXXXX";
	int fd = mkstemp(path);
	static struct page_trace_record rec;
	static uint8_t prev[3][PG], cur[3][PG];
	const char *err = NULL;

	CU_ASSERT_FATAL(fd >= 0);
	close(fd);
	struct page_trace *t = page_trace_create(path, &err);

	CU_ASSERT_PTR_NOT_NULL_FATAL(t);
	for (int i = 0; i < 3; i++) {
		random_page(prev[i]);
		random_page(cur[i]);
		CU_ASSERT_EQUAL(page_trace_append(t, (uint16_t)(i + 1), 0x123456789aULL + (uint64_t)i,
						  prev[i], cur[i], &err), 0);
	}
	CU_ASSERT_EQUAL(page_trace_close(t, &err), 0);
	t = page_trace_open(path, &err);
	CU_ASSERT_PTR_NOT_NULL_FATAL(t);
	for (int i = 0; i < 3; i++) {
		CU_ASSERT_EQUAL(page_trace_next(t, &rec, &err), 1);
		CU_ASSERT_EQUAL(rec.block, i + 1);
		CU_ASSERT_EQUAL(rec.page, 0x123456789aULL + (uint64_t)i);
		CU_ASSERT_EQUAL(memcmp(rec.prev, prev[i], PG), 0);
		CU_ASSERT_EQUAL(memcmp(rec.cur, cur[i], PG), 0);
	}
	CU_ASSERT_EQUAL(page_trace_next(t, &rec, &err), 0);
	page_trace_close(t, &err);

	/* A record cut short is an error, not the end. */
	CU_ASSERT_EQUAL(truncate(path, PAGE_TRACE_HEADER + PAGE_TRACE_RECORD + 100), 0);
	t = page_trace_open(path, &err);
	CU_ASSERT_PTR_NOT_NULL_FATAL(t);
	CU_ASSERT_EQUAL(page_trace_next(t, &rec, &err), 1);
	CU_ASSERT_EQUAL(page_trace_next(t, &rec, &err), -1);
	page_trace_close(t, &err);

	/* Not a trace. */
	FILE *f = fopen(path, "wb");

	fputs("RDBTRACX and more bytes", f);
	fclose(f);
	CU_ASSERT_PTR_NULL(page_trace_open(path, &err));
	unlink(path);
}

int register_page_delta_tests(void)
{
	CU_pSuite suite = CU_add_suite("page_delta", NULL, NULL);

	if (!suite)
		return -1;
	if (!CU_add_test(suite, "identical and zero pages", test_identical_and_zero_pages) ||
	    !CU_add_test(suite, "every byte changed is not smaller",
			 test_every_byte_changed_is_not_smaller) ||
	    !CU_add_test(suite, "alternating bytes", test_alternating_bytes) ||
	    !CU_add_test(suite, "single byte at the page ends", test_single_byte_at_page_ends) ||
	    !CU_add_test(suite, "random sparse changes", test_random_sparse_changes) ||
	    !CU_add_test(suite, "random densities", test_random_densities) ||
	    !CU_add_test(suite, "the same through SSE2", test_sse2_path) ||
	    !CU_add_test(suite, "output capacity respected", test_output_capacity_respected) ||
	    !CU_add_test(suite, "decoder rejects malformed", test_decoder_rejects_malformed) ||
	    !CU_add_test(suite, "decoder truncations", test_decoder_truncations) ||
	    !CU_add_test(suite, "decoder survives garbage", test_decoder_survives_garbage) ||
	    !CU_add_test(suite, "LZ4 or RAW for a miss", test_lz4_or_raw_for_a_miss) ||
	    !CU_add_test(suite, "page decode rejects", test_page_decode_rejects) ||
	    !CU_add_test(suite, "checksum", test_checksum) ||
	    !CU_add_test(suite, "trace round trip", test_trace_round_trip))
		return -1;
	return 0;
}
