/*
 * Copy-on-write snapshots of an export (disk_snapshot.c): the parent
 * writes through a real NBD connection to its live export, and the
 * snapshot must keep reading the image as it was when it was taken,
 * directly and through its read-only NBD export (unix socket and TCP).
 */
#include <CUnit/CUnit.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "fork/disk_snapshot.h"
#include "base/log.h"
#include "nbd/nbd_proto.h"
#include "nbd/nbd_server.h"
#include "nbd_test_client.h"
#include "suites.h"

/* 1 MiB and a short last block of 1000 bytes. */
#define DISK_SIZE (1024u * 1024 + 1000)
#define BLOCK 4096u
#define READ_ONLY_FLAGS (NBD_FLAG_HAS_FLAGS | NBD_FLAG_READ_ONLY | NBD_FLAG_SEND_FLUSH | \
			 NBD_FLAG_CAN_MULTI_CONN)

static struct nbd_fixture fx;
static uint8_t original[DISK_SIZE];
static uint8_t seen[DISK_SIZE];
static char err[256];

/* The live export with a pattern written over all of it; fd: a client of it. */
static int setup(int *fd)
{
	if (nbd_fixture_setup(&fx, DISK_SIZE) < 0)
		return -1;
	nbd_client_fill_pattern(original, sizeof(original), 9);
	if (pwrite(fx.disk_fd, original, sizeof(original), 0) != (ssize_t)sizeof(original))
		return -1;
	*fd = nbd_client_connect();
	return *fd >= 0 ? nbd_client_handshake(*fd, "vm1", DISK_SIZE) : -1;
}

static void teardown(int fd)
{
	if (fd >= 0)
		close(fd);
	nbd_fixture_teardown(&fx);
}

static struct disk_snapshot *snapshot(void)
{
	struct disk_snapshot *ds = disk_snapshot_create(fx.export, fx.dir, err, sizeof(err));

	CU_ASSERT_PTR_NOT_NULL(ds);
	if (!ds)
		fprintf(stderr, "disk_snapshot_create: %s\n", err);
	return ds;
}

static int64_t write_at(int fd, uint64_t offset, uint32_t len, unsigned seed)
{
	uint8_t *data = malloc(len);
	int64_t r;

	nbd_client_fill_pattern(data, len, seed);
	r = nbd_client_transact(fd, NBD_CMD_WRITE, 0, offset, len, data, NULL);
	free(data);
	return r;
}

/* 1 when the whole snapshot reads back as expected. */
static int snapshot_equals(struct disk_snapshot *ds, const uint8_t *expected)
{
	memset(seen, 0xa5, sizeof(seen));
	if (disk_snapshot_read(ds, 0, seen, DISK_SIZE, err, sizeof(err)) != 0)
		return 0;
	return memcmp(seen, expected, DISK_SIZE) == 0;
}

static struct disk_snapshot_stats ds_stats(struct disk_snapshot *ds)
{
	struct disk_snapshot_stats s;

	disk_snapshot_get_stats(ds, &s);
	return s;
}

