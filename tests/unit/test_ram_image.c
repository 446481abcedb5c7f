/*
 * The backup's data path: the RAM image (ram_image.c), an epoch staged
 * and committed into it (epoch_stage.c), and the restore stream built
 * from it (restore_stream.c), parsed back with the COLO stream parser.
 */
#include <CUnit/CUnit.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qemu/colo_stream.h"
#include "backup/epoch_stage.h"
#include "qemu/migration_writer.h"
#include "image/ram_image.h"
#include "backup/eager_restore.h"
#include "backup/restore_stream.h"
#include "suites.h"

#define PAGE MIG_PAGE_SIZE
#define MACHINE "pc-i440fx-7.2"
#define RAM_ID 3u

/* A page whose bytes depend on tag, never all zero. */
static void fill_page(uint8_t *p, unsigned tag)
{
	for (size_t i = 0; i < PAGE; i++)
		p[i] = (uint8_t)(tag * 13 + i * 5 + 1);
	p[0] = (uint8_t)(tag | 1);
}

static struct ram_image *two_blocks(uint64_t pages0, uint64_t pages1)
{
	const char *names[] = { "pc.ram", "vga.vram" };
	uint64_t lengths[] = { pages0 * PAGE, pages1 * PAGE };
	char err[256] = "";
	struct ram_image *img = ram_image_create(MACHINE, RAM_ID, names, lengths,
						 2, err, sizeof(err));

	CU_ASSERT_STRING_EQUAL(err, "");
	return img;
}

static const uint8_t *page_at(const struct ram_image *img, size_t block,
			      uint64_t page)
{
	return ram_image_block(img, block)->mem + page * PAGE;
}

static bool is_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return false;
	return true;
}

/* Whether the kernel has a page behind addr (reading maps one too). */
static bool resident(const void *addr)
{
	unsigned char vec = 0;

	if (mincore((void *)addr, PAGE, &vec) != 0)
		return true; /* make a failure visible in the assertion */
	return vec & 1;
}

/* ---- ram_image ------------------------------------------------------ */

static void expect_create_fails(const char *machine, uint32_t id,
				const char *const *names,
				const uint64_t *lengths, size_t count,
				const char *why)
{
	char err[256] = "";
	struct ram_image *img = ram_image_create(machine, id, names, lengths,
						 count, err, sizeof(err));

	CU_ASSERT_PTR_NULL(img);
	ram_image_destroy(img);
	if (!strstr(err, why)) {
		fprintf(stderr, "\nerror '%s' does not mention '%s'\n", err, why);
		CU_FAIL("unexpected error message");
	}
}

static void test_image_rejects_bad_layouts(void)
{
	const char *names[] = { "pc.ram", "vga.vram", "pc.ram" };
	uint64_t lengths[] = { 16 * PAGE, 4 * PAGE, 16 * PAGE };
	uint64_t zero[] = { 0 };
	uint64_t unaligned[] = { 16 * PAGE + 512 };
	char long_name[300];
	const char *many[RAM_IMAGE_MAX_BLOCKS + 1];
	uint64_t many_lengths[RAM_IMAGE_MAX_BLOCKS + 1];
	const char *bad_names[] = { long_name };
	const char *empty_names[] = { "" };

	memset(long_name, 'x', 256);
	long_name[256] = '\0';
	for (size_t i = 0; i <= RAM_IMAGE_MAX_BLOCKS; i++) {
		many[i] = "same";
		many_lengths[i] = PAGE;
	}
	expect_create_fails(MACHINE, 0, names, lengths, 2, "section id 0");
	expect_create_fails(MACHINE, 1, names, zero, 1, "not a positive multiple");
	expect_create_fails(MACHINE, 1, names, unaligned, 1,
			    "not a positive multiple");
	expect_create_fails(MACHINE, 1, names, lengths, 3, "duplicate RAM block");
	expect_create_fails(MACHINE, 1, names, lengths, 0, "0 RAM blocks");
	expect_create_fails(MACHINE, 1, many, many_lengths,
			    RAM_IMAGE_MAX_BLOCKS + 1, "65 RAM blocks");
	expect_create_fails(MACHINE, 1, bad_names, lengths, 1, "name must be");
	expect_create_fails(MACHINE, 1, empty_names, lengths, 1, "name must be");
	expect_create_fails("", 1, names, lengths, 1, "machine type");
	/* The limit itself is fine when names differ. */
	char unique[RAM_IMAGE_MAX_BLOCKS][8];
	for (size_t i = 0; i < RAM_IMAGE_MAX_BLOCKS; i++) {
		snprintf(unique[i], sizeof(unique[i]), "b%zu", i);
		many[i] = unique[i];
	}
	char err[256] = "";
	struct ram_image *img = ram_image_create(MACHINE, 1, many, many_lengths,
						 RAM_IMAGE_MAX_BLOCKS, err,
						 sizeof(err));
	CU_ASSERT_PTR_NOT_NULL(img);
	if (img)
		CU_ASSERT_EQUAL(ram_image_pages_total(img), RAM_IMAGE_MAX_BLOCKS);
	ram_image_destroy(img);
}

