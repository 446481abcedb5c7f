/*
 * Unit tests for primary/disk_copy.c: the initial copy and the write
 * mirror, replayed as the backup applies them (every frame in order,
 * onto a model of its disk).  The copy reads its chunks on a worker
 * thread, so a guest write can be mirrored while a chunk is read; the
 * chunk must then be read again, or its older data would follow the
 * write's frame and undo it at the backup.
 */
#include <CUnit/CUnit.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/buffer.h"
#include "nbd/nbd_server.h"
#include "nbd_test_client.h"
#include "primary/disk_copy.h"
#include "suites.h"
#include "wire/repl_proto.h"

#define DISK_SIZE (4u * 1024 * 1024)
#define CHUNK (1u << 20)
#define BLOCK 4096u

struct copy_fixture {
	struct nbd_fixture nbd;
	struct disk_copy *dc;
	struct buffer frames; /* the epoch stream, all epochs in order */
	bool copied;
	bool failed;
};

static struct buffer *buffer_for(void *opaque, uint64_t epoch)
{
	struct copy_fixture *x = opaque;

	(void)epoch;
	return &x->frames;
}

static int appended(void *opaque, uint64_t epoch, size_t before)
{
	(void)opaque;
	(void)epoch;
	(void)before;
	return 0;
}

static size_t backlog(void *opaque)
{
	(void)opaque;
	return 0;
}

static uint64_t open_epoch(void *opaque)
{
	(void)opaque;
	return 1;
}

static void on_copied(void *opaque)
{
	((struct copy_fixture *)opaque)->copied = true;
}

static void on_failed(void *opaque, enum disk_copy_fault fault, const char *why)
{
	(void)fault;
	(void)why;
	((struct copy_fixture *)opaque)->failed = true;
}

static void fill(uint8_t *p, size_t len, uint8_t seed)
{
	for (size_t i = 0; i < len; i++)
		p[i] = (uint8_t)(seed + i * 7);
}

/* Every frame of the stream applied in order to a zeroed model disk. */
static uint8_t *backup_disk(struct copy_fixture *x, unsigned *syncs_at_zero)
{
	uint8_t *disk = calloc(1, DISK_SIZE);
	const uint8_t *p = buffer_head(&x->frames);
	size_t left = buffer_len(&x->frames);
	struct repl_frame f;
	const char *err;
	ssize_t n;

	*syncs_at_zero = 0;
	while (disk && left && (n = repl_frame_parse(p, left, &f, &err)) > 0) {
		if (f.type == REPL_DISK_SYNC) {
			struct repl_disk_sync s;
			CU_ASSERT_EQUAL_FATAL(repl_decode_disk_sync(&f, &s, &err), 0);
			memcpy(disk + s.offset, s.data, s.len);
			*syncs_at_zero += s.offset == 0;
		} else if (f.type == REPL_DISK_WRITE) {
			struct repl_disk_write w;
			CU_ASSERT_EQUAL_FATAL(repl_decode_disk_write(&f, &w, &err), 0);
			memcpy(disk + w.offset, w.data, w.len);
		}
		p += n;
		left -= (size_t)n;
	}
	CU_ASSERT_EQUAL(left, 0);
	return disk;
}

static void set_up(struct copy_fixture *x)
{
	struct disk_copy_events ev = {
		.opaque = x, .open_epoch = open_epoch, .on_copied = on_copied,
		.on_failed = on_failed,
	};
	uint8_t *data = malloc(DISK_SIZE);
	char err[256];

	memset(x, 0, sizeof(*x));
	buffer_init(&x->frames);
	CU_ASSERT_EQUAL_FATAL(nbd_fixture_setup(&x->nbd, DISK_SIZE), 0);
	CU_ASSERT_FATAL(data != NULL);
	fill(data, DISK_SIZE, 1);
	CU_ASSERT_EQUAL_FATAL(pwrite(x->nbd.disk_fd, data, DISK_SIZE, 0), (ssize_t)DISK_SIZE);
	free(data);
	x->dc = disk_copy_open(x->nbd.loop, x->nbd.disk_path, &ev, err, sizeof(err));
	CU_ASSERT_FATAL(x->dc != NULL);
}