static void test_frozen_after_writes_zeroes_trims(void)
{
	uint8_t live[8192], zeros[8192] = { 0 };
	int fd = -1;

	CU_ASSERT_EQUAL_FATAL(setup(&fd), 0);
	struct disk_snapshot *ds = snapshot();
	CU_ASSERT_PTR_NOT_NULL_FATAL(ds);
	CU_ASSERT_EQUAL(disk_snapshot_size(ds), DISK_SIZE);
	CU_ASSERT_EQUAL(ds_stats(ds).blocks, 257);

	/* Unaligned at both ends: blocks 3 and 4, preserved whole. */
	CU_ASSERT_EQUAL(write_at(fd, 3 * BLOCK + 100, 5000, 1), 0);
	/* Blocks 10 and 11 zeroed, may punch; 12 with NO_HOLE. */
	CU_ASSERT_EQUAL(nbd_client_transact(fd, NBD_CMD_WRITE_ZEROES, 0, 10 * BLOCK,
					    2 * BLOCK, NULL, NULL), 0);
	CU_ASSERT_EQUAL(nbd_client_transact(fd, NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_NO_HOLE,
					    12 * BLOCK + 7, 10, NULL, NULL), 0);
	/* Ten bytes trimmed inside block 16. */
	CU_ASSERT_EQUAL(nbd_client_transact(fd, NBD_CMD_TRIM, 0, 16 * BLOCK + 1, 10,
					    NULL, NULL), 0);
	/* The short last block (256), at its very end. */
	CU_ASSERT_EQUAL(write_at(fd, DISK_SIZE - 500, 500, 2), 0);
	/* Block 3 again: already preserved, nothing more to copy. */
	CU_ASSERT_EQUAL(write_at(fd, 3 * BLOCK, BLOCK, 3), 0);

	/* The live image changed... */
	CU_ASSERT_EQUAL(pread(fx.disk_fd, live, sizeof(live), 10 * BLOCK), (ssize_t)sizeof(live));
	CU_ASSERT_EQUAL(memcmp(live, zeros, sizeof(live)), 0);
	/* ...the snapshot did not, written or never-written blocks alike. */
	CU_ASSERT(snapshot_equals(ds, original));
	struct disk_snapshot_stats s = ds_stats(ds);
	CU_ASSERT_EQUAL(s.blocks_preserved, 7);
	CU_ASSERT_EQUAL(s.bytes_preserved, 6 * BLOCK + 1000);
	CU_ASSERT_EQUAL(s.preserve_failures, 0);
	CU_ASSERT_EQUAL(s.bytes_read, DISK_SIZE);
	CU_ASSERT_FALSE(s.detached);

	/* Small unaligned reads across preserved and live blocks. */
	for (uint64_t off = 3 * BLOCK - 17; off < 17 * BLOCK; off += 1111) {
		CU_ASSERT_EQUAL(disk_snapshot_read(ds, off, seen, 3000, err, sizeof(err)), 0);
		CU_ASSERT_EQUAL(memcmp(seen, original + off, 3000), 0);
	}
	CU_ASSERT_EQUAL(disk_snapshot_read(ds, DISK_SIZE - 10, seen, 10, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(memcmp(seen, original + DISK_SIZE - 10, 10), 0);
	/* Beyond the end. */
	CU_ASSERT_EQUAL(disk_snapshot_read(ds, DISK_SIZE - 10, seen, 11, err, sizeof(err)), -EINVAL);
	CU_ASSERT_EQUAL(disk_snapshot_read(ds, UINT64_MAX, seen, 1, err, sizeof(err)), -EINVAL);

	disk_snapshot_destroy(ds);
	/* Unregistered: the parent's writes go on without it. */
	CU_ASSERT_EQUAL(write_at(fd, 20 * BLOCK, BLOCK, 4), 0);
	teardown(fd);
}

static void test_zero_blocks_take_no_room(void)
{
	uint8_t *zeros = calloc(1, DISK_SIZE);
	int fd = -1;

	CU_ASSERT_EQUAL_FATAL(nbd_fixture_setup(&fx, DISK_SIZE), 0);
	fd = nbd_client_connect();
	CU_ASSERT_EQUAL_FATAL(nbd_client_handshake(fd, "vm1", DISK_SIZE), 0);
	struct disk_snapshot *ds = snapshot();
	CU_ASSERT_PTR_NOT_NULL_FATAL(ds);
	/* A never-written (sparse) image: preserved, but nothing written. */
	CU_ASSERT_EQUAL(write_at(fd, 0, 64 * BLOCK, 5), 0);
	CU_ASSERT_EQUAL(write_at(fd, DISK_SIZE - 1000, 1000, 6), 0);
	CU_ASSERT(snapshot_equals(ds, zeros));
	CU_ASSERT_EQUAL(ds_stats(ds).blocks_preserved, 65);
	CU_ASSERT_EQUAL(ds_stats(ds).bytes_preserved, 0);
	disk_snapshot_destroy(ds);
	teardown(fd);
	free(zeros);
}

static void test_two_snapshots_at_different_instants(void)
{
	uint8_t *at_b = malloc(DISK_SIZE);
	int fd = -1;

	CU_ASSERT_EQUAL_FATAL(setup(&fd), 0);
	struct disk_snapshot *a = snapshot();
	CU_ASSERT_EQUAL(write_at(fd, 0, BLOCK, 7), 0);
	struct disk_snapshot *b = snapshot();
	CU_ASSERT_FATAL(a && b);
	CU_ASSERT_EQUAL(pread(fx.disk_fd, at_b, DISK_SIZE, 0), (ssize_t)DISK_SIZE);
	/* Block 0 again and block 1 for the first time: both snapshots care. */
	CU_ASSERT_EQUAL(write_at(fd, 0, 2 * BLOCK, 8), 0);
	CU_ASSERT(snapshot_equals(a, original));
	CU_ASSERT(snapshot_equals(b, at_b));
	CU_ASSERT_EQUAL(ds_stats(a).blocks_preserved, 2);
	CU_ASSERT_EQUAL(ds_stats(b).blocks_preserved, 2);

	/* The older one goes; the younger one still holds. */
	disk_snapshot_destroy(a);
	CU_ASSERT_EQUAL(write_at(fd, 5 * BLOCK, BLOCK, 9), 0);
	CU_ASSERT(snapshot_equals(b, at_b));
	CU_ASSERT_EQUAL(ds_stats(b).blocks_preserved, 3);
	disk_snapshot_destroy(b);
	teardown(fd);
	free(at_b);
}

static void test_live_export_destroyed_first(void)
{
	int fd = -1;

	CU_ASSERT_EQUAL_FATAL(setup(&fd), 0);
	struct disk_snapshot *a = snapshot(), *b = snapshot();
	CU_ASSERT_FATAL(a && b);
	CU_ASSERT_EQUAL(write_at(fd, 0, BLOCK, 10), 0);
	close(fd);
	nbd_export_destroy(fx.export);
	fx.export = NULL;
	/* Detached: every read fails, even of a preserved block. */
	CU_ASSERT(ds_stats(a).detached);
	CU_ASSERT_EQUAL(disk_snapshot_read(a, 0, seen, BLOCK, err, sizeof(err)), -EIO);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "live export"));
	CU_ASSERT_EQUAL(disk_snapshot_read(b, BLOCK, seen, BLOCK, err, sizeof(err)), -EIO);
	/* Destroying them afterwards is still required, and safe. */
	disk_snapshot_destroy(b);
	disk_snapshot_destroy(a);
	teardown(-1);
}