static void test_image_store_and_bitmap(void)
{
	struct ram_image *img = two_blocks(100, 8);
	uint8_t page[PAGE];

	CU_ASSERT_PTR_NOT_NULL_FATAL(img);
	CU_ASSERT_EQUAL(ram_image_block_count(img), 2);
	CU_ASSERT_STRING_EQUAL(ram_image_block(img, 1)->name, "vga.vram");
	CU_ASSERT_EQUAL(ram_image_block(img, 1)->length, 8 * PAGE);
	CU_ASSERT_PTR_NULL(ram_image_block(img, 2));
	CU_ASSERT_STRING_EQUAL(ram_image_machine_type(img), MACHINE);
	CU_ASSERT_EQUAL(ram_image_ram_section_id(img), RAM_ID);
	CU_ASSERT_EQUAL(ram_image_pages_total(img), 108);
	CU_ASSERT_EQUAL(ram_image_pages_written(img), 0);

	fill_page(page, 1);
	CU_ASSERT_EQUAL(ram_image_store_page(img, 0, 99, page), 0);
	CU_ASSERT_EQUAL(ram_image_store_page(img, 0, 64, page), 0);
	CU_ASSERT_EQUAL(ram_image_store_page(img, 0, 64, page), 0); /* again */
	CU_ASSERT_EQUAL(ram_image_pages_written(img), 2);
	CU_ASSERT(ram_image_page_written(ram_image_block(img, 0), 99));
	CU_ASSERT(ram_image_page_written(ram_image_block(img, 0), 64));
	CU_ASSERT(!ram_image_page_written(ram_image_block(img, 0), 63));
	CU_ASSERT(!ram_image_page_written(ram_image_block(img, 0), 65));
	CU_ASSERT_EQUAL(memcmp(page_at(img, 0, 99), page, PAGE), 0);

	/* A zero page over a written one clears the data and the bit. */
	CU_ASSERT_EQUAL(ram_image_store_page(img, 0, 99, NULL), 0);
	CU_ASSERT(is_zero(page_at(img, 0, 99), PAGE));
	CU_ASSERT(!ram_image_page_written(ram_image_block(img, 0), 99));
	CU_ASSERT_EQUAL(ram_image_pages_written(img), 1);
	CU_ASSERT_EQUAL(ram_image_store_page(img, 0, 98, NULL), 0);
	CU_ASSERT_EQUAL(ram_image_pages_written(img), 1);

	/* Out of range: refused, nothing written. */
	CU_ASSERT_EQUAL(ram_image_store_page(img, 0, 100, page), -1);
	CU_ASSERT_EQUAL(ram_image_store_page(img, 1, 8, page), -1);
	CU_ASSERT_EQUAL(ram_image_store_page(img, 2, 0, page), -1);
	CU_ASSERT_EQUAL(ram_image_store_page(img, 0, UINT64_MAX, NULL), -1);
	CU_ASSERT_EQUAL(ram_image_pages_written(img), 1);
	CU_ASSERT_EQUAL(ram_image_store_page(img, 1, 7, page), 0);
	CU_ASSERT_EQUAL(memcmp(page_at(img, 1, 7), page, PAGE), 0);
	CU_ASSERT_EQUAL(ram_image_pages_written(img), 2);
	ram_image_destroy(img);
	ram_image_destroy(NULL);
}

static void test_image_untouched_pages_cost_nothing(void)
{
	struct ram_image *img = two_blocks(200, 8);
	uint8_t page[PAGE];

	CU_ASSERT_PTR_NOT_NULL_FATAL(img);
	fill_page(page, 2);
	CU_ASSERT_EQUAL(ram_image_store_page(img, 0, 10, page), 0);
	CU_ASSERT_EQUAL(ram_image_store_page(img, 0, 50, NULL), 0);
	CU_ASSERT(resident(page_at(img, 0, 10)));
	/* A zero page stored over a never-written one stays unbacked. */
	CU_ASSERT(!resident(page_at(img, 0, 50)));
	CU_ASSERT(!resident(page_at(img, 0, 150)));
	CU_ASSERT(!resident(page_at(img, 1, 0)));
	ram_image_destroy(img);
}

static void test_image_device_blob(void)
{
	struct ram_image *img = two_blocks(4, 4);
	struct buffer other;

	CU_ASSERT_PTR_NOT_NULL_FATAL(img);
	CU_ASSERT_EQUAL(buffer_len(ram_image_device_blob(img)), 0);
	CU_ASSERT_EQUAL(ram_image_set_device_blob(img, (const uint8_t *)"abc", 3), 0);
	CU_ASSERT_EQUAL(buffer_len(ram_image_device_blob(img)), 3);
	CU_ASSERT_EQUAL(ram_image_set_device_blob(img, (const uint8_t *)"wxyz", 4), 0);
	CU_ASSERT_EQUAL_FATAL(buffer_len(ram_image_device_blob(img)), 4);
	CU_ASSERT_EQUAL(memcmp(buffer_head(ram_image_device_blob(img)), "wxyz", 4), 0);
	buffer_init(&other);
	buffer_append(&other, "12", 2);
	ram_image_swap_device_blob(img, &other);
	CU_ASSERT_EQUAL(buffer_len(ram_image_device_blob(img)), 2);
	CU_ASSERT_EQUAL_FATAL(buffer_len(&other), 4);
	CU_ASSERT_EQUAL(memcmp(buffer_head(&other), "wxyz", 4), 0);
	buffer_free(&other);
	ram_image_destroy(img);
}

/* ---- epoch_stage ---------------------------------------------------- */

static int temp_disk(size_t size, char *path, size_t len)
{
	snprintf(path, len, "/tmp/remusdb-stage-XXXXXX");
	int fd = mkstemp(path);

	if (fd >= 0 && ftruncate(fd, (off_t)size) != 0) {
		close(fd);
		unlink(path);
		return -1;
	}
	return fd;
}

static bool disk_equals(int fd, uint64_t offset, const uint8_t *expect,
			size_t len)
{
	uint8_t *got = malloc(len);
	bool same = got && pread(fd, got, len, (off_t)offset) == (ssize_t)len &&
		    memcmp(got, expect, len) == 0;

	free(got);
	return same;
}

