/*
 * Block status of a frozen disk (disk_snapshot_extents, and BLOCK_STATUS
 * on the snapshot's read-only NBD export): a range is a hole exactly
 * where the image was a hole, or read as zeros from a preserved block,
 * at the freeze, whatever the parent did to the live image since.
 *
 * The oracle is per 4 KiB block: the test knows which blocks it wrote
 * before the freeze (the rest of the sparse image is a hole; ext4 and
 * tmpfs report holes at that granularity), which of those were zeros,
 * and which blocks the parent's changes preserved since.  A block is a
 * hole in the frozen view iff (not preserved and not allocated at the
 * freeze) or (preserved and all zeros at the freeze).
 */
#include <CUnit/CUnit.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/be.h"
#include "nbd/disk_file.h"
#include "fork/disk_snapshot.h"
#include "base/log.h"
#include "nbd/nbd_proto.h"
#include "nbd/nbd_server.h"
#include "nbd_test_client.h"
#include "suites.h"

#define BLOCK 4096u
/* 256 full blocks and a short last one of 1000 bytes. */
#define NBLOCKS 257u
#define DISK_SIZE (256u * BLOCK + 1000)
#define HZ (NBD_STATE_HOLE | NBD_STATE_ZERO)
#define READ_ONLY_FLAGS (NBD_FLAG_HAS_FLAGS | NBD_FLAG_READ_ONLY | NBD_FLAG_SEND_FLUSH | \
			 NBD_FLAG_CAN_MULTI_CONN)

static struct nbd_fixture fx;
static char err[256];

/* What the test knows of each block. */
struct oracle {
	bool allocated[NBLOCKS]; /* written before the freeze */
	bool zero[NBLOCKS];      /* reads zeros at the freeze */
	bool preserved[NBLOCKS]; /* touched by a change since */
};

static uint64_t block_len(uint64_t b)
{
	return b == NBLOCKS - 1 ? DISK_SIZE - b * BLOCK : BLOCK;
}

static bool frozen_hole(const struct oracle *o, uint64_t b)
{
	if (o->preserved[b])
		return o->zero[b] || !o->allocated[b];
	return !o->allocated[b];
}

/* Writes block b behind the server's back, before the freeze. */
static void put_block(struct oracle *o, uint64_t b, bool zeros, unsigned seed)
{
	uint8_t buf[BLOCK];

	if (zeros)
		memset(buf, 0, sizeof(buf));
	else
		nbd_client_fill_pattern(buf, sizeof(buf), seed + (unsigned)b);
	CU_ASSERT_EQUAL(pwrite(fx.disk_fd, buf, block_len(b), (off_t)(b * BLOCK)),
			(ssize_t)block_len(b));
	o->allocated[b] = true;
	o->zero[b] = zeros;
}

static void mark_touched(struct oracle *o, uint64_t offset, uint64_t len)
{
	for (uint64_t b = offset / BLOCK; b <= (offset + len - 1) / BLOCK; b++)
		o->preserved[b] = true;
}

static int64_t change(int fd, struct oracle *o, uint16_t type, uint16_t flags,
		      uint64_t offset, uint32_t len)
{
	uint8_t *data = NULL;
	int64_t r;

	if (type == NBD_CMD_WRITE) {
		data = malloc(len);
		nbd_client_fill_pattern(data, len, (unsigned)offset);
	}
	r = nbd_client_transact(fd, type, flags, offset, len, data, NULL);
	free(data);
	if (r == 0)
		mark_touched(o, offset, len);
	return r;
}

/*
 * 1 when extents (from offset 0) say exactly what the oracle says of
 * every block they cover; *covered gets how far they reach.
 */
static int extents_match(const struct oracle *o, const struct disk_extent *e, size_t n,
			 uint64_t *covered, bool quiet)
{
	uint64_t pos = 0;

	for (size_t i = 0; i < n; i++) {
		/* Block-aligned, or the image's end: the oracle's granularity. */
		if (e[i].length == 0 || (pos + e[i].length) % BLOCK != 0) {
			if (pos + e[i].length != DISK_SIZE)
				return 0;
		}
		for (uint64_t b = pos / BLOCK; b * BLOCK < pos + e[i].length; b++) {
			if (frozen_hole(o, b) != (bool)e[i].hole) {
				if (!quiet)
					fprintf(stderr, "block %llu: reported %s, frozen view has %s\n",
						(unsigned long long)b,
						e[i].hole ? "hole" : "data",
						frozen_hole(o, b) ? "hole" : "data");
				return 0;
			}
		}
		pos += e[i].length;
	}
	*covered = pos;
	return 1;
}

