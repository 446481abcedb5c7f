/*
 * The dirty page census (dirty_census.h): per-block counts, distinct
 * pages, pages hot in >= 90% of the epochs, the top list, and a reset.
 */
#include <CUnit/CUnit.h>
#include <string.h>

#include "codec/dirty_census.h"
#include "suites.h"

static json_t *block_named(json_t *census, const char *name)
{
	size_t i;
	json_t *b;

	json_array_foreach(json_object_get(census, "blocks"), i, b)
		if (!strcmp(json_string_value(json_object_get(b, "name")), name))
			return b;
	return NULL;
}

static json_int_t field(json_t *b, const char *key)
{
	return json_integer_value(json_object_get(b, key));
}

static void test_counts_distinct_hot_and_top(void)
{
	struct dirty_census c;
	const char *names[] = { "pc.ram", "vga.vram" };
	const uint64_t lengths[] = { 64 * 4096, 8 * 4096 };

	memset(&c, 0, sizeof(c));
	CU_ASSERT_EQUAL_FATAL(dirty_census_layout(&c, names, lengths, 2), 0);
	/* 10 epochs: page 3 every time, page 7 in 9, page 5 once (zero). */
	for (int e = 0; e < 10; e++) {
		dirty_census_page(&c, 0, 3, false);
		if (e < 9)
			dirty_census_page(&c, 0, 7, false);
		if (e == 0)
			dirty_census_page(&c, 0, 5, true);
		dirty_census_epoch_end(&c);
	}
	dirty_census_page(&c, 0, 1000, false); /* beyond the block: counted, no index */
	dirty_census_page(&c, 9, 0, false);    /* no such block: ignored */
	json_t *j = dirty_census_json(&c);
	CU_ASSERT_EQUAL(field(j, "epochs"), 10);
	CU_ASSERT_EQUAL(json_array_size(json_object_get(j, "blocks")), 1); /* vga.vram: none */
	json_t *ram = block_named(j, "pc.ram");
	CU_ASSERT_PTR_NOT_NULL_FATAL(ram);
	CU_ASSERT_EQUAL(field(ram, "pages"), 20);
	CU_ASSERT_EQUAL(field(ram, "zero_pages"), 1);
	CU_ASSERT_EQUAL(field(ram, "distinct"), 3);
	CU_ASSERT_EQUAL(field(ram, "hot"), 2);
	json_t *top = json_object_get(ram, "top");
	CU_ASSERT_EQUAL(json_array_size(top), 3);
	CU_ASSERT_EQUAL(json_integer_value(json_array_get(json_array_get(top, 0), 0)), 3);
	CU_ASSERT_EQUAL(json_integer_value(json_array_get(json_array_get(top, 1), 1)), 9);
	json_decref(j);

	dirty_census_reset(&c);
	dirty_census_page(&c, 1, 2, false);
	dirty_census_epoch_end(&c);
	j = dirty_census_json(&c);
	CU_ASSERT_PTR_NULL(block_named(j, "pc.ram"));
	CU_ASSERT_EQUAL(field(block_named(j, "vga.vram"), "distinct"), 1);
	json_decref(j);
	dirty_census_free(&c);
}

static void test_top_keeps_the_most_shipped(void)
{
	struct dirty_census c;
	const char *names[] = { "pc.ram" };
	const uint64_t lengths[] = { 100 * 4096 };

	memset(&c, 0, sizeof(c));
	CU_ASSERT_EQUAL_FATAL(dirty_census_layout(&c, names, lengths, 1), 0);
	/* page i shipped i times: the top list is 99, 98, ... */
	for (uint64_t i = 0; i < 100; i++)
		for (uint64_t k = 0; k < i; k++)
			dirty_census_page(&c, 0, i, false);
	json_t *j = dirty_census_json(&c);
	json_t *top = json_object_get(block_named(j, "pc.ram"), "top");
	CU_ASSERT_EQUAL(json_array_size(top), DIRTY_CENSUS_TOP);
	for (size_t k = 0; k < json_array_size(top); k++)
		CU_ASSERT_EQUAL(json_integer_value(json_array_get(json_array_get(top, k), 0)),
				(json_int_t)(99 - k));
	json_decref(j);
	dirty_census_free(&c);
}

/*
 * status polls the summary: the same counts, and no page read.  The
 * per-page counters are taken away while it runs, so a summary that
 * scanned them would crash here (a NULL read under ASan) instead of
 * costing status 4 bytes per guest page unnoticed.
 */
static void test_summary_counts_without_reading_a_page(void)
{
	struct dirty_census c;
	const char *names[] = { "pc.ram" };
	const uint64_t lengths[] = { 64 * 4096 };

	memset(&c, 0, sizeof(c));
	CU_ASSERT_EQUAL_FATAL(dirty_census_layout(&c, names, lengths, 1), 0);
	for (int e = 0; e < 4; e++) {
		dirty_census_page(&c, 0, 3, false);
		dirty_census_page(&c, 0, (uint64_t)e + 10, e == 0);
		dirty_census_epoch_end(&c);
	}
	uint32_t *times = c.blocks[0].times;
	c.blocks[0].times = NULL;
	json_t *j = dirty_census_summary_json(&c);
	c.blocks[0].times = times;
	json_t *ram = block_named(j, "pc.ram");
	CU_ASSERT_PTR_NOT_NULL_FATAL(ram);
	CU_ASSERT_EQUAL(field(j, "epochs"), 4);
	CU_ASSERT_EQUAL(field(ram, "pages"), 7);
	CU_ASSERT_EQUAL(field(ram, "zero_pages"), 1);
	CU_ASSERT_EQUAL(field(ram, "distinct"), 5);
	CU_ASSERT_PTR_NULL(json_object_get(ram, "hot"));
	CU_ASSERT_PTR_NULL(json_object_get(ram, "top"));
	json_decref(j);
	/* the full census still has them */
	j = dirty_census_json(&c);
	CU_ASSERT_EQUAL(field(block_named(j, "pc.ram"), "hot"), 1);
	json_decref(j);
	dirty_census_free(&c);
}

int register_dirty_census_tests(void)
{
	CU_pSuite suite = CU_add_suite("dirty_census", NULL, NULL);

	if (!suite ||
	    !CU_add_test(suite, "counts, distinct, hot, top, reset",
			 test_counts_distinct_hot_and_top) ||
	    !CU_add_test(suite, "the top list keeps the most shipped pages",
			 test_top_keeps_the_most_shipped) ||
	    !CU_add_test(suite, "the summary counts without reading a page",
			 test_summary_counts_without_reading_a_page))
		return -1;
	return 0;
}
