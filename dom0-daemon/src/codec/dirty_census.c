/* Per-block dirty page counts of a protection (dirty_census.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/dirty_census.h"

#define PAGE_SIZE_BYTES 4096u

int dirty_census_layout(struct dirty_census *c, const char *const *names,
			const uint64_t *lengths, size_t count)
{
	dirty_census_free(c);
	if (count > REPL_MAX_BLOCKS)
		count = REPL_MAX_BLOCKS;
	for (size_t i = 0; i < count; i++) {
		struct dirty_census_block *b = &c->blocks[i];
		snprintf(b->name, sizeof(b->name), "%s", names[i]);
		b->page_count = lengths[i] / PAGE_SIZE_BYTES;
		b->times = b->page_count ? calloc(b->page_count, sizeof(*b->times)) : NULL;
		if (b->page_count && !b->times) {
			c->count = i;
			dirty_census_free(c);
			return -1;
		}
	}
	c->count = count;
	return 0;
}

void dirty_census_page(struct dirty_census *c, unsigned block, uint64_t page_index, bool zero)
{
	if (block >= c->count)
		return;
	struct dirty_census_block *b = &c->blocks[block];
	if (zero)
		b->zero_pages++;
	else
		b->pages++;
	if (page_index < b->page_count && b->times[page_index]++ == 0)
		b->distinct++;
}

void dirty_census_epoch_end(struct dirty_census *c)
{
	c->epochs++;
}

void dirty_census_reset(struct dirty_census *c)
{
	for (size_t i = 0; i < c->count; i++) {
		struct dirty_census_block *b = &c->blocks[i];
		if (b->times)
			memset(b->times, 0, b->page_count * sizeof(*b->times));
		b->pages = b->zero_pages = b->distinct = 0;
	}
	c->epochs = 0;
}

void dirty_census_free(struct dirty_census *c)
{
	for (size_t i = 0; i < c->count; i++)
		free(c->blocks[i].times);
	memset(c, 0, sizeof(*c));
}

static json_t *block_counts_json(const struct dirty_census_block *b)
{
	return json_pack("{s:s, s:I, s:I, s:I, s:I}", "name", b->name,
			 "page_count", (json_int_t)b->page_count,
			 "pages", (json_int_t)b->pages, "zero_pages", (json_int_t)b->zero_pages,
			 "distinct", (json_int_t)b->distinct);
}

static json_t *block_json(const struct dirty_census_block *b, uint64_t epochs)
{
	uint64_t top_idx[DIRTY_CENSUS_TOP], hot = 0;
	uint32_t top_n[DIRTY_CENSUS_TOP] = { 0 };
	size_t filled = 0;

	for (uint64_t i = 0; i < b->page_count; i++) {
		uint32_t t = b->times[i];
		if (!t)
			continue;
		if (epochs && (uint64_t)t * 10 >= epochs * 9)
			hot++;
		if (filled < DIRTY_CENSUS_TOP || t > top_n[filled - 1]) {
			size_t k = filled < DIRTY_CENSUS_TOP ? filled++ : filled - 1;
			while (k > 0 && top_n[k - 1] < t) {
				top_n[k] = top_n[k - 1];
				top_idx[k] = top_idx[k - 1];
				k--;
			}
			top_n[k] = t;
			top_idx[k] = i;
		}
	}
	json_t *top = json_array();
	for (size_t k = 0; k < filled; k++)
		json_array_append_new(top, json_pack("[I, I]", (json_int_t)top_idx[k],
						     (json_int_t)top_n[k]));
	json_t *o = block_counts_json(b);

	json_object_set_new(o, "hot", json_integer((json_int_t)hot));
	json_object_set_new(o, "top", top);
	return o;
}

static json_t *census_json(const struct dirty_census *c, bool scan_pages)
{
	json_t *blocks = json_array();

	for (size_t i = 0; i < c->count; i++) {
		const struct dirty_census_block *b = &c->blocks[i];
		if (b->pages || b->zero_pages)
			json_array_append_new(blocks, scan_pages ? block_json(b, c->epochs)
								 : block_counts_json(b));
	}
	return json_pack("{s:I, s:o}", "epochs", (json_int_t)c->epochs, "blocks", blocks);
}

json_t *dirty_census_summary_json(const struct dirty_census *c)
{
	return census_json(c, false);
}

json_t *dirty_census_json(const struct dirty_census *c)
{
	return census_json(c, true);
}