/* The whole snapshot's map, asking again from where each answer ends. */
static int whole_map(struct disk_snapshot *ds, struct disk_extent *out, size_t cap,
		     size_t *n)
{
	struct disk_extent part[16];
	uint64_t pos = 0;

	*n = 0;
	while (pos < DISK_SIZE) {
		size_t got;
		if (disk_snapshot_extents(ds, pos, DISK_SIZE - pos, part, 16, &got,
					  err, sizeof(err)) != 0)
			return -1;
		/* An answer may end inside a run: merge it back. */
		for (size_t i = 0; i < got; i++) {
			pos += part[i].length;
			if (*n > 0 && out[*n - 1].hole == part[i].hole)
				out[*n - 1].length += part[i].length;
			else if (*n < cap)
				out[(*n)++] = part[i];
			else
				return -1;
		}
	}
	return 0;
}

/* Field by field: the struct has padding. */
static bool same_extents(const struct disk_extent *a, const struct disk_extent *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (a[i].length != b[i].length || !a[i].hole != !b[i].hole)
			return false;
	return true;
}

/* Every hole reported reads as zeros from the snapshot (its content agrees). */
static int holes_read_zero(struct disk_snapshot *ds, const struct disk_extent *e, size_t n)
{
	static uint8_t buf[DISK_SIZE];
	uint64_t pos = 0;

	if (disk_snapshot_read(ds, 0, buf, DISK_SIZE, err, sizeof(err)) != 0)
		return 0;
	for (size_t i = 0; i < n; i++) {
		for (uint64_t j = pos; e[i].hole && j < pos + e[i].length; j++)
			if (buf[j])
				return 0;
		pos += e[i].length;
	}
	return 1;
}

static struct disk_snapshot *freeze(void)
{
	struct disk_snapshot *ds = disk_snapshot_create(fx.export, fx.dir, err, sizeof(err));

	CU_ASSERT_PTR_NOT_NULL(ds);
	if (!ds)
		fprintf(stderr, "disk_snapshot_create: %s\n", err);
	return ds;
}

static int connect_live(void)
{
	int fd = nbd_client_connect();

	return fd >= 0 && nbd_client_handshake(fd, "vm1", DISK_SIZE) == 0 ? fd : -1;
}

/*
 * The layout of the brief's cases: data at blocks 0-3 and 8-11, an
 * allocated block of zeros at 20, data in the short last block, the rest
 * a hole.  Then the parent: writes the hole at 40, writes 2-9 (data,
 * hole, data), trims 10, writes the allocated zeros at 20, and zeroes
 * block 0 (may punch).
 */