static void test_stage_applies_nothing_before_commit(void)
{
	struct ram_image *img = two_blocks(16, 4);
	struct epoch_stage *s = epoch_stage_create();
	char path[64], err[256] = "";
	int fd = temp_disk(64 * 1024, path, sizeof(path));
	uint8_t page[PAGE], first[PAGE], data[5000], zeros[5000] = { 0 };

	CU_ASSERT_PTR_NOT_NULL_FATAL(img);
	CU_ASSERT_PTR_NOT_NULL_FATAL(s);
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL(ram_image_set_device_blob(img, (const uint8_t *)"old\0", 4), 0);

	epoch_stage_begin(s, 7);
	CU_ASSERT_EQUAL(epoch_stage_epoch(s), 7);
	fill_page(page, 3);
	memcpy(first, page, PAGE);
	CU_ASSERT_EQUAL(epoch_stage_add_page(s, 0, 2, page), 0);
	/* The receiver reuses its buffer: the stage must have copied. */
	fill_page(page, 4);
	CU_ASSERT_EQUAL(epoch_stage_add_page(s, 1, 3, page), 0);
	CU_ASSERT_EQUAL(epoch_stage_add_page(s, 0, 5, NULL), 0);
	CU_ASSERT_EQUAL(epoch_stage_add_device_chunk(s, 6, 0, (const uint8_t *)"new", 3), 0);
	CU_ASSERT(!epoch_stage_device_complete(s));
	CU_ASSERT_EQUAL(epoch_stage_add_device_chunk(s, 6, 3, (const uint8_t *)"ab\0", 3), 0);
	CU_ASSERT(epoch_stage_device_complete(s));
	memset(data, 0x5a, sizeof(data));
	CU_ASSERT_EQUAL(epoch_stage_add_disk_write(s, 8192, data, sizeof(data)), 0);
	CU_ASSERT_EQUAL(epoch_stage_pages(s), 3);
	CU_ASSERT_EQUAL(epoch_stage_bytes(s), 2 * PAGE + 6 + sizeof(data));

	/* Staged only: the image and the disk are as before. */
	CU_ASSERT_EQUAL(ram_image_pages_written(img), 0);
	CU_ASSERT(is_zero(page_at(img, 0, 2), PAGE));
	CU_ASSERT_EQUAL(memcmp(buffer_head(ram_image_device_blob(img)), "old", 4), 0);
	CU_ASSERT(disk_equals(fd, 8192, zeros, sizeof(zeros)));

	CU_ASSERT_EQUAL(epoch_stage_commit(s, img, fd, err, sizeof(err)), 0);
	CU_ASSERT_STRING_EQUAL(err, "");
	CU_ASSERT_EQUAL(memcmp(page_at(img, 0, 2), first, PAGE), 0);
	CU_ASSERT_EQUAL(memcmp(page_at(img, 1, 3), page, PAGE), 0);
	CU_ASSERT_EQUAL(ram_image_pages_written(img), 2);
	CU_ASSERT_EQUAL_FATAL(buffer_len(ram_image_device_blob(img)), 6);
	CU_ASSERT_EQUAL(memcmp(buffer_head(ram_image_device_blob(img)), "newab", 6), 0);
	CU_ASSERT(disk_equals(fd, 8192, data, sizeof(data)));
	/* Empty afterwards, same epoch number. */
	CU_ASSERT_EQUAL(epoch_stage_pages(s), 0);
	CU_ASSERT_EQUAL(epoch_stage_bytes(s), 0);
	CU_ASSERT_EQUAL(epoch_stage_epoch(s), 7);
	CU_ASSERT(epoch_stage_device_complete(s));

	epoch_stage_destroy(s);
	epoch_stage_destroy(NULL);
	ram_image_destroy(img);
	close(fd);
	unlink(path);
}

