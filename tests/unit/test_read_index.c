/*
 * Disk read tracking: the index alone (lookups, invalidation by byte
 * range, budget and CLOCK eviction, statistics), then through the NBD
 * path with a real client on the export's unix socket, and a micro
 * measurement of what recording costs per 4 KiB block read.
 */
#include <CUnit/CUnit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "nbd/nbd_proto.h"
#include "nbd/nbd_server.h"
#include "nbd_test_client.h"
#include "nbd/read_index.h"
#include "suites.h"

#define BS READ_INDEX_BLOCK_SIZE
/* A budget that holds a few dozen entries. */
#define SMALL_BUDGET 1024u

static uint8_t blocks[64][BS];

/* Distinct non-zero content for block i. */
static void fill_blocks(void)
{
	for (unsigned i = 0; i < 64; i++)
		nbd_client_fill_pattern(blocks[i], BS, i + 1);
}

/* Pseudo-random bytes (xorshift64), different for every seed. */
static void fill_random(uint8_t *p, size_t len, uint64_t seed)
{
	uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;

	for (size_t i = 0; i < len; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(p + i, &x, len - i < 8 ? len - i : 8);
	}
}

static struct read_index_stats stats_of(struct read_index *idx)
{
	struct read_index_stats s;

	read_index_get_stats(idx, &s);
	return s;
}

/* 1 when content's hash looks up to exactly block, else 0. */
static int finds(struct read_index *idx, const uint8_t *content, uint64_t block)
{
	uint64_t got = UINT64_MAX;

	return read_index_lookup(idx, read_index_hash(content), &got) == 1 && got == block;
}

static int misses(struct read_index *idx, const uint8_t *content)
{
	uint64_t got;

	return read_index_lookup(idx, read_index_hash(content), &got) == 0;
}

/* ---- the index alone ---------------------------------------------- */

static void test_lookup_finds_read_block_and_counts(void)
{
	struct read_index *idx = read_index_create(1 << 20);

	CU_ASSERT_PTR_NOT_NULL_FATAL(idx);
	fill_blocks();
	read_index_note_block(idx, 7, blocks[0]);
	read_index_note_block(idx, 9, blocks[1]);
	CU_ASSERT_TRUE(finds(idx, blocks[0], 7));
	CU_ASSERT_TRUE(finds(idx, blocks[1], 9));
	CU_ASSERT_TRUE(misses(idx, blocks[2])); /* content never read */
	/* A hash that differs in one half only also misses. */
	XXH128_hash_t h = read_index_hash(blocks[0]);
	uint64_t got;
	h.high64 ^= 1;
	CU_ASSERT_EQUAL(read_index_lookup(idx, h, &got), 0);
	/* Reading block 7 again with the same content is a refresh. */
	read_index_note_block(idx, 7, blocks[0]);

	struct read_index_stats s = stats_of(idx);
	CU_ASSERT_EQUAL(s.entries, 2);
	CU_ASSERT_EQUAL(s.inserts, 2);
	CU_ASSERT_EQUAL(s.refreshes, 1);
	CU_ASSERT_EQUAL(s.lookups, 4);
	CU_ASSERT_EQUAL(s.hits, 2);
	CU_ASSERT_DOUBLE_EQUAL(read_index_hit_rate(&s), 0.5, 1e-9);
	CU_ASSERT_TRUE(s.capacity > 10000);
	CU_ASSERT_TRUE(s.bytes <= 1 << 20);
	read_index_destroy(idx);
}

