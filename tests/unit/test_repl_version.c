/*
 * The protocol version's negotiation as pure functions (repl_version.h):
 * the highest common version over ranges that overlap, touch, contain
 * each other or are disjoint, the primary's offer, the backup's range as
 * its ERROR reason gives it (a version-1 daemon's plain reason
 * included), and the exact lines both sides log.  The case tables also
 * run against deliberately broken selections, which they must catch.
 */
#include <CUnit/CUnit.h>
#include <stdio.h>
#include <string.h>

#include "wire/repl_auth.h"
#include "wire/repl_proto.h"
#include "wire/repl_version.h"
#include "suites.h"

#define R(lo, hi) ((struct repl_version_range){ (lo), (hi) })

typedef uint16_t (*common_fn)(struct repl_version_range, struct repl_version_range);

struct common_case {
	struct repl_version_range a, b;
	uint16_t want;
};

static const struct common_case common_cases[] = {
	{ R(1, 2), R(1, 2), 2 },     /* the same build on both hosts */
	{ R(1, 2), R(1, 1), 1 },     /* a version-1 peer */
	{ R(1, 1), R(1, 2), 1 },
	{ R(1, 2), R(2, 3), 2 },     /* overlapping */
	{ R(2, 3), R(1, 2), 2 },
	{ R(1, 5), R(2, 3), 3 },     /* one holds the other */
	{ R(2, 3), R(1, 5), 3 },
	{ R(1, 2), R(2, 2), 2 },     /* touching at one end */
	{ R(2, 4), R(4, 9), 4 },
	{ R(3, 3), R(3, 3), 3 },
	{ R(1, 2), R(3, 3), 0 },     /* disjoint, either way round */
	{ R(3, 3), R(1, 2), 0 },
	{ R(1, 1), R(2, 3), 0 },
	{ R(5, 9), R(1, 4), 0 },
	{ R(1, 2), R(0, 0), 0 },     /* unknown */
	{ R(0, 0), R(1, 2), 0 },
	{ R(1, 2), R(3, 2), 0 },     /* not a range */
	{ R(1, 65535), R(65535, 65535), 65535 },
};

/* Mismatches of fn against the table, each printed when `show`. */
static unsigned check_common(common_fn fn, bool show)
{
	unsigned bad = 0;

	for (size_t i = 0; i < sizeof(common_cases) / sizeof(common_cases[0]); i++) {
		const struct common_case *c = &common_cases[i];
		uint16_t got = fn(c->a, c->b);
		if (got == c->want)
			continue;
		if (show)
			fprintf(stderr, "\n  common(%u..%u, %u..%u) = %u, want %u", c->a.lo, c->a.hi,
				c->b.lo, c->b.hi, got, c->want);
		bad++;
	}
	return bad;
}

/* Broken selections: each differs from the right one by a small slip. */
static uint16_t common_touching_is_disjoint(struct repl_version_range a,
					    struct repl_version_range b)
{
	uint16_t hi = a.hi < b.hi ? a.hi : b.hi, lo = a.lo > b.lo ? a.lo : b.lo;

	return repl_version_known(a) && repl_version_known(b) && lo < hi ? hi : 0;
}

static uint16_t common_lowest(struct repl_version_range a, struct repl_version_range b)
{
	uint16_t hi = a.hi < b.hi ? a.hi : b.hi, lo = a.lo > b.lo ? a.lo : b.lo;

	return repl_version_known(a) && repl_version_known(b) && lo <= hi ? lo : 0;
}

static uint16_t common_ignores_lower_bounds(struct repl_version_range a,
					    struct repl_version_range b)
{
	if (!repl_version_known(a) || !repl_version_known(b))
		return 0;
	return a.hi < b.hi ? a.hi : b.hi;
}

static void test_common_version(void)
{
	CU_ASSERT_EQUAL(check_common(repl_version_common, true), 0);
	/* Negative controls: the same table catches each small slip. */
	CU_ASSERT(check_common(common_touching_is_disjoint, false) > 0);
	CU_ASSERT(check_common(common_lowest, false) > 0);
	CU_ASSERT(check_common(common_ignores_lower_bounds, false) > 0);
}