static void test_preserved_blocks_keep_the_frozen_holes(void)
{
	struct oracle o = { 0 };
	struct disk_extent e[64], live[64];
	size_t n, nl;
	uint64_t covered;

	CU_ASSERT_EQUAL_FATAL(nbd_fixture_setup(&fx, DISK_SIZE), 0);
	for (uint64_t b = 0; b < 4; b++)
		put_block(&o, b, false, 1);
	for (uint64_t b = 8; b < 12; b++)
		put_block(&o, b, false, 1);
	put_block(&o, 20, true, 0);
	put_block(&o, NBLOCKS - 1, false, 1);
	int fd = connect_live();
	CU_ASSERT_FATAL(fd >= 0);
	struct disk_snapshot *ds = freeze();
	CU_ASSERT_PTR_NOT_NULL_FATAL(ds);

	/* Nothing preserved yet: the live image's own map, block 20 is data. */
	CU_ASSERT_EQUAL(whole_map(ds, e, 64, &n), 0);
	CU_ASSERT(extents_match(&o, e, n, &covered, false));
	CU_ASSERT_EQUAL(n, 7);
	CU_ASSERT_FALSE(e[4].hole); /* block 20 */
	CU_ASSERT_EQUAL(e[4].length, BLOCK);

	CU_ASSERT_EQUAL(change(fd, &o, NBD_CMD_WRITE, 0, 40 * BLOCK, BLOCK), 0);
	CU_ASSERT_EQUAL(change(fd, &o, NBD_CMD_WRITE, 0, 2 * BLOCK + 10, 8 * BLOCK - 20), 0);
	CU_ASSERT_EQUAL(change(fd, &o, NBD_CMD_TRIM, 0, 10 * BLOCK, BLOCK), 0);
	CU_ASSERT_EQUAL(change(fd, &o, NBD_CMD_WRITE, 0, 20 * BLOCK, BLOCK), 0);
	CU_ASSERT_EQUAL(change(fd, &o, NBD_CMD_WRITE_ZEROES, 0, 0, BLOCK), 0);
	struct disk_snapshot_stats st;
	disk_snapshot_get_stats(ds, &st);
	CU_ASSERT_EQUAL(st.blocks_preserved, 12);

	CU_ASSERT_EQUAL(whole_map(ds, e, 64, &n), 0);
	CU_ASSERT(extents_match(&o, e, n, &covered, false));
	CU_ASSERT_EQUAL(covered, DISK_SIZE);
	CU_ASSERT(holes_read_zero(ds, e, n));
	/* data 0-3, hole 4-7 (preserved zeros), data 8-11, hole to 256, data. */
	const struct disk_extent want[] = {
		{ 4 * BLOCK, 0 }, { 4 * BLOCK, 1 }, { 4 * BLOCK, 0 },
		{ 244 * BLOCK, 1 }, { 1000, 0 },
	};
	CU_ASSERT_EQUAL_FATAL(n, 5);
	CU_ASSERT(same_extents(e, want, n));

	/*
	 * Negative controls: the live image's map now differs from the
	 * snapshot's (4-7 and 40 are data there, 10 a hole), so answering
	 * from the live image would fail; and the oracle without the
	 * preserved blocks (the freeze's allocation alone) rejects this
	 * map (block 20 is allocated zeros there), so it can tell.
	 */
	disk_file_extents(&(struct disk_file){ .fd = fx.disk_fd, .size = DISK_SIZE }, 0,
			  DISK_SIZE, live, 64, &nl);
	CU_ASSERT(nl != n || !same_extents(live, e, n));
	uint64_t ignored;
	struct oracle live_truth = o;
	memset(live_truth.preserved, 0, sizeof(live_truth.preserved));
	CU_ASSERT_FALSE(extents_match(&live_truth, e, n, &ignored, true));

	/* Ranges that start and end inside runs are clipped to them. */
	CU_ASSERT_EQUAL(disk_snapshot_extents(ds, 3 * BLOCK + 5, 2 * BLOCK, e, 64, &n,
					      err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(n, 2);
	CU_ASSERT_EQUAL(e[0].length, BLOCK - 5);
	CU_ASSERT_FALSE(e[0].hole);
	CU_ASSERT_EQUAL(e[1].length, BLOCK + 5);
	CU_ASSERT(e[1].hole);
	/* max 1: one extent, shorter than asked. */
	CU_ASSERT_EQUAL(disk_snapshot_extents(ds, 0, DISK_SIZE, e, 1, &n, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(n, 1);
	CU_ASSERT_EQUAL(e[0].length, 4 * BLOCK);
	/* The short last block alone. */
	CU_ASSERT_EQUAL(disk_snapshot_extents(ds, DISK_SIZE - 1, 1, e, 64, &n, err,
					      sizeof(err)), 0);
	CU_ASSERT(n == 1 && e[0].length == 1 && !e[0].hole);

	/* Bad ranges: clean EINVAL, nothing written to out. */
	CU_ASSERT_EQUAL(disk_snapshot_extents(ds, 0, 0, e, 64, &n, err, sizeof(err)), -EINVAL);
	CU_ASSERT_EQUAL(n, 0);
	CU_ASSERT_EQUAL(disk_snapshot_extents(ds, DISK_SIZE, 1, e, 64, &n, err, sizeof(err)),
			-EINVAL);
	CU_ASSERT_EQUAL(disk_snapshot_extents(ds, DISK_SIZE - 10, 11, e, 64, &n, err,
					      sizeof(err)), -EINVAL);
	CU_ASSERT_EQUAL(disk_snapshot_extents(ds, UINT64_MAX, 2, e, 64, &n, err, sizeof(err)),
			-EINVAL);
	CU_ASSERT_EQUAL(disk_snapshot_extents(ds, 1, UINT64_MAX, e, 64, &n, err, sizeof(err)),
			-EINVAL);
	CU_ASSERT_EQUAL(disk_snapshot_extents(ds, 0, 1, e, 0, &n, err, sizeof(err)), -EINVAL);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "beyond"));

	disk_snapshot_destroy(ds);
	close(fd);
	nbd_fixture_teardown(&fx);
}

/* A seeded random history against the per-block oracle, map and content. */
static void test_random_changes_against_the_oracle(void)
{
	struct disk_extent e[NBLOCKS + 1];
	size_t n;
	uint64_t covered;
	unsigned seed = 12345;

	for (int round = 0; round < 4; round++) {
		struct oracle o = { 0 };

		CU_ASSERT_EQUAL_FATAL(nbd_fixture_setup(&fx, DISK_SIZE), 0);
		for (uint64_t b = 0; b < NBLOCKS; b++) {
			int r = rand_r(&seed) % 4;
			if (r == 1)
				put_block(&o, b, false, (unsigned)round);
			else if (r == 2)
				put_block(&o, b, true, 0);
		}
		int fd = connect_live();
		CU_ASSERT_FATAL(fd >= 0);
		struct disk_snapshot *ds = freeze();
		CU_ASSERT_PTR_NOT_NULL_FATAL(ds);
		for (int i = 0; i < 60; i++) {
			uint64_t off = (uint64_t)rand_r(&seed) % DISK_SIZE;
			uint32_t len = 1 + (uint32_t)rand_r(&seed) % (6 * BLOCK);
			static const uint16_t types[] = { NBD_CMD_WRITE, NBD_CMD_TRIM,
							  NBD_CMD_WRITE_ZEROES };
			if (len > DISK_SIZE - off)
				len = (uint32_t)(DISK_SIZE - off);
			CU_ASSERT_EQUAL(change(fd, &o, types[rand_r(&seed) % 3], 0, off, len), 0);
		}
		CU_ASSERT_EQUAL(whole_map(ds, e, NBLOCKS + 1, &n), 0);
		CU_ASSERT(extents_match(&o, e, n, &covered, false));
		CU_ASSERT_EQUAL(covered, DISK_SIZE);
		CU_ASSERT(holes_read_zero(ds, e, n));
		disk_snapshot_destroy(ds);
		close(fd);
		nbd_fixture_teardown(&fx);
	}
}

/*
 * Preserved and live blocks alternating more often than one call looks
 * at: the answer is shorter than asked, never wrong, and asking again
 * from its end covers the rest.
 */
static void test_alternating_runs_bound_one_call(void)
{
	const uint64_t size = 16u * 1024 * 1024;
	uint8_t *data = malloc(size);
	struct disk_extent e[8];
	size_t n, calls = 0;

	CU_ASSERT_EQUAL_FATAL(nbd_fixture_setup(&fx, size), 0);
	nbd_client_fill_pattern(data, size, 3);
	CU_ASSERT_EQUAL(pwrite(fx.disk_fd, data, size, 0), (ssize_t)size);
	struct disk_snapshot *ds = freeze();
	CU_ASSERT_PTR_NOT_NULL_FATAL(ds);
	/* Every other block preserved (as a write would), none written yet. */
	for (uint64_t b = 0; b < size / BLOCK; b += 2)
		CU_ASSERT_EQUAL(nbd_export_before_write(fx.export, b * BLOCK, 1), 0);
	CU_ASSERT_EQUAL(disk_snapshot_extents(ds, 0, size, e, 8, &n, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(n, 1);
	CU_ASSERT_FALSE(e[0].hole);
	CU_ASSERT(e[0].length > 0 && e[0].length < size);
	for (uint64_t pos = 0; pos < size; calls++) {
		CU_ASSERT_EQUAL_FATAL(disk_snapshot_extents(ds, pos, size - pos, e, 8, &n, err,
							    sizeof(err)), 0);
		CU_ASSERT(n == 1 && !e[0].hole);
		pos += e[0].length;
	}
	printf("\n    alternating runs: a 16 MiB request of 4096 runs took %zu calls ", calls);
	CU_ASSERT(calls > 1 && calls <= 8);
	disk_snapshot_destroy(ds);
	nbd_fixture_teardown(&fx);
	free(data);
}

/* ds as a fork's read-only export "vm1@fork-1"; the client dials it from now on. */
static struct nbd_export *export_snapshot(struct disk_snapshot *ds)
{
	static char snap_sock[160]; /* static: the client keeps the pointer */

	snprintf(snap_sock, sizeof(snap_sock), "%s/snap.sock", fx.dir);
	struct nbd_export *snap = nbd_export_create_snapshot(fx.loop, "vm1@fork-1", snap_sock,
							     NULL, ds);
	if (snap)
		nbd_client_use(fx.loop, snap_sock);
	return snap;
}

/* The same frozen view through the read-only export, and bad requests. */
static void test_block_status_over_the_snapshot_export(void)
{
	struct oracle o = { 0 };
	uint32_t pairs[64], error;
	uint8_t buf[8 + 2 * BLOCK], zeros[2 * BLOCK] = { 0 };

	CU_ASSERT_EQUAL_FATAL(nbd_fixture_setup(&fx, DISK_SIZE), 0);
	for (uint64_t b = 16; b < 32; b++)
		put_block(&o, b, false, 2);
	int fd = connect_live();
	CU_ASSERT_FATAL(fd >= 0);
	struct disk_snapshot *ds = freeze();
	CU_ASSERT_PTR_NOT_NULL_FATAL(ds);
	/* The parent fills the hole before 16 and trims 24-31 after the freeze. */
	CU_ASSERT_EQUAL(change(fd, &o, NBD_CMD_WRITE, 0, 8 * BLOCK, 8 * BLOCK), 0);
	CU_ASSERT_EQUAL(change(fd, &o, NBD_CMD_TRIM, 0, 24 * BLOCK, 8 * BLOCK), 0);
	struct nbd_export *snap = export_snapshot(ds);
	CU_ASSERT_PTR_NOT_NULL_FATAL(snap);
	int sfd = nbd_client_connect();
	CU_ASSERT_FATAL(sfd >= 0);
	CU_ASSERT_EQUAL_FATAL(nbd_client_handshake_structured(sfd, "vm1@fork-1", DISK_SIZE,
							      READ_ONLY_FLAGS, 1), 0);
	/* hole 0-15 (8-15 preserved zeros), data 16-31 (24-31 preserved), hole to the end. */
	const uint32_t want[] = { 16 * BLOCK, HZ, 16 * BLOCK, 0, DISK_SIZE - 32 * BLOCK, HZ };
	CU_ASSERT_EQUAL(nbd_client_block_status(sfd, 0, 0, DISK_SIZE, pairs, 32, &error), 3);
	CU_ASSERT_EQUAL(memcmp(pairs, want, sizeof(want)), 0);
	/* What it says agrees with what it reads. */
	uint64_t h = nbd_client_next_handle();
	uint16_t cflags, type;
	uint32_t len;
	CU_ASSERT_EQUAL(nbd_client_send_request(sfd, NBD_CMD_READ, 0, h, 8 * BLOCK,
						2 * BLOCK), 0);
	CU_ASSERT_EQUAL(nbd_client_recv_chunk(sfd, h, &cflags, &type, buf, sizeof(buf), &len), 0);
	CU_ASSERT_EQUAL(type, NBD_REPLY_TYPE_OFFSET_DATA);
	CU_ASSERT_EQUAL(len, 8 + 2 * BLOCK);
	CU_ASSERT_EQUAL(memcmp(buf + 8, zeros, 2 * BLOCK), 0);
	/* REQ_ONE, inside the data run. */
	CU_ASSERT_EQUAL(nbd_client_block_status(sfd, NBD_CMD_FLAG_REQ_ONE, 20 * BLOCK,
						100 * BLOCK, pairs, 32, &error), 1);
	CU_ASSERT_EQUAL(pairs[0], 12 * BLOCK);
	CU_ASSERT_EQUAL(pairs[1], 0);

	/* Bad requests get error chunks; the connection lives on. */
	CU_ASSERT_EQUAL(nbd_client_block_status(sfd, 0, 0, 0, pairs, 32, &error), 0);
	CU_ASSERT_EQUAL(error, NBD_EINVAL);
	CU_ASSERT_EQUAL(nbd_client_block_status(sfd, 0, DISK_SIZE - 512, 1024, pairs, 32,
						&error), 0);
	CU_ASSERT_EQUAL(error, NBD_EINVAL);
	CU_ASSERT_EQUAL(nbd_client_block_status(sfd, 0, DISK_SIZE, 1, pairs, 32, &error), 0);
	CU_ASSERT_EQUAL(error, NBD_EINVAL);
	CU_ASSERT_EQUAL(nbd_client_block_status(sfd, 0, UINT64_MAX - 10, 4096, pairs, 32,
						&error), 0);
	CU_ASSERT_EQUAL(error, NBD_EINVAL);
	CU_ASSERT_EQUAL(nbd_client_block_status(sfd, 0, 0, UINT32_MAX, pairs, 32, &error), 0);
	CU_ASSERT_EQUAL(error, NBD_EINVAL);
	CU_ASSERT_EQUAL(nbd_client_block_status(sfd, NBD_CMD_FLAG_DF, 0, BLOCK, pairs, 32,
						&error), 0);
	CU_ASSERT_EQUAL(error, NBD_EINVAL);
	CU_ASSERT_EQUAL(nbd_client_block_status(sfd, 0, 0, DISK_SIZE, pairs, 32, &error), 3);

	/* A client that selected no context is refused with EINVAL. */
	int plain = nbd_client_connect();
	CU_ASSERT_FATAL(plain >= 0);
	CU_ASSERT_EQUAL_FATAL(nbd_client_handshake_structured(plain, "vm1@fork-1", DISK_SIZE,
							      READ_ONLY_FLAGS, 0), 0);
	CU_ASSERT_EQUAL(nbd_client_block_status(plain, 0, 0, BLOCK, pairs, 32, &error), 0);
	CU_ASSERT_EQUAL(error, NBD_EINVAL);
	close(plain);

	/* Detached: an I/O error, as for reads. */
	disk_snapshot_destroy(ds);
	CU_ASSERT_EQUAL(nbd_client_block_status(sfd, 0, 0, BLOCK, pairs, 32, &error), 0);
	CU_ASSERT_EQUAL(error, NBD_EIO);
	struct nbd_export_stats st;
	nbd_export_get_stats(snap, &st);
	CU_ASSERT_EQUAL(st.block_status, 3);
	close(sfd);
	nbd_export_destroy(snap);
	close(fd);
	nbd_fixture_teardown(&fx);
}

/*
 * Random BLOCK_STATUS requests, valid or not (offsets and lengths near
 * and past the end, zero, huge; stray flags), on one connection: each
 * gets either extents that agree with the oracle and stay within the
 * request, or an EINVAL error chunk, and the connection lives on.
 */
static void test_random_requests_get_answers_or_clean_errors(void)
{
	struct oracle o = { 0 };
	static uint32_t pairs[2 * 1024];
	uint32_t error;
	unsigned seed = 777, answered = 0, refused = 0;

	CU_ASSERT_EQUAL_FATAL(nbd_fixture_setup(&fx, DISK_SIZE), 0);
	for (uint64_t b = 0; b < NBLOCKS; b++) {
		int r = rand_r(&seed) % 3;
		if (r)
			put_block(&o, b, r == 2, 5);
	}
	int fd = connect_live();
	CU_ASSERT_FATAL(fd >= 0);
	struct disk_snapshot *ds = freeze();
	CU_ASSERT_PTR_NOT_NULL_FATAL(ds);
	for (int i = 0; i < 30; i++) {
		uint64_t off = (uint64_t)rand_r(&seed) % DISK_SIZE;
		uint32_t len = 1 + (uint32_t)rand_r(&seed) % (8 * BLOCK);
		if (len > DISK_SIZE - off)
			len = (uint32_t)(DISK_SIZE - off);
		CU_ASSERT_EQUAL(change(fd, &o, rand_r(&seed) % 2 ? NBD_CMD_WRITE : NBD_CMD_TRIM,
				       0, off, len), 0);
	}
	struct nbd_export *snap = export_snapshot(ds);
	CU_ASSERT_PTR_NOT_NULL_FATAL(snap);
	int sfd = nbd_client_connect();
	CU_ASSERT_FATAL(sfd >= 0);
	CU_ASSERT_EQUAL_FATAL(nbd_client_handshake_structured(sfd, "vm1@fork-1", DISK_SIZE,
							      READ_ONLY_FLAGS, 1), 0);
	static const uint64_t edges[] = { 0, 1, DISK_SIZE - 1, DISK_SIZE, DISK_SIZE + 1,
					  UINT64_MAX, UINT64_MAX - 4095 };
	for (int i = 0; i < 2000; i++) {
		int pick = rand_r(&seed) % 4;
		uint64_t off = pick == 0 ? edges[rand_r(&seed) % 7]
					 : (uint64_t)rand_r(&seed) % (DISK_SIZE + 2 * BLOCK);
		uint32_t len = pick == 1 ? (uint32_t)rand_r(&seed) * 2u + 1
					 : (uint32_t)rand_r(&seed) % (DISK_SIZE + BLOCK);
		uint16_t flags = rand_r(&seed) % 8 == 0 ? (uint16_t)(1u << (rand_r(&seed) % 16))
							: 0;
		bool valid = len > 0 && off <= DISK_SIZE && len <= DISK_SIZE - off &&
			     !(flags & ~(NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_REQ_ONE));
		int n = nbd_client_block_status(sfd, flags, off, len, pairs, 1024, &error);

		CU_ASSERT_FATAL(n >= 0); /* a reply, never a dropped connection */
		if (!valid) {
			CU_ASSERT(n == 0 && error == NBD_EINVAL);
			refused++;
			continue;
		}
		CU_ASSERT(n >= 1 && n <= 1024 && error == 0);
		if (flags & NBD_CMD_FLAG_REQ_ONE)
			CU_ASSERT_EQUAL(n, 1);
		uint64_t pos = off;
		for (int k = 0; k < n && k < 1024; k++) {
			CU_ASSERT(pairs[2 * k] > 0);
			CU_ASSERT(pairs[2 * k + 1] == 0 || pairs[2 * k + 1] == HZ);
			for (uint64_t b = pos / BLOCK; b * BLOCK < pos + pairs[2 * k]; b++)
				CU_ASSERT_EQUAL(frozen_hole(&o, b), pairs[2 * k + 1] == HZ);
			pos += pairs[2 * k];
		}
		CU_ASSERT(pos <= off + len);
		answered++;
	}
	printf("\n    random requests: %u answered, %u refused with EINVAL ", answered, refused);
	CU_ASSERT(answered > 500 && refused > 100);
	close(sfd);
	nbd_export_destroy(snap);
	disk_snapshot_destroy(ds);
	close(fd);
	nbd_fixture_teardown(&fx);
}

static int quiet_logs(void)
{
	/* Bad requests are sent on purpose: keep the output readable. */
	return log_open(NULL, LOG_ERROR);
}

static int restore_logs(void)
{
	return log_open(NULL, LOG_INFO);
}

int register_disk_snapshot_extent_tests(void)
{
	CU_pSuite suite = CU_add_suite("disk_snapshot_extents", quiet_logs, restore_logs);

	if (!suite ||
	    !CU_add_test(suite, "preserved blocks keep the frozen holes",
			 test_preserved_blocks_keep_the_frozen_holes) ||
	    !CU_add_test(suite, "random changes against the oracle",
			 test_random_changes_against_the_oracle) ||
	    !CU_add_test(suite, "alternating runs bound one call",
			 test_alternating_runs_bound_one_call) ||
	    !CU_add_test(suite, "block status over the snapshot export",
			 test_block_status_over_the_snapshot_export) ||
	    !CU_add_test(suite, "random requests get answers or clean errors",
			 test_random_requests_get_answers_or_clean_errors))
		return -1;
	return 0;
}