static void tear_down(struct copy_fixture *x)
{
	disk_copy_destroy(x->dc);
	nbd_fixture_teardown(&x->nbd);
	buffer_free(&x->frames);
}

static void start_copy(struct copy_fixture *x)
{
	struct disk_copy_sink sink = {
		.opaque = x, .buffer_for = buffer_for, .appended = appended, .backlog = backlog,
	};
	char err[256];

	CU_ASSERT_EQUAL_FATAL(disk_copy_start(x->dc, x->nbd.export, &sink, err, sizeof(err)), 0);
	/* The first chunk's read is posted here; its end waits for a loop turn. */
	CU_ASSERT_EQUAL_FATAL(disk_copy_set_plan(x->dc, NULL, 0), 0);
}

static void run_until_copied(struct copy_fixture *x)
{
	for (int i = 0; i < 1000 && !x->copied && !x->failed; i++)
		event_loop_run_once(x->nbd.loop, 10);
	CU_ASSERT_TRUE(x->copied);
	CU_ASSERT_FALSE(x->failed);
}

static void test_the_copy_gives_the_backup_the_disk(void)
{
	struct copy_fixture x;
	uint8_t *live = malloc(DISK_SIZE);
	unsigned syncs_at_zero;

	set_up(&x);
	start_copy(&x);
	run_until_copied(&x);
	CU_ASSERT_EQUAL(disk_copy_bytes(x.dc), DISK_SIZE);
	uint8_t *backup = backup_disk(&x, &syncs_at_zero);
	CU_ASSERT_EQUAL(pread(x.nbd.disk_fd, live, DISK_SIZE, 0), (ssize_t)DISK_SIZE);
	CU_ASSERT_EQUAL(memcmp(backup, live, DISK_SIZE), 0);
	CU_ASSERT_EQUAL(syncs_at_zero, 1);
	free(backup);
	free(live);
	tear_down(&x);
}

/*
 * The first chunk is read (its old data in the reader's buffer) before a
 * guest write to it lands and is mirrored, as an NBD worker's pwrite and
 * its completion on the loop do; only then does the loop see the read
 * end.  The backup must end with the write's data.
 */
static void test_a_chunk_overtaken_by_a_write_is_read_again(void)
{
	struct copy_fixture x;
	uint8_t block[BLOCK], *live = malloc(DISK_SIZE);
	unsigned syncs_at_zero;

	set_up(&x);
	start_copy(&x);
	usleep(200 * 1000); /* the reader has long read the first chunk */
	fill(block, BLOCK, 99);
	CU_ASSERT_EQUAL(pwrite(x.nbd.disk_fd, block, BLOCK, 8192), (ssize_t)BLOCK);
	nbd_export_notify_write(x.nbd.export, NBD_WRITE_DATA, 8192, block, BLOCK);
	run_until_copied(&x);
	uint8_t *backup = backup_disk(&x, &syncs_at_zero);
	CU_ASSERT_EQUAL(pread(x.nbd.disk_fd, live, DISK_SIZE, 0), (ssize_t)DISK_SIZE);
	CU_ASSERT_EQUAL(memcmp(backup + 8192, block, BLOCK), 0);
	CU_ASSERT_EQUAL(memcmp(backup, live, DISK_SIZE), 0);
	CU_ASSERT_EQUAL(syncs_at_zero, 1); /* the stale read was never queued */
	free(backup);
	free(live);
	tear_down(&x);
}

int register_disk_copy_tests(void)
{
	CU_pSuite suite = CU_add_suite("disk_copy", NULL, NULL);

	if (!suite)
		return -1;
	if (!CU_add_test(suite, "the copy gives the backup the disk",
			 test_the_copy_gives_the_backup_the_disk) ||
	    !CU_add_test(suite, "a chunk overtaken by a write is read again",
			 test_a_chunk_overtaken_by_a_write_is_read_again))
		return -1;
	return 0;
}