static void test_ours_and_in(void)
{
	struct repl_version_range ours = repl_version_ours();

	CU_ASSERT_EQUAL(ours.lo, REPL_PROTOCOL_MIN);
	CU_ASSERT_EQUAL(ours.hi, REPL_PROTOCOL_MAX);
	CU_ASSERT(repl_version_known(ours));
	CU_ASSERT_FALSE(repl_version_known(R(0, 0)));
	CU_ASSERT_FALSE(repl_version_known(R(2, 1)));
	CU_ASSERT(repl_version_in(R(1, 2), 1));
	CU_ASSERT(repl_version_in(R(1, 2), 2));
	CU_ASSERT_FALSE(repl_version_in(R(1, 2), 3));
	CU_ASSERT_FALSE(repl_version_in(R(2, 3), 1));
	CU_ASSERT_FALSE(repl_version_in(R(0, 0), 0));
}

static void test_offer(void)
{
	/* Not knowing the backup's range: our highest. */
	CU_ASSERT_EQUAL(repl_version_offer(R(1, 2), R(0, 0)), 2);
	CU_ASSERT_EQUAL(repl_version_offer(R(3, 3), R(0, 0)), 3);
	/* Knowing it: the highest both speak (the retry). */
	CU_ASSERT_EQUAL(repl_version_offer(R(1, 2), R(1, 1)), 1);
	CU_ASSERT_EQUAL(repl_version_offer(R(1, 3), R(2, 5)), 3);
	CU_ASSERT_EQUAL(repl_version_offer(R(2, 4), R(1, 2)), 2);
	/* Nothing common: still our highest, which the backup refuses with its range. */
	CU_ASSERT_EQUAL(repl_version_offer(R(1, 2), R(3, 4)), 2);
	CU_ASSERT_EQUAL(repl_version_offer(R(3, 3), R(1, 2)), 3);
}

static struct repl_version_range from(const char *reason, uint16_t hello_version)
{
	return repl_version_from_refusal(reason, strlen(reason), hello_version);
}

#define RANGE_IS(r, l, h) CU_ASSERT((r).lo == (l) && (r).hi == (h))

static void test_range_from_refusal(void)
{
	RANGE_IS(from("supported 1..2", 1), 1, 2);
	RANGE_IS(from("supported 1..2; the primary offers ...", 1), 1, 2);
	RANGE_IS(from("supported 3..3; x", 3), 3, 3);
	RANGE_IS(from("supported 1..65535", 1), 1, 65535);
	RANGE_IS(from("supported 12..345; x", 12), 12, 345);
	/* A version-1 daemon's reason, whose HELLO said 1: it speaks 1..1. */
	RANGE_IS(from("the peer speaks replication protocol version 2, we speak 1: run the "
		      "same remusdbd version on both hosts", 1), 1, 1);
	RANGE_IS(from("", 1), 1, 1);
	/* The same plain reason from a daemon that opened with 2: unknown. */
	RANGE_IS(from("the peer speaks replication protocol version 3, we speak 2", 2), 0, 0);
	/* Not the fixed form: unknown (1 when the HELLO said 1 is not assumed). */
	const char *bad[] = {
		"supported 2..1", "supported 0..2", "supported 01..2", "supported 1..02",
		"supported 1..65536", "supported 1..123456", "supported 1-2", "supported 1..",
		"supported ..2", "supported 1..2;", "supported 1..2x", "supported 1..2 ",
		"Supported 1..2", "supported  1..2", "supported 1...2", "supported -1..2",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct repl_version_range r = from(bad[i], 2);
		if (repl_version_known(r))
			fprintf(stderr, "\n  '%s' gave %u..%u", bad[i], r.lo, r.hi);
		CU_ASSERT_FALSE(repl_version_known(r));
	}
	/* Only len bytes are read: the reason is not NUL-terminated on the wire. */
	const char *longer = "supported 1..29";
	RANGE_IS(repl_version_from_refusal(longer, 14, 2), 1, 2);
	RANGE_IS(repl_version_from_refusal(longer, 13, 2), 0, 0);
}

static void test_refusal_reason(void)
{
	char buf[256];

	repl_version_refusal_reason(buf, sizeof(buf), R(1, 2), 3);
	CU_ASSERT_STRING_EQUAL(buf, "supported 1..2; the primary offers replication protocol "
			       "3, this daemon speaks 1..2: the primary retries with 2 if it "
			       "speaks it, otherwise upgrade this daemon first");
	RANGE_IS(from(buf, 1), 1, 2);
	repl_version_refusal_reason(buf, sizeof(buf), R(3, 4), 2);
	CU_ASSERT_STRING_EQUAL(buf, "supported 3..4; the primary offers replication protocol "
			       "2, this daemon speaks 3..4: upgrade the older daemon (the "
			       "primary's) first");
	RANGE_IS(from(buf, 3), 3, 4);
	/* Every reason reads back as the range it was written with. */
	for (uint16_t lo = 1; lo <= 4; lo++)
		for (uint16_t hi = lo; hi <= 4; hi++) {
			repl_version_refusal_reason(buf, sizeof(buf), R(lo, hi), 9);
			RANGE_IS(from(buf, lo), lo, hi);
		}
	CU_ASSERT(strlen(buf) < REPL_TEXT_MAX);
}

