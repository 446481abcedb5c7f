/*
 * The primary's cache of recently sent guest pages, the base of the
 * XOR_RLE deltas of checkpoint compression (page_delta.h): an LRU keyed
 * by (RAM block index, page index) within a byte budget
 * (`--compress-cache`, by default 10% of guest RAM).
 *
 * Every operation is O(1): a chained hash table finds a slot, an intrusive
 * doubly-linked list orders the slots by use.  All memory (page data,
 * slots, buckets) is allocated at creation to fit the budget, so the
 * compression thread's hot path never allocates.
 *
 * Not thread-safe, on purpose: the one compression thread owns the cache
 * and nothing else touches it, so a lock would only cost.  A caller that
 * shares it must serialize every call, lookups included (a lookup
 * reorders the list).
 */
#ifndef REMUSDB_PAGE_CACHE_H
#define REMUSDB_PAGE_CACHE_H

#include <stddef.h>
#include <stdint.h>

#define PAGE_CACHE_PAGE 4096

struct page_cache;

struct page_cache_stats {
	uint64_t hits, misses;  /* lookups */
	uint64_t insertions;    /* new keys stored */
	uint64_t updates;       /* stores over a key already cached */
	uint64_t evictions;     /* least recently used pages dropped for room */
	uint64_t invalidations; /* pages dropped by page_cache_invalidate() */
	uint64_t pages;         /* cached now */
	uint64_t capacity;      /* pages the budget holds */
	uint64_t bytes;         /* page data cached now: pages * 4096 */
	uint64_t budget_bytes;  /* the budget asked for */
	uint64_t memory_bytes;  /* allocated: data, slots and buckets, <= budget */
};

/*
 * A cache whose whole allocation (page data, slots, buckets) fits in
 * budget_bytes.  A budget below one page gives a cache that holds
 * nothing: every lookup misses, every store is dropped.  NULL when
 * memory is short.
 */
struct page_cache *page_cache_create(uint64_t budget_bytes);
void page_cache_destroy(struct page_cache *c);

/*
 * The cached copy of (block, page), made the most recently used, or NULL
 * (a miss).  The pointer is valid until the next store or invalidation.
 */
const uint8_t *page_cache_lookup(struct page_cache *c, uint16_t block, uint64_t page);

/*
 * Stores a copy of data as (block, page), the most recently used:
 * overwrites the key's copy if cached, else takes a free slot or evicts
 * the least recently used page.
 */
void page_cache_store(struct page_cache *c, uint16_t block, uint64_t page,
		      const uint8_t data[PAGE_CACHE_PAGE]);

/* Drops (block, page) if cached (its copy is no longer the backup's). */
void page_cache_invalidate(struct page_cache *c, uint16_t block, uint64_t page);

/* Drops every page (a resend of the whole RAM, a new backup); keeps stats. */
void page_cache_clear(struct page_cache *c);

void page_cache_get_stats(const struct page_cache *c, struct page_cache_stats *out);

#endif
