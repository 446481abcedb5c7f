/*
 * The LRU cache of sent pages (see page_cache.h): slots in one array,
 * page data in one mapping, a chained hash table of slot indexes.
 *
 * Why indexes and not pointers: 32-bit links keep a slot at 24 bytes (with padding), so
 * the bookkeeping stays under 1% of the page data it indexes.
 */
#include "codec/page_cache.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/unmap_later.h"

#define NIL UINT32_MAX

struct slot {
	uint64_t page;
	uint32_t older, newer; /* LRU list; free slots chain through `older` */
	uint32_t chain;        /* next slot in the same hash bucket */
	uint16_t block;
};

struct page_cache {
	struct slot *slots;
	uint8_t *data; /* capacity pages, slot i's at i * 4096 */
	uint32_t *buckets;
	uint32_t capacity, bucket_mask;
	uint32_t newest, oldest, free_list;
	size_t data_bytes;
	struct page_cache_stats stats;
};

/* A 64-bit mix (splitmix64's finalizer): guest page indexes are dense. */
static inline uint32_t bucket_of(const struct page_cache *c, uint16_t block, uint64_t page)
{
	uint64_t x = page ^ (uint64_t)block << 48;

	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 31;
	return (uint32_t)x & c->bucket_mask;
}

static uint64_t memory_for(uint64_t slots, uint64_t buckets)
{
	return slots * (PAGE_CACHE_PAGE + sizeof(struct slot)) + buckets * sizeof(uint32_t);
}

static uint64_t pow2_at_least(uint64_t n)
{
	uint64_t p = 1;

	while (p < n)
		p <<= 1;
	return p;
}

struct page_cache *page_cache_create(uint64_t budget_bytes)
{
	struct page_cache *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	/*
	 * Buckets are a power of two >= slots (load factor <= 1) and thus
	 * fewer than 2 * slots: sizing for 2 * slots keeps memory_for() within
	 * the budget, then the exact count is fixed.
	 */
	uint64_t slots = budget_bytes / (PAGE_CACHE_PAGE + sizeof(struct slot) + 2 * sizeof(uint32_t));

	if (slots > NIL - 1)
		slots = NIL - 1;
	/* No slots, no buckets: every call returns before the table. */
	uint64_t buckets = slots ? pow2_at_least(slots) : 0;

	c->capacity = (uint32_t)slots;
	c->bucket_mask = buckets ? (uint32_t)(buckets - 1) : 0;
	c->stats.capacity = slots;
	c->stats.budget_bytes = budget_bytes;
	c->stats.memory_bytes = memory_for(slots, buckets);
	if (slots) {
		c->buckets = malloc(buckets * sizeof(uint32_t));
		c->slots = malloc(slots * sizeof(struct slot));
		/* An anonymous mapping: page-aligned, and untouched pages cost nothing. */
		c->data_bytes = slots * PAGE_CACHE_PAGE;
		c->data = mmap(NULL, c->data_bytes, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (c->data == MAP_FAILED)
			c->data = NULL;
	}
	if (slots && (!c->buckets || !c->slots || !c->data)) {
		page_cache_destroy(c);
		return NULL;
	}
	page_cache_clear(c);
	return c;
}

void page_cache_destroy(struct page_cache *c)
{
	if (!c)
		return;
	if (c->data) /* a large cache's pages are freed off the loop */
		unmap_later(c->data, c->data_bytes, -1);
	free(c->slots);
	free(c->buckets);
	free(c);
}

void page_cache_clear(struct page_cache *c)
{
	for (uint32_t b = 0; c->capacity && b <= c->bucket_mask; b++)
		c->buckets[b] = NIL;
	for (uint32_t i = 0; i < c->capacity; i++)
		c->slots[i].older = i + 1 < c->capacity ? i + 1 : NIL;
	c->free_list = c->capacity ? 0 : NIL;
	c->newest = c->oldest = NIL;
	c->stats.pages = 0;
	c->stats.bytes = 0;
}

static uint32_t find(const struct page_cache *c, uint16_t block, uint64_t page)
{
	uint32_t i = c->buckets[bucket_of(c, block, page)];

	while (i != NIL && (c->slots[i].page != page || c->slots[i].block != block))
		i = c->slots[i].chain;
	return i;
}

static void list_unlink(struct page_cache *c, uint32_t i)
{
	struct slot *s = &c->slots[i];

	if (s->newer != NIL)
		c->slots[s->newer].older = s->older;
	else
		c->newest = s->older;
	if (s->older != NIL)
		c->slots[s->older].newer = s->newer;
	else
		c->oldest = s->newer;
}

static void list_push_newest(struct page_cache *c, uint32_t i)
{
	struct slot *s = &c->slots[i];

	s->newer = NIL;
	s->older = c->newest;
	if (c->newest != NIL)
		c->slots[c->newest].newer = i;
	c->newest = i;
	if (c->oldest == NIL)
		c->oldest = i;
}

static void hash_unlink(struct page_cache *c, uint32_t i)
{
	uint32_t *link = &c->buckets[bucket_of(c, c->slots[i].block, c->slots[i].page)];

	while (*link != i)
		link = &c->slots[*link].chain;
	*link = c->slots[i].chain;
}

/* Takes slot i out of the hash and the LRU list, onto the free list. */
static void drop(struct page_cache *c, uint32_t i)
{
	hash_unlink(c, i);
	list_unlink(c, i);
	c->slots[i].older = c->free_list;
	c->free_list = i;
	c->stats.pages--;
	c->stats.bytes -= PAGE_CACHE_PAGE;
}

const uint8_t *page_cache_lookup(struct page_cache *c, uint16_t block, uint64_t page)
{
	uint32_t i = c->capacity ? find(c, block, page) : NIL;

	if (i == NIL) {
		c->stats.misses++;
		return NULL;
	}
	c->stats.hits++;
	if (c->newest != i) {
		list_unlink(c, i);
		list_push_newest(c, i);
	}
	return c->data + (size_t)i * PAGE_CACHE_PAGE;
}

void page_cache_store(struct page_cache *c, uint16_t block, uint64_t page,
		      const uint8_t data[PAGE_CACHE_PAGE])
{
	if (c->capacity == 0)
		return;
	uint32_t i = find(c, block, page);

	if (i != NIL) {
		c->stats.updates++;
		list_unlink(c, i);
	} else {
		if (c->free_list == NIL) {
			c->stats.evictions++;
			drop(c, c->oldest);
		}
		i = c->free_list;
		c->free_list = c->slots[i].older;

		struct slot *s = &c->slots[i];
		uint32_t b = bucket_of(c, block, page);

		s->block = block;
		s->page = page;
		s->chain = c->buckets[b];
		c->buckets[b] = i;
		c->stats.insertions++;
		c->stats.pages++;
		c->stats.bytes += PAGE_CACHE_PAGE;
	}
	list_push_newest(c, i);
	memcpy(c->data + (size_t)i * PAGE_CACHE_PAGE, data, PAGE_CACHE_PAGE);
}

void page_cache_invalidate(struct page_cache *c, uint16_t block, uint64_t page)
{
	if (c->capacity == 0)
		return;
	uint32_t i = find(c, block, page);

	if (i != NIL) {
		drop(c, i);
		c->stats.invalidations++;
	}
}

void page_cache_get_stats(const struct page_cache *c, struct page_cache_stats *out)
{
	*out = c->stats;
}
