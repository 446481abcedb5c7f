/*
 * The pluggable per-page coding steps of the replication stream, one on
 * each side, and the defaults that ship with the pipeline.
 *
 * Why hooks: the page encodings that save bandwidth (XOR+RLE against a
 * cache of sent pages, LZ4, disk references from read tracking) are
 * separate pieces of work; the pipeline (checkpoint_pipeline.h) and the
 * backup (replica_stream.c) only need to know how to call them.  The
 * default encoder codes a zero page as ZERO and any other as RAW (the
 * daemon uses asc_encoder.h); the default decoder decodes XOR_RLE and
 * LZ4 (page_delta.h), and a page it refuses is answered with a
 * PAGE_REQUEST, never a crash.
 */
#ifndef REMUSDB_PAGE_CODING_H
#define REMUSDB_PAGE_CODING_H

#include <jansson.h>
#include <stdint.h>

#include "base/buffer.h"
#include "wire/repl_proto.h"

/*
 * The primary's encoder.  Everything except status runs on the
 * pipeline's worker thread, one epoch after the other in epoch order,
 * pages in the order the checkpoint delivered them, while the event loop
 * goes on: state the encoder shares with the loop (the read index that
 * NBD reads fill and writes invalidate, for DISK_REF) needs a lock.  A
 * disk reference is resolved by the backup against the disk as epoch N
 * leaves it, while the worker looks the index up later (the guest may
 * have written in N+1 meanwhile); the backup's hash check makes that a
 * fallback, never a wrong page.
 */
struct page_encoder {
	void *ctx;
	/*
	 * Appends exactly one coded-page record for the page to out, with
	 * repl_put_coded_page(): its kind, its data and the XXH3-64 of the
	 * page as the backup must have it after decoding (page_checksum()).
	 * page is NULL for a zero page, else 4096 bytes valid during the
	 * call.  An XOR_RLE/LZ4 record is decoded by the backup against
	 * the page as of the last epoch it committed, so an encoder's
	 * reference must be what it sent for that page before.  Returns 0,
	 * or -1 (out of memory): the epoch cannot be sent and the link ends.
	 */
	int (*encode_page)(void *ctx, uint64_t epoch, unsigned block, uint64_t page_index,
			   const uint8_t *page, struct buffer *out);
	/* Optional: the last page of `epoch` was coded. */
	void (*epoch_done)(void *ctx, uint64_t epoch);
	/*
	 * Optional, on the event loop: adds the encoder's own members
	 * (cache hit rate, RT annotations, ...) to the status object.  The
	 * encoder synchronises with its worker-thread state itself.
	 */
	void (*status)(void *ctx, json_t *obj);
	/*
	 * Optional, on the event loop: `reset-stats` ran, so status counts
	 * from now on (cache and index contents stay as they are).
	 */
	void (*reset_stats)(void *ctx);
	/*
	 * Optional, on the event loop: the bytes the encoder holds allocated
	 * (ASC's page cache), for the primary's memory account.
	 */
	uint64_t (*memory_bytes)(void *ctx);
};

/*
 * The backup's decoder for kinds that need more than the record
 * (XOR_RLE, LZ4).  base is the page as of the last committed epoch
 * (4096 bytes; zeros for a page never written).  Writes the page to out
 * and returns 0, or -1 when it cannot decode it (unknown to it, or bad
 * data): the backup then asks for the page again.  Runs on the event loop.
 */
struct page_decoder {
	void *ctx;
	int (*decode_page)(void *ctx, uint8_t kind, const uint8_t *base, const uint8_t *data,
			   uint32_t len, uint8_t out[REPL_PAGE_SIZE]);
};

/* ZERO for a zero page, RAW otherwise. */
extern const struct page_encoder page_encoder_default;
/* Decodes XOR_RLE and LZ4 (page_delta.h); a page it refuses is requested again. */
extern const struct page_decoder page_decoder_default;

/* XXH3-64 (seed 0) of a page; page NULL stands for a zero page. */
uint64_t page_checksum(const uint8_t *page);
/* True when all 4096 bytes are 0. */
bool page_is_zero(const uint8_t *page);

#endif
