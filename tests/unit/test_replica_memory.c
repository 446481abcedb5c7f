/*
 * The backup's memory admission (replica_memory.c): what a replica is
 * counted at, and that the rule refuses by the byte, not only grossly,
 * with the numbers and the fix in its one line.
 */
#include <CUnit/CUnit.h>
#include <stdio.h>
#include <string.h>

#include "backup/coded_pages.h"
#include "backup/replica_memory.h"
#include "suites.h"

#define MIB (1ULL << 20)
#define GIB (1ULL << 30)

static void test_need_of_a_guest(void)
{
	struct replica_memory m;

	replica_memory_need(GIB, true, &m);
	CU_ASSERT_EQUAL(m.image, GIB);
	CU_ASSERT_EQUAL(m.staging, GIB / 8);
	CU_ASSERT_EQUAL(m.deferred, REPLICA_DEFER_MAX);
	CU_ASSERT_EQUAL(m.takeover, 0);
	CU_ASSERT_EQUAL(replica_memory_total(&m), GIB + GIB / 8 + REPLICA_DEFER_MAX);
	/* A takeover that writes the image into QEMU holds it twice. */
	replica_memory_need(GIB, false, &m);
	CU_ASSERT_EQUAL(m.takeover, GIB);
	/* A small guest still gets the staging floor. */
	replica_memory_need(128 * MIB, true, &m);
	CU_ASSERT_EQUAL(m.staging, REPLICA_STAGING_MIN);
}

/* Fits exactly: admitted; one byte short: refused (the small bug). */
static void test_admission_by_the_byte(void)
{
	struct replica_memory m;
	char why[512] = "";
	uint64_t total;

	replica_memory_need(GIB, true, &m);
	total = replica_memory_total(&m);
	CU_ASSERT_EQUAL(replica_memory_admit("db", &m, total, 0, 0, why, sizeof(why)), 0);
	CU_ASSERT_STRING_EQUAL(why, "");
	CU_ASSERT_EQUAL(replica_memory_admit("db", &m, total - 1, 0, 0, why, sizeof(why)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(why, "not enough memory for a replica of db"));
	CU_ASSERT_PTR_NOT_NULL(strstr(why, "), 0.0 MiB short;")); /* one byte */
	CU_ASSERT_PTR_NOT_NULL(strstr(why, "--memory-limit"));
}

/* The replicas already here count: what fits alone does not fit beside them. */
static void test_others_count(void)
{
	struct replica_memory m;
	char why[512] = "";
	uint64_t total;

	replica_memory_need(2 * GIB, true, &m);
	total = replica_memory_total(&m);
	CU_ASSERT_EQUAL(replica_memory_admit("b", &m, 4 * GIB + total, 4 * GIB, 2, why,
					     sizeof(why)), 0);
	CU_ASSERT_EQUAL(replica_memory_admit("b", &m, 4 * GIB + total, 4 * GIB + 1, 2, why,
					     sizeof(why)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(why, "(2 replicas hold 4.00 GiB)"));
	/* More in use than the limit (it was lowered): nothing is left, no wrap. */
	CU_ASSERT_EQUAL(replica_memory_admit("b", &m, GIB, 3 * GIB, 1, why, sizeof(why)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(why, "0.00 GiB of this backup's 1.00 GiB"));
}

/* Declared lengths near 2^64 saturate: they never wrap into a fit. */
static void test_huge_layouts_saturate(void)
{
	struct replica_memory m;
	char why[512] = "";

	replica_memory_need(UINT64_MAX - 4096, false, &m);
	CU_ASSERT_EQUAL(replica_memory_total(&m), UINT64_MAX);
	CU_ASSERT_EQUAL(replica_memory_add(UINT64_MAX, 1), UINT64_MAX);
	CU_ASSERT_EQUAL(replica_memory_admit("x", &m, 1ULL << 40, 0, 0, why, sizeof(why)), -1);
	/* limit 0: no limit (a zeroed repl_settings) */
	CU_ASSERT_EQUAL(replica_memory_admit("x", &m, 0, 0, 0, why, sizeof(why)), 0);
}

static void test_refusal_names_every_part(void)
{
	struct replica_memory m;
	char why[512] = "";

	replica_memory_need(4 * GIB, false, &m);
	CU_ASSERT_EQUAL(replica_memory_admit("big", &m, 8 * GIB, 0, 0, why, sizeof(why)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(why, "it needs 8.75 GiB (image 4.00, epoch staging 0.50, "
				       "deferred frames 0.25, takeover copy 4.00)"));
	CU_ASSERT_PTR_NULL(strchr(why, '\n'));
}

int register_replica_memory_tests(void)
{
	CU_pSuite suite = CU_add_suite("replica_memory", NULL, NULL);

	if (!suite)
		return -1;
	if (!CU_add_test(suite, "need of a guest", test_need_of_a_guest) ||
	    !CU_add_test(suite, "admission by the byte", test_admission_by_the_byte) ||
	    !CU_add_test(suite, "the replicas already here count", test_others_count) ||
	    !CU_add_test(suite, "huge layouts saturate", test_huge_layouts_saturate) ||
	    !CU_add_test(suite, "the refusal names every part", test_refusal_names_every_part))
		return -1;
	return 0;
}
