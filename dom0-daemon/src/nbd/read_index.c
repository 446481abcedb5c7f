/*
 * The read-tracking index (read_index.h): content hash <-> disk block,
 * in memory fixed at creation, O(1) expected per block.
 *
 * Layout.  A slot array of 32-byte entries (hash, block, two chain
 * links) plus one flag byte per slot, and two bucket arrays of 32-bit
 * slot numbers: one keyed by block (to invalidate), one keyed by content
 * hash (to look up).  Chaining through links stored in the entries needs
 * no tombstones, so invalidating never degrades later probes, and 32-bit
 * slot numbers halve what pointers would cost.  Bucket counts are the
 * largest power of two not above the slot count, so chains average at
 * most two entries.  Per entry: 32 + 1 + at most 8 bytes of buckets, 41
 * bytes counted against the budget; 64 MiB holds about 1.6 million
 * entries, 6.4 GiB of distinct disk content.
 *
 * Buckets are chosen by a seeded XXH3-64 of the key with a seed drawn at
 * creation: block numbers and content are both the guest's to choose,
 * and without a secret a guest could pile entries into one chain and
 * stall the event loop.
 *
 * One entry per content.  A block whose content another live entry
 * already has is not indexed (counted as a duplicate; the existing entry
 * counts as used).  Either block would do for a lookup, and unique hashes
 * keep hash chains short even when a disk holds thousands of identical
 * blocks.  The cost: once the indexed copy is written, that content
 * misses until it is read again.
 *
 * All-zero blocks are not indexed: the replication protocol already
 * sends a zero page as a ZERO record, cheaper than any annotation, and
 * zero blocks (fresh filesystem space) would otherwise fill the index.
 * They are recognised by their hash, so no second pass over the data.
 *
 * Eviction: CLOCK (second chance).  A hit is useful right after the guest
 * read the block (the page-cache and buffer-pool pages it filled are
 * dirty in that epoch), so plain FIFO order is nearly right; CLOCK adds a
 * reference bit, set when the block is read again or matched by a
 * lookup, that spares such entries one sweep of the hand.  So a large
 * scan (a DSS query) flows through without flushing the blocks that
 * keep proving useful.  LRU would need 8 more bytes per entry for its
 * list and a list update on every hit; CLOCK needs one bit.  Freed slots
 * (invalidated entries) go on a free list and are reused before anything
 * is evicted.
 */
#include "nbd/read_index.h"

#include <pthread.h>

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>

#define NIL UINT32_MAX
#define FLAG_LIVE 1u
#define FLAG_REFERENCED 2u

enum chain { BY_BLOCK, BY_HASH };

struct entry {
	XXH128_hash_t hash;
	uint64_t block;
	uint32_t next[2]; /* chain links; next[BY_HASH] also links the free list */
};

struct read_index {
	void *arena;          /* one mapping: entries, flags, buckets */
	size_t arena_size;
	struct entry *entries;
	uint8_t *flags;
	uint32_t *buckets[2]; /* heads, indexed by enum chain */
	uint32_t capacity;
	uint32_t bucket_mask;
	uint32_t next_unused; /* slots at and above it were never used */
	uint32_t free_head;
	uint32_t hand;        /* CLOCK */
	uint64_t seed;
	uint64_t invalidation_seq;
	XXH128_hash_t zero_hash;
	struct read_index_stats stats;
	/*
	 * The event loop records reads and invalidates; the checkpoint
	 * pipeline's worker thread looks pages up (page_coding.h).  One
	 * mutex around each public call: they are short and rarely contend.
	 */
	pthread_mutex_t lock;
};

#define ENTRY_COST (sizeof(struct entry) + 1 + 2 * sizeof(uint32_t))

static uint64_t random_seed(void)
{
	uint64_t seed;
	struct timespec ts;

	if (getrandom(&seed, sizeof(seed), GRND_NONBLOCK) == (ssize_t)sizeof(seed))
		return seed;
	/* No entropy yet (early boot): worse bucket secrecy, still correct. */
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)(uintptr_t)&ts;
}

