/*
 * The primary's ASC+RT page encoder against a model backup: every record
 * it writes is decoded the way the backup does (page_decoder_default
 * against the backup's copy, DISK_REF by reading the disk), and the
 * backup's copy must end equal to the page, with the checksum the record
 * carries.  Also what must NOT become a disk reference.
 */
#include <CUnit/CUnit.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "codec/asc_encoder.h"
#include "base/be.h"
#include "base/buffer.h"
#include "codec/page_coding.h"
#include "nbd/read_index.h"
#include "wire/repl_proto.h"
#include "suites.h"

#define PS REPL_PAGE_SIZE
#define PAGES 8

struct rig {
	char disk_path[64];
	int disk_fd;
	struct read_index *index;
	struct page_encoder *enc;
	uint8_t backup[PAGES][PS]; /* the model backup's committed pages */
};

static void fill(uint8_t *p, uint64_t seed)
{
	uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;

	for (size_t i = 0; i < PS; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(p + i, &x, 8);
	}
}

static void rig_up(struct rig *r, bool compress, bool tracking)
{
	char err[256];

	memset(r, 0, sizeof(*r));
	snprintf(r->disk_path, sizeof(r->disk_path), "/tmp/asc-disk-XXXXXX");
	r->disk_fd = mkstemp(r->disk_path);
	CU_ASSERT_FATAL(r->disk_fd >= 0);
	CU_ASSERT_EQUAL_FATAL(ftruncate(r->disk_fd, 64 * PS), 0);
	if (tracking) {
		r->index = read_index_create(1 << 20);
		CU_ASSERT_PTR_NOT_NULL_FATAL(r->index);
	}
	struct asc_options opt = { .compress = compress, .index = r->index,
				   .disk_path = r->disk_path };
	r->enc = asc_encoder_create(&opt, err, sizeof(err));
	CU_ASSERT_PTR_NOT_NULL_FATAL(r->enc);
	CU_ASSERT_EQUAL(asc_encoder_set_guest_ram(r->enc, 64u << 20), 0);
	asc_encoder_allow_disk_refs_from(r->enc, 1); /* the disk copy is done */
}

static void rig_down(struct rig *r)
{
	asc_encoder_destroy(r->enc);
	read_index_destroy(r->index);
	close(r->disk_fd);
	unlink(r->disk_path);
}

/* The guest read disk block b, which holds `content`. */
static void guest_reads(struct rig *r, uint64_t b, const uint8_t *content)
{
	CU_ASSERT_EQUAL(pwrite(r->disk_fd, content, PS, (off_t)(b * PS)), PS);
	read_index_note_block(r->index, b, content);
}

/*
 * Encodes page `index` (NULL: zero) of `epoch` and applies the record to
 * the model backup; returns the record's kind.
 */
static uint8_t send_page_of(struct rig *r, uint64_t epoch, uint64_t index, const uint8_t *page)
{
	struct buffer b;
	const char *err = NULL;

	buffer_init(&b);
	CU_ASSERT_EQUAL_FATAL(r->enc->encode_page(r->enc->ctx, epoch, 0, index, page, &b), 0);
	const uint8_t *rec = buffer_head(&b);
	CU_ASSERT_EQUAL_FATAL(load_be64(rec), index);
	uint8_t kind = rec[8];
	uint64_t sum = load_be64(rec + 9);
	uint32_t len = load_be32(rec + 17);
	const uint8_t *data = rec + REPL_CODED_RECORD_HEADER;
	CU_ASSERT_EQUAL_FATAL(buffer_len(&b), REPL_CODED_RECORD_HEADER + len);
	CU_ASSERT(repl_coded_kind_length_ok(kind, len));
	uint8_t out[PS];
	switch (kind) {
	case REPL_KIND_RAW:
		memcpy(out, data, PS);
		break;
	case REPL_KIND_ZERO:
		memset(out, 0, PS);
		break;
	case REPL_KIND_DISK_REF: {
		XXH128_canonical_t canon;
		CU_ASSERT_EQUAL(pread(r->disk_fd, out, PS, (off_t)load_be64(data)), PS);
		XXH128_canonicalFromHash(&canon, XXH3_128bits(out, PS));
		CU_ASSERT_EQUAL(memcmp(canon.digest, data + 8, 16), 0);
		break;
	}
	default:
		CU_ASSERT_EQUAL_FATAL(page_decoder_default.decode_page(NULL, kind, r->backup[index],
								       data, len, out), 0);
	}
	(void)err;
	CU_ASSERT_EQUAL(page_checksum(out), sum);
	if (page)
		CU_ASSERT_EQUAL(memcmp(out, page, PS), 0);
	memcpy(r->backup[index], out, PS);
	buffer_free(&b);
	return kind;
}

static uint8_t send_page(struct rig *r, uint64_t index, const uint8_t *page)
{
	return send_page_of(r, 1, index, page);
}

