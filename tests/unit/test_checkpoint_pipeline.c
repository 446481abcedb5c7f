/*
 * The primary's checkpoint pipeline and its wire order: the sequencer
 * (disk frames of epoch N+1 issued while N is being coded follow
 * EPOCH_END N, and each EPOCH_END's digest is what the backup computes
 * over the frames it received), and the pipeline (pages copied, coded on
 * its worker thread, delivered on the event loop through its eventfd,
 * kept until acknowledged, and torn down cleanly mid-epoch).
 */
#include <CUnit/CUnit.h>
#include <stdlib.h>
#include <string.h>

#include "base/buffer.h"
#include "codec/device_delta.h"
#include "primary/checkpoint_pipeline.h"
#include "primary/checkpoint_sequencer.h"
#include "base/event_loop.h"
#include "codec/page_coding.h"
#include "wire/repl_proto.h"
#include "suites.h"

/* ---- the sequencer ------------------------------------------------------- */

struct wire {
	struct buffer b;
	unsigned flushes;
	unsigned epoch_ends;
};

static struct buffer *wire_buf(void *opaque)
{
	return &((struct wire *)opaque)->b;
}

static void wire_flush(void *opaque)
{
	((struct wire *)opaque)->flushes++;
}

static void wire_epoch_end(void *opaque, const struct repl_epoch_end *e)
{
	((struct wire *)opaque)->epoch_ends++;
}

/* A disk write of `epoch` through the sequencer, as disk_copy does it. */
static void put_write(struct checkpoint_sequencer *seq, uint64_t epoch, uint64_t offset, uint8_t fill)
{
	uint8_t d[64];
	struct buffer *b = checkpoint_sequencer_buffer(seq, epoch);

	memset(d, fill, sizeof(d));
	CU_ASSERT_PTR_NOT_NULL_FATAL(b);
	size_t before = buffer_len(b);
	CU_ASSERT_EQUAL_FATAL(repl_put_disk_write(b, epoch, offset, d, sizeof(d)), 0);
	CU_ASSERT_EQUAL_FATAL(checkpoint_sequencer_appended(seq, epoch, before), 0);
}

/* An epoch's coded frames, as the pipeline's worker would produce them. */
static void coded_frames(struct buffer *b, uint64_t epoch, uint64_t index)
{
	struct repl_coded_builder cb;
	uint8_t page[REPL_PAGE_SIZE];

	memset(page, (int)epoch, sizeof(page));
	CU_ASSERT_EQUAL_FATAL(repl_coded_begin(&cb, b, epoch, 0), 0);
	size_t before = buffer_len(b);
	CU_ASSERT_EQUAL_FATAL(page_encoder_default.encode_page(NULL, epoch, 0, index, page, b), 0);
	CU_ASSERT_EQUAL_FATAL(repl_coded_note(&cb, before), 0);
	repl_coded_end(&cb);
	CU_ASSERT_EQUAL_FATAL(repl_put_device(b, epoch, 4, 0, (const uint8_t *)"QEVM", 4), 0);
}

/* What a frame says its epoch is (DISK_WRITE, PAGES_CODED, DEVICE, EPOCH_END), or -1. */
static int64_t frame_epoch(const struct repl_frame *f)
{
	switch (f->type) {
	case REPL_DISK_WRITE:
	case REPL_PAGES_CODED:
	case REPL_DEVICE:
	case REPL_EPOCH_END:
		return (int64_t)((uint64_t)f->payload[6] << 8 | f->payload[7]);
	default:
		return -1;
	}
}

/*
 * Reads the wire as the backup does: every covered frame carries the
 * epoch of the next EPOCH_END (or 1 during the bulk), and each EPOCH_END's
 * digest equals the one over the covered frames since the previous one.
 * Returns the EPOCH_ENDs seen, in order, in ends[].
 */
