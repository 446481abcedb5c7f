/* The disk change log (disk_changes.c): marks, generations, and what a torn file means. */
#include <CUnit/CUnit.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/be.h"
#include "image/disk_changes.h"
#include "base/event_loop.h"
#include "base/file_flush.h"
#include "suites.h"

#define MIB (1u << 20)
#define IMAGE_SIZE (5 * MIB + 4096) /* 6 extents, the last one short */

static char dir[64], image[128], log_path[160];

static void make_image(void)
{
	strcpy(dir, "/tmp/rdb-changes-XXXXXX");
	CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
	snprintf(image, sizeof(image), "%s/disk.img", dir);
	snprintf(log_path, sizeof(log_path), "%s.changes", image);
	int fd = open(image, O_RDWR | O_CREAT, 0600);
	CU_ASSERT_TRUE_FATAL(fd >= 0 && ftruncate(fd, IMAGE_SIZE) == 0);
	close(fd);
}

static void remove_image(void)
{
	unlink(log_path);
	unlink(image);
	rmdir(dir);
}

static struct disk_changes *open_log(void)
{
	char err[256];
	struct disk_changes *dc = disk_changes_open(image, IMAGE_SIZE, err, sizeof(err));

	CU_ASSERT_PTR_NOT_NULL_FATAL(dc);
	return dc;
}

static bool is_marked(const struct disk_changes *dc, uint64_t i)
{
	return disk_changes_bitmap(dc)[i / 8] & (1u << (i % 8));
}

static void test_no_log_vouches_for_nothing(void)
{
	make_image();
	CU_ASSERT_FALSE(disk_changes_exist(image));
	struct disk_changes *dc = open_log();
	CU_ASSERT_EQUAL(disk_changes_extent_count(dc), 6);
	CU_ASSERT_EQUAL(disk_changes_generation(dc), DISK_CHANGES_NO_GENERATION);
	CU_ASSERT_PTR_NOT_NULL(strstr(disk_changes_trouble(dc), "no change log"));
	CU_ASSERT_EQUAL(disk_changes_marked(dc), 6);
	disk_changes_close(dc);
	remove_image();
}

/* A primary's life: a session starts, its copy is acknowledged, later writes stay marked. */
static void test_generation_keeps_unacknowledged_writes(void)
{
	make_image();
	struct disk_changes *dc = open_log();
	disk_changes_new_session(dc);
	CU_ASSERT_EQUAL(disk_changes_mark(dc, 0, 4096, 3), 0);           /* extent 0, epoch 3 */
	CU_ASSERT_EQUAL(disk_changes_mark(dc, 2 * MIB - 1, 2, 9), 0);    /* extents 1 and 2 */
	CU_ASSERT_EQUAL(disk_changes_mark(dc, 5 * MIB, 4096, 4), 0);     /* the short extent 5 */
	CU_ASSERT_EQUAL(disk_changes_mark(dc, IMAGE_SIZE, 4096, 9), 0);  /* past the end: nothing */
	CU_ASSERT_EQUAL(disk_changes_begin_generation(dc, 0xabc, 5), 0);
	CU_ASSERT_PTR_NULL(disk_changes_trouble(dc));
	CU_ASSERT_EQUAL(disk_changes_generation(dc), 0xabc);
	CU_ASSERT_FALSE(is_marked(dc, 0));
	CU_ASSERT_TRUE(is_marked(dc, 1));
	CU_ASSERT_TRUE(is_marked(dc, 2));
	CU_ASSERT_FALSE(is_marked(dc, 3));
	CU_ASSERT_FALSE(is_marked(dc, 5));
	CU_ASSERT_EQUAL(disk_changes_marked(dc), 2);
	disk_changes_close(dc);

	/* Reopened (a restart): the generation and the marks survived; epochs did not. */
	CU_ASSERT_TRUE(disk_changes_exist(image));
	dc = open_log();
	CU_ASSERT_EQUAL(disk_changes_generation(dc), 0xabc);
	CU_ASSERT_EQUAL(disk_changes_marked(dc), 2);
	CU_ASSERT_TRUE(is_marked(dc, 1));
	disk_changes_forget_acked(dc, 1000); /* no generation begun in this process: kept */
	CU_ASSERT_EQUAL(disk_changes_marked(dc), 2);
	disk_changes_close(dc);
	remove_image();
}