static void test_stage_discard(void)
{
	struct ram_image *img = two_blocks(8, 4);
	struct epoch_stage *s = epoch_stage_create();
	char err[256] = "";
	uint8_t page[PAGE];

	CU_ASSERT_PTR_NOT_NULL_FATAL(img);
	CU_ASSERT_PTR_NOT_NULL_FATAL(s);
	epoch_stage_begin(s, 1);
	fill_page(page, 5);
	CU_ASSERT_EQUAL(epoch_stage_add_page(s, 0, 1, page), 0);
	CU_ASSERT_EQUAL(epoch_stage_add_device_chunk(s, 10, 0, page, 4), 0);
	CU_ASSERT_EQUAL(epoch_stage_add_disk_zero(s, 0, 4096), 0);
	epoch_stage_discard(s);
	CU_ASSERT_EQUAL(epoch_stage_pages(s), 0);
	CU_ASSERT(epoch_stage_device_complete(s));
	/* Committing after a discard changes nothing, even without a disk. */
	CU_ASSERT_EQUAL(epoch_stage_commit(s, img, -1, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(ram_image_pages_written(img), 0);
	CU_ASSERT_EQUAL(buffer_len(ram_image_device_blob(img)), 0);
	/* begin() drops what was staged too. */
	CU_ASSERT_EQUAL(epoch_stage_add_page(s, 0, 1, page), 0);
	epoch_stage_begin(s, 2);
	CU_ASSERT_EQUAL(epoch_stage_pages(s), 0);
	CU_ASSERT_EQUAL(epoch_stage_commit(s, img, -1, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(ram_image_pages_written(img), 0);
	epoch_stage_destroy(s);
	ram_image_destroy(img);
}

static void test_stage_device_chunk_checks(void)
{
	struct epoch_stage *s = epoch_stage_create();
	const uint8_t d[8] = "abcdefg";

	CU_ASSERT_PTR_NOT_NULL_FATAL(s);
	epoch_stage_begin(s, 3);
	CU_ASSERT_EQUAL(epoch_stage_add_device_chunk(s, 0, 0, d, 0), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(epoch_stage_error(s), "empty"));
	CU_ASSERT_EQUAL(epoch_stage_add_device_chunk(s, 8, 2, d, 2), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(epoch_stage_error(s), "expected 0"));
	CU_ASSERT_EQUAL(epoch_stage_add_device_chunk(s, 8, 0, d, 9), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(epoch_stage_error(s), "overruns"));
	CU_ASSERT(epoch_stage_device_complete(s)); /* nothing accepted yet */
	CU_ASSERT_EQUAL(epoch_stage_add_device_chunk(s, 8, 0, d, 3), 0);
	CU_ASSERT_EQUAL(epoch_stage_add_device_chunk(s, 9, 3, d, 3), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(epoch_stage_error(s), "earlier chunks 8"));
	CU_ASSERT_EQUAL(epoch_stage_add_device_chunk(s, 8, 0, d, 3), -1); /* replay */
	CU_ASSERT_EQUAL(epoch_stage_add_device_chunk(s, 8, 3, d, 6), -1);
	CU_ASSERT(!epoch_stage_device_complete(s));
	CU_ASSERT_EQUAL(epoch_stage_add_device_chunk(s, 8, 3, d, 5), 0);
	CU_ASSERT(epoch_stage_device_complete(s));
	CU_ASSERT_EQUAL(epoch_stage_add_device_chunk(s, 8, 8, d, 1), -1);
	CU_ASSERT_EQUAL(epoch_stage_bytes(s), 8);
	epoch_stage_destroy(s);
}

static void test_stage_without_device_keeps_blob(void)
{
	struct ram_image *img = two_blocks(8, 4);
	struct epoch_stage *s = epoch_stage_create();
	char err[256] = "";
	uint8_t page[PAGE];

	CU_ASSERT_PTR_NOT_NULL_FATAL(img);
	CU_ASSERT_PTR_NOT_NULL_FATAL(s);
	epoch_stage_begin(s, 1);
	CU_ASSERT_EQUAL(epoch_stage_add_device_chunk(s, 4, 0, (const uint8_t *)"one", 4), 0);
	CU_ASSERT_EQUAL(epoch_stage_commit(s, img, -1, err, sizeof(err)), 0);
	epoch_stage_begin(s, 2);
	fill_page(page, 6);
	CU_ASSERT_EQUAL(epoch_stage_add_page(s, 0, 0, page), 0);
	CU_ASSERT_EQUAL(epoch_stage_commit(s, img, -1, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL_FATAL(buffer_len(ram_image_device_blob(img)), 4);
	CU_ASSERT_EQUAL(memcmp(buffer_head(ram_image_device_blob(img)), "one", 4), 0);
	/* The blob swapped out of the image is reused, not leaked. */
	epoch_stage_begin(s, 3);
	CU_ASSERT_EQUAL(epoch_stage_add_device_chunk(s, 4, 0, (const uint8_t *)"two", 4), 0);
	CU_ASSERT_EQUAL(epoch_stage_commit(s, img, -1, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(memcmp(buffer_head(ram_image_device_blob(img)), "two", 4), 0);
	epoch_stage_destroy(s);
	ram_image_destroy(img);
}

static void test_stage_refused_commit_changes_nothing(void)
{
	struct ram_image *img = two_blocks(8, 4);
	struct epoch_stage *s = epoch_stage_create();
	char path[64], err[256] = "";
	int fd = temp_disk(16384, path, sizeof(path));
	uint8_t page[PAGE], zeros[PAGE] = { 0 };

	CU_ASSERT_PTR_NOT_NULL_FATAL(img);
	CU_ASSERT_PTR_NOT_NULL_FATAL(s);
	CU_ASSERT_FATAL(fd >= 0);
	fill_page(page, 7);

	/* A valid page, a disk write, then a page beyond block 1. */
	epoch_stage_begin(s, 4);
	CU_ASSERT_EQUAL(epoch_stage_add_page(s, 0, 0, page), 0);
	CU_ASSERT_EQUAL(epoch_stage_add_disk_write(s, 0, page, PAGE), 0);
	CU_ASSERT_EQUAL(epoch_stage_add_page(s, 1, 4, page), 0);
	CU_ASSERT_EQUAL(epoch_stage_commit(s, img, fd, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "page 4 is outside RAM block vga.vram"));
	CU_ASSERT_EQUAL(ram_image_pages_written(img), 0);
	CU_ASSERT(disk_equals(fd, 0, zeros, PAGE));
	CU_ASSERT_EQUAL(epoch_stage_pages(s), 0);

	/* A block the image does not have. */
	CU_ASSERT_EQUAL(epoch_stage_add_page(s, 2, 0, NULL), 0);
	CU_ASSERT_EQUAL(epoch_stage_commit(s, img, fd, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "image has 2 blocks"));

	/* Device state not complete. */
	CU_ASSERT_EQUAL(epoch_stage_add_page(s, 0, 0, page), 0);
	CU_ASSERT_EQUAL(epoch_stage_add_device_chunk(s, 10, 0, page, 4), 0);
	CU_ASSERT_EQUAL(epoch_stage_commit(s, img, fd, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "device state incomplete (4 of 10"));
	CU_ASSERT_EQUAL(ram_image_pages_written(img), 0);
	CU_ASSERT_EQUAL(buffer_len(ram_image_device_blob(img)), 0);

	/* Disk writes but no disk. */
	CU_ASSERT_EQUAL(epoch_stage_add_page(s, 0, 0, page), 0);
	CU_ASSERT_EQUAL(epoch_stage_add_disk_zero(s, 0, 100), 0);
	CU_ASSERT_EQUAL(epoch_stage_commit(s, img, -1, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "no disk"));
	CU_ASSERT_EQUAL(ram_image_pages_written(img), 0);

	/* Ranges that overflow are refused when staged. */
	CU_ASSERT_EQUAL(epoch_stage_add_disk_zero(s, UINT64_MAX - 10, 100), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(epoch_stage_error(s), "overflows"));
	CU_ASSERT_EQUAL(epoch_stage_add_disk_write(s, UINT64_MAX - 1, page, 16), -1);
	epoch_stage_destroy(s);
	ram_image_destroy(img);
	close(fd);
	unlink(path);
}

static void test_stage_disk_in_arrival_order(void)
{
	struct ram_image *img = two_blocks(8, 4);
	struct epoch_stage *s = epoch_stage_create();
	char path[64], err[256] = "";
	const size_t size = 256 * 1024;
	int fd = temp_disk(size, path, sizeof(path));
	uint8_t *expect = malloc(size), *a = malloc(size);
	struct stat st;

	CU_ASSERT_PTR_NOT_NULL_FATAL(img);
	CU_ASSERT_PTR_NOT_NULL_FATAL(s);
	CU_ASSERT_PTR_NOT_NULL_FATAL(expect);
	CU_ASSERT_PTR_NOT_NULL_FATAL(a);
	CU_ASSERT_FATAL(fd >= 0);
	for (size_t i = 0; i < size; i++)
		a[i] = (uint8_t)(i * 7 + 3);
	memset(expect, 0, size);

	/* Write everything, zero the middle, then overwrite part of it again. */
	epoch_stage_begin(s, 9);
	CU_ASSERT_EQUAL(epoch_stage_add_disk_write(s, 0, a, size), 0);
	memcpy(expect, a, size);
	CU_ASSERT_EQUAL(epoch_stage_add_disk_zero(s, 65536, 131072), 0);
	memset(expect + 65536, 0, 131072);
	CU_ASSERT_EQUAL(epoch_stage_add_disk_write(s, 70000, a + 5, 1000), 0);
	memcpy(expect + 70000, a + 5, 1000);
	/* An unaligned zero range (punched or written, it must read as zeros). */
	CU_ASSERT_EQUAL(epoch_stage_add_disk_zero(s, 10, 300), 0);
	memset(expect + 10, 0, 300);
	CU_ASSERT_EQUAL(epoch_stage_add_disk_write(s, 0, a, 0), 0); /* no-op */
	CU_ASSERT_EQUAL(epoch_stage_commit(s, img, fd, err, sizeof(err)), 0);
	CU_ASSERT_STRING_EQUAL(err, "");
	CU_ASSERT(disk_equals(fd, 0, expect, size));
	CU_ASSERT_EQUAL(fstat(fd, &st), 0);
	CU_ASSERT_EQUAL(st.st_size, (off_t)size); /* KEEP_SIZE */
	free(expect);
	free(a);
	epoch_stage_destroy(s);
	ram_image_destroy(img);
	close(fd);
	unlink(path);
}

static void test_stage_disk_failure_is_reported(void)
{
	struct ram_image *img = two_blocks(8, 4);
	struct epoch_stage *s = epoch_stage_create();
	char path[64], err[256] = "";
	int fd = temp_disk(16384, path, sizeof(path));
	uint8_t page[PAGE];

	CU_ASSERT_PTR_NOT_NULL_FATAL(img);
	CU_ASSERT_PTR_NOT_NULL_FATAL(s);
	CU_ASSERT_FATAL(fd >= 0);
	int ro = open(path, O_RDONLY);
	CU_ASSERT_FATAL(ro >= 0);
	fill_page(page, 8);
	epoch_stage_begin(s, 12);
	CU_ASSERT_EQUAL(epoch_stage_add_page(s, 0, 3, page), 0);
	CU_ASSERT_EQUAL(epoch_stage_add_disk_write(s, 4096, page, PAGE), 0);
	CU_ASSERT_EQUAL(epoch_stage_commit(s, img, ro, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "epoch 12: disk write of 4096 bytes at "
					   "offset 4096 failed"));
	/* The image is not half-updated behind the caller's back. */
	CU_ASSERT_EQUAL(ram_image_pages_written(img), 0);
	CU_ASSERT_EQUAL(epoch_stage_pages(s), 0);
	close(ro);
	epoch_stage_destroy(s);
	ram_image_destroy(img);
	close(fd);
	unlink(path);
}

static void test_stage_large_epoch(void)
{
	const uint64_t pages = 3000; /* spans many 256-page chunks */
	struct ram_image *img = two_blocks(pages, 4);
	struct epoch_stage *s = epoch_stage_create();
	char err[256] = "";
	uint8_t page[PAGE];

	CU_ASSERT_PTR_NOT_NULL_FATAL(img);
	CU_ASSERT_PTR_NOT_NULL_FATAL(s);
	for (unsigned round = 0; round < 3; round++) {
		epoch_stage_begin(s, 100 + round);
		for (uint64_t p = 0; p < pages; p++) {
			fill_page(page, (unsigned)(p * 3 + round));
			if (epoch_stage_add_page(s, 0, p, p % 10 == round ? NULL : page)) {
				CU_FAIL("add_page failed");
				break;
			}
		}
		/* Sent twice in one epoch: the later version wins. */
		fill_page(page, 999 + round);
		CU_ASSERT_EQUAL(epoch_stage_add_page(s, 0, 17, page), 0);
		CU_ASSERT_EQUAL(epoch_stage_pages(s), pages + 1);
		CU_ASSERT_EQUAL(epoch_stage_commit(s, img, -1, err, sizeof(err)), 0);
		size_t bad = 0;
		for (uint64_t p = 0; p < pages; p++) {
			fill_page(page, p == 17 ? 999 + round : (unsigned)(p * 3 + round));
			bool zero = p % 10 == round && p != 17;
			if (zero ? !is_zero(page_at(img, 0, p), PAGE)
				 : memcmp(page_at(img, 0, p), page, PAGE) != 0)
				bad++;
		}
		CU_ASSERT_EQUAL(bad, 0);
		CU_ASSERT_EQUAL(ram_image_pages_written(img), pages - pages / 10);
	}
	epoch_stage_destroy(s);
	ram_image_destroy(img);
}

/* ---- restore_stream ------------------------------------------------- */

static void test_restore_refuses_unrestorable(void)
{
	struct ram_image *img = two_blocks(4, 4);
	char err[256] = "";

	CU_ASSERT_PTR_NOT_NULL_FATAL(img);
	CU_ASSERT_PTR_NULL(restore_stream_create(img, NULL, err, sizeof(err)));
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "no device state"));
	CU_ASSERT_EQUAL(ram_image_set_device_blob(img, (const uint8_t *)"\x04\x01", 2), 0);
	CU_ASSERT_PTR_NULL(restore_stream_create(img, NULL, err, sizeof(err)));
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "EOF marker"));
	restore_stream_destroy(NULL);
	ram_image_destroy(img);
}

#define BLOCK0_PAGES 48
#define BLOCK1_PAGES 20
#define BLOB_LEN 300

/* The expected content of each block, kept apart from the image. */
struct restore_fixture {
	struct ram_image *img;
	uint8_t *expect[2];
	uint8_t blob[BLOB_LEN];
	uint64_t nonzero_pages;
};

static void fixture_store(struct restore_fixture *f, unsigned block,
			  uint64_t p, const uint8_t *data)
{
	CU_ASSERT_EQUAL(ram_image_store_page(f->img, block, p, data), 0);
	if (data)
		memcpy(f->expect[block] + p * PAGE, data, PAGE);
	else
		memset(f->expect[block] + p * PAGE, 0, PAGE);
}

/*
 * Block 0: written pages (incl. the first and last), a page written then
 * zeroed, a page written with zero bytes (bit set, content zero), the
 * rest never written.  Block 1 starts with a never-written page, so its
 * named record is a ZERO.
 */
static int fixture_init(struct restore_fixture *f)
{
	uint8_t page[PAGE];

	memset(f, 0, sizeof(*f));
	f->img = two_blocks(BLOCK0_PAGES, BLOCK1_PAGES);
	f->expect[0] = calloc(BLOCK0_PAGES, PAGE);
	f->expect[1] = calloc(BLOCK1_PAGES, PAGE);
	if (!f->img || !f->expect[0] || !f->expect[1])
		return -1;
	for (uint64_t p = 0; p < BLOCK0_PAGES; p++) {
		if (p < 2 || (p >= 8 && p < 16) || p == 47 || p == 30) {
			fill_page(page, (unsigned)p);
			fixture_store(f, 0, p, page);
		}
	}
	fill_page(page, 5);
	fixture_store(f, 0, 5, page);
	fixture_store(f, 0, 5, NULL);
	memset(page, 0, PAGE);
	fixture_store(f, 0, 7, page);
	fill_page(page, 1003);
	fixture_store(f, 1, 3, page);
	fill_page(page, 1019);
	page[PAGE - 1] = 0x80; /* a page non-zero only in its last word */
	memset(page, 0, PAGE - 1);
	fixture_store(f, 1, 19, page);
	f->nonzero_pages = 2 + 8 + 2 + 2;
	/* A FULL-section-looking blob whose only 00 byte is the final EOF. */
	f->blob[0] = MIG_SECTION_FULL;
	for (size_t i = 1; i < BLOB_LEN - 1; i++)
		f->blob[i] = (uint8_t)(i % 250 + 1);
	f->blob[BLOB_LEN - 1] = MIG_EOF;
	return ram_image_set_device_blob(f->img, f->blob, BLOB_LEN);
}

static void fixture_free(struct restore_fixture *f)
{
	ram_image_destroy(f->img);
	free(f->expect[0]);
	free(f->expect[1]);
}

/* Size of the whole stream if every record after a block's first uses CONTINUE. */
static uint64_t expected_stream_size(const struct restore_fixture *f)
{
	const char *names[2] = { "pc.ram", "vga.vram" };
	const uint64_t pages[2] = { BLOCK0_PAGES, BLOCK1_PAGES };
	uint64_t n = 8 + 5 + strlen(MACHINE) + 17 + 8 + 8 + 5 + 5;

	for (int b = 0; b < 2; b++) {
		n += 1 + strlen(names[b]) + 8;   /* MEM_SIZE entry */
		n += 1 + strlen(names[b]);       /* name on the first record */
		n += pages[b] * (8 + 1);         /* record headers + zero fill */
	}
	n += f->nonzero_pages * (PAGE - 1);      /* page data instead of fill */
	return n + 8 + 5 + BLOB_LEN;
}

/* Produces the whole stream in slices of max_bytes. */
static int produce_mapped(const struct ram_image *img, const char *mapped, size_t max_bytes,
			  struct buffer *out, uint64_t *bytes)
{
	char err[256] = "";
	struct restore_stream *rs = restore_stream_create(img, mapped, err, sizeof(err));
	int rc, calls = 0;

	if (!rs)
		return -1;
	do {
		size_t before = buffer_len(out);

		rc = restore_stream_produce(rs, out, max_bytes);
		calls++;
		/* One record of overshoot at most. */
		if (buffer_len(out) - before > max_bytes + PAGE + 300)
			rc = -1;
	} while (rc == 1 && calls < 10000000);
	*bytes = restore_stream_bytes(rs);
	/* Done is sticky. */
	if (rc == 0 && restore_stream_produce(rs, out, max_bytes) != 0)
		rc = -1;
	restore_stream_destroy(rs);
	return rc;
}

static int produce_all(const struct ram_image *img, size_t max_bytes,
		       struct buffer *out, uint64_t *bytes)
{
	return produce_mapped(img, NULL, max_bytes, out, bytes);
}

struct parsed {
	struct restore_fixture *f;
	char machine[256];
	size_t blocks;
	size_t sections;
	uint8_t section_type[4];
	uint32_t section_id[4];
	uint8_t seen[2][BLOCK0_PAGES];
	size_t page_records, zero_records, bad;
	struct buffer blob;
	uint64_t blob_total;
	bool bulk_complete;
};

static int on_configuration(void *opaque, const char *machine_type)
{
	struct parsed *p = opaque;

	snprintf(p->machine, sizeof(p->machine), "%s", machine_type);
	return 0;
}

static int on_section(void *opaque, const struct colo_section *s)
{
	struct parsed *p = opaque;

	if (p->sections < 4) {
		p->section_type[p->sections] = s->type;
		p->section_id[p->sections] = s->id;
	}
	p->sections++;
	return 0;
}

static int on_ram_block(void *opaque, const struct colo_ram_block *b)
{
	struct parsed *p = opaque;
	const struct ram_image_block *mine = ram_image_block(p->f->img, b->index);

	if (!mine || strcmp(mine->name, b->name) != 0 || mine->length != b->length)
		p->bad++;
	p->blocks++;
	return 0;
}

static uint8_t *expected_page(struct parsed *p, unsigned block, uint64_t offset)
{
	if (block > 1 || offset % PAGE) {
		p->bad++;
		return NULL;
	}
	p->seen[block][offset / PAGE]++;
	return p->f->expect[block] + offset;
}

static int on_page(void *opaque, const struct colo_ram_block *b,
		   uint64_t offset, const uint8_t *data)
{
	struct parsed *p = opaque;
	const uint8_t *e = expected_page(p, b->index, offset);

	/* A PAGE record for a zero page would waste 4 KiB: count it as bad. */
	if (!e || memcmp(e, data, PAGE) != 0 || is_zero(e, PAGE))
		p->bad++;
	p->page_records++;
	return 0;
}

static int on_zero_page(void *opaque, const struct colo_ram_block *b,
			uint64_t offset, uint8_t fill)
{
	struct parsed *p = opaque;
	const uint8_t *e = expected_page(p, b->index, offset);

	if (!e || fill != 0 || !is_zero(e, PAGE))
		p->bad++;
	p->zero_records++;
	return 0;
}

static int on_blob_chunk(void *opaque, const uint8_t *data, size_t len)
{
	struct parsed *p = opaque;

	return buffer_append(&p->blob, data, len);
}

static int on_blob_complete(void *opaque, uint64_t total)
{
	((struct parsed *)opaque)->blob_total = total;
	return 0;
}

static int on_bulk_complete(void *opaque)
{
	((struct parsed *)opaque)->bulk_complete = true;
	return 0;
}

/*
 * Feeds the stream to colo_stream in odd chunk sizes.  The parser reads a
 * COLO source's bulk stream, which ends with VMDESCRIPTION; the restore
 * stream has none, so a minimal one is appended after it: the parser only
 * confirms the end of the device blob (its EOF byte) by that trailer.
 */
static void parse_back(struct restore_fixture *f, const struct buffer *stream,
		       struct parsed *p)
{
	static const size_t chunks[] = { 1, 7, 4093, 13, 65536, 3, 4096, 2 };
	static const char json[] = "{\"page_size\":4096}";
	uint8_t trailer[5 + sizeof(json) - 1];
	struct colo_stream_callbacks cb = {
		.opaque = p,
		.on_configuration = on_configuration,
		.on_section = on_section,
		.on_ram_block = on_ram_block,
		.on_page = on_page,
		.on_zero_page = on_zero_page,
		.on_device_blob_chunk = on_blob_chunk,
		.on_device_blob_complete = on_blob_complete,
		.on_bulk_complete = on_bulk_complete,
	};
	const char *err = NULL;

	memset(p, 0, sizeof(*p));
	p->f = f;
	buffer_init(&p->blob);
	struct colo_stream *cs = colo_stream_new(&cb, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(cs);
	size_t at = 0, i = 0;
	while (at < buffer_len(stream)) {
		size_t n = chunks[i++ % (sizeof(chunks) / sizeof(chunks[0]))];

		if (n > buffer_len(stream) - at)
			n = buffer_len(stream) - at;
		if (colo_stream_feed(cs, buffer_head(stream) + at, n, &err) != 0) {
			fprintf(stderr, "\ncolo_stream: %s\n", err);
			CU_FAIL("colo_stream rejected the restore stream");
			break;
		}
		at += n;
	}
	/* Everything up to the blob's final EOF byte was consumed. */
	CU_ASSERT_EQUAL(buffer_len(&p->blob), BLOB_LEN - 1);
	trailer[0] = MIG_VMDESCRIPTION;
	store_be32(trailer + 1, (uint32_t)(sizeof(json) - 1));
	memcpy(trailer + 5, json, sizeof(json) - 1);
	CU_ASSERT_EQUAL(colo_stream_feed(cs, trailer, sizeof(trailer), &err), 0);
	CU_ASSERT_EQUAL(colo_stream_finish(cs, &err), 0);
	colo_stream_free(cs);
}

static void test_restore_round_trip(void)
{
	struct restore_fixture f;
	struct buffer stream;
	struct parsed p;
	uint64_t bytes = 0;

	CU_ASSERT_EQUAL_FATAL(fixture_init(&f), 0);
	buffer_init(&stream);
	CU_ASSERT_EQUAL_FATAL(produce_all(f.img, 10000, &stream, &bytes), 0);
	CU_ASSERT_EQUAL(bytes, buffer_len(&stream));
	/* Exact size: one named record per block, CONTINUE for the rest. */
	CU_ASSERT_EQUAL(buffer_len(&stream), expected_stream_size(&f));

	parse_back(&f, &stream, &p);
	CU_ASSERT_STRING_EQUAL(p.machine, MACHINE);
	CU_ASSERT_EQUAL(p.blocks, 2);
	CU_ASSERT_EQUAL(p.sections, 2);
	CU_ASSERT_EQUAL(p.section_type[0], MIG_SECTION_START);
	CU_ASSERT_EQUAL(p.section_type[1], MIG_SECTION_END);
	CU_ASSERT_EQUAL(p.section_id[0], RAM_ID);
	CU_ASSERT_EQUAL(p.section_id[1], RAM_ID);
	CU_ASSERT_EQUAL(p.bad, 0);
	CU_ASSERT_EQUAL(p.page_records, f.nonzero_pages);
	CU_ASSERT_EQUAL(p.zero_records,
			BLOCK0_PAGES + BLOCK1_PAGES - f.nonzero_pages);
	size_t missing_or_twice = 0;
	for (size_t i = 0; i < BLOCK0_PAGES; i++)
		missing_or_twice += p.seen[0][i] != 1;
	for (size_t i = 0; i < BLOCK1_PAGES; i++)
		missing_or_twice += p.seen[1][i] != 1;
	CU_ASSERT_EQUAL(missing_or_twice, 0);
	CU_ASSERT_TRUE(p.bulk_complete);
	CU_ASSERT_EQUAL(p.blob_total, BLOB_LEN);
	CU_ASSERT_EQUAL_FATAL(buffer_len(&p.blob), BLOB_LEN);
	CU_ASSERT_EQUAL(memcmp(buffer_head(&p.blob), f.blob, BLOB_LEN), 0);
	/* The blob closes the stream verbatim. */
	CU_ASSERT_EQUAL(memcmp(buffer_head(&stream) + buffer_len(&stream) - BLOB_LEN,
			       f.blob, BLOB_LEN), 0);
	buffer_free(&p.blob);
	buffer_free(&stream);
	fixture_free(&f);
}

/*
 * A block the takeover's QEMU maps from the image (restore_stream.h): the
 * stream declares it with its length but carries none of its pages; the
 * other block's pages all come, and the device state closes it as ever.
 * The control: the same image unmapped carries block 0's pages.
 */
static void test_restore_mapped_block_carries_no_page(void)
{
	struct restore_fixture f;
	struct buffer stream;
	struct parsed p;
	uint64_t bytes = 0;
	char err[256] = "";

	CU_ASSERT_EQUAL_FATAL(fixture_init(&f), 0);
	CU_ASSERT_PTR_NULL(restore_stream_create(f.img, "no.such", err, sizeof(err)));
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "no RAM block named no.such"));
	buffer_init(&stream);
	CU_ASSERT_EQUAL_FATAL(produce_mapped(f.img, "pc.ram", 10000, &stream, &bytes), 0);
	/* Block 0's records (and its name on the first) are gone from the full size. */
	CU_ASSERT_EQUAL(buffer_len(&stream), expected_stream_size(&f) -
			(1 + strlen("pc.ram")) - BLOCK0_PAGES * (8 + 1) - 12 * (PAGE - 1));
	parse_back(&f, &stream, &p);
	CU_ASSERT_EQUAL(p.blocks, 2);
	CU_ASSERT_EQUAL(p.bad, 0);
	size_t block0 = 0, block1_once = 0;
	for (size_t i = 0; i < BLOCK0_PAGES; i++)
		block0 += p.seen[0][i];
	for (size_t i = 0; i < BLOCK1_PAGES; i++)
		block1_once += p.seen[1][i] == 1;
	CU_ASSERT_EQUAL(block0, 0);
	CU_ASSERT_EQUAL(block1_once, BLOCK1_PAGES);
	CU_ASSERT_EQUAL(p.page_records, 2);
	CU_ASSERT_EQUAL(p.blob_total, BLOB_LEN);
	buffer_free(&p.blob);
	buffer_clear(&stream);
	/* The control: unmapped, block 0 is all there. */
	CU_ASSERT_EQUAL_FATAL(produce_all(f.img, 10000, &stream, &bytes), 0);
	parse_back(&f, &stream, &p);
	block0 = 0;
	for (size_t i = 0; i < BLOCK0_PAGES; i++)
		block0 += p.seen[0][i] == 1;
	CU_ASSERT_EQUAL(block0, BLOCK0_PAGES);
	buffer_free(&p.blob);
	buffer_free(&stream);
	fixture_free(&f);
}

static void test_restore_slices_give_same_bytes(void)
{
	static const size_t slices[] = { 0, 1, 100, 4105, 70000, 1 << 24 };
	struct restore_fixture f;
	struct buffer whole;

	CU_ASSERT_EQUAL_FATAL(fixture_init(&f), 0);
	buffer_init(&whole);
	uint64_t bytes = 0;
	CU_ASSERT_EQUAL_FATAL(produce_all(f.img, 1 << 30, &whole, &bytes), 0);
	for (size_t i = 0; i < sizeof(slices) / sizeof(slices[0]); i++) {
		struct buffer part;

		buffer_init(&part);
		CU_ASSERT_EQUAL(produce_all(f.img, slices[i], &part, &bytes), 0);
		CU_ASSERT_EQUAL(bytes, buffer_len(&whole));
		CU_ASSERT(buffer_len(&part) == buffer_len(&whole) &&
			  memcmp(buffer_head(&part), buffer_head(&whole),
				 buffer_len(&whole)) == 0);
		buffer_free(&part);
	}
	buffer_free(&whole);
	fixture_free(&f);
}

/*
 * A mostly untouched guest, as after boot: the stream must describe every
 * page without faulting in the memory of pages never written.  Writes are
 * 16 MiB apart and the probes 8 MiB from them, so transparent huge pages
 * around a written page cannot blur the result.
 */
static int send_buffer_of(int fd)
{
	int size = 0;
	socklen_t len = sizeof(size);

	CU_ASSERT_EQUAL(getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, &len), 0);
	return size;
}

/*
 * The restore's socket holds a whole chunk (the kernel reports twice what
 * was set), not the default's few hundred KiB that made the stream a
 * ping-pong between the daemon and QEMU.  Unprivileged, the kernel caps it
 * at wmem_max: then it must at least have grown.
 */
static void test_restore_socket_holds_a_chunk(void)
{
	int sv[2];

	CU_ASSERT_EQUAL_FATAL(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	int before = send_buffer_of(sv[0]);
	CU_ASSERT_EQUAL(eager_restore_widen_send_buffer(sv[0]), 0);
	int after = send_buffer_of(sv[0]);
	if (geteuid() == 0) {
		CU_ASSERT(after >= (int)EAGER_RESTORE_CHUNK);
	} else {
		CU_ASSERT(after > before);
	}
	CU_ASSERT_EQUAL(eager_restore_widen_send_buffer(-1), -1); /* a bad fd is reported */
	close(sv[0]);
	close(sv[1]);
}

static void test_restore_skips_never_written_memory(void)
{
	const uint64_t pages = 64 * 1024; /* 256 MiB */
	struct ram_image *img = two_blocks(pages, 16);
	uint8_t page[PAGE];
	struct buffer out;
	char err[256] = "";
	uint64_t written = 0, produced = 0;

	CU_ASSERT_PTR_NOT_NULL_FATAL(img);
	for (uint64_t p = 0; p < pages; p += 4096) {
		fill_page(page, (unsigned)p);
		CU_ASSERT_EQUAL(ram_image_store_page(img, 0, p, page), 0);
		written++;
	}
	/* Explicit zero pages over never-written ones stay unbacked too. */
	CU_ASSERT_EQUAL(ram_image_store_page(img, 0, 2048 + 1, NULL), 0);
	CU_ASSERT_EQUAL(ram_image_set_device_blob(img, (const uint8_t *)"\x04\x00", 2), 0);
	struct restore_stream *rs = restore_stream_create(img, NULL, err, sizeof(err));
	CU_ASSERT_PTR_NOT_NULL_FATAL(rs);
	buffer_init(&out);
	int rc;
	while ((rc = restore_stream_produce(rs, &out, 256 * 1024)) == 1) {
		produced += buffer_len(&out);
		buffer_clear(&out); /* as if written to the socket */
	}
	produced += buffer_len(&out);
	CU_ASSERT_EQUAL(rc, 0);
	CU_ASSERT_EQUAL(produced, restore_stream_bytes(rs));
	uint64_t expect = 8 + 5 + strlen(MACHINE) + 17 + 8 + (1 + 6 + 8) +
			  (1 + 8 + 8) + 8 + 5 + 5 + (1 + 6) + (1 + 8) +
			  (pages + 16) * 9 + written * (PAGE - 1) + 8 + 5 + 2;
	CU_ASSERT_EQUAL(produced, expect);
	size_t touched = 0;
	for (uint64_t p = 2048; p < pages; p += 4096)
		touched += resident(page_at(img, 0, p)) + resident(page_at(img, 0, p + 1));
	CU_ASSERT_EQUAL(touched, 0);
	buffer_free(&out);
	restore_stream_destroy(rs);
	ram_image_destroy(img);
}

int register_ram_image_tests(void)
{
	CU_pSuite suite = CU_add_suite("ram_image", NULL, NULL);

	if (!suite)
		return -1;
	if (!CU_add_test(suite, "image rejects bad layouts",
			 test_image_rejects_bad_layouts) ||
	    !CU_add_test(suite, "image stores pages and tracks writes",
			 test_image_store_and_bitmap) ||
	    !CU_add_test(suite, "untouched pages cost nothing",
			 test_image_untouched_pages_cost_nothing) ||
	    !CU_add_test(suite, "image device blob", test_image_device_blob) ||
	    !CU_add_test(suite, "stage applies nothing before commit",
			 test_stage_applies_nothing_before_commit) ||
	    !CU_add_test(suite, "stage discard", test_stage_discard) ||
	    !CU_add_test(suite, "stage device chunk checks",
			 test_stage_device_chunk_checks) ||
	    !CU_add_test(suite, "epoch without device state keeps the blob",
			 test_stage_without_device_keeps_blob) ||
	    !CU_add_test(suite, "refused commit changes nothing",
			 test_stage_refused_commit_changes_nothing) ||
	    !CU_add_test(suite, "disk writes in arrival order",
			 test_stage_disk_in_arrival_order) ||
	    !CU_add_test(suite, "disk failure is reported",
			 test_stage_disk_failure_is_reported) ||
	    !CU_add_test(suite, "large epoch, repeated", test_stage_large_epoch) ||
	    !CU_add_test(suite, "restore refuses an unrestorable image",
			 test_restore_refuses_unrestorable) ||
	    !CU_add_test(suite, "restore stream parses back page for page",
			 test_restore_round_trip) ||
	    !CU_add_test(suite, "restore of a mapped block carries no page",
			 test_restore_mapped_block_carries_no_page) ||
	    !CU_add_test(suite, "restore slices give the same bytes",
			 test_restore_slices_give_same_bytes) ||
	    !CU_add_test(suite, "restore skips never-written memory",
			 test_restore_skips_never_written_memory) ||
	    !CU_add_test(suite, "restore socket holds a chunk",
			 test_restore_socket_holds_a_chunk))
		return -1;
	return 0;
}