/*
 * The preserve file refuses the copy: a file size limit below the
 * written offset makes its pwrite fail with EFBIG, as a full filesystem
 * would with ENOSPC.  The parent's write must be refused, not applied.
 */
static void test_preserve_failure_refuses_the_write(void)
{
	const uint64_t offset = 768 * 1024;
	struct rlimit saved, low;
	uint8_t live[BLOCK];
	int fd = -1;

	CU_ASSERT_EQUAL_FATAL(setup(&fd), 0);
	struct disk_snapshot *ds = snapshot();
	CU_ASSERT_PTR_NOT_NULL_FATAL(ds);
	void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
	CU_ASSERT_EQUAL_FATAL(getrlimit(RLIMIT_FSIZE, &saved), 0);
	low = saved;
	low.rlim_cur = 512 * 1024;
	CU_ASSERT_EQUAL_FATAL(setrlimit(RLIMIT_FSIZE, &low), 0);
	int64_t r = write_at(fd, offset, BLOCK, 11);
	/* Below the limit the copy works. */
	int64_t r_low = write_at(fd, 0, BLOCK, 12);
	CU_ASSERT_EQUAL(setrlimit(RLIMIT_FSIZE, &saved), 0);
	signal(SIGXFSZ, old_handler);

	CU_ASSERT_EQUAL(r, NBD_ENOSPC);
	CU_ASSERT_EQUAL(r_low, 0);
	CU_ASSERT_EQUAL(pread(fx.disk_fd, live, BLOCK, (off_t)offset), (ssize_t)BLOCK);
	CU_ASSERT_EQUAL(memcmp(live, original + offset, BLOCK), 0);
	CU_ASSERT(snapshot_equals(ds, original));
	CU_ASSERT_EQUAL(ds_stats(ds).preserve_failures, 1);
	CU_ASSERT_EQUAL(ds_stats(ds).blocks_preserved, 1);
	/* With room again, the same write goes through. */
	CU_ASSERT_EQUAL(write_at(fd, offset, BLOCK, 11), 0);
	CU_ASSERT(snapshot_equals(ds, original));
	CU_ASSERT_EQUAL(ds_stats(ds).blocks_preserved, 2);
	disk_snapshot_destroy(ds);
	teardown(fd);
}