static size_t check_wire(const struct buffer *b, uint64_t *ends, size_t max)
{
	struct repl_digest d;
	size_t pos = 0, n = 0;
	uint64_t open = 0; /* the span being read */

	CU_ASSERT_EQUAL_FATAL(repl_digest_init(&d), 0);
	while (pos < buffer_len(b)) {
		struct repl_frame f;
		const char *err;
		ssize_t used = repl_frame_parse(buffer_head(b) + pos, buffer_len(b) - pos, &f, &err);

		CU_ASSERT_FATAL(used > 0);
		pos += (size_t)used;
		if (f.type == REPL_EPOCH_END) {
			struct repl_epoch_end e;
			CU_ASSERT_EQUAL_FATAL(repl_decode_epoch_end(&f, &e, &err), 0);
			CU_ASSERT_EQUAL(e.epoch, open);
			CU_ASSERT_EQUAL(e.checksum, repl_digest_value(&d));
			CU_ASSERT_EQUAL(e.bytes, d.bytes);
			repl_digest_reset(&d);
			if (n < max)
				ends[n++] = e.epoch;
			open = e.epoch + 1;
			continue;
		}
		int64_t tag = frame_epoch(&f);
		/* Tag N inside span N; tag 1 is also allowed inside the bulk's span 0. */
		if (tag >= 0)
			CU_ASSERT((uint64_t)tag == open || (open == 0 && tag == 1));
		repl_digest_add_frame(&d, &f);
	}
	repl_digest_free(&d);
	return n;
}

static void test_sequencer_order_and_digest(void)
{
	struct wire w = { 0 };
	struct checkpoint_sequencer_io io = {
		.opaque = &w, .wire = wire_buf, .flush = wire_flush, .on_epoch_end = wire_epoch_end,
	};
	struct buffer job;
	uint64_t ends[8];

	buffer_init(&w.b);
	buffer_init(&job);
	struct checkpoint_sequencer *seq = checkpoint_sequencer_create(&io);
	CU_ASSERT_PTR_NOT_NULL_FATAL(seq);

	/* The bulk (span 0) streams; writes tagged 1 go straight out beside it. */
	CU_ASSERT_EQUAL(checkpoint_sequencer_head(seq), 0);
	put_write(seq, 1, 0, 'a');
	CU_ASSERT_EQUAL(checkpoint_sequencer_held(seq), 0);
	CU_ASSERT_PTR_NULL(checkpoint_sequencer_buffer(seq, 2)); /* not open yet */
	CU_ASSERT_EQUAL(checkpoint_sequencer_cut(seq, 1), -1);   /* the bulk is not over */
	CU_ASSERT_EQUAL(checkpoint_sequencer_end(seq, 0, NULL, 0, 5), 0);
	CU_ASSERT_EQUAL(w.epoch_ends, 1);
	CU_ASSERT_PTR_NULL(checkpoint_sequencer_buffer(seq, 0));

	/* Checkpoint 1: while it is coded, epoch 2's writes wait in its outbox. */
	put_write(seq, 1, 64, 'b');
	CU_ASSERT_EQUAL(checkpoint_sequencer_cut(seq, 1), 0);
	CU_ASSERT_PTR_NULL(checkpoint_sequencer_buffer(seq, 1)); /* cut: no more writes */
	size_t on_wire = buffer_len(&w.b);
	put_write(seq, 2, 128, 'c');
	put_write(seq, 2, 192, 'd');
	CU_ASSERT_EQUAL(buffer_len(&w.b), on_wire);
	CU_ASSERT(checkpoint_sequencer_held(seq) > 0);

	/* Checkpoint 2 is cut before 1 is coded, and even coded first. */
	CU_ASSERT_EQUAL(checkpoint_sequencer_cut(seq, 2), 0);
	put_write(seq, 3, 256, 'e');
	coded_frames(&job, 2, 40);
	CU_ASSERT_EQUAL(checkpoint_sequencer_end(seq, 2, buffer_head(&job), buffer_len(&job), 1), 0);
	CU_ASSERT_EQUAL(buffer_len(&w.b), on_wire); /* still behind epoch 1 */
	CU_ASSERT_EQUAL(w.epoch_ends, 1);
	CU_ASSERT_EQUAL(checkpoint_sequencer_end(seq, 2, NULL, 0, 1), -1); /* twice */

	buffer_clear(&job);
	coded_frames(&job, 1, 30);
	CU_ASSERT_EQUAL(checkpoint_sequencer_end(seq, 1, buffer_head(&job), buffer_len(&job), 1), 0);
	/* 1 and 2 are out; 3 is the head and its write moved onto the wire. */
	CU_ASSERT_EQUAL(w.epoch_ends, 3);
	CU_ASSERT_EQUAL(checkpoint_sequencer_head(seq), 3);
	CU_ASSERT_EQUAL(checkpoint_sequencer_held(seq), 0);
	put_write(seq, 3, 320, 'f');
	CU_ASSERT_EQUAL(checkpoint_sequencer_cut(seq, 3), 0);
	buffer_clear(&job);
	coded_frames(&job, 3, 50);
	CU_ASSERT_EQUAL(checkpoint_sequencer_end(seq, 3, buffer_head(&job), buffer_len(&job), 1), 0);

	size_t n = check_wire(&w.b, ends, 8);
	CU_ASSERT_EQUAL(n, 4);
	for (size_t i = 0; i < n; i++)
		CU_ASSERT_EQUAL(ends[i], i);
	CU_ASSERT(w.flushes > 0);

	/* Torn down with an epoch half-way: nothing leaks. */
	CU_ASSERT_EQUAL(checkpoint_sequencer_cut(seq, 4), 0);
	put_write(seq, 5, 0, 'g');
	checkpoint_sequencer_destroy(seq);
	buffer_free(&job);
	buffer_free(&w.b);
}