static void test_forget_acked_clears_only_acknowledged(void)
{
	make_image();
	struct disk_changes *dc = open_log();
	disk_changes_new_session(dc);
	CU_ASSERT_EQUAL(disk_changes_begin_generation(dc, 7, 0), 0);
	CU_ASSERT_EQUAL(disk_changes_marked(dc), 0);
	CU_ASSERT_EQUAL(disk_changes_mark(dc, 3 * MIB, 10, 11), 0);
	CU_ASSERT_EQUAL(disk_changes_mark(dc, 4 * MIB, 10, 12), 0);
	CU_ASSERT_EQUAL(disk_changes_mark(dc, 1 * MIB, 10, DISK_CHANGES_NO_EPOCH), 0);
	disk_changes_forget_acked(dc, 11);
	CU_ASSERT_FALSE(is_marked(dc, 3));
	CU_ASSERT_TRUE(is_marked(dc, 4));
	CU_ASSERT_TRUE(is_marked(dc, 1)); /* written outside any epoch: never acknowledged */
	disk_changes_close(dc);
	dc = open_log();
	CU_ASSERT_EQUAL(disk_changes_marked(dc), 2);
	disk_changes_close(dc);
	remove_image();
}

/* A new session before its copy is acknowledged keeps the old generation and its marks. */
static void test_unfinished_session_keeps_the_old_generation(void)
{
	make_image();
	struct disk_changes *dc = open_log();
	disk_changes_new_session(dc);
	CU_ASSERT_EQUAL(disk_changes_begin_generation(dc, 7, 0), 0);
	CU_ASSERT_EQUAL(disk_changes_mark(dc, 0, 1, DISK_CHANGES_NO_EPOCH), 0);
	disk_changes_new_session(dc);                 /* a second protection starts ... */
	CU_ASSERT_EQUAL(disk_changes_mark(dc, 2 * MIB, 1, 1), 0);
	disk_changes_forget_acked(dc, 1);             /* ... and its epoch 1 is acknowledged */
	CU_ASSERT_EQUAL(disk_changes_generation(dc), 7);
	CU_ASSERT_TRUE(is_marked(dc, 0));
	CU_ASSERT_TRUE(is_marked(dc, 2));
	disk_changes_close(dc);
	remove_image();
}

static void corrupt(off_t at)
{
	int fd = open(log_path, O_RDWR);
	uint8_t byte;

	CU_ASSERT_TRUE_FATAL(fd >= 0 && pread(fd, &byte, 1, at) == 1);
	byte ^= 0x10;
	CU_ASSERT_EQUAL(pwrite(fd, &byte, 1, at), 1);
	close(fd);
}

static void test_torn_or_foreign_log_is_unproven(void)
{
	make_image();
	struct disk_changes *dc = open_log();
	disk_changes_new_session(dc);
	CU_ASSERT_EQUAL(disk_changes_begin_generation(dc, 7, 0), 0);
	disk_changes_close(dc);
	corrupt(49); /* one bit of the bitmap */
	dc = open_log();
	CU_ASSERT_EQUAL(disk_changes_generation(dc), DISK_CHANGES_NO_GENERATION);
	CU_ASSERT_PTR_NOT_NULL(strstr(disk_changes_trouble(dc), "torn"));
	CU_ASSERT_EQUAL(disk_changes_marked(dc), 6);
	disk_changes_close(dc);
	/* The same log for a disk of another size. */
	corrupt(49);
	char err[256];
	dc = disk_changes_open(image, IMAGE_SIZE + 20 * MIB, err, sizeof(err));
	CU_ASSERT_PTR_NOT_NULL_FATAL(dc);
	CU_ASSERT_PTR_NOT_NULL(strstr(disk_changes_trouble(dc), "bytes, not the"));
	disk_changes_close(dc);
	remove_image();
}

static void test_invalidate_and_seal(void)
{
	uint8_t discarded[1] = { 0x24 }; /* extents 2 and 5 */

	make_image();
	struct disk_changes *dc = open_log();
	CU_ASSERT_EQUAL(disk_changes_invalidate(dc, "a copy to it did not finish"), 0);
	disk_changes_close(dc);
	dc = open_log();
	CU_ASSERT_PTR_NOT_NULL(strstr(disk_changes_trouble(dc), "did not finish"));
	/* A replica's seal at takeover: the generation, then the discarded epoch's extents. */
	CU_ASSERT_EQUAL(disk_changes_begin_generation(dc, 9, DISK_CHANGES_NO_EPOCH), 0);
	CU_ASSERT_EQUAL(disk_changes_marked(dc), 0);
	CU_ASSERT_EQUAL(disk_changes_mark_bitmap(dc, discarded, 6), 0);
	disk_changes_close(dc);
	dc = open_log();
	CU_ASSERT_EQUAL(disk_changes_generation(dc), 9);
	CU_ASSERT_TRUE(is_marked(dc, 2));
	CU_ASSERT_TRUE(is_marked(dc, 5));
	CU_ASSERT_EQUAL(disk_changes_marked(dc), 2);
	disk_changes_close(dc);
	remove_image();
}