/* Reads, refused changes and FLUSH on a connected read-only export. */
static void check_read_only_export(int snap_fd, struct nbd_export *snap)
{
	uint8_t buf[3 * BLOCK];
	struct nbd_export_stats s;

	CU_ASSERT_EQUAL_FATAL(nbd_client_handshake_flags(snap_fd, "vm1@fork-1", DISK_SIZE,
							 READ_ONLY_FLAGS), 0);
	CU_ASSERT_EQUAL(nbd_client_transact(snap_fd, NBD_CMD_READ, 0, BLOCK - 5,
					    sizeof(buf), NULL, buf), 0);
	CU_ASSERT_EQUAL(memcmp(buf, original + BLOCK - 5, sizeof(buf)), 0);
	CU_ASSERT_EQUAL(nbd_client_transact(snap_fd, NBD_CMD_READ, 0, DISK_SIZE - 1000,
					    1000, NULL, buf), 0);
	CU_ASSERT_EQUAL(memcmp(buf, original + DISK_SIZE - 1000, 1000), 0);
	/* The spec's answer to changes on a read-only export is EPERM. */
	nbd_client_fill_pattern(buf, BLOCK, 13);
	CU_ASSERT_EQUAL(nbd_client_transact(snap_fd, NBD_CMD_WRITE, 0, 0, BLOCK, buf, NULL),
			NBD_EPERM);
	CU_ASSERT_EQUAL(nbd_client_transact(snap_fd, NBD_CMD_WRITE, NBD_CMD_FLAG_FUA, 0, 10,
					    buf, NULL), NBD_EPERM);
	CU_ASSERT_EQUAL(nbd_client_transact(snap_fd, NBD_CMD_TRIM, 0, 0, BLOCK, NULL, NULL),
			NBD_EPERM);
	CU_ASSERT_EQUAL(nbd_client_transact(snap_fd, NBD_CMD_WRITE_ZEROES, 0, 0, BLOCK,
					    NULL, NULL), NBD_EPERM);
	CU_ASSERT_EQUAL(nbd_client_transact(snap_fd, NBD_CMD_FLUSH, 0, 0, 0, NULL, NULL), 0);
	/* Still in sync after the refused write's payload. */
	CU_ASSERT_EQUAL(nbd_client_transact(snap_fd, NBD_CMD_READ, 0, 0, BLOCK, NULL, buf), 0);
	CU_ASSERT_EQUAL(memcmp(buf, original, BLOCK), 0);
	nbd_export_get_stats(snap, &s);
	CU_ASSERT_EQUAL(s.reads, 3);
	CU_ASSERT_EQUAL(s.bytes_read, sizeof(buf) + 1000 + BLOCK);
	CU_ASSERT_EQUAL(s.writes, 0);
	CU_ASSERT_EQUAL(s.errors, 4);
	CU_ASSERT_EQUAL(s.flushes, 1);
}

static void test_read_only_export_over_unix_and_tcp(void)
{
	char snap_sock[160];
	int fd = -1;

	CU_ASSERT_EQUAL_FATAL(setup(&fd), 0);
	struct disk_snapshot *ds = snapshot();
	CU_ASSERT_PTR_NOT_NULL_FATAL(ds);
	/* The parent writes on after the fork; the clone must not see it. */
	CU_ASSERT_EQUAL(write_at(fd, 0, 2 * BLOCK, 14), 0);
	CU_ASSERT_EQUAL(write_at(fd, DISK_SIZE - 1000, 1000, 15), 0);
	snprintf(snap_sock, sizeof(snap_sock), "%s/snap.sock", fx.dir);
	/* A failed creation leaves nothing behind and does not hold ds. */
	CU_ASSERT_PTR_NULL(nbd_export_create_snapshot(fx.loop, "bad", snap_sock,
						      "not-an-address", ds));
	CU_ASSERT_EQUAL(access(snap_sock, F_OK), -1);
	struct nbd_export *snap = nbd_export_create_snapshot(fx.loop, "vm1@fork-1", snap_sock,
							     "127.0.0.1:0", ds);
	CU_ASSERT_PTR_NOT_NULL_FATAL(snap);
	CU_ASSERT_EQUAL(nbd_export_size(snap), DISK_SIZE);
	CU_ASSERT_NOT_EQUAL(nbd_export_tcp_port(snap), 0);
	CU_ASSERT_EQUAL(nbd_export_tcp_port(fx.export), 0);

	nbd_client_use(fx.loop, snap_sock);
	int unix_fd = nbd_client_connect();
	CU_ASSERT_FATAL(unix_fd >= 0);
	check_read_only_export(unix_fd, snap);
	close(unix_fd);
	nbd_client_pump(20);

	int tcp_fd = nbd_client_connect_tcp(nbd_export_tcp_port(snap));
	CU_ASSERT_FATAL(tcp_fd >= 0);
	/* Stats are cumulative: start the TCP round from the unix one's. */
	struct nbd_export_stats before;
	nbd_export_get_stats(snap, &before);
	uint8_t buf[BLOCK];
	CU_ASSERT_EQUAL(nbd_client_handshake_flags(tcp_fd, "vm1@fork-1", DISK_SIZE,
						   READ_ONLY_FLAGS), 0);
	CU_ASSERT_EQUAL(nbd_client_transact(tcp_fd, NBD_CMD_READ, 0, 0, BLOCK, NULL, buf), 0);
	CU_ASSERT_EQUAL(memcmp(buf, original, BLOCK), 0);
	CU_ASSERT_EQUAL(nbd_client_transact(tcp_fd, NBD_CMD_WRITE, 0, 0, BLOCK, buf, NULL),
			NBD_EPERM);
	struct nbd_export_stats after;
	nbd_export_get_stats(snap, &after);
	CU_ASSERT_EQUAL(after.connections_total, before.connections_total + 1);
	CU_ASSERT_EQUAL(after.connections_current, 1);
	CU_ASSERT_EQUAL(ds_stats(ds).bytes_read, 3 * BLOCK + 1000 + BLOCK + BLOCK);

	/* The snapshot goes first: the export's reads fail, then it is freed with the export. */
	disk_snapshot_destroy(ds);
	CU_ASSERT_EQUAL(nbd_client_transact(tcp_fd, NBD_CMD_READ, 0, 0, BLOCK, NULL, buf), NBD_EIO);
	/* The parent is no longer held back by it. */
	nbd_client_use(fx.loop, fx.socket_path);
	CU_ASSERT_EQUAL(write_at(fd, 9 * BLOCK, BLOCK, 16), 0);
	close(tcp_fd);
	nbd_export_destroy(snap);
	CU_ASSERT_EQUAL(access(snap_sock, F_OK), -1);
	teardown(fd);
}