static void test_invalidate_range_touches_partial_ends(void)
{
	struct read_index *idx = read_index_create(1 << 20);

	CU_ASSERT_PTR_NOT_NULL_FATAL(idx);
	fill_blocks();
	for (unsigned b = 10; b < 16; b++)
		read_index_note_block(idx, b, blocks[b]);
	/* 4096 bytes from the middle of block 10: blocks 10 and 11. */
	read_index_invalidate_range(idx, 10 * BS + 100, BS);
	CU_ASSERT_TRUE(misses(idx, blocks[10]));
	CU_ASSERT_TRUE(misses(idx, blocks[11]));
	CU_ASSERT_TRUE(finds(idx, blocks[12], 12));
	/* One byte, the last of block 12; then the first of block 14. */
	read_index_invalidate_range(idx, 13 * BS - 1, 1);
	CU_ASSERT_TRUE(misses(idx, blocks[12]));
	CU_ASSERT_TRUE(finds(idx, blocks[13], 13));
	read_index_invalidate_range(idx, 14 * BS, 1);
	CU_ASSERT_TRUE(misses(idx, blocks[14]));
	CU_ASSERT_TRUE(finds(idx, blocks[15], 15));
	/* Empty ranges touch nothing; a range up to the last byte is fine. */
	read_index_invalidate_range(idx, 13 * BS, 0);
	CU_ASSERT_TRUE(finds(idx, blocks[13], 13));
	read_index_invalidate_range(idx, UINT64_MAX - 10, 100);
	CU_ASSERT_EQUAL(stats_of(idx).invalidations, 4);
	/* A range far larger than the index takes the pass over the slots. */
	read_index_note_block(idx, 1000000, blocks[1]);
	read_index_invalidate_range(idx, 14 * BS, (1000000ULL - 14) * BS);
	CU_ASSERT_TRUE(misses(idx, blocks[15]));
	CU_ASSERT_TRUE(finds(idx, blocks[13], 13));
	CU_ASSERT_TRUE(finds(idx, blocks[1], 1000000));
	read_index_invalidate_range(idx, 0, UINT64_MAX);
	CU_ASSERT_EQUAL(stats_of(idx).entries, 0);
	CU_ASSERT_EQUAL(stats_of(idx).invalidations, 7);
	read_index_destroy(idx);
}

static void test_note_read_records_whole_blocks_only(void)
{
	static uint8_t disk[8 * BS];
	struct read_index *idx = read_index_create(1 << 20);

	CU_ASSERT_PTR_NOT_NULL_FATAL(idx);
	nbd_client_fill_pattern(disk, sizeof(disk), 5);
	/* Bytes [100, 100 + 3 blocks): whole blocks 1 and 2 only. */
	read_index_note_read(idx, read_index_read_begin(idx), 100, disk + 100, 3 * BS);
	CU_ASSERT_EQUAL(stats_of(idx).inserts, 2);
	CU_ASSERT_TRUE(finds(idx, disk + BS, 1));
	CU_ASSERT_TRUE(finds(idx, disk + 2 * BS, 2));
	CU_ASSERT_TRUE(misses(idx, disk));
	CU_ASSERT_TRUE(misses(idx, disk + 3 * BS));
	/* Less than a block, even if aligned at one end: nothing. */
	read_index_note_read(idx, read_index_read_begin(idx), 4 * BS, disk + 4 * BS, BS - 1);
	read_index_note_read(idx, read_index_read_begin(idx), 4 * BS + 1, disk + 4 * BS + 1, BS - 1);
	CU_ASSERT_EQUAL(stats_of(idx).inserts, 2);
	/* Aligned at both ends: every block. */
	read_index_note_read(idx, read_index_read_begin(idx), 4 * BS, disk + 4 * BS, 4 * BS);
	CU_ASSERT_EQUAL(stats_of(idx).inserts, 6);
	CU_ASSERT_TRUE(finds(idx, disk + 7 * BS, 7));
	read_index_destroy(idx);
}

static void test_read_overtaken_by_write_is_not_recorded(void)
{
	struct read_index *idx = read_index_create(1 << 20);

	CU_ASSERT_PTR_NOT_NULL_FATAL(idx);
	fill_blocks();
	/* The disk read happened, then a write landed before the recording. */
	uint64_t token = read_index_read_begin(idx);
	read_index_invalidate_range(idx, 3 * BS, 512);
	read_index_note_read(idx, token, 3 * BS, blocks[3], BS);
	CU_ASSERT_TRUE(misses(idx, blocks[3]));
	CU_ASSERT_EQUAL(stats_of(idx).stale_reads, 1);
	CU_ASSERT_EQUAL(stats_of(idx).entries, 0);
	read_index_destroy(idx);
}