/* A disk replaced by another file (a copy renamed over it) does not inherit the log. */
static void test_replaced_disk_is_unproven(void)
{
	char other[200];

	make_image();
	struct disk_changes *dc = open_log();
	disk_changes_new_session(dc);
	CU_ASSERT_EQUAL(disk_changes_begin_generation(dc, 7, 0), 0);
	disk_changes_close(dc);
	dc = open_log();
	CU_ASSERT_EQUAL(disk_changes_generation(dc), 7); /* the same file: vouched for */
	disk_changes_close(dc);
	snprintf(other, sizeof(other), "%s.new", image);
	int fd = open(other, O_RDWR | O_CREAT, 0600);
	CU_ASSERT_TRUE_FATAL(fd >= 0 && ftruncate(fd, IMAGE_SIZE) == 0);
	close(fd);
	CU_ASSERT_EQUAL_FATAL(rename(other, image), 0);
	dc = open_log();
	CU_ASSERT_EQUAL(disk_changes_generation(dc), DISK_CHANGES_NO_GENERATION);
	CU_ASSERT_PTR_NOT_NULL(strstr(disk_changes_trouble(dc), "the disk was replaced"));
	disk_changes_close(dc);
	remove_image();
}

/* A replica reads its log before its file exists; sealing it later still flushes the file. */
static void test_log_read_before_the_image_exists(void)
{
	make_image();
	unlink(image);
	struct disk_changes *dc = open_log();
	CU_ASSERT_EQUAL(disk_changes_invalidate(dc, "a copy to it did not finish"), 0);
	int fd = open(image, O_RDWR | O_CREAT, 0600);
	CU_ASSERT_TRUE_FATAL(fd >= 0 && ftruncate(fd, IMAGE_SIZE) == 0);
	close(fd);
	CU_ASSERT_EQUAL(disk_changes_begin_generation(dc, 3, DISK_CHANGES_NO_EPOCH), 0);
	CU_ASSERT_EQUAL(disk_changes_generation(dc), 3);
	disk_changes_close(dc);
	remove_image();
}

/* A log that cannot be written is unproven from then on; the caller's write still goes. */
static void test_unwritable_log_becomes_unproven(void)
{
	make_image();
	/* A directory where the log belongs: no write can succeed, even as root. */
	CU_ASSERT_EQUAL_FATAL(mkdir(log_path, 0700), 0);
	struct disk_changes *dc = open_log();
	CU_ASSERT_PTR_NOT_NULL(strstr(disk_changes_trouble(dc), "cannot be opened"));
	disk_changes_new_session(dc);
	CU_ASSERT_EQUAL(disk_changes_begin_generation(dc, 8, 0), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(disk_changes_trouble(dc), "could not be written"));
	CU_ASSERT_EQUAL(disk_changes_generation(dc), DISK_CHANGES_NO_GENERATION);
	CU_ASSERT_EQUAL(disk_changes_mark(dc, 0, 1, 1), 0); /* nothing new to say */
	CU_ASSERT_EQUAL(disk_changes_invalidate(dc, "x"), -1);
	disk_changes_close(dc);
	rmdir(log_path);
	remove_image();
}

static void on_flushed(void *opaque, int err)
{
	*(int *)opaque = err;
}