/* ---- the pipeline --------------------------------------------------------- */

struct delivered {
	struct checkpoint_pipeline *pl;
	unsigned count;
	uint64_t epochs[8];
	bool destroy_inside;
	bool errors;
	struct buffer frames;
};

static void on_encoded(void *opaque, struct checkpoint_job *job)
{
	struct delivered *d = opaque;
	size_t len;
	const uint8_t *frames = checkpoint_job_frames(job, &len);

	if (d->count < 8)
		d->epochs[d->count] = checkpoint_job_epoch(job);
	d->count++;
	d->errors |= checkpoint_job_error(job) != NULL;
	if (len)
		buffer_append(&d->frames, frames, len);
	if (d->destroy_inside) {
		checkpoint_pipeline_destroy(d->pl);
		d->pl = NULL;
	}
}

static bool run_until(event_loop *loop, const struct delivered *d, unsigned count)
{
	int64_t deadline = monotonic_ms() + 10000;

	while (d->count < count) {
		if (monotonic_ms() > deadline)
			return false;
		event_loop_run_once(loop, 10);
	}
	return true;
}

static void test_pipeline_codes_on_its_thread(void)
{
	event_loop *loop = event_loop_create();
	struct delivered d = { 0 };
	char err[128];
	uint8_t page[REPL_PAGE_SIZE], other[REPL_PAGE_SIZE];
	const uint8_t *found;

	CU_ASSERT_PTR_NOT_NULL_FATAL(loop);
	buffer_init(&d.frames);
	d.pl = checkpoint_pipeline_create(loop, &page_encoder_default, on_encoded, &d, err, sizeof(err));
	CU_ASSERT_PTR_NOT_NULL_FATAL(d.pl);
	memset(page, 0x11, sizeof(page));
	memset(other, 0x22, sizeof(other));

	CU_ASSERT_EQUAL(checkpoint_pipeline_add_page(d.pl, 0, 1, page), -1); /* no open job */
	CU_ASSERT_EQUAL(checkpoint_pipeline_open(d.pl, 1), 0);
	CU_ASSERT_EQUAL(checkpoint_pipeline_open(d.pl, 2), -1); /* one at a time */
	/* 600 pages: more than one arena chunk; a revisit (index 3 again) and a zero page. */
	for (uint64_t i = 0; i < 600; i++)
		CU_ASSERT_EQUAL(checkpoint_pipeline_add_page(d.pl, 0, i, i == 5 ? NULL : page), 0);
	CU_ASSERT_EQUAL(checkpoint_pipeline_add_page(d.pl, 0, 3, other), 0);
	CU_ASSERT_EQUAL(checkpoint_pipeline_add_page(d.pl, 1, 0, other), 0);
	CU_ASSERT_EQUAL(checkpoint_pipeline_add_device(d.pl, 8, 0, (const uint8_t *)"QEVMQEVM", 8), 0);
	memset(page, 0x33, sizeof(page)); /* the job holds its own copy */
	CU_ASSERT_EQUAL(checkpoint_pipeline_submit(d.pl), 0);
	CU_ASSERT_EQUAL(checkpoint_pipeline_encoding(d.pl), 1);
	CU_ASSERT_EQUAL(checkpoint_pipeline_open(d.pl, 2), 0);
	CU_ASSERT_EQUAL(checkpoint_pipeline_add_page(d.pl, 0, 9, other), 0);
	CU_ASSERT_EQUAL(checkpoint_pipeline_submit(d.pl), 0);
	CU_ASSERT_FATAL(run_until(loop, &d, 2));
	CU_ASSERT_FALSE(d.errors);
	CU_ASSERT_EQUAL(d.epochs[0], 1);
	CU_ASSERT_EQUAL(d.epochs[1], 2);
	CU_ASSERT_EQUAL(checkpoint_pipeline_encoding(d.pl), 0);

	/* The frames decode, every page hashes to its record's checksum. */
	size_t pos = 0, records = 0, zero = 0, device = 0;
	while (pos < buffer_len(&d.frames)) {
		struct repl_frame f;
		const char *perr;
		ssize_t n = repl_frame_parse(buffer_head(&d.frames) + pos,
					     buffer_len(&d.frames) - pos, &f, &perr);
		CU_ASSERT_FATAL(n > 0);
		pos += (size_t)n;
		if (f.type == REPL_DEVICE) {
			device++;
			continue;
		}
		CU_ASSERT_EQUAL_FATAL(f.type, REPL_PAGES_CODED);
		CU_ASSERT(f.length <= CHECKPOINT_PIPELINE_FRAME_MAX);
		struct repl_pages_coded pc;
		CU_ASSERT_EQUAL_FATAL(repl_decode_pages_coded(&f, &pc, &perr), 0);
		struct repl_coded_iter it;
		struct repl_coded_page cp;
		repl_coded_iter_init(&it, &pc);
		while (repl_coded_iter_next(&it, &cp)) {
			records++;
			zero += cp.kind == REPL_KIND_ZERO;
			CU_ASSERT_EQUAL(cp.checksum,
					page_checksum(cp.kind == REPL_KIND_ZERO ? NULL : cp.data));
		}
	}
	CU_ASSERT_EQUAL(records, 603);
	CU_ASSERT_EQUAL(zero, 1);
	CU_ASSERT_EQUAL(device, 1);

	/* Kept until acknowledged: the last copy of a page is what a resend sends. */
	CU_ASSERT_EQUAL(checkpoint_pipeline_find_page(d.pl, 1, 0, 3, &found), 1);
	CU_ASSERT_EQUAL(memcmp(found, other, REPL_PAGE_SIZE), 0);
	CU_ASSERT_EQUAL(checkpoint_pipeline_find_page(d.pl, 1, 0, 5, &found), 1);
	CU_ASSERT_PTR_NULL(found);
	CU_ASSERT_EQUAL(checkpoint_pipeline_find_page(d.pl, 1, 0, 7, &found), 1);
	CU_ASSERT_EQUAL(found[0], 0x11);
	CU_ASSERT_EQUAL(checkpoint_pipeline_find_page(d.pl, 1, 1, 5, &found), 0);
	CU_ASSERT_EQUAL(checkpoint_pipeline_find_page(d.pl, 7, 0, 5, &found), 0);
	checkpoint_pipeline_acked(d.pl, 1);
	CU_ASSERT_EQUAL(checkpoint_pipeline_find_page(d.pl, 1, 0, 3, &found), 0);
	CU_ASSERT_EQUAL(checkpoint_pipeline_find_page(d.pl, 2, 0, 9, &found), 1);

	/* Torn down with a job open and one submitted: joined, nothing leaks. */
	CU_ASSERT_EQUAL(checkpoint_pipeline_open(d.pl, 3), 0);
	CU_ASSERT_EQUAL(checkpoint_pipeline_add_page(d.pl, 0, 1, other), 0);
	CU_ASSERT_EQUAL(checkpoint_pipeline_submit(d.pl), 0);
	CU_ASSERT_EQUAL(checkpoint_pipeline_open(d.pl, 4), 0);
	CU_ASSERT_EQUAL(checkpoint_pipeline_add_page(d.pl, 0, 1, other), 0);
	checkpoint_pipeline_destroy(d.pl);
	buffer_free(&d.frames);
	event_loop_destroy(loop);
}