static void test_zero_and_duplicate_and_changed_content(void)
{
	static const uint8_t zero[BS];
	struct read_index *idx = read_index_create(1 << 20);

	CU_ASSERT_PTR_NOT_NULL_FATAL(idx);
	fill_blocks();
	read_index_note_block(idx, 1, zero);
	CU_ASSERT_TRUE(misses(idx, zero));
	CU_ASSERT_EQUAL(stats_of(idx).zero_blocks, 1);
	/* Blocks 2 and 3 hold the same content: one entry, and it is live. */
	read_index_note_block(idx, 2, blocks[5]);
	read_index_note_block(idx, 3, blocks[5]);
	CU_ASSERT_TRUE(finds(idx, blocks[5], 2));
	CU_ASSERT_EQUAL(stats_of(idx).duplicates, 1);
	CU_ASSERT_EQUAL(stats_of(idx).entries, 1);
	read_index_invalidate_range(idx, 2 * BS, BS);
	CU_ASSERT_TRUE(misses(idx, blocks[5]));
	/* Block 4 read with other content than indexed: the new one wins. */
	read_index_note_block(idx, 4, blocks[6]);
	read_index_note_block(idx, 4, blocks[7]);
	CU_ASSERT_TRUE(misses(idx, blocks[6]));
	CU_ASSERT_TRUE(finds(idx, blocks[7], 4));
	/* ...and so does zero content read later. */
	read_index_note_block(idx, 4, zero);
	CU_ASSERT_TRUE(misses(idx, blocks[7]));
	CU_ASSERT_EQUAL(stats_of(idx).entries, 0);
	read_index_destroy(idx);
}

static void test_budget_and_clock_eviction(void)
{
	CU_ASSERT_PTR_NULL(read_index_create(16));
	struct read_index *idx = read_index_create(SMALL_BUDGET);

	CU_ASSERT_PTR_NOT_NULL_FATAL(idx);
	fill_blocks();
	struct read_index_stats s = stats_of(idx);
	uint64_t cap = s.capacity;
	CU_ASSERT_TRUE(s.bytes <= SMALL_BUDGET);
	uint64_t bytes = s.bytes;
	CU_ASSERT_FATAL(cap >= 4 && cap < 30);
	for (uint64_t b = 0; b < cap; b++)
		read_index_note_block(idx, b, blocks[b]);
	CU_ASSERT_EQUAL(stats_of(idx).evictions, 0);
	/* A hit marks block 0: the hand spares it and takes block 1. */
	CU_ASSERT_TRUE(finds(idx, blocks[0], 0));
	read_index_note_block(idx, cap, blocks[cap]);
	CU_ASSERT_TRUE(finds(idx, blocks[0], 0));
	CU_ASSERT_TRUE(misses(idx, blocks[1]));
	CU_ASSERT_TRUE(finds(idx, blocks[cap], cap));
	/* A freed slot is reused before anything else is evicted. */
	read_index_invalidate_range(idx, 2 * BS, BS);
	read_index_note_block(idx, cap + 1, blocks[cap + 1]);
	CU_ASSERT_EQUAL(stats_of(idx).evictions, 1);
	/* Twice the capacity more: the index stays full, never above. */
	uint8_t other[BS];
	for (uint64_t i = 0; i < 2 * cap; i++) {
		fill_random(other, BS, 1000 + i);
		read_index_note_block(idx, 100 + i, other);
	}
	s = stats_of(idx);
	CU_ASSERT_EQUAL(s.entries, cap);
	CU_ASSERT_EQUAL(s.inserts, cap + 2 + 2 * cap);
	CU_ASSERT_EQUAL(s.inserts, s.entries + s.evictions + s.invalidations);
	CU_ASSERT_EQUAL(s.evictions, 2 * cap + 1);
	CU_ASSERT_EQUAL(s.bytes, bytes); /* nothing grows */
	read_index_destroy(idx);
}