/* The flush runs on a worker; its end (or its errno) arrives on the loop. */
static void test_file_flush_reports_on_the_loop(void)
{
	char err[256];
	int result = -1;

	make_image();
	event_loop *loop = event_loop_create();
	CU_ASSERT_PTR_NOT_NULL_FATAL(loop);
	struct file_flush *f = file_flush_create(loop, err, sizeof(err));
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	CU_ASSERT_EQUAL(file_flush_start(f, image, on_flushed, &result), 0);
	CU_ASSERT_TRUE(file_flush_busy(f));
	CU_ASSERT_EQUAL(file_flush_start(f, image, on_flushed, &result), -1); /* one at a time */
	for (int i = 0; i < 500 && result == -1; i++)
		event_loop_run_once(loop, 10);
	CU_ASSERT_EQUAL(result, 0);
	CU_ASSERT_FALSE(file_flush_busy(f));
	result = -1;
	CU_ASSERT_EQUAL(file_flush_start(f, "/nonexistent/disk.img", on_flushed, &result), 0);
	for (int i = 0; i < 500 && result == -1; i++)
		event_loop_run_once(loop, 10);
	CU_ASSERT_EQUAL(result, ENOENT);
	/* Finished by its owner: waited for, its callback at once, and only once. */
	result = -1;
	CU_ASSERT_EQUAL(file_flush_start(f, image, on_flushed, &result), 0);
	file_flush_finish(f);
	CU_ASSERT_EQUAL(result, 0);
	CU_ASSERT_FALSE(file_flush_busy(f));
	result = -1;
	for (int i = 0; i < 5; i++)
		event_loop_run_once(loop, 10);
	CU_ASSERT_EQUAL(result, -1);
	file_flush_finish(f); /* idle: nothing to do */
	CU_ASSERT_EQUAL(result, -1);
	/* Destroyed while a flush runs: it is waited for, and no callback comes. */
	result = -1;
	CU_ASSERT_EQUAL(file_flush_start(f, image, on_flushed, &result), 0);
	file_flush_destroy(f);
	CU_ASSERT_EQUAL(result, -1);
	event_loop_destroy(loop);
	remove_image();
}

static char boot_id_file[200];

static void set_boot_id(const char *uuid)
{
	snprintf(boot_id_file, sizeof(boot_id_file), "%s/boot_id", dir);
	FILE *f = fopen(boot_id_file, "w");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	fprintf(f, "%s\n", uuid);
	fclose(f);
	disk_changes_set_boot_id_file(boot_id_file);
}

static void forget_boot_id(void)
{
	unlink(boot_id_file);
	disk_changes_set_boot_id_file(NULL);
}

#define BOOT_A "0f3c2b1a-5d4e-4f60-8a9b-0c1d2e3f4a5b"
#define BOOT_B "0f3c2b1a-5d4e-4f60-8a9b-0c1d2e3f4a5c" /* one digit apart */

/*
 * A backup's unflushed claim (disk_changes_claim_unflushed) holds while
 * the same kernel runs and not after a reboot; a flushed seal holds
 * across both (the negative control: the reboot check must look at the
 * claim, not at every log).
 */
static void test_unflushed_claim_holds_within_one_boot(void)
{
	make_image();
	set_boot_id(BOOT_A);
	struct disk_changes *dc = open_log();
	CU_ASSERT_EQUAL(disk_changes_invalidate(dc, "a copy to it did not finish"), 0);
	CU_ASSERT_EQUAL(disk_changes_claim_unflushed(dc, 0x77), 0);
	CU_ASSERT_TRUE(disk_changes_unflushed(dc));
	CU_ASSERT_PTR_NULL(disk_changes_trouble(dc));
	disk_changes_close(dc);

	/* The daemon restarts under the same kernel: the claim stands. */
	dc = open_log();
	CU_ASSERT_EQUAL(disk_changes_generation(dc), 0x77);
	CU_ASSERT_TRUE(disk_changes_unflushed(dc));
	CU_ASSERT_EQUAL(disk_changes_marked(dc), 0);
	disk_changes_close(dc);

	/* The host rebooted: the page cache the claim was about is gone. */
	set_boot_id(BOOT_B);
	dc = open_log();
	CU_ASSERT_EQUAL(disk_changes_generation(dc), DISK_CHANGES_NO_GENERATION);
	CU_ASSERT_PTR_NOT_NULL(strstr(disk_changes_trouble(dc), "rebooted"));
	CU_ASSERT_EQUAL(disk_changes_marked(dc), 6);
	disk_changes_close(dc);

	/* A flushed seal (a takeover's or a goodbye's) replaces the claim and survives a reboot. */
	set_boot_id(BOOT_A);
	dc = open_log();
	CU_ASSERT_EQUAL(disk_changes_begin_generation(dc, 0x78, DISK_CHANGES_NO_EPOCH), 0);
	CU_ASSERT_FALSE(disk_changes_unflushed(dc));
	disk_changes_close(dc);
	set_boot_id(BOOT_B);
	dc = open_log();
	CU_ASSERT_EQUAL(disk_changes_generation(dc), 0x78);
	CU_ASSERT_PTR_NULL(disk_changes_trouble(dc));
	/* A copy starting over withdraws any claim. */
	CU_ASSERT_EQUAL(disk_changes_claim_unflushed(dc, 0x79), 0);
	CU_ASSERT_EQUAL(disk_changes_invalidate(dc, "a copy to it did not finish"), 0);
	CU_ASSERT_FALSE(disk_changes_unflushed(dc));
	disk_changes_close(dc);
	dc = open_log();
	CU_ASSERT_PTR_NOT_NULL(strstr(disk_changes_trouble(dc), "did not finish"));
	disk_changes_close(dc);

	/* No boot id to name: no claim. */
	forget_boot_id();
	disk_changes_set_boot_id_file("/nonexistent/boot_id");
	dc = open_log();
	CU_ASSERT_EQUAL(disk_changes_claim_unflushed(dc, 0x7a), -1);
	CU_ASSERT_EQUAL(disk_changes_generation(dc), DISK_CHANGES_NO_GENERATION);
	disk_changes_close(dc);
	disk_changes_set_boot_id_file(NULL);
	remove_image();
}

