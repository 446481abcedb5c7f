/*
 * The device state blob coded against the previous epoch's blob
 * (device_delta.c): every blob survives encode -> decode against its
 * base, whatever their lengths; an unchanged blob costs a few bytes per
 * chunk; and a decoder fed a truncated, padded or nonsensical record
 * stream refuses it.
 */
#include <CUnit/CUnit.h>
#include <stdlib.h>
#include <string.h>

#include "base/buffer.h"
#include "codec/device_delta.h"
#include "suites.h"

static void fill_random(uint8_t *p, size_t n, unsigned *seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(rand_r(seed) >> 7);
}

/* Codes cur against base, decodes it back and compares; returns the coded length. */
static size_t round_trip(const uint8_t *cur, size_t cur_len, const uint8_t *base, size_t base_len)
{
	struct buffer rec;
	const char *err = NULL;
	uint8_t *out = malloc(cur_len);

	buffer_init(&rec);
	CU_ASSERT_PTR_NOT_NULL_FATAL(out);
	CU_ASSERT_EQUAL_FATAL(device_delta_encode(cur, cur_len, base, base_len, &rec), 0);
	CU_ASSERT_EQUAL(device_delta_decode(buffer_head(&rec), buffer_len(&rec), base, base_len,
					    out, cur_len, &err), 0);
	CU_ASSERT_EQUAL(memcmp(out, cur, cur_len), 0);
	size_t n = buffer_len(&rec);
	buffer_free(&rec);
	free(out);
	return n;
}

static void test_round_trips(void)
{
	enum { BIG = 150 * 1024 + 123 };
	unsigned seed = 7;
	uint8_t *a = malloc(BIG), *b = malloc(BIG);

	CU_ASSERT_PTR_NOT_NULL_FATAL(a);
	CU_ASSERT_PTR_NOT_NULL_FATAL(b);
	fill_random(a, BIG, &seed);
	memcpy(b, a, BIG);
	/* Unchanged: three bytes a chunk (kind and an empty delta). */
	CU_ASSERT_EQUAL(round_trip(b, BIG, a, BIG), 3 * ((BIG + 4095) / 4096));
	/* A few device registers changed, one at each end of a chunk. */
	b[0] ^= 1;
	b[4095] ^= 0x80;
	b[4096] ^= 0x40;
	b[BIG - 1] ^= 0xff;
	b[70000] = (uint8_t)(b[70000] + 3);
	CU_ASSERT(round_trip(b, BIG, a, BIG) < 3 * ((BIG + 4095) / 4096) + 64);
	/* Everything changed: RAW chunks, one byte of overhead each. */
	fill_random(b, BIG, &seed);
	CU_ASSERT_EQUAL(round_trip(b, BIG, a, BIG), BIG + (BIG + 4095) / 4096);
	/* The blob grew, shrank, has no base, or is shorter than a chunk. */
	CU_ASSERT(round_trip(a, BIG, a, BIG - 5000) < 5000 + 3 * 40);
	CU_ASSERT(round_trip(a, BIG - 5000, a, BIG) < 3 * 40);
	round_trip(a, BIG, NULL, 0);
	round_trip(a, 1, a, BIG);
	round_trip(a, 4096, b, 1);
	/* A blob whose tail chunk is zero against a base that is zero there too. */
	memset(b, 0, BIG);
	CU_ASSERT_EQUAL(round_trip(b, 10, b, BIG), 3);
	free(a);
	free(b);
}

static void test_limits(void)
{
	struct buffer rec;
	uint8_t one = 1, out[8];
	const char *err = NULL;

	buffer_init(&rec);
	CU_ASSERT_EQUAL(device_delta_encode(&one, 0, NULL, 0, &rec), -1);
	CU_ASSERT_EQUAL(device_delta_encode(&one, DEVICE_DELTA_MAX_BLOB + 1, NULL, 0, &rec), -1);
	CU_ASSERT_EQUAL(buffer_len(&rec), 0);
	CU_ASSERT_EQUAL(device_delta_decode(&one, 1, NULL, 0, out, 0, &err), -1);
	CU_ASSERT_PTR_NOT_NULL(err);
	buffer_free(&rec);
}

/* The decoder must refuse rec as a blob of `total` bytes, with `what` in its error. */
static void refuses(const uint8_t *rec, size_t len, size_t total, const char *what)
{
	static uint8_t base[8192], out[3 * 4096];
	const char *err = NULL;

	CU_ASSERT_EQUAL(device_delta_decode(rec, len, base, sizeof(base), out, total, &err), -1);
	CU_ASSERT_PTR_NOT_NULL_FATAL(err);
	if (!strstr(err, what))
		fprintf(stderr, "\nexpected \"%s\" in \"%s\"\n", what, err);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, what));
}

static void test_malformed_records(void)
{
	uint8_t rec[4200];

	memset(rec, 0, sizeof(rec));
	/* One RAW chunk of 100 bytes, cut short by one. */
	refuses(rec, 100, 100, "cut short");
	/* Two chunks announced by the length, one record present. */
	rec[0] = DEVICE_DELTA_RAW;
	refuses(rec, 1 + 4096, 4097, "fewer records");
	/* A byte after the last chunk. */
	refuses(rec, 1 + 100 + 1, 100, "after the last chunk");
	/* An unknown kind. */
	rec[0] = 1;
	refuses(rec, 10, 5, "unknown record kind");
	/* XOR_RLE without its length, with a length past the end, too long a delta. */
	rec[0] = DEVICE_DELTA_XOR_RLE;
	refuses(rec, 2, 5, "cut short");
	rec[1] = 0;
	rec[2] = 9;
	refuses(rec, 3 + 8, 5, "length is wrong");
	rec[1] = 0x0f;
	rec[2] = 0xff; /* 4095: the longest a delta may be... */
	refuses(rec, 3 + 4095, 5, "");
	rec[1] = 0x10;
	rec[2] = 0x00; /* ...and 4096 is one too many */
	refuses(rec, 3 + 4096, 5, "length is wrong");
	/* A delta page_delta itself refuses: runs past the page. */
	rec[1] = 0;
	rec[2] = 3;
	rec[3] = 0x80;
	rec[4] = 0x40; /* 8192 unchanged bytes: beyond the page */
	rec[5] = 0;
	refuses(rec, 6, 5, "");
}

int register_device_delta_tests(void)
{
	CU_pSuite suite = CU_add_suite("device_delta", NULL, NULL);

	if (!suite ||
	    !CU_add_test(suite, "blobs round-trip against any base", test_round_trips) ||
	    !CU_add_test(suite, "limits", test_limits) ||
	    !CU_add_test(suite, "malformed records are refused", test_malformed_records))
		return -1;
	return 0;
}