/* One epoch of n copies of page through the pipeline, delivered (not acknowledged). */
static void one_epoch(event_loop *loop, struct delivered *d, uint64_t epoch, unsigned n,
		      const uint8_t *page)
{
	unsigned before = d->count;

	CU_ASSERT_EQUAL_FATAL(checkpoint_pipeline_open(d->pl, epoch), 0);
	for (unsigned i = 0; i < n; i++)
		CU_ASSERT_EQUAL_FATAL(checkpoint_pipeline_add_page(d->pl, 0, i, page), 0);
	CU_ASSERT_EQUAL_FATAL(checkpoint_pipeline_submit(d->pl), 0);
	CU_ASSERT_FATAL(run_until(loop, d, before + 1));
}

/*
 * The pipeline's memory account (status "memory"): an epoch's raw pages
 * count from the pause until their acknowledgement, its coded frames
 * from the worker on; a recycled job keeps its count, and steady epochs
 * of one size leave it where it was (a count that missed a release
 * would creep up); a job freed past the pool takes its count along.
 */
static void test_pipeline_accounts_its_memory(void)
{
	event_loop *loop = event_loop_create();
	struct delivered d = { 0 };
	char err[128];
	uint8_t page[REPL_PAGE_SIZE];
	uint64_t peak, raw = 300ull * REPL_PAGE_SIZE;

	CU_ASSERT_PTR_NOT_NULL_FATAL(loop);
	buffer_init(&d.frames);
	d.pl = checkpoint_pipeline_create(loop, &page_encoder_default, on_encoded, &d, err, sizeof(err));
	CU_ASSERT_PTR_NOT_NULL_FATAL(d.pl);
	memset(page, 0x5a, sizeof(page));
	CU_ASSERT_EQUAL(checkpoint_pipeline_memory(d.pl, &peak), 0);
	CU_ASSERT_EQUAL(peak, 0);

	/* In the pause: 300 pages take two 1 MiB chunks and a page table. */
	CU_ASSERT_EQUAL_FATAL(checkpoint_pipeline_open(d.pl, 1), 0);
	for (unsigned i = 0; i < 300; i++)
		CU_ASSERT_EQUAL_FATAL(checkpoint_pipeline_add_page(d.pl, 0, i, page), 0);
	uint64_t paused = checkpoint_pipeline_memory(d.pl, NULL);
	CU_ASSERT(paused >= 2u << 20);
	CU_ASSERT(paused < (2u << 20) + (64u << 10));
	CU_ASSERT_EQUAL_FATAL(checkpoint_pipeline_submit(d.pl), 0);
	CU_ASSERT_FATAL(run_until(loop, &d, 1));
	/* Coded (raw records with the default encoder): the frames count too. */
	uint64_t coded = checkpoint_pipeline_memory(d.pl, &peak);
	CU_ASSERT(coded >= paused + raw);
	CU_ASSERT(peak >= coded);

	/* Acknowledged: the job goes to the pool with its allocations. */
	checkpoint_pipeline_acked(d.pl, 1);
	uint64_t pooled = checkpoint_pipeline_memory(d.pl, NULL);
	CU_ASSERT(pooled <= coded);
	CU_ASSERT(pooled >= 2u << 20);
	/* Steady epochs of one size: the count comes back to the same place. */
	for (uint64_t e = 2; e <= 4; e++) {
		one_epoch(loop, &d, e, 300, page);
		CU_ASSERT_EQUAL(checkpoint_pipeline_memory(d.pl, NULL), coded);
		checkpoint_pipeline_acked(d.pl, e);
		CU_ASSERT_EQUAL(checkpoint_pipeline_memory(d.pl, NULL), pooled);
	}

	/* Three unacknowledged epochs: three jobs held; the pool keeps two. */
	for (uint64_t e = 5; e <= 7; e++)
		one_epoch(loop, &d, e, 300, page);
	uint64_t three = checkpoint_pipeline_memory(d.pl, &peak);
	CU_ASSERT(three >= 3 * (paused + raw));
	CU_ASSERT_EQUAL(peak, three);
	checkpoint_pipeline_acked(d.pl, 7);
	uint64_t two_pooled = checkpoint_pipeline_memory(d.pl, &peak);
	CU_ASSERT(two_pooled < three - (paused + raw) + (64u << 10));
	CU_ASSERT(two_pooled >= 2 * pooled - (64u << 10));
	CU_ASSERT_EQUAL(peak, three); /* the peak stays */

	checkpoint_pipeline_destroy(d.pl);
	buffer_free(&d.frames);
	event_loop_destroy(loop);
}

