/*
 * Disk read tracking (RemusDB's RT, thesis §3.7): which 4 KiB disk blocks
 * the guest has read, and the XXH3-128 hash of their content, so that a
 * dirty guest page whose content equals a disk block can be shipped to
 * the backup as "page P = disk block B, hash H" instead of 4096 bytes.
 *
 * The index is a cache, never a source of truth: the backup reads B from
 * its replica and verifies H, so a wrong answer only costs a fallback.
 * What the index guarantees is narrower and local: lookup() only returns
 * a block whose entry is live, and every write, trim or write-zeroes
 * removes the entries of every block it touches before the data changes.
 * So the index never claims a hash for a block that was written since it
 * was read.
 *
 * Memory is fixed at creation (a byte budget); when full, entries are
 * evicted by CLOCK (read_index.c says why).  Thread-safe: the NBD server
 * records and invalidates on the event loop while the checkpoint
 * pipeline's worker thread looks pages up; every call takes one mutex.
 */
#ifndef REMUSDB_READ_INDEX_H
#define REMUSDB_READ_INDEX_H

#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

#define READ_INDEX_BLOCK_SIZE 4096u
#define READ_INDEX_BLOCK_SHIFT 12

struct read_index;

struct read_index_stats {
	uint64_t entries;       /* live entries now */
	uint64_t capacity;      /* entries the budget holds */
	uint64_t bytes;         /* memory allocated, all of it at creation */
	uint64_t inserts;       /* entries created by reads */
	uint64_t refreshes;     /* a block read again with the same content */
	uint64_t duplicates;    /* content another live entry has: not indexed */
	uint64_t invalidations; /* entries removed by writes, trims, zeroes */
	uint64_t evictions;     /* entries removed to make room */
	uint64_t lookups;
	uint64_t hits;
	uint64_t zero_blocks;   /* all-zero blocks read, not indexed */
	uint64_t stale_reads;   /* reads not recorded: a write overtook them */
};

/*
 * An index of at most budget_bytes (everything included, allocated now).
 * NULL when the budget holds no entry or memory is short.
 */
struct read_index *read_index_create(size_t budget_bytes);
void read_index_destroy(struct read_index *idx);

/* The content hash the index keys on: XXH3-128 of one 4 KiB block or page. */
XXH128_hash_t read_index_hash(const void *block);

/*
 * Reads are recorded in two steps so that a write that lands between the
 * disk read and the recording is never missed: take a token before
 * reading the disk, hand it to note_read() with the data read.  If any
 * invalidation happened in between, nothing is recorded (counted in
 * stale_reads).  Reads and writes run on each connection's worker
 * thread (nbd_io_batch.c), so a write on another connection can land
 * there; the writer invalidates before and again after its pwrite.
 */
uint64_t read_index_read_begin(struct read_index *idx);
/*
 * Records the whole 4 KiB-aligned blocks inside [offset, offset+len)
 * with their content (data holds the len bytes read at offset); partial
 * blocks at either end are skipped.
 */
void read_index_note_read(struct read_index *idx, uint64_t token, uint64_t offset,
			  const uint8_t *data, size_t len);
/* Records one block read with nothing written in between (no token). */
void read_index_note_block(struct read_index *idx, uint64_t block,
			   const uint8_t *data);
/*
 * Forgets every block [offset, offset+len) touches, partial blocks at
 * both ends included.  Call before the data changes.
 */
void read_index_invalidate_range(struct read_index *idx, uint64_t offset,
				 uint64_t len);
/*
 * A live block whose content hash is hash: 1 with *block set, or 0.
 * When several blocks hold that content, any one of them.
 */
int read_index_lookup(struct read_index *idx, XXH128_hash_t hash, uint64_t *block);

void read_index_get_stats(struct read_index *idx, struct read_index_stats *out);
/* hits / lookups, 0 before the first lookup. */
double read_index_hit_rate(const struct read_index_stats *stats);

#endif
