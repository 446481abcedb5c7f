/*
 * snapshot_capture: a plain precopy migration stream (two RAM iterations,
 * so some pages are sent again, zero pages, device sections, EOF,
 * VMDESCRIPTION) built with migration_writer, fed in chunks of many
 * sizes; the image, the device state and the redirtied list must not
 * depend on the chunking.  Then truncated, extended and garbled streams.
 */
#include <CUnit/CUnit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/be.h"
#include "qemu/migration_writer.h"
#include "pc_reader.h"
#include "image/ram_image.h"
#include "fork/snapshot_capture.h"
#include "suites.h"

#define RAM_ID 2
#define PC_PAGES 16
#define VGA_PAGES 4

static const struct migw_ram_block blocks[2] = {
	{ "pc.ram", PC_PAGES * MIG_PAGE_SIZE },
	{ "vga.vram", VGA_PAGES * MIG_PAGE_SIZE },
};

static const char vmdesc[] = "{\"page_size\": 4096, \"devices\": []}";

struct stream {
	struct buffer b;
	uint8_t pc[PC_PAGES * MIG_PAGE_SIZE], vga[VGA_PAGES * MIG_PAGE_SIZE];
	size_t blob_off, blob_len;
	unsigned pages, zeros;
};

static uint8_t *expected(struct stream *t, unsigned block, uint64_t page)
{
	return (block ? t->vga : t->pc) + page * MIG_PAGE_SIZE;
}

/* name NULL: CONTINUE.  version changes the content of a resent page. */
static void page(struct stream *t, const char *name, unsigned block, uint64_t p,
		 unsigned version)
{
	uint8_t data[MIG_PAGE_SIZE];

	pc_test_fill(data, block, p + 1000 * version);
	CU_ASSERT_EQUAL_FATAL(migw_ram_page(&t->b, name, p * MIG_PAGE_SIZE, data), 0);
	memcpy(expected(t, block, p), data, MIG_PAGE_SIZE);
	t->pages++;
}

static void zero(struct stream *t, const char *name, unsigned block, uint64_t p)
{
	CU_ASSERT_EQUAL_FATAL(migw_ram_zero(&t->b, name, p * MIG_PAGE_SIZE, 0), 0);
	memset(expected(t, block, p), 0, MIG_PAGE_SIZE);
	t->zeros++;
}

static void section(struct stream *t, uint8_t type)
{
	CU_ASSERT_EQUAL_FATAL(migw_section_part(&t->b, type, RAM_ID), 0);
}

static void section_end(struct stream *t)
{
	CU_ASSERT_EQUAL_FATAL(migw_ram_eos(&t->b), 0);
	CU_ASSERT_EQUAL_FATAL(migw_section_footer(&t->b, RAM_ID), 0);
}

/*
 * Iteration 1 sends every page; iteration 2 resends pc 5, vga 1, pc 2
 * (zero before, data now), pc 9 (data before, zero now); the END section
 * resends pc 12 and pc 5 again.  Last sightings: vga 1, pc 2, pc 9,
 * pc 12, pc 5.
 */
static void build(struct stream *t)
{
	memset(t, 0, sizeof(*t));
	buffer_init(&t->b);
	CU_ASSERT_EQUAL_FATAL(migw_header(&t->b), 0);
	CU_ASSERT_EQUAL_FATAL(migw_configuration(&t->b, "pc-q35-7.2"), 0);
	CU_ASSERT_EQUAL_FATAL(migw_section_start(&t->b, MIG_SECTION_START, RAM_ID,
						 "ram", 0, 4), 0);
	CU_ASSERT_EQUAL_FATAL(migw_ram_mem_size(&t->b, blocks, 2), 0);
	section_end(t);

	section(t, MIG_SECTION_PART);
	for (uint64_t p = 0; p < PC_PAGES; p++) {
		const char *name = p ? NULL : "pc.ram";

		if (p == 2 || p == 3 || p == 7)
			zero(t, name, 0, p);
		else
			page(t, name, 0, p, 0);
	}
	section_end(t);
	section(t, MIG_SECTION_PART);
	/* CONTINUE across sections: still pc.ram. */
	CU_ASSERT_EQUAL_FATAL(migw_ram_zero(&t->b, NULL, 3 * MIG_PAGE_SIZE, 0), 0);
	t->zeros++;
	/* pc 3 was sent twice as zero: that counts as redirtied too. */
	for (uint64_t p = 0; p < VGA_PAGES; p++)
		page(t, p ? NULL : "vga.vram", 1, p, 0);
	section_end(t);

	section(t, MIG_SECTION_PART);
	page(t, "pc.ram", 0, 5, 1);
	page(t, "vga.vram", 1, 1, 1);
	page(t, "pc.ram", 0, 2, 1);
	zero(t, NULL, 0, 9);
	section_end(t);

	section(t, MIG_SECTION_END);
	page(t, NULL, 0, 12, 1);
	page(t, NULL, 0, 5, 2);
	section_end(t);

	/* Device state: FULL sections, EOF; then VMDESCRIPTION. */
	t->blob_off = buffer_len(&t->b);
	CU_ASSERT_EQUAL_FATAL(buffer_append(&t->b, pc_test_blob, pc_test_blob_len), 0);
	t->blob_len = pc_test_blob_len;
	uint8_t trailer[5] = { MIG_VMDESCRIPTION };
	store_be32(trailer + 1, (uint32_t)strlen(vmdesc));
	CU_ASSERT_EQUAL_FATAL(buffer_append(&t->b, trailer, 5), 0);
	CU_ASSERT_EQUAL_FATAL(buffer_append(&t->b, vmdesc, strlen(vmdesc)), 0);
}