/* The owner may tear the pipeline down from inside its own callback. */
static void test_pipeline_destroyed_from_its_callback(void)
{
	event_loop *loop = event_loop_create();
	struct delivered d = { .destroy_inside = true };
	char err[128];
	uint8_t page[REPL_PAGE_SIZE] = { 1 };

	CU_ASSERT_PTR_NOT_NULL_FATAL(loop);
	buffer_init(&d.frames);
	d.pl = checkpoint_pipeline_create(loop, &page_encoder_default, on_encoded, &d, err, sizeof(err));
	CU_ASSERT_PTR_NOT_NULL_FATAL(d.pl);
	for (uint64_t e = 1; e <= 2; e++) {
		CU_ASSERT_EQUAL(checkpoint_pipeline_open(d.pl, e), 0);
		CU_ASSERT_EQUAL(checkpoint_pipeline_add_page(d.pl, 0, 1, page), 0);
		CU_ASSERT_EQUAL(checkpoint_pipeline_submit(d.pl), 0);
	}
	CU_ASSERT(run_until(loop, &d, 1));
	CU_ASSERT_PTR_NULL(d.pl);
	/* Destroyed after the first: the second is never delivered. */
	int64_t until = monotonic_ms() + 100;
	while (monotonic_ms() < until)
		event_loop_run_once(loop, 10);
	CU_ASSERT_EQUAL(d.count, 1);
	buffer_free(&d.frames);
	event_loop_destroy(loop);
}