/* The intended order: the clone's export, then the snapshot, then the parent. */
static void test_export_then_snapshot_then_parent(void)
{
	char snap_sock[160];
	int fd = -1;

	CU_ASSERT_EQUAL_FATAL(setup(&fd), 0);
	struct disk_snapshot *ds = snapshot();
	CU_ASSERT_PTR_NOT_NULL_FATAL(ds);
	snprintf(snap_sock, sizeof(snap_sock), "%s/snap.sock", fx.dir);
	struct nbd_export *snap = nbd_export_create_snapshot(fx.loop, "vm1@fork-2", snap_sock,
							     NULL, ds);
	CU_ASSERT_PTR_NOT_NULL_FATAL(snap);
	CU_ASSERT_EQUAL(nbd_export_tcp_port(snap), 0);
	nbd_client_use(fx.loop, snap_sock);
	int snap_fd = nbd_client_connect();
	CU_ASSERT_EQUAL(nbd_client_handshake_flags(snap_fd, "vm1@fork-2", DISK_SIZE,
						   READ_ONLY_FLAGS), 0);
	nbd_export_destroy(snap);
	CU_ASSERT_EQUAL(nbd_client_sees_eof(snap_fd), 1);
	close(snap_fd);
	CU_ASSERT_EQUAL(disk_snapshot_read(ds, 0, seen, BLOCK, err, sizeof(err)), 0);
	disk_snapshot_destroy(ds);
	teardown(fd);
}

static int quiet_logs(void)
{
	/* Failures are provoked on purpose: keep the output readable. */
	return log_open(NULL, LOG_ERROR);
}

static int restore_logs(void)
{
	return log_open(NULL, LOG_INFO);
}

int register_disk_snapshot_tests(void)
{
	CU_pSuite suite = CU_add_suite("disk_snapshot", quiet_logs, restore_logs);

	if (!suite ||
	    !CU_add_test(suite, "frozen after writes, zeroes, trims, edges, last block",
			 test_frozen_after_writes_zeroes_trims) ||
	    !CU_add_test(suite, "zero blocks take no room", test_zero_blocks_take_no_room) ||
	    !CU_add_test(suite, "two snapshots at different instants",
			 test_two_snapshots_at_different_instants) ||
	    !CU_add_test(suite, "live export destroyed first", test_live_export_destroyed_first) ||
	    !CU_add_test(suite, "preserve failure refuses the write",
			 test_preserve_failure_refuses_the_write) ||
	    !CU_add_test(suite, "read-only export over unix and TCP",
			 test_read_only_export_over_unix_and_tcp) ||
	    !CU_add_test(suite, "export, then snapshot, then parent",
			 test_export_then_snapshot_then_parent))
		return -1;
	return 0;
}