static void test_mismatch_line(void)
{
	char buf[256];

	repl_version_mismatch_line(buf, sizeof(buf), "10.77.0.2:7788", R(2, 3), R(1, 1));
	CU_ASSERT_STRING_EQUAL(buf, "backup 10.77.0.2:7788 speaks replication protocol 1..1, "
			       "this daemon 2..3: upgrade the older daemon (the backup's) first");
	repl_version_mismatch_line(buf, sizeof(buf), "10.77.0.2:7788", R(1, 2), R(3, 3));
	CU_ASSERT_STRING_EQUAL(buf, "backup 10.77.0.2:7788 speaks replication protocol 3..3, "
			       "this daemon 1..2: upgrade the older daemon (this one) first");
}

/* The range a nonce carries (the version binding's): read back, or none. */
static void test_nonce_stamp(void)
{
	uint8_t nonce[REPL_NONCE_SIZE];
	struct repl_version_range r;

	memset(nonce, 0xab, sizeof(nonce));
	r = repl_version_from_nonce(nonce, sizeof(nonce));
	CU_ASSERT(r.lo == 0 && r.hi == 0); /* random bytes: an older daemon's */
	repl_version_stamp_nonce(nonce, sizeof(nonce), R(1, 3));
	r = repl_version_from_nonce(nonce, sizeof(nonce));
	CU_ASSERT(r.lo == 1 && r.hi == 3);
	CU_ASSERT_EQUAL(nonce[0], 0xab); /* the random part stays */
	CU_ASSERT_EQUAL(nonce[REPL_NONCE_SIZE - REPL_VERSION_STAMP_SIZE - 1], 0xab);
	repl_version_stamp_nonce(nonce, sizeof(nonce), R(300, 65535));
	r = repl_version_from_nonce(nonce, sizeof(nonce));
	CU_ASSERT(r.lo == 300 && r.hi == 65535);
	/* One byte of the magic off, or a range that is none: unknown. */
	nonce[REPL_NONCE_SIZE - REPL_VERSION_STAMP_SIZE] ^= 1;
	r = repl_version_from_nonce(nonce, sizeof(nonce));
	CU_ASSERT(r.lo == 0 && r.hi == 0);
	repl_version_stamp_nonce(nonce, sizeof(nonce), R(3, 2));
	r = repl_version_from_nonce(nonce, sizeof(nonce));
	CU_ASSERT(r.lo == 0 && r.hi == 0);
}

static void test_downgraded(void)
{
	CU_ASSERT(repl_version_downgraded(R(1, 3), R(1, 3), 2));
	CU_ASSERT(repl_version_downgraded(R(1, 3), R(2, 5), 2));
	CU_ASSERT_FALSE(repl_version_downgraded(R(1, 3), R(1, 3), 3));
	CU_ASSERT_FALSE(repl_version_downgraded(R(1, 3), R(1, 2), 2)); /* a real 1..2 peer */
	CU_ASSERT_FALSE(repl_version_downgraded(R(1, 3), R(0, 0), 1)); /* no range: older */
	CU_ASSERT_FALSE(repl_version_downgraded(R(1, 3), R(4, 5), 3)); /* disjoint */
	char line[400];
	repl_version_downgrade_reason(line, sizeof(line), R(1, 3), R(1, 3), 2);
	struct repl_version_range back = repl_version_from_refusal(line, strlen(line), 1);
	CU_ASSERT(back.lo == 1 && back.hi == 3); /* a refusal the primary reads as any other */
}

int register_repl_version_tests(void)
{
	CU_pSuite s = CU_add_suite("repl_version", NULL, NULL);

	if (!s ||
	    !CU_add_test(s, "highest common version", test_common_version) ||
	    !CU_add_test(s, "our range", test_ours_and_in) ||
	    !CU_add_test(s, "the primary's offer", test_offer) ||
	    !CU_add_test(s, "the backup's range from its refusal", test_range_from_refusal) ||
	    !CU_add_test(s, "the backup's refusal", test_refusal_reason) ||
	    !CU_add_test(s, "the primary's line", test_mismatch_line) ||
	    !CU_add_test(s, "the range a nonce carries", test_nonce_stamp) ||
	    !CU_add_test(s, "a talked-down session", test_downgraded))
		return -1;
	return 0;
}
