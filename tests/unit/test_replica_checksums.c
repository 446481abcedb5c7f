/*
 * image-checksums on the backup (replica_checksums.c): the file holds the
 * XXH3-64 of every page of the named block of the committed image,
 * big-endian, in page order, written across several loop turns; a dump
 * that sees another epoch commit meanwhile fails instead of mixing two
 * images; bad requests are refused.
 */
#include <CUnit/CUnit.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/be.h"
#include "base/event_loop.h"
#include "codec/page_coding.h"
#include "image/ram_image.h"
#include "backup/replica.h"
#include "suites.h"

#define PAGES (3 * 16384 + 5) /* more than one slice, and a partial one */

struct rig {
	struct replica r;
	char path[64];
};

static void rig_up(struct rig *t)
{
	const char *names[] = { "pc.ram", "vga.vram" };
	const uint64_t lengths[] = { (uint64_t)PAGES * 4096, 4096 };
	char err[128];
	uint8_t page[4096];

	memset(t, 0, sizeof(*t));
	t->r.loop = event_loop_create();
	CU_ASSERT_PTR_NOT_NULL_FATAL(t->r.loop);
	snprintf(t->r.name, sizeof(t->r.name), "sums");
	t->r.image = ram_image_create("pc-i440fx-7.2", 2, names, lengths, 2, err, sizeof(err));
	CU_ASSERT_PTR_NOT_NULL_FATAL(t->r.image);
	for (uint64_t p = 0; p < PAGES; p += 7) {
		memset(page, (int)(p & 0xff), sizeof(page));
		store_be64(page, p);
		CU_ASSERT_EQUAL(ram_image_store_page(t->r.image, 0, p, page), 0);
	}
	replica_checksums_init(&t->r.checksums);
	snprintf(t->path, sizeof(t->path), "/tmp/replica-sums-XXXXXX");
	int fd = mkstemp(t->path);
	CU_ASSERT_FATAL(fd >= 0);
	close(fd);
}

static void rig_down(struct rig *t)
{
	replica_checksums_stop(&t->r);
	ram_image_destroy(t->r.image);
	event_loop_destroy(t->r.loop);
	unlink(t->path);
}

static bool run_until_finished(struct rig *t, unsigned *turns)
{
	int64_t deadline = monotonic_ms() + 10000;

	*turns = 0;
	while (t->r.checksums.state == SUMS_RUNNING) {
		if (monotonic_ms() > deadline)
			return false;
		event_loop_run_once(t->r.loop, 10);
		(*turns)++;
	}
	return true;
}

static void test_checksums_of_every_page(void)
{
	struct rig t;
	char err[256];
	unsigned turns;

	rig_up(&t);
	/* Nothing committed yet, an unknown block, a relative path. */
	CU_ASSERT_EQUAL(replica_checksums_start(&t.r, "pc.ram", t.path, err, sizeof(err)), -1);
	t.r.any_commit = true;
	t.r.committed_epoch = 41;
	CU_ASSERT_EQUAL(replica_checksums_start(&t.r, "pc.rom", t.path, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "no RAM block"));
	CU_ASSERT_EQUAL(replica_checksums_start(&t.r, "pc.ram", "sums", err, sizeof(err)), -1);

	CU_ASSERT_EQUAL_FATAL(replica_checksums_start(&t.r, "pc.ram", t.path, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(replica_checksums_start(&t.r, "pc.ram", t.path, err, sizeof(err)), -1);
	CU_ASSERT_FATAL(run_until_finished(&t, &turns));
	CU_ASSERT_EQUAL(t.r.checksums.state, SUMS_DONE);
	CU_ASSERT(turns >= 4); /* a slice per turn, the loop free in between */
	CU_ASSERT_EQUAL(t.r.checksums.epoch, 41);

	const struct ram_image_block *b = ram_image_block(t.r.image, 0);
	FILE *f = fopen(t.path, "rb");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	uint8_t sum[8];
	uint64_t p = 0, wrong = 0;
	while (fread(sum, 1, 8, f) == 8) {
		wrong += load_be64(sum) != page_checksum(b->mem + p * 4096);
		p++;
	}
	fclose(f);
	CU_ASSERT_EQUAL(p, PAGES);
	CU_ASSERT_EQUAL(wrong, 0);
	rig_down(&t);
}

static void test_an_epoch_committed_meanwhile_fails(void)
{
	struct rig t;
	char err[256];
	unsigned turns;

	rig_up(&t);
	t.r.any_commit = true;
	t.r.committed_epoch = 7;
	CU_ASSERT_EQUAL_FATAL(replica_checksums_start(&t.r, "pc.ram", t.path, err, sizeof(err)), 0);
	event_loop_run_once(t.r.loop, 10); /* one slice */
	t.r.committed_epoch = 8;
	CU_ASSERT_FATAL(run_until_finished(&t, &turns));
	CU_ASSERT_EQUAL(t.r.checksums.state, SUMS_FAILED);
	CU_ASSERT_PTR_NOT_NULL(strstr(t.r.checksums.error, "moved on from epoch 7 to 8"));
	/* Stopped while running: nothing left behind (the loop holds no timer). */
	t.r.committed_epoch = 9;
	CU_ASSERT_EQUAL_FATAL(replica_checksums_start(&t.r, "vga.vram", t.path, err, sizeof(err)), 0);
	replica_checksums_stop(&t.r);
	CU_ASSERT_EQUAL(t.r.checksums.state, SUMS_FAILED);
	CU_ASSERT_EQUAL(t.r.checksums.fd, -1);
	rig_down(&t);
}

int register_replica_checksums_tests(void)
{
	CU_pSuite suite = CU_add_suite("replica_checksums", NULL, NULL);

	if (!suite ||
	    !CU_add_test(suite, "checksums of every page", test_checksums_of_every_page) ||
	    !CU_add_test(suite, "an epoch committed meanwhile fails",
			 test_an_epoch_committed_meanwhile_fails))
		return -1;
	return 0;
}