static void test_deltas_track_the_backup(void)
{
	struct rig r;
	uint8_t page[PS];

	rig_up(&r, true, false);
	fill(page, 1);
	/* First sight: no cached copy, random bytes do not compress: raw. */
	CU_ASSERT_EQUAL(send_page(&r, 3, page), REPL_KIND_RAW);
	page[0] ^= 1;
	page[PS - 1] ^= 0x80;
	CU_ASSERT_EQUAL(send_page(&r, 3, page), REPL_KIND_XOR_RLE);
	/* Rewritten with the same bytes: an empty delta. */
	CU_ASSERT_EQUAL(send_page(&r, 3, page), REPL_KIND_XOR_RLE);
	/* A zero page, then data again: the delta is against the zeros the backup has. */
	CU_ASSERT_EQUAL(send_page(&r, 3, NULL), REPL_KIND_ZERO);
	memset(page, 0, PS);
	page[100] = 7;
	CU_ASSERT_EQUAL(send_page(&r, 3, page), REPL_KIND_XOR_RLE);
	/* Everything changed: no delta is smaller, a miss-style LZ4 or raw. */
	fill(page, 2);
	CU_ASSERT_EQUAL(send_page(&r, 3, page), REPL_KIND_RAW);
	/* A compressible page never cached goes as LZ4. */
	memset(page, 'a', PS);
	CU_ASSERT_EQUAL(send_page(&r, 5, page), REPL_KIND_LZ4);
	rig_down(&r);
}

/* A member of the encoder's status: "compression" or "read_tracking", then key. */
static json_int_t status_int(struct rig *r, const char *part, const char *key)
{
	json_t *o = json_object();

	r->enc->status(r->enc->ctx, o);
	json_int_t v = json_integer_value(json_object_get(json_object_get(o, part), key));
	json_decref(o);
	return v;
}

/* reset-stats: status counts from the reset on; the cache keeps its pages. */
static void test_status_counts_since_reset(void)
{
	struct rig r;
	uint8_t page[PS];

	rig_up(&r, true, true);
	fill(page, 9);
	CU_ASSERT_EQUAL(send_page(&r, 1, page), REPL_KIND_RAW);
	page[7] ^= 1;
	CU_ASSERT_EQUAL(send_page(&r, 1, page), REPL_KIND_XOR_RLE);
	CU_ASSERT_EQUAL(send_page(&r, 2, NULL), REPL_KIND_ZERO);
	r.enc->epoch_done(r.enc->ctx, 1);
	CU_ASSERT_EQUAL(status_int(&r, "compression", "pages_xor_rle"), 1);
	CU_ASSERT_EQUAL(status_int(&r, "compression", "pages_raw"), 1);
	CU_ASSERT_EQUAL(status_int(&r, "compression", "cache_hits"), 1);
	CU_ASSERT(status_int(&r, "read_tracking", "index_lookups") > 0);

	r.enc->reset_stats(r.enc->ctx);
	CU_ASSERT_EQUAL(status_int(&r, "compression", "pages_xor_rle"), 0);
	CU_ASSERT_EQUAL(status_int(&r, "compression", "pages_raw"), 0);
	CU_ASSERT_EQUAL(status_int(&r, "compression", "pages_zero"), 0);
	CU_ASSERT_EQUAL(status_int(&r, "compression", "cache_hits"), 0);
	CU_ASSERT_EQUAL(status_int(&r, "read_tracking", "index_lookups"), 0);
	CU_ASSERT_EQUAL(status_int(&r, "compression", "cache_pages"), 2); /* page 1 and the zero page 2 */

	page[8] ^= 1; /* still cached: a delta, and a hit counted from zero */
	CU_ASSERT_EQUAL(send_page(&r, 1, page), REPL_KIND_XOR_RLE);
	r.enc->epoch_done(r.enc->ctx, 2);
	CU_ASSERT_EQUAL(status_int(&r, "compression", "pages_xor_rle"), 1);
	CU_ASSERT_EQUAL(status_int(&r, "compression", "cache_hits"), 1);
	CU_ASSERT_EQUAL(status_int(&r, "compression", "pages_raw"), 0);
	rig_down(&r);
}

static json_int_t cache_budget(unsigned percent, uint64_t bytes)
{
	char err[256];
	struct asc_options opt = { .compress = true, .cache_percent = percent,
				   .cache_bytes = bytes };
	struct page_encoder *enc = asc_encoder_create(&opt, err, sizeof(err));

	CU_ASSERT_PTR_NOT_NULL_FATAL(enc);
	CU_ASSERT_EQUAL(asc_encoder_set_guest_ram(enc, 1000u << 20), 0);
	json_t *st = json_object();
	enc->status(enc->ctx, st);
	json_int_t budget = json_integer_value(json_object_get(
		json_object_get(st, "compression"), "cache_budget_bytes"));
	json_decref(st);
	asc_encoder_destroy(enc);
	return budget;
}

