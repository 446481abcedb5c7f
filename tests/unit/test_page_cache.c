/*
 * The LRU cache of sent pages (page_cache.c): eviction order, the budget,
 * updates, invalidation, statistics, and a random workload checked against
 * a plain array model of an LRU.
 */
#include <CUnit/CUnit.h>
#include <stdbool.h>
#include <string.h>

#include "codec/page_cache.h"
#include "suites.h"

#define PG PAGE_CACHE_PAGE

/* A budget that holds exactly n pages (slot and bucket bookkeeping included). */
static uint64_t budget_for(uint64_t n)
{
	return n * (PG + 32);
}

static void fill(uint8_t *page, uint64_t tag)
{
	for (int i = 0; i < PG; i += 8)
		memcpy(page + i, &tag, 8);
}

static bool holds(struct page_cache *c, uint16_t block, uint64_t page, uint64_t tag)
{
	const uint8_t *p = page_cache_lookup(c, block, page);
	uint8_t want[PG];

	if (!p)
		return false;
	fill(want, tag);
	return memcmp(p, want, PG) == 0;
}

static void test_budget_respected(void)
{
	const uint64_t budgets[] = { 0, 4095, 4096, PG + 32, 10 * (PG + 32) - 1,
				     1 << 20, 3u << 20, 64u << 20 };
	struct page_cache_stats s;

	for (size_t i = 0; i < sizeof(budgets) / sizeof(budgets[0]); i++) {
		struct page_cache *c = page_cache_create(budgets[i]);

		CU_ASSERT_PTR_NOT_NULL_FATAL(c);
		page_cache_get_stats(c, &s);
		CU_ASSERT(s.memory_bytes <= budgets[i]);
		CU_ASSERT(s.capacity * PG <= budgets[i]);
		/* Bookkeeping stays small: at least 98% of the budget holds pages. */
		if (budgets[i] >= (1 << 20))
			CU_ASSERT(s.capacity * PG * 100 >= budgets[i] * 98);
		CU_ASSERT_EQUAL(s.budget_bytes, budgets[i]);
		page_cache_destroy(c);
	}
	struct page_cache *c = page_cache_create(budget_for(10));

	page_cache_get_stats(c, &s);
	CU_ASSERT_EQUAL(s.capacity, 10);
	page_cache_destroy(c);
}

static void test_lru_eviction_order(void)
{
	struct page_cache *c = page_cache_create(budget_for(4));
	struct page_cache_stats s;
	uint8_t page[PG];

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	for (uint64_t k = 0; k < 4; k++) {
		fill(page, 100 + k);
		page_cache_store(c, 0, k, page);
	}
	/* Use 0 and 2: the order, oldest first, is now 1, 3, 0, 2. */
	CU_ASSERT(holds(c, 0, 0, 100));
	CU_ASSERT(holds(c, 0, 2, 102));
	fill(page, 104);
	page_cache_store(c, 0, 4, page); /* evicts 1 */
	fill(page, 105);
	page_cache_store(c, 0, 5, page); /* evicts 3 */
	page_cache_get_stats(c, &s);
	CU_ASSERT_EQUAL(s.evictions, 2);
	CU_ASSERT_EQUAL(s.pages, 4);
	CU_ASSERT_EQUAL(s.bytes, 4 * PG);
	CU_ASSERT_PTR_NULL(page_cache_lookup(c, 0, 1));
	CU_ASSERT_PTR_NULL(page_cache_lookup(c, 0, 3));
	/* Order now 0, 2, 4, 5; looking 0 up makes 2 the oldest. */
	CU_ASSERT(holds(c, 0, 0, 100));
	fill(page, 106);
	page_cache_store(c, 0, 6, page);
	CU_ASSERT_PTR_NULL(page_cache_lookup(c, 0, 2));
	CU_ASSERT(holds(c, 0, 4, 104));
	CU_ASSERT(holds(c, 0, 5, 105));
	CU_ASSERT(holds(c, 0, 6, 106));
	CU_ASSERT(holds(c, 0, 0, 100));
	page_cache_destroy(c);
}