/* A log written by the first version (48-byte header, no flags) is still read. */
static void write_v1_log(uint64_t generation, uint32_t flags)
{
	struct stat st;
	uint8_t buf[48 + 1 + 8];

	CU_ASSERT_EQUAL_FATAL(stat(image, &st), 0);
	memset(buf, 0, sizeof(buf));
	memcpy(buf, "RDBCHG1\n", 8);
	store_be64(buf + 8, generation);
	store_be64(buf + 16, IMAGE_SIZE);
	store_be32(buf + 24, DISK_CHANGES_EXTENT_SHIFT);
	store_be32(buf + 28, flags);
	store_be64(buf + 32, 6);
	store_be64(buf + 40, (uint64_t)st.st_ino);
	buf[48] = 0x08; /* extent 3 */
	store_be64(buf + 49, XXH64(buf, 49, 0));
	int fd = open(log_path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	CU_ASSERT_TRUE_FATAL(fd >= 0 && write(fd, buf, sizeof(buf)) == (ssize_t)sizeof(buf));
	close(fd);
}

static void test_version_1_log_is_read(void)
{
	make_image();
	write_v1_log(5, 0);
	struct disk_changes *dc = open_log();
	CU_ASSERT_EQUAL(disk_changes_generation(dc), 5);
	CU_ASSERT_EQUAL(disk_changes_marked(dc), 1);
	CU_ASSERT_TRUE(is_marked(dc, 3));
	CU_ASSERT_FALSE(disk_changes_unflushed(dc));
	/* Written again, as version 2: the same generation and marks. */
	CU_ASSERT_EQUAL(disk_changes_mark(dc, 0, 1, DISK_CHANGES_NO_EPOCH), 0);
	disk_changes_close(dc);
	dc = open_log();
	CU_ASSERT_EQUAL(disk_changes_generation(dc), 5);
	CU_ASSERT_EQUAL(disk_changes_marked(dc), 2);
	disk_changes_close(dc);
	/* Version 1 had no flags: a set one is not a file we wrote. */
	write_v1_log(5, 1);
	dc = open_log();
	CU_ASSERT_PTR_NOT_NULL(strstr(disk_changes_trouble(dc), "torn"));
	disk_changes_close(dc);
	remove_image();
}

int register_disk_changes_tests(void)
{
	CU_pSuite suite = CU_add_suite("disk_changes", NULL, NULL);

	if (!suite ||
	    !CU_add_test(suite, "no log vouches for nothing", test_no_log_vouches_for_nothing) ||
	    !CU_add_test(suite, "a generation keeps unacknowledged writes",
			 test_generation_keeps_unacknowledged_writes) ||
	    !CU_add_test(suite, "forget_acked clears only acknowledged marks",
			 test_forget_acked_clears_only_acknowledged) ||
	    !CU_add_test(suite, "an unfinished session keeps the old generation",
			 test_unfinished_session_keeps_the_old_generation) ||
	    !CU_add_test(suite, "a torn or foreign log is unproven",
			 test_torn_or_foreign_log_is_unproven) ||
	    !CU_add_test(suite, "invalidate, then seal with discarded extents",
			 test_invalidate_and_seal) ||
	    !CU_add_test(suite, "a replaced disk is unproven", test_replaced_disk_is_unproven) ||
	    !CU_add_test(suite, "an image flush reports on the loop",
			 test_file_flush_reports_on_the_loop) ||
	    !CU_add_test(suite, "a log read before its image exists",
			 test_log_read_before_the_image_exists) ||
	    !CU_add_test(suite, "an unwritable log becomes unproven",
			 test_unwritable_log_becomes_unproven) ||
	    !CU_add_test(suite, "an unflushed claim holds within one boot",
			 test_unflushed_claim_holds_within_one_boot) ||
	    !CU_add_test(suite, "a version 1 log is still read", test_version_1_log_is_read))
		return -1;
	return 0;
}