/* Epoch e's device blob: 40 KB that change in two bytes from one epoch to the next. */
static void device_blob(uint8_t *blob, size_t len, uint64_t e)
{
	for (size_t i = 0; i < len; i++)
		blob[i] = (uint8_t)(i * 13);
	blob[100] = (uint8_t)e;
	blob[len - 1] = (uint8_t)(e * 7);
}

/*
 * Runs three epochs with device state through a pipeline and rebuilds each
 * epoch's blob from the frames the way the backup does, against the blob
 * rebuilt for the epoch before.  Returns the DEVICE_DELTA frames seen.
 */
static unsigned device_epochs(bool delta, uint64_t *sent)
{
	enum { LEN = 40000 };
	event_loop *loop = event_loop_create();
	struct delivered d = { 0 };
	char err[128];
	static uint8_t blob[LEN], committed[LEN], decoded[LEN];
	size_t committed_len = 0;
	unsigned deltas = 0;

	CU_ASSERT_PTR_NOT_NULL_FATAL(loop);
	buffer_init(&d.frames);
	d.pl = checkpoint_pipeline_create(loop, &page_encoder_default, on_encoded, &d, err, sizeof(err));
	CU_ASSERT_PTR_NOT_NULL_FATAL(d.pl);
	checkpoint_pipeline_delta_device(d.pl, delta);
	*sent = 0;
	for (uint64_t e = 1; e <= 3; e++) {
		device_blob(blob, LEN, e);
		CU_ASSERT_EQUAL(checkpoint_pipeline_open(d.pl, e), 0);
		/* In two chunks, as QEMU's stream delivers it; a chunk out of order is refused. */
		CU_ASSERT_EQUAL(checkpoint_pipeline_add_device(d.pl, LEN, 0, blob, 1000), 0);
		CU_ASSERT_EQUAL(checkpoint_pipeline_add_device(d.pl, LEN, 2000, blob + 2000, 10), -1);
		CU_ASSERT_EQUAL(checkpoint_pipeline_add_device(d.pl, LEN + 1, 1000, blob + 1000, 10), -1);
		CU_ASSERT_EQUAL(checkpoint_pipeline_add_device(d.pl, LEN, 1000, blob + 1000, LEN - 1000), 0);
		CU_ASSERT_EQUAL(checkpoint_pipeline_submit(d.pl), 0);
		CU_ASSERT_FATAL(run_until(loop, &d, (unsigned)e));
		CU_ASSERT_FALSE(d.errors);

		size_t pos = 0, have = 0;
		while (pos < buffer_len(&d.frames)) {
			struct repl_frame f;
			const char *perr = NULL;
			ssize_t n = repl_frame_parse(buffer_head(&d.frames) + pos,
						     buffer_len(&d.frames) - pos, &f, &perr);
			CU_ASSERT_FATAL(n > 0);
			pos += (size_t)n;
			if (f.type == REPL_DEVICE) {
				struct repl_device dv;
				CU_ASSERT_EQUAL_FATAL(repl_decode_device(&f, &dv, &perr), 0);
				CU_ASSERT_EQUAL_FATAL(dv.offset, have);
				memcpy(decoded + dv.offset, dv.data, dv.len);
				have += dv.len;
			} else if (f.type == REPL_DEVICE_DELTA) {
				struct repl_device_delta dd;
				CU_ASSERT_EQUAL_FATAL(repl_decode_device_delta(&f, &dd, &perr), 0);
				CU_ASSERT_EQUAL(dd.base_len, committed_len);
				CU_ASSERT_EQUAL_FATAL(device_delta_decode(dd.records, dd.records_len,
									  committed, committed_len,
									  decoded, LEN, &perr), 0);
				have = LEN;
				deltas++;
			}
		}
		CU_ASSERT_EQUAL(have, LEN);
		CU_ASSERT_EQUAL(memcmp(decoded, blob, LEN), 0);
		memcpy(committed, decoded, LEN);
		committed_len = LEN;
		*sent += buffer_len(&d.frames);
		buffer_clear(&d.frames);
		checkpoint_pipeline_acked(d.pl, e);
	}
	checkpoint_pipeline_destroy(d.pl);
	buffer_free(&d.frames);
	event_loop_destroy(loop);
	return deltas;
}