static double seconds_since(const struct timespec *t0)
{
	struct timespec t1;

	clock_gettime(CLOCK_MONOTONIC, &t1);
	return (double)(t1.tv_sec - t0->tv_sec) + (double)(t1.tv_nsec - t0->tv_nsec) / 1e9;
}

/*
 * What read tracking adds per 4 KiB block read: the XXH3-128 hash, then
 * the index update.  Printed, not asserted: timings under sanitizers or
 * valgrind say little, and a loaded machine must not fail the suite.
 */
static void test_measure_cost_per_block(void)
{
	const size_t n = 2048; /* 8 MiB of distinct blocks */
	uint8_t *data = malloc(n * BS);
	struct read_index *idx = read_index_create(64u << 20);
	struct timespec t0;
	uint64_t sink = 0;

	CU_ASSERT_PTR_NOT_NULL_FATAL(data);
	CU_ASSERT_PTR_NOT_NULL_FATAL(idx);
	fill_random(data, n * BS, 42);
	/* A first pass brings the data and the index's pages in. */
	read_index_note_read(idx, read_index_read_begin(idx), 0, data, n * BS);
	read_index_invalidate_range(idx, 0, n * BS);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (size_t i = 0; i < n; i++)
		sink ^= read_index_hash(data + i * BS).low64;
	double hash_s = seconds_since(&t0);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	read_index_note_read(idx, read_index_read_begin(idx), 0, data, n * BS);
	double note_s = seconds_since(&t0);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (size_t i = 0; i < n; i++)
		sink ^= (uint64_t)finds(idx, data + i * BS, i);
	double lookup_s = seconds_since(&t0);
	CU_ASSERT_EQUAL(stats_of(idx).inserts, 2 * n);
	CU_ASSERT_EQUAL(stats_of(idx).hits, n);
	read_index_destroy(idx);

	/*
	 * Steady state: a full index, every new block evicts one.  Distinct
	 * content from a block number stamped into the random data.
	 */
	idx = read_index_create(4u << 20);
	CU_ASSERT_PTR_NOT_NULL_FATAL(idx);
	uint64_t next = 0, cap = stats_of(idx).capacity;
	while (next < cap + n) {
		for (size_t i = 0; i < n && next < cap + n; i++, next++) {
			memcpy(data + i * BS, &next, sizeof(next));
			if (next == cap)
				clock_gettime(CLOCK_MONOTONIC, &t0);
			read_index_note_block(idx, next, data + i * BS);
		}
	}
	double evict_s = seconds_since(&t0);
	CU_ASSERT_EQUAL(stats_of(idx).evictions, n);
	printf("\n    read tracking cost per 4 KiB block: hash %.0f ns (%.1f GB/s), "
	       "hash+record %.0f ns, hash+record+evict in a full 4 MiB index %.0f ns, "
	       "hash+lookup %.0f ns [%llx] ",
	       hash_s * 1e9 / (double)n, (double)n * BS / hash_s / 1e9,
	       note_s * 1e9 / (double)n, evict_s * 1e9 / (double)n,
	       lookup_s * 1e9 / (double)n, (unsigned long long)(sink & 0xf));
	read_index_destroy(idx);
	free(data);
}

/* ---- through the NBD path ----------------------------------------- */

#define DISK_SIZE (4u * 1024 * 1024)

static struct nbd_fixture fx;

/*
 * An export of a zeroed image with tracking on (its index in *idx), a
 * client past the handshake (returned), and blocks[] filled.
 */