/* Feeds t in chunks of `chunk` bytes; returns the first failing call's rc. */
static int feed(struct snapshot_capture *sc, const uint8_t *d, size_t n, size_t chunk,
		const char **err)
{
	for (size_t off = 0; off < n; off += chunk) {
		size_t len = n - off < chunk ? n - off : chunk;

		if (snapshot_capture_feed(sc, d + off, len, err) < 0)
			return -1;
	}
	return 0;
}

static void check_capture(struct snapshot_capture *sc, struct stream *t)
{
	static const struct page_ref want[] = {
		{ 0, 3 }, { 1, 1 }, { 0, 2 }, { 0, 9 }, { 0, 12 }, { 0, 5 },
	};
	struct ram_image *img = snapshot_capture_image(sc);
	struct snapshot_capture_stats st;
	size_t n = 0;

	CU_ASSERT(snapshot_capture_complete(sc));
	CU_ASSERT_PTR_NOT_NULL_FATAL(img);
	CU_ASSERT_STRING_EQUAL(ram_image_machine_type(img), "pc-q35-7.2");
	CU_ASSERT_EQUAL(ram_image_ram_section_id(img), RAM_ID);
	CU_ASSERT_EQUAL_FATAL(ram_image_block_count(img), 2);
	for (unsigned b = 0; b < 2; b++) {
		const struct ram_image_block *blk = ram_image_block(img, b);

		CU_ASSERT_STRING_EQUAL(blk->name, blocks[b].name);
		CU_ASSERT_EQUAL_FATAL(blk->length, blocks[b].length);
		CU_ASSERT(!memcmp(blk->mem, expected(t, b, 0), blk->length));
	}
	/* Zero records leave pages unwritten (pc 2, 3, 7 of iteration 1; pc 9 now). */
	CU_ASSERT_EQUAL(ram_image_pages_written(img), PC_PAGES + VGA_PAGES - 3);
	const struct buffer *blob = ram_image_device_blob(img);
	CU_ASSERT_EQUAL(buffer_len(blob), t->blob_len);
	CU_ASSERT(!memcmp(buffer_head(blob), buffer_head(&t->b) + t->blob_off, t->blob_len));

	const struct page_ref *r = snapshot_capture_redirtied(sc, &n);
	CU_ASSERT_EQUAL_FATAL(n, sizeof(want) / sizeof(want[0]));
	for (size_t i = 0; i < n; i++) {
		CU_ASSERT_EQUAL(r[i].block, want[i].block);
		CU_ASSERT_EQUAL(r[i].page, want[i].page);
	}
	snapshot_capture_get_stats(sc, &st);
	CU_ASSERT_EQUAL(st.stream_bytes, buffer_len(&t->b));
	CU_ASSERT_EQUAL(st.pages, t->pages);
	CU_ASSERT_EQUAL(st.zero_pages, t->zeros);
	CU_ASSERT_EQUAL(st.redirtied, n);
	CU_ASSERT_EQUAL(st.device_bytes, t->blob_len);
}

static void test_capture_any_chunking(void)
{
	static const size_t chunks[] = { 1, 2, 3, 7, 13, 100, 4095, 4096, 4097, 65536, SIZE_MAX };
	struct stream *t = malloc(sizeof(*t));

	CU_ASSERT_PTR_NOT_NULL_FATAL(t);
	build(t);
	for (size_t i = 0; i < sizeof(chunks) / sizeof(chunks[0]); i++) {
		struct snapshot_capture *sc = snapshot_capture_new();
		const char *err = NULL;

		CU_ASSERT_PTR_NOT_NULL_FATAL(sc);
		CU_ASSERT_PTR_NULL(snapshot_capture_image(sc));
		CU_ASSERT_EQUAL(feed(sc, buffer_head(&t->b), buffer_len(&t->b), chunks[i], &err), 0);
		if (err)
			fprintf(stderr, "\nchunk %zu: %s\n", chunks[i], err);
		CU_ASSERT_EQUAL(snapshot_capture_finish(sc, &err), 0);
		check_capture(sc, t);
		/* A finished capture takes no more bytes. */
		CU_ASSERT_EQUAL(snapshot_capture_feed(sc, (const uint8_t *)"", 0, &err), 0);
		CU_ASSERT_EQUAL(snapshot_capture_feed(sc, (const uint8_t *)"x", 1, &err), -1);
		CU_ASSERT_PTR_NOT_NULL(strstr(err, "after the end"));
		/* ... and is no longer complete: errors are sticky. */
		CU_ASSERT_FALSE(snapshot_capture_complete(sc));
		CU_ASSERT_EQUAL(snapshot_capture_finish(sc, &err), -1);
		CU_ASSERT_PTR_NOT_NULL(strstr(err, "after the end"));
		snapshot_capture_free(sc);
	}
	buffer_free(&t->b);
	free(t);
}

