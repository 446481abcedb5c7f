/*
 * Where a protection's checkpoints find their dirty pages: per RAM block,
 * the pages and zero pages shipped since the last reset-stats, how many
 * distinct pages that was, how many were dirty in nearly every epoch, and
 * the pages dirtied most often.  A benchmark's tool (remusdb-bench dirty)
 * asks it why a checkpoint carries the pages it does; the counters cost
 * 4 bytes per guest page.  Its counts are kept as pages ship, so a summary
 * costs nothing per page; only the hot and most shipped pages need a scan
 * of every page, which `status` therefore leaves to `dirty-census`.
 */
#ifndef REMUSDB_DIRTY_CENSUS_H
#define REMUSDB_DIRTY_CENSUS_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "wire/repl_proto.h"

#define DIRTY_CENSUS_TOP 32

struct dirty_census_block {
	char name[256];
	uint64_t page_count;   /* the block's length / 4096 */
	uint32_t *times;       /* per page: epochs since reset that shipped it */
	uint64_t pages;        /* full pages shipped since reset */
	uint64_t zero_pages;
	uint64_t distinct;     /* pages with times > 0 */
};

struct dirty_census {
	size_t count;
	uint64_t epochs;       /* checkpoints counted since reset */
	struct dirty_census_block blocks[REPL_MAX_BLOCKS];
};

/* The RAM layout (names, lengths in bytes); -1 when out of memory. */
int dirty_census_layout(struct dirty_census *c, const char *const *names,
			const uint64_t *lengths, size_t count);
void dirty_census_page(struct dirty_census *c, unsigned block, uint64_t page_index, bool zero);
void dirty_census_epoch_end(struct dirty_census *c);
void dirty_census_reset(struct dirty_census *c);
void dirty_census_free(struct dirty_census *c);
/* {"epochs": N, "blocks": [{name, page_count, pages, zero_pages,
 * distinct}]}: the counts, at a cost per block, none per page. */
json_t *dirty_census_summary_json(const struct dirty_census *c);
/* The summary plus, per block, hot = pages shipped in at least 90% of the
 * epochs and top = the most shipped pages as [page_index, times]: a scan
 * of every guest page (4 bytes each), for a caller that asked for it. */
json_t *dirty_census_json(const struct dirty_census *c);

#endif