static void test_cache_budget_follows_the_settings(void)
{
	CU_ASSERT_EQUAL(cache_budget(0, 0), 100u << 20);   /* a tenth by default */
	CU_ASSERT_EQUAL(cache_budget(25, 0), 250u << 20);
	CU_ASSERT_EQUAL(cache_budget(25, 64u << 20), 64u << 20); /* a size wins */
}

static void test_off_sends_raw(void)
{
	struct rig r;
	uint8_t page[PS];

	rig_up(&r, false, false);
	memset(page, 'a', PS);
	CU_ASSERT_EQUAL(send_page(&r, 1, page), REPL_KIND_RAW);
	CU_ASSERT_EQUAL(send_page(&r, 1, page), REPL_KIND_RAW);
	rig_down(&r);
}

static void test_read_block_becomes_a_reference(void)
{
	struct rig r;
	uint8_t block[PS];

	rig_up(&r, true, true);
	fill(block, 9);
	guest_reads(&r, 17, block);
	CU_ASSERT_EQUAL(send_page(&r, 2, block), REPL_KIND_DISK_REF);
	rig_down(&r);
}

static void test_no_reference_before_the_disk_copy_ends(void)
{
	struct rig r;
	uint8_t block[PS];

	rig_up(&r, true, true);
	/* The copy's end travels in epoch 7: the backup's disk is whole from there. */
	asc_encoder_allow_disk_refs_from(r.enc, 7);
	fill(block, 9);
	guest_reads(&r, 17, block);
	CU_ASSERT_NOT_EQUAL(send_page_of(&r, 6, 2, block), REPL_KIND_DISK_REF);
	CU_ASSERT_EQUAL(send_page_of(&r, 7, 3, block), REPL_KIND_DISK_REF);
	json_t *st = json_object();
	r.enc->status(r.enc->ctx, st);
	json_t *rt = json_object_get(st, "read_tracking");
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(rt, "pages_before_disk_copy")), 1);
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(rt, "annotations")), 1);
	json_decref(st);
	rig_down(&r);
}

static void test_written_block_is_not_referenced(void)
{
	struct rig r;
	uint8_t block[PS];

	rig_up(&r, true, true);
	fill(block, 9);
	guest_reads(&r, 17, block);
	/* The guest writes the block through the disk: the index forgets it. */
	read_index_invalidate_range(r.index, 17 * PS + 100, 1);
	CU_ASSERT_NOT_EQUAL(send_page(&r, 2, block), REPL_KIND_DISK_REF);
	rig_down(&r);
}

static void test_page_modified_in_memory_is_sent(void)
{
	struct rig r;
	uint8_t block[PS];

	rig_up(&r, true, true);
	fill(block, 9);
	guest_reads(&r, 17, block);
	block[2000] ^= 0xff; /* the buffer page changed after the read */
	CU_ASSERT_NOT_EQUAL(send_page(&r, 2, block), REPL_KIND_DISK_REF);
	rig_down(&r);
}

static void test_hash_match_with_other_bytes_is_sent(void)
{
	struct rig r;
	uint8_t block[PS], other[PS];

	rig_up(&r, true, true);
	fill(block, 9);
	guest_reads(&r, 17, block);
	/*
	 * The disk changes behind the index's back (as a hash collision
	 * would look to the encoder): the byte comparison must refuse.
	 */
	fill(other, 10);
	CU_ASSERT_EQUAL(pwrite(r.disk_fd, other, PS, 17 * PS), PS);
	CU_ASSERT_NOT_EQUAL(send_page(&r, 2, block), REPL_KIND_DISK_REF);
	json_t *st = json_object();
	r.enc->status(r.enc->ctx, st);
	json_t *rt = json_object_get(st, "read_tracking");
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(rt, "hash_hits_bytes_differ")), 1);
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(rt, "annotations")), 0);
	json_decref(st);
	rig_down(&r);
}

int register_asc_encoder_tests(void)
{
	CU_pSuite suite = CU_add_suite("asc_encoder", NULL, NULL);

	if (!suite ||
	    !CU_add_test(suite, "deltas track the backup's copy", test_deltas_track_the_backup) ||
	    !CU_add_test(suite, "compression off sends raw", test_off_sends_raw) ||
	    !CU_add_test(suite, "the cache budget follows the settings",
			 test_cache_budget_follows_the_settings) ||
	    !CU_add_test(suite, "status counts since reset-stats", test_status_counts_since_reset) ||
	    !CU_add_test(suite, "a read block becomes a disk reference",
			 test_read_block_becomes_a_reference) ||
	    !CU_add_test(suite, "no disk reference before the disk copy ends",
			 test_no_reference_before_the_disk_copy_ends) ||
	    !CU_add_test(suite, "a block written after the read is not referenced",
			 test_written_block_is_not_referenced) ||
	    !CU_add_test(suite, "a page changed in memory is sent",
			 test_page_modified_in_memory_is_sent) ||
	    !CU_add_test(suite, "a hash match with other bytes is sent",
			 test_hash_match_with_other_bytes_is_sent))
		return -1;
	return 0;
}