static void test_update_existing_key(void)
{
	struct page_cache *c = page_cache_create(budget_for(2));
	struct page_cache_stats s;
	uint8_t page[PG];

	fill(page, 1);
	page_cache_store(c, 3, 7, page);
	fill(page, 2);
	page_cache_store(c, 3, 8, page);
	fill(page, 3);
	page_cache_store(c, 3, 7, page); /* update: 7 becomes the newest */
	page_cache_get_stats(c, &s);
	CU_ASSERT_EQUAL(s.updates, 1);
	CU_ASSERT_EQUAL(s.insertions, 2);
	CU_ASSERT_EQUAL(s.pages, 2);
	CU_ASSERT_EQUAL(s.evictions, 0);
	fill(page, 4);
	page_cache_store(c, 3, 9, page); /* evicts 8, not 7 */
	CU_ASSERT(holds(c, 3, 7, 3));
	CU_ASSERT_PTR_NULL(page_cache_lookup(c, 3, 8));
	page_cache_destroy(c);
}

static void test_block_is_part_of_the_key(void)
{
	struct page_cache *c = page_cache_create(budget_for(4));
	uint8_t page[PG];

	fill(page, 1);
	page_cache_store(c, 1, 5, page);
	fill(page, 2);
	page_cache_store(c, 2, 5, page);
	CU_ASSERT(holds(c, 1, 5, 1));
	CU_ASSERT(holds(c, 2, 5, 2));
	CU_ASSERT_PTR_NULL(page_cache_lookup(c, 0, 5));
	page_cache_destroy(c);
}

static void test_invalidate_and_clear(void)
{
	struct page_cache *c = page_cache_create(budget_for(2));
	struct page_cache_stats s;
	uint8_t page[PG];

	fill(page, 1);
	page_cache_store(c, 0, 1, page);
	page_cache_store(c, 0, 2, page);
	page_cache_invalidate(c, 0, 1);
	page_cache_invalidate(c, 0, 1);  /* absent: nothing */
	page_cache_invalidate(c, 9, 99); /* never there */
	CU_ASSERT_PTR_NULL(page_cache_lookup(c, 0, 1));
	/* Its slot is free again: no eviction to store another page. */
	page_cache_store(c, 0, 3, page);
	page_cache_get_stats(c, &s);
	CU_ASSERT_EQUAL(s.invalidations, 1);
	CU_ASSERT_EQUAL(s.evictions, 0);
	CU_ASSERT_EQUAL(s.pages, 2);
	CU_ASSERT(holds(c, 0, 2, 1));
	CU_ASSERT(holds(c, 0, 3, 1));
	page_cache_clear(c);
	page_cache_get_stats(c, &s);
	CU_ASSERT_EQUAL(s.pages, 0);
	CU_ASSERT_EQUAL(s.bytes, 0);
	CU_ASSERT_PTR_NULL(page_cache_lookup(c, 0, 2));
	page_cache_store(c, 0, 4, page);
	page_cache_store(c, 0, 5, page);
	page_cache_get_stats(c, &s);
	CU_ASSERT_EQUAL(s.evictions, 0);
	CU_ASSERT_EQUAL(s.pages, 2);
	page_cache_destroy(c);
}

static void test_stats_count_lookups(void)
{
	struct page_cache *c = page_cache_create(budget_for(2));
	struct page_cache_stats s;
	uint8_t page[PG];

	fill(page, 1);
	CU_ASSERT_PTR_NULL(page_cache_lookup(c, 0, 1));
	page_cache_store(c, 0, 1, page);
	CU_ASSERT_PTR_NOT_NULL(page_cache_lookup(c, 0, 1));
	CU_ASSERT_PTR_NOT_NULL(page_cache_lookup(c, 0, 1));
	page_cache_get_stats(c, &s);
	CU_ASSERT_EQUAL(s.hits, 2);
	CU_ASSERT_EQUAL(s.misses, 1);
	CU_ASSERT_EQUAL(s.insertions, 1);
	page_cache_destroy(c);
}