static void test_pipeline_codes_device_state(void)
{
	uint64_t whole, coded;

	/* Off (the unoptimized baseline): every epoch's blob goes whole. */
	CU_ASSERT_EQUAL(device_epochs(false, &whole), 0);
	CU_ASSERT(whole > 3 * 40000);
	/* On: the first blob goes whole, the next two as deltas of a few hundred bytes. */
	CU_ASSERT_EQUAL(device_epochs(true, &coded), 2);
	CU_ASSERT(coded < 40000 + 2 * 1000);
}

/* An encoder hook that breaks the record format fails the job, not the stream. */
static int bad_encoder(void *ctx, uint64_t epoch, unsigned block, uint64_t index,
		       const uint8_t *page, struct buffer *out)
{
	return buffer_append(out, "junk", 4);
}

static void test_pipeline_rejects_a_bad_encoder(void)
{
	event_loop *loop = event_loop_create();
	struct delivered d = { 0 };
	struct page_encoder enc = { .encode_page = bad_encoder };
	char err[128];

	CU_ASSERT_PTR_NOT_NULL_FATAL(loop);
	buffer_init(&d.frames);
	d.pl = checkpoint_pipeline_create(loop, &enc, on_encoded, &d, err, sizeof(err));
	CU_ASSERT_PTR_NOT_NULL_FATAL(d.pl);
	CU_ASSERT_EQUAL(checkpoint_pipeline_open(d.pl, 1), 0);
	CU_ASSERT_EQUAL(checkpoint_pipeline_add_page(d.pl, 0, 1, NULL), 0);
	CU_ASSERT_EQUAL(checkpoint_pipeline_submit(d.pl), 0);
	CU_ASSERT(run_until(loop, &d, 1));
	CU_ASSERT_TRUE(d.errors);
	checkpoint_pipeline_destroy(d.pl);
	buffer_free(&d.frames);
	event_loop_destroy(loop);
}

int register_checkpoint_pipeline_tests(void)
{
	CU_pSuite suite = CU_add_suite("checkpoint_pipeline", NULL, NULL);

	if (!suite ||
	    !CU_add_test(suite, "sequencer: epoch order and digests",
			 test_sequencer_order_and_digest) ||
	    !CU_add_test(suite, "pipeline codes on its thread", test_pipeline_codes_on_its_thread) ||
	    !CU_add_test(suite, "pipeline codes device state", test_pipeline_codes_device_state) ||
	    !CU_add_test(suite, "pipeline accounts its memory", test_pipeline_accounts_its_memory) ||
	    !CU_add_test(suite, "pipeline destroyed from its callback",
			 test_pipeline_destroyed_from_its_callback) ||
	    !CU_add_test(suite, "pipeline rejects a bad encoder",
			 test_pipeline_rejects_a_bad_encoder))
		return -1;
	return 0;
}