static void test_capture_truncated(void)
{
	struct stream *t = malloc(sizeof(*t));

	CU_ASSERT_PTR_NOT_NULL_FATAL(t);
	build(t);
	size_t n = buffer_len(&t->b);
	const size_t cuts[] = { 0, 1, 8, 30, 100, 5000, t->blob_off - 1, t->blob_off,
				t->blob_off + 10, t->blob_off + t->blob_len,
				t->blob_off + t->blob_len + 3, n - 1 };

	for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
		struct snapshot_capture *sc = snapshot_capture_new();
		const char *err = NULL;

		CU_ASSERT_EQUAL(feed(sc, buffer_head(&t->b), cuts[i], 997, &err), 0);
		CU_ASSERT_FALSE(snapshot_capture_complete(sc));
		CU_ASSERT_EQUAL(snapshot_capture_finish(sc, &err), -1);
		CU_ASSERT(err && strstr(err, "ended after"));
		snapshot_capture_free(sc);
	}
	buffer_free(&t->b);
	free(t);
}

static void test_capture_bad_streams(void)
{
	struct stream *t = malloc(sizeof(*t));
	struct snapshot_capture *sc;
	const char *err = NULL, *first;

	CU_ASSERT_PTR_NOT_NULL_FATAL(t);
	build(t);
	/* Bytes after VMDESCRIPTION in the same read: QEMU never sends them. */
	CU_ASSERT_EQUAL_FATAL(buffer_append(&t->b, "\x00", 1), 0);
	sc = snapshot_capture_new();
	CU_ASSERT_EQUAL(snapshot_capture_feed(sc, buffer_head(&t->b), buffer_len(&t->b), &err), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "after VMDESCRIPTION"));
	CU_ASSERT_FALSE(snapshot_capture_complete(sc));
	CU_ASSERT_EQUAL(snapshot_capture_finish(sc, &err), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "after VMDESCRIPTION"));
	snapshot_capture_free(sc);

	/* Garbage: a bad magic; the error is sticky and finish() repeats it. */
	sc = snapshot_capture_new();
	CU_ASSERT_EQUAL(snapshot_capture_feed(sc, (const uint8_t *)"QEVX\0\0\0\3", 8, &err), -1);
	CU_ASSERT_PTR_NOT_NULL_FATAL(err);
	first = err;
	CU_ASSERT(strlen(first) > 0);
	CU_ASSERT_EQUAL(snapshot_capture_feed(sc, buffer_head(&t->b), 8, &err), -1);
	CU_ASSERT_PTR_EQUAL(err, first);
	CU_ASSERT_EQUAL(snapshot_capture_finish(sc, &err), -1);
	CU_ASSERT_PTR_EQUAL(err, first);
	CU_ASSERT_PTR_NULL(snapshot_capture_image(sc));
	snapshot_capture_free(sc);

	/* A COLO-only or postcopy command is refused; so is an unknown item. */
	static const uint8_t bad_items[][6] = {
		{ MIG_COMMAND, 0, 7, 0, 0 },   /* PACKAGED */
		{ 0x42 },
	};
	for (size_t i = 0; i < 2; i++) {
		struct buffer b;

		buffer_init(&b);
		CU_ASSERT_EQUAL_FATAL(migw_header(&b), 0);
		CU_ASSERT_EQUAL_FATAL(buffer_append(&b, bad_items[i], 6), 0);
		sc = snapshot_capture_new();
		CU_ASSERT_EQUAL(snapshot_capture_feed(sc, buffer_head(&b), buffer_len(&b), &err), -1);
		snapshot_capture_free(sc);
		buffer_free(&b);
	}

	buffer_free(&t->b);
	free(t);
	snapshot_capture_free(NULL);
}

int register_snapshot_capture_tests(void)
{
	CU_pSuite suite = CU_add_suite("snapshot_capture", NULL, NULL);

	if (!suite)
		return -1;
	if (!CU_add_test(suite, "capture is independent of chunking",
			 test_capture_any_chunking) ||
	    !CU_add_test(suite, "truncated stream", test_capture_truncated) ||
	    !CU_add_test(suite, "bad streams", test_capture_bad_streams))
		return -1;
	return 0;
}