static void test_zero_budget_holds_nothing(void)
{
	struct page_cache *c = page_cache_create(0);
	struct page_cache_stats s;
	uint8_t page[PG];

	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	fill(page, 1);
	page_cache_store(c, 0, 1, page);
	CU_ASSERT_PTR_NULL(page_cache_lookup(c, 0, 1));
	page_cache_invalidate(c, 0, 1);
	page_cache_get_stats(c, &s);
	CU_ASSERT_EQUAL(s.capacity, 0);
	CU_ASSERT_EQUAL(s.pages, 0);
	CU_ASSERT_EQUAL(s.misses, 1);
	page_cache_destroy(c);
}

/*
 * Random lookups, stores and invalidations over 40 keys in a 16-page
 * cache, against a model: an array of keys ordered newest first.
 */
static void test_random_workload_matches_model(void)
{
	enum { CAP = 16, KEYS = 40 };
	struct page_cache *c = page_cache_create(budget_for(CAP));
	uint64_t model[CAP], version[KEYS] = { 0 };
	int n = 0;
	uint64_t x = 12345;
	uint8_t page[PG];

	for (int step = 0; step < 20000; step++) {
		x = x * 6364136223846793005ULL + 1442695040888963407ULL;
		uint64_t key = (x >> 33) % KEYS;
		int op = (int)((x >> 20) % 10), at = -1;

		for (int i = 0; i < n; i++)
			if (model[i] == key)
				at = i;
		if (op < 5) { /* lookup */
			const uint8_t *p = page_cache_lookup(c, (uint16_t)(key % 3), key);

			CU_ASSERT_EQUAL(p != NULL, at >= 0);
			if (p) {
				fill(page, key << 32 | version[key]);
				CU_ASSERT_EQUAL(memcmp(p, page, PG), 0);
			}
		} else if (op < 9) { /* store */
			version[key]++;
			fill(page, key << 32 | version[key]);
			page_cache_store(c, (uint16_t)(key % 3), key, page);
			if (at < 0)
				at = n < CAP ? n++ : CAP - 1; /* the oldest falls off */
		} else { /* invalidate */
			page_cache_invalidate(c, (uint16_t)(key % 3), key);
			if (at >= 0) {
				memmove(model + at, model + at + 1, (size_t)(n - at - 1) * sizeof(*model));
				n--;
			}
			continue;
		}
		if (at >= 0) { /* to the front */
			memmove(model + 1, model, (size_t)at * sizeof(*model));
			model[0] = key;
		}
	}
	struct page_cache_stats s;

	page_cache_get_stats(c, &s);
	CU_ASSERT_EQUAL(s.pages, (uint64_t)n);
	CU_ASSERT(s.evictions > 0 && s.hits > 0 && s.misses > 0 && s.invalidations > 0);
	page_cache_destroy(c);
}

int register_page_cache_tests(void)
{
	CU_pSuite suite = CU_add_suite("page_cache", NULL, NULL);

	if (!suite)
		return -1;
	if (!CU_add_test(suite, "budget respected", test_budget_respected) ||
	    !CU_add_test(suite, "LRU eviction order", test_lru_eviction_order) ||
	    !CU_add_test(suite, "update of an existing key", test_update_existing_key) ||
	    !CU_add_test(suite, "block is part of the key", test_block_is_part_of_the_key) ||
	    !CU_add_test(suite, "invalidate and clear", test_invalidate_and_clear) ||
	    !CU_add_test(suite, "stats count lookups", test_stats_count_lookups) ||
	    !CU_add_test(suite, "zero budget holds nothing", test_zero_budget_holds_nothing) ||
	    !CU_add_test(suite, "random workload matches a model",
			 test_random_workload_matches_model))
		return -1;
	return 0;
}