XXH128_hash_t read_index_hash(const void *block)
{
	return XXH3_128bits(block, READ_INDEX_BLOCK_SIZE);
}

struct read_index *read_index_create(size_t budget_bytes)
{
	static const uint8_t zeros[READ_INDEX_BLOCK_SIZE];
	struct read_index *idx;

	if (budget_bytes < sizeof(*idx) + ENTRY_COST)
		return NULL;
	size_t capacity = (budget_bytes - sizeof(*idx)) / ENTRY_COST;
	if (capacity >= NIL)
		capacity = NIL - 1;
	size_t buckets = 1;
	while (buckets * 2 <= capacity)
		buckets *= 2;
	idx = calloc(1, sizeof(*idx));
	if (!idx)
		return NULL;
	/*
	 * One anonymous mapping: the kernel supplies zeroed pages as slots
	 * come into use, and it may back the mapping with huge pages.  Every
	 * access is random, so with 4 KiB pages nearly every one also misses
	 * the TLB, and under nested virtualisation a TLB miss costs several
	 * cache misses more.
	 */
	size_t bucket_bytes = buckets * sizeof(uint32_t);
	idx->arena_size = capacity * sizeof(struct entry) + 2 * bucket_bytes + capacity;
	idx->arena = mmap(NULL, idx->arena_size, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (idx->arena == MAP_FAILED) {
		free(idx);
		return NULL;
	}
	madvise(idx->arena, idx->arena_size, MADV_HUGEPAGE); /* a hint: may fail */
	idx->entries = idx->arena;
	idx->buckets[BY_BLOCK] = (uint32_t *)(idx->entries + capacity);
	idx->buckets[BY_HASH] = idx->buckets[BY_BLOCK] + buckets;
	idx->flags = (uint8_t *)(idx->buckets[BY_HASH] + buckets);
	memset(idx->buckets[BY_BLOCK], 0xff, buckets * sizeof(uint32_t));
	memset(idx->buckets[BY_HASH], 0xff, buckets * sizeof(uint32_t));
	idx->capacity = (uint32_t)capacity;
	idx->bucket_mask = (uint32_t)(buckets - 1);
	idx->free_head = NIL;
	idx->seed = random_seed();
	idx->zero_hash = read_index_hash(zeros);
	idx->stats.capacity = capacity;
	idx->stats.bytes = sizeof(*idx) + idx->arena_size;
	pthread_mutex_init(&idx->lock, NULL);
	return idx;
}

void read_index_destroy(struct read_index *idx)
{
	if (!idx)
		return;
	if (idx->arena)
		munmap(idx->arena, idx->arena_size);
	pthread_mutex_destroy(&idx->lock);
	free(idx);
}

static uint32_t *block_head(struct read_index *idx, uint64_t block)
{
	uint64_t h = XXH3_64bits_withSeed(&block, sizeof(block), idx->seed);
	return &idx->buckets[BY_BLOCK][h & idx->bucket_mask];
}

static uint32_t *hash_head(struct read_index *idx, XXH128_hash_t hash)
{
	uint64_t key[2] = { hash.low64, hash.high64 };
	uint64_t h = XXH3_64bits_withSeed(key, sizeof(key), idx->seed);
	return &idx->buckets[BY_HASH][h & idx->bucket_mask];
}

static uint32_t find_block(struct read_index *idx, uint64_t block)
{
	uint32_t s = *block_head(idx, block);

	while (s != NIL && idx->entries[s].block != block)
		s = idx->entries[s].next[BY_BLOCK];
	return s;
}

static uint32_t find_hash(struct read_index *idx, XXH128_hash_t hash)
{
	uint32_t s = *hash_head(idx, hash);

	while (s != NIL && !XXH128_isEqual(idx->entries[s].hash, hash))
		s = idx->entries[s].next[BY_HASH];
	return s;
}

static void chain_remove(struct read_index *idx, enum chain c, uint32_t *link,
			 uint32_t s)
{
	while (*link != s)
		link = &idx->entries[*link].next[c];
	*link = idx->entries[s].next[c];
}

/* Takes live slot s out of both chains; the caller reuses or frees it. */
static void unlink_entry(struct read_index *idx, uint32_t s)
{
	struct entry *e = &idx->entries[s];

	chain_remove(idx, BY_BLOCK, block_head(idx, e->block), s);
	chain_remove(idx, BY_HASH, hash_head(idx, e->hash), s);
	idx->flags[s] = 0;
	idx->stats.entries--;
}

static void invalidate_slot(struct read_index *idx, uint32_t s)
{
	unlink_entry(idx, s);
	idx->entries[s].next[BY_HASH] = idx->free_head;
	idx->free_head = s;
	idx->stats.invalidations++;
}

/* A slot for a new entry: a freed one, a never used one, or a CLOCK victim. */
static uint32_t take_slot(struct read_index *idx)
{
	uint32_t s;

	if (idx->free_head != NIL) {
		s = idx->free_head;
		idx->free_head = idx->entries[s].next[BY_HASH];
		return s;
	}
	if (idx->next_unused < idx->capacity)
		return idx->next_unused++;
	/*
	 * Every slot is live here (freed ones are on the free list), so the
	 * hand finds a victim within two sweeps; each bit it clears was set
	 * by a hit or re-read, which keeps the cost O(1) amortized.
	 */
	for (;;) {
		s = idx->hand;
		idx->hand = s + 1 == idx->capacity ? 0 : s + 1;
		if (!(idx->flags[s] & FLAG_REFERENCED))
			break;
		idx->flags[s] &= (uint8_t)~FLAG_REFERENCED;
	}
	unlink_entry(idx, s);
	idx->stats.evictions++;
	return s;
}

/*
 * Once the index outgrows the CPU caches, recording is bound by memory
 * latency, not hashing: each bucket and chain step is a cache miss.  The
 * buckets known before the data is hashed are requested first, so their
 * misses overlap the ~0.2 us of hashing: the new block's bucket, and
 * when the index is full the likely CLOCK victim's two buckets.
 */
static void prefetch_buckets(struct read_index *idx, uint64_t block)
{
	__builtin_prefetch(block_head(idx, block));
	if (idx->free_head != NIL || idx->next_unused < idx->capacity)
		return;
	const struct entry *victim = &idx->entries[idx->hand];
	if (idx->flags[idx->hand] & FLAG_REFERENCED)
		return;
	__builtin_prefetch(block_head(idx, victim->block));
	__builtin_prefetch(hash_head(idx, victim->hash));
}

static void note_block(struct read_index *idx, uint64_t block, const uint8_t *data)
{
	prefetch_buckets(idx, block);
	XXH128_hash_t hash = read_index_hash(data);
	uint32_t s = find_block(idx, block);

	if (s != NIL) {
		if (XXH128_isEqual(idx->entries[s].hash, hash)) {
			idx->flags[s] |= FLAG_REFERENCED;
			idx->stats.refreshes++;
			return;
		}
		/* Only if the image changed behind the NBD server's back. */
		invalidate_slot(idx, s);
	}
	if (XXH128_isEqual(hash, idx->zero_hash)) {
		idx->stats.zero_blocks++;
		return;
	}
	s = find_hash(idx, hash);
	if (s != NIL) {
		idx->flags[s] |= FLAG_REFERENCED;
		idx->stats.duplicates++;
		return;
	}
	s = take_slot(idx);
	struct entry *e = &idx->entries[s];
	uint32_t *bhead = block_head(idx, block);
	uint32_t *hhead = hash_head(idx, hash);
	e->hash = hash;
	e->block = block;
	e->next[BY_BLOCK] = *bhead;
	e->next[BY_HASH] = *hhead;
	*bhead = s;
	*hhead = s;
	idx->flags[s] = FLAG_LIVE;
	idx->stats.entries++;
	idx->stats.inserts++;
}

void read_index_note_block(struct read_index *idx, uint64_t block,
			   const uint8_t *data)
{
	pthread_mutex_lock(&idx->lock);
	note_block(idx, block, data);
	pthread_mutex_unlock(&idx->lock);
}

uint64_t read_index_read_begin(struct read_index *idx)
{
	pthread_mutex_lock(&idx->lock);
	uint64_t seq = idx->invalidation_seq;
	pthread_mutex_unlock(&idx->lock);
	return seq;
}

void read_index_note_read(struct read_index *idx, uint64_t token, uint64_t offset,
			  const uint8_t *data, size_t len)
{
	if (len == 0 || len > UINT64_MAX - offset)
		return;
	pthread_mutex_lock(&idx->lock);
	if (token != idx->invalidation_seq) {
		idx->stats.stale_reads++;
		pthread_mutex_unlock(&idx->lock);
		return;
	}
	/* Whole blocks only: a partial block's hash would describe no block. */
	uint64_t first = (offset >> READ_INDEX_BLOCK_SHIFT) +
			 ((offset & (READ_INDEX_BLOCK_SIZE - 1)) != 0);
	uint64_t end = (offset + len) >> READ_INDEX_BLOCK_SHIFT;
	for (uint64_t b = first; b < end; b++)
		note_block(idx, b, data + ((b << READ_INDEX_BLOCK_SHIFT) - offset));
	pthread_mutex_unlock(&idx->lock);
}

static void invalidate_range(struct read_index *idx, uint64_t offset, uint64_t len)
{
	/* Any write, even of unindexed blocks, voids reads in flight. */
	idx->invalidation_seq++;
	uint64_t last_byte = len - 1 > UINT64_MAX - offset ? UINT64_MAX : offset + len - 1;
	uint64_t first = offset >> READ_INDEX_BLOCK_SHIFT;
	uint64_t last = last_byte >> READ_INDEX_BLOCK_SHIFT;
	/*
	 * A trim of a whole disk spans millions of blocks: past the number
	 * of slots ever used, one pass over the slots is cheaper, so the
	 * cost is O(min(blocks in the range, capacity)).
	 */
	if (last - first >= idx->next_unused) {
		for (uint32_t s = 0; s < idx->next_unused; s++) {
			uint64_t b = idx->entries[s].block;
			if ((idx->flags[s] & FLAG_LIVE) && b >= first && b <= last)
				invalidate_slot(idx, s);
		}
		return;
	}
	for (uint64_t b = first;; b++) {
		uint32_t s = find_block(idx, b);
		if (s != NIL)
			invalidate_slot(idx, s);
		if (b == last)
			break;
	}
}

void read_index_invalidate_range(struct read_index *idx, uint64_t offset,
				 uint64_t len)
{
	if (len == 0)
		return;
	pthread_mutex_lock(&idx->lock);
	invalidate_range(idx, offset, len);
	pthread_mutex_unlock(&idx->lock);
}

int read_index_lookup(struct read_index *idx, XXH128_hash_t hash, uint64_t *block)
{
	int found = 0;

	pthread_mutex_lock(&idx->lock);
	idx->stats.lookups++;
	uint32_t s = find_hash(idx, hash);
	if (s != NIL) {
		idx->stats.hits++;
		idx->flags[s] |= FLAG_REFERENCED;
		*block = idx->entries[s].block;
		found = 1;
	}
	pthread_mutex_unlock(&idx->lock);
	return found;
}

void read_index_get_stats(struct read_index *idx, struct read_index_stats *out)
{
	pthread_mutex_lock(&idx->lock);
	*out = idx->stats;
	pthread_mutex_unlock(&idx->lock);
}

double read_index_hit_rate(const struct read_index_stats *stats)
{
	return stats->lookups ? (double)stats->hits / (double)stats->lookups : 0.0;
}