static int nbd_setup(size_t budget, struct read_index **idx)
{
	*idx = read_index_create(budget);
	fill_blocks();
	if (nbd_fixture_setup(&fx, DISK_SIZE) < 0 || !*idx) {
		read_index_destroy(*idx);
		return -1;
	}
	nbd_export_set_read_index(fx.export, *idx);
	int fd = nbd_client_connect();
	if (fd >= 0 && nbd_client_handshake(fd, "vm1", DISK_SIZE) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static void nbd_teardown(int fd)
{
	close(fd);
	nbd_fixture_teardown(&fx);
}

static int64_t nbd_write(int fd, uint64_t offset, const void *data, uint32_t len)
{
	return nbd_client_transact(fd, NBD_CMD_WRITE, 0, offset, len, data, NULL);
}

static int64_t nbd_read(int fd, uint64_t offset, void *out, uint32_t len)
{
	return nbd_client_transact(fd, NBD_CMD_READ, 0, offset, len, NULL, out);
}

static void test_nbd_read_then_write_is_forgotten(void)
{
	uint8_t in[4 * BS];
	struct read_index *idx;
	int fd = nbd_setup(1 << 20, &idx);

	CU_ASSERT_FATAL(fd >= 0);
	/* Writes alone record nothing: the guest wrote, it did not read. */
	CU_ASSERT_EQUAL(nbd_write(fd, 8 * BS, blocks, 4 * BS), 0);
	CU_ASSERT_EQUAL(stats_of(idx).entries, 0);
	CU_ASSERT_EQUAL(nbd_read(fd, 8 * BS, in, sizeof(in)), 0);
	CU_ASSERT_EQUAL(memcmp(in, blocks, sizeof(in)), 0);
	for (unsigned i = 0; i < 4; i++)
		CU_ASSERT_TRUE(finds(idx, blocks[i], 8 + i));
	/* A lookup by other content misses. */
	CU_ASSERT_TRUE(misses(idx, blocks[9]));

	/* WRITE: block 8's old content must not be found any more. */
	CU_ASSERT_EQUAL(nbd_write(fd, 8 * BS, blocks[9], BS), 0);
	CU_ASSERT_TRUE(misses(idx, blocks[0]));
	CU_ASSERT_TRUE(misses(idx, blocks[9])); /* written, not yet read */
	/* TRIM and WRITE_ZEROES forget too. */
	CU_ASSERT_EQUAL(nbd_client_transact(fd, NBD_CMD_TRIM, 0, 9 * BS, BS, NULL, NULL), 0);
	CU_ASSERT_EQUAL(nbd_client_transact(fd, NBD_CMD_WRITE_ZEROES, 0, 10 * BS, BS,
					    NULL, NULL), 0);
	CU_ASSERT_TRUE(misses(idx, blocks[1]));
	CU_ASSERT_TRUE(misses(idx, blocks[2]));
	CU_ASSERT_TRUE(finds(idx, blocks[3], 11));
	/* Reading block 8 again records what it holds now. */
	CU_ASSERT_EQUAL(nbd_read(fd, 8 * BS, in, BS), 0);
	CU_ASSERT_TRUE(finds(idx, blocks[9], 8));

	/* The zeroed block reads back as zeros and is not indexed. */
	CU_ASSERT_EQUAL(nbd_read(fd, 10 * BS, in, BS), 0);
	struct read_index_stats s = stats_of(idx);
	CU_ASSERT_EQUAL(s.zero_blocks, 1);
	CU_ASSERT_EQUAL(s.invalidations, 3);
	CU_ASSERT_EQUAL(s.entries, 2);
	nbd_teardown(fd);
}

static void test_nbd_partial_write_forgets_both_end_blocks(void)
{
	uint8_t in[4 * BS], patch[BS];
	struct read_index *idx;
	int fd = nbd_setup(1 << 20, &idx);

	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL(nbd_write(fd, 20 * BS, blocks, 4 * BS), 0);
	CU_ASSERT_EQUAL(nbd_read(fd, 20 * BS, in, sizeof(in)), 0);
	CU_ASSERT_EQUAL(stats_of(idx).entries, 4);
	/* 4096 bytes from the middle of block 20 to the middle of 21. */
	memset(patch, 0x5a, sizeof(patch));
	CU_ASSERT_EQUAL(nbd_write(fd, 20 * BS + 2048, patch, BS), 0);
	CU_ASSERT_TRUE(misses(idx, blocks[0]));
	CU_ASSERT_TRUE(misses(idx, blocks[1]));
	CU_ASSERT_TRUE(finds(idx, blocks[2], 22));
	/* One byte at the last byte of block 22. */
	CU_ASSERT_EQUAL(nbd_write(fd, 23 * BS - 1, patch, 1), 0);
	CU_ASSERT_TRUE(misses(idx, blocks[2]));
	CU_ASSERT_TRUE(finds(idx, blocks[3], 23));
	nbd_teardown(fd);
}

static void test_nbd_unaligned_read_records_whole_blocks(void)
{
	uint8_t in[3 * BS];
	struct read_index *idx;
	int fd = nbd_setup(1 << 20, &idx);

	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL(nbd_write(fd, 30 * BS, blocks, 4 * BS), 0);
	/* Bytes 512 into block 30 up to 512 into block 33: whole 31 and 32. */
	CU_ASSERT_EQUAL(nbd_read(fd, 30 * BS + 512, in, sizeof(in)), 0);
	CU_ASSERT_EQUAL(memcmp(in, (const uint8_t *)blocks + 512, sizeof(in)), 0);
	struct read_index_stats s = stats_of(idx);
	CU_ASSERT_EQUAL(s.inserts, 2);
	CU_ASSERT_TRUE(misses(idx, blocks[0]));
	CU_ASSERT_TRUE(finds(idx, blocks[1], 31));
	CU_ASSERT_TRUE(finds(idx, blocks[2], 32));
	CU_ASSERT_TRUE(misses(idx, blocks[3]));
	/* A sub-block read records nothing. */
	CU_ASSERT_EQUAL(nbd_read(fd, 30 * BS, in, 512), 0);
	CU_ASSERT_EQUAL(stats_of(idx).inserts, 2);
	s = stats_of(idx);
	CU_ASSERT_EQUAL(s.lookups, 4);
	CU_ASSERT_EQUAL(s.hits, 2);
	CU_ASSERT_DOUBLE_EQUAL(read_index_hit_rate(&s), 0.5, 1e-9);
	nbd_teardown(fd);
}

/*
 * A read and a write of the same block in flight together, on one
 * connection and on two (each connection's I/O runs on its own worker,
 * so on two they truly race): whichever runs first, the old content must
 * be forgotten.  A read that raced the write may go unrecorded (its
 * token went stale); the next one records what the disk holds.
 */
static void test_nbd_read_racing_write(void)
{
	uint8_t in[BS];
	struct read_index *idx;
	int fd = nbd_setup(1 << 20, &idx);

	CU_ASSERT_FATAL(fd >= 0);
	int other = nbd_client_connect();
	CU_ASSERT_EQUAL_FATAL(nbd_client_handshake(other, "vm1", DISK_SIZE), 0);
	for (unsigned round = 0; round < 8; round++) {
		uint64_t block = 40 + round;
		const uint8_t *old = blocks[2 * round], *new = blocks[2 * round + 1];
		int writer = round % 2 ? other : fd;
		uint64_t rh = nbd_client_next_handle(), wh = nbd_client_next_handle();

		CU_ASSERT_EQUAL(nbd_write(fd, block * BS, old, BS), 0);
		CU_ASSERT_EQUAL(nbd_read(fd, block * BS, in, BS), 0);
		CU_ASSERT_TRUE(finds(idx, old, block));
		/* Both requests sent before either reply is read. */
		CU_ASSERT_EQUAL(nbd_client_send_request(fd, NBD_CMD_READ, 0, rh, block * BS, BS), 0);
		CU_ASSERT_EQUAL(nbd_client_send_request(writer, NBD_CMD_WRITE, 0, wh, block * BS, BS), 0);
		CU_ASSERT_EQUAL(nbd_client_send(writer, new, BS), 0);
		if (writer == fd) {
			CU_ASSERT_EQUAL(nbd_client_recv_reply(fd, rh, in, BS), 0);
			CU_ASSERT_EQUAL(nbd_client_recv_reply(fd, wh, NULL, 0), 0);
		} else {
			CU_ASSERT_EQUAL(nbd_client_recv_reply(writer, wh, NULL, 0), 0);
			CU_ASSERT_EQUAL(nbd_client_recv_reply(fd, rh, in, BS), 0);
		}
		CU_ASSERT_TRUE(misses(idx, old));
		if (memcmp(in, new, BS) != 0)
			CU_ASSERT_EQUAL(memcmp(in, old, BS), 0);
		/* Nothing in flight now: a read records what the disk holds. */
		CU_ASSERT_EQUAL(nbd_read(fd, block * BS, in, BS), 0);
		CU_ASSERT_EQUAL(memcmp(in, new, BS), 0);
		CU_ASSERT_TRUE(finds(idx, new, block));
	}
	close(other);
	nbd_teardown(fd);
}

static void test_nbd_budget_evicts(void)
{
	uint8_t *in = malloc(64 * BS);
	struct read_index *idx;
	int fd = nbd_setup(SMALL_BUDGET, &idx);

	CU_ASSERT_PTR_NOT_NULL_FATAL(in);
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL(nbd_write(fd, 0, blocks, 64 * BS), 0);
	CU_ASSERT_EQUAL(nbd_read(fd, 0, in, 64 * BS), 0);
	struct read_index_stats s = stats_of(idx);
	CU_ASSERT_TRUE(s.capacity < 64);
	CU_ASSERT_EQUAL(s.inserts, 64);
	CU_ASSERT_EQUAL(s.entries, s.capacity);
	CU_ASSERT_EQUAL(s.evictions, 64 - s.capacity);
	CU_ASSERT_TRUE(s.bytes <= SMALL_BUDGET);
	/* The newest blocks are the ones kept. */
	CU_ASSERT_TRUE(finds(idx, blocks[63], 63));
	CU_ASSERT_TRUE(misses(idx, blocks[0]));
	/* Tracking off: the index goes, reads still work. */
	nbd_export_set_read_index(fx.export, NULL);
	CU_ASSERT_PTR_NULL(nbd_export_read_index(fx.export));
	CU_ASSERT_EQUAL(nbd_read(fd, 0, in, BS), 0);
	CU_ASSERT_EQUAL(memcmp(in, blocks[0], BS), 0);
	nbd_teardown(fd);
	free(in);
}

static int quiet_logs(void)
{
	return log_open(NULL, LOG_ERROR);
}

static int restore_logs(void)
{
	return log_open(NULL, LOG_INFO);
}

int register_read_index_tests(void)
{
	CU_pSuite suite = CU_add_suite("read_index", quiet_logs, restore_logs);

	if (!suite ||
	    !CU_add_test(suite, "lookup finds a read block, counts", test_lookup_finds_read_block_and_counts) ||
	    !CU_add_test(suite, "invalidation touches partial ends", test_invalidate_range_touches_partial_ends) ||
	    !CU_add_test(suite, "note_read records whole blocks only", test_note_read_records_whole_blocks_only) ||
	    !CU_add_test(suite, "read overtaken by a write not recorded", test_read_overtaken_by_write_is_not_recorded) ||
	    !CU_add_test(suite, "zero, duplicate and changed content", test_zero_and_duplicate_and_changed_content) ||
	    !CU_add_test(suite, "budget and CLOCK eviction", test_budget_and_clock_eviction) ||
	    !CU_add_test(suite, "cost per block (printed)", test_measure_cost_per_block) ||
	    !CU_add_test(suite, "NBD: read then write is forgotten", test_nbd_read_then_write_is_forgotten) ||
	    !CU_add_test(suite, "NBD: partial write forgets both ends", test_nbd_partial_write_forgets_both_end_blocks) ||
	    !CU_add_test(suite, "NBD: unaligned read, whole blocks", test_nbd_unaligned_read_records_whole_blocks) ||
	    !CU_add_test(suite, "NBD: read racing a write", test_nbd_read_racing_write) ||
	    !CU_add_test(suite, "NBD: budget evicts, tracking off", test_nbd_budget_evicts))
		return -1;
	return 0;
}
