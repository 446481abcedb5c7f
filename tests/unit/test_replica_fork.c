/*
 * A fork from the backup (vm_fork.h, replica_fork.c), without the fork():
 * the disk replica frozen on an unserved export while the backup's epoch
 * commits write it, the snapshot handed over to the taken-over VM's
 * export, and the recently committed pages a fork pushes first.  Each
 * has its negative control: an epoch committed without the preserve pass
 * is seen by the snapshot (a single block is enough to tell).
 */
#include <CUnit/CUnit.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fork/disk_snapshot.h"
#include "backup/epoch_stage.h"
#include "base/event_loop.h"
#include "qemu/migration_writer.h"
#include "nbd/nbd_server.h"
#include "image/ram_image.h"
#include "suites.h"

#define DISK_SIZE (256u * 1024)
#define BLOCK 4096u

static char dir[64], disk_path[128], err[256];
static int disk_fd = -1;
static event_loop *loop;

static int setup_disk(void)
{
	uint8_t pattern[DISK_SIZE];

	snprintf(dir, sizeof(dir), "/tmp/rdb-rfork-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	snprintf(disk_path, sizeof(disk_path), "%s/replica.img", dir);
	disk_fd = open(disk_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	for (size_t i = 0; i < sizeof(pattern); i++)
		pattern[i] = (uint8_t)(i / BLOCK + 1);
	loop = event_loop_create();
	return disk_fd >= 0 && loop &&
	       pwrite(disk_fd, pattern, sizeof(pattern), 0) == (ssize_t)sizeof(pattern) ? 0 : -1;
}

static void teardown_disk(void)
{
	char cmd[128];

	if (disk_fd >= 0)
		close(disk_fd);
	disk_fd = -1;
	event_loop_destroy(loop);
	loop = NULL;
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", dir);
}

static int preserve(void *opaque, uint64_t offset, uint64_t length)
{
	return nbd_export_before_write(opaque, offset, length);
}

/* An epoch writing 0xEE over block `block` and zeroing block `zero_block`. */
static struct epoch_stage *epoch_writing(unsigned block, unsigned zero_block)
{
	static uint8_t data[BLOCK];
	struct epoch_stage *s = epoch_stage_create();

	memset(data, 0xEE, sizeof(data));
	epoch_stage_begin(s, 7);
	CU_ASSERT_EQUAL(epoch_stage_add_disk_write(s, (uint64_t)block * BLOCK, data, BLOCK), 0);
	CU_ASSERT_EQUAL(epoch_stage_add_disk_zero(s, (uint64_t)zero_block * BLOCK, BLOCK), 0);
	return s;
}

static struct ram_image *small_image(void)
{
	const char *names[] = { "pc.ram" };
	uint64_t lengths[] = { 64 * MIG_PAGE_SIZE };

	return ram_image_create("pc-q35-7.2", 2, names, lengths, 1, err, sizeof(err));
}

static uint8_t block_byte(struct disk_snapshot *ds, unsigned block)
{
	uint8_t buf[BLOCK];

	CU_ASSERT_EQUAL(disk_snapshot_read(ds, (uint64_t)block * BLOCK, buf, BLOCK, err,
					   sizeof(err)), 0);
	return buf[100];
}

static void test_commit_preserves_frozen_disk(void)
{
	CU_ASSERT_EQUAL_FATAL(setup_disk(), 0);
	struct ram_image *img = small_image();
	struct nbd_export *live = nbd_export_open_unserved(loop, "rtest", disk_path);
	CU_ASSERT_PTR_NOT_NULL_FATAL(live);
	struct disk_snapshot *ds = disk_snapshot_create(live, dir, err, sizeof(err));
	CU_ASSERT_PTR_NOT_NULL_FATAL(ds);

	struct epoch_stage *s = epoch_writing(3, 5);
	CU_ASSERT_EQUAL(epoch_stage_for_each_disk_range(s, preserve, live), 0);
	CU_ASSERT_EQUAL(epoch_stage_commit(s, img, disk_fd, err, sizeof(err)), 0);
	/* The replica moved on; the snapshot did not. */
	uint8_t now[BLOCK];
	CU_ASSERT_EQUAL(pread(disk_fd, now, BLOCK, 3 * BLOCK), (ssize_t)BLOCK);
	CU_ASSERT_EQUAL(now[100], 0xEE);
	CU_ASSERT_EQUAL(block_byte(ds, 3), 4);
	CU_ASSERT_EQUAL(block_byte(ds, 5), 6);
	CU_ASSERT_EQUAL(block_byte(ds, 4), 5);

	/* Negative control: one more epoch, one block, without the preserve pass. */
	epoch_stage_destroy(s);
	s = epoch_stage_create();
	static uint8_t data[BLOCK];
	memset(data, 0xAB, sizeof(data));
	epoch_stage_begin(s, 8);
	epoch_stage_add_disk_write(s, 9 * BLOCK, data, BLOCK);
	CU_ASSERT_EQUAL(epoch_stage_commit(s, img, disk_fd, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(block_byte(ds, 9), 0xAB); /* not frozen: caught */

	epoch_stage_destroy(s);
	disk_snapshot_destroy(ds);
	nbd_export_destroy(live);
	ram_image_destroy(img);
	teardown_disk();
}

static void test_snapshot_follows_the_taken_over_export(void)
{
	CU_ASSERT_EQUAL_FATAL(setup_disk(), 0);
	struct nbd_export *replica_view = nbd_export_open_unserved(loop, "view", disk_path);
	struct nbd_export *vm_disk = nbd_export_open_unserved(loop, "vm", disk_path);
	CU_ASSERT_PTR_NOT_NULL_FATAL(replica_view);
	CU_ASSERT_PTR_NOT_NULL_FATAL(vm_disk);
	struct disk_snapshot *ds = disk_snapshot_create(replica_view, dir, err, sizeof(err));
	CU_ASSERT_PTR_NOT_NULL_FATAL(ds);

	CU_ASSERT_EQUAL(disk_snapshot_rebind(ds, vm_disk), 0);
	/* The old view goes without taking the snapshot with it. */
	nbd_export_destroy(replica_view);
	struct disk_snapshot_stats st;
	disk_snapshot_get_stats(ds, &st);
	CU_ASSERT_FALSE(st.detached);
	/* The taken-over guest writes block 2 through the VM's export. */
	CU_ASSERT_EQUAL(nbd_export_before_write(vm_disk, 2 * BLOCK, 10), 0);
	uint8_t data[BLOCK];
	memset(data, 0x55, sizeof(data));
	CU_ASSERT_EQUAL(pwrite(disk_fd, data, BLOCK, 2 * BLOCK), (ssize_t)BLOCK);
	CU_ASSERT_EQUAL(block_byte(ds, 2), 3);
	/* A mismatched export is refused and changes nothing. */
	char small[160];
	snprintf(small, sizeof(small), "%s/small.img", dir);
	FILE *f = fopen(small, "w");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	fclose(f);
	CU_ASSERT_EQUAL(truncate(small, BLOCK), 0);
	struct nbd_export *other = nbd_export_open_unserved(loop, "other", small);
	CU_ASSERT_EQUAL(disk_snapshot_rebind(ds, other), -1);
	nbd_export_destroy(other);
	disk_snapshot_get_stats(ds, &st);
	CU_ASSERT_FALSE(st.detached);

	disk_snapshot_destroy(ds);
	nbd_export_destroy(vm_disk);
	teardown_disk();
}

static void test_recent_pages_two_generations(void)
{
	struct ram_image *img = small_image();
	uint8_t page[MIG_PAGE_SIZE];
	size_t n;

	CU_ASSERT_PTR_NOT_NULL_FATAL(img);
	memset(page, 1, sizeof(page));
	struct page_ref *refs = ram_image_recent_pages(img, &n);
	CU_ASSERT_EQUAL(n, 0);
	free(refs);
	ram_image_store_page(img, 0, 10, page);
	ram_image_store_page(img, 0, 3, NULL);
	ram_image_rotate_recent(img);
	ram_image_store_page(img, 0, 40, page);
	ram_image_store_page(img, 0, 10, page); /* in both: listed once, as older */
	refs = ram_image_recent_pages(img, &n);
	CU_ASSERT_EQUAL_FATAL(n, 3);
	CU_ASSERT_EQUAL(refs[0].page, 3);
	CU_ASSERT_EQUAL(refs[1].page, 10);
	CU_ASSERT_EQUAL(refs[2].page, 40);
	free(refs);
	/* Two rotations forget the first generation. */
	ram_image_rotate_recent(img);
	refs = ram_image_recent_pages(img, &n);
	CU_ASSERT_EQUAL_FATAL(n, 2);
	CU_ASSERT_EQUAL(refs[0].page, 10);
	CU_ASSERT_EQUAL(refs[1].page, 40);
	free(refs);
	ram_image_rotate_recent(img);
	refs = ram_image_recent_pages(img, &n);
	CU_ASSERT_EQUAL(n, 0);
	free(refs);
	ram_image_destroy(img);
}

int register_replica_fork_tests(void)
{
	CU_pSuite suite = CU_add_suite("replica_fork", NULL, NULL);

	if (!suite ||
	    !CU_add_test(suite, "commits preserve the frozen disk replica",
			 test_commit_preserves_frozen_disk) ||
	    !CU_add_test(suite, "the snapshot follows the taken-over export",
			 test_snapshot_follows_the_taken_over_export) ||
	    !CU_add_test(suite, "recent pages: two generations",
			 test_recent_pages_two_generations))
		return -1;
	return 0;
}
