/*
 * The primary's page encoder with RemusDB's two memory optimizations
 * (thesis sections 3.4 and 3.7), plugged into the checkpoint pipeline as
 * its page_encoder (page_coding.h):
 *
 *   - ASC: a dirty page found in an LRU cache of the pages last sent
 *     (page_cache.h) goes as an XOR+RLE delta against that copy, which is
 *     the backup's committed copy too; a miss goes LZ4-compressed or raw,
 *     whichever is smaller (page_delta.h).  Every page sent is cached.
 *   - RT: a dirty page whose XXH3-128 matches a disk block the guest read
 *     and has not written since (read_index.h) goes as a disk reference.
 *     Before it does, the encoder reads that block from the VM's disk and
 *     compares all 4096 bytes, so a hash collision can never make the
 *     backup take a wrong page; the backup checks the hash once more
 *     against its own replica as the epoch leaves it.
 *
 * Everything but asc_encoder_set_guest_ram() and the status hook runs on
 * the pipeline's one worker thread.
 */
#ifndef REMUSDB_ASC_ENCODER_H
#define REMUSDB_ASC_ENCODER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codec/page_coding.h"

struct read_index;

struct asc_options {
	bool compress;              /* ASC */
	uint64_t cache_bytes;       /* the LRU cache; 0: cache_percent of guest RAM */
	unsigned cache_percent;     /* 1-100; 0: 10, RemusDB's default */
	struct read_index *index;   /* RT: NULL = off; borrowed, thread-safe */
	const char *disk_path;      /* the VM's disk image, read to confirm RT matches */
	/*
	 * For `remusdb-bench compress`: every dirty page that has a cached
	 * previous version is appended with it to this page trace
	 * (page_trace.h), up to trace_max_records.  NULL: none.
	 */
	const char *trace_path;
	uint64_t trace_max_records;
};

/* The encoder behind a page_encoder; NULL with err filled. */
struct page_encoder *asc_encoder_create(const struct asc_options *opt, char *err,
					size_t errlen);
void asc_encoder_destroy(struct page_encoder *enc); /* NULL is a no-op */

/*
 * The guest's RAM size, known from the RAM layout: sizes the default
 * cache.  Called on the event loop before the first checkpoint is coded
 * (the bulk copy comes first); 0, or -1 when the cache cannot be had.
 */
int asc_encoder_set_guest_ram(struct page_encoder *enc, uint64_t bytes);

/*
 * RT: pages of epochs from `epoch` on may be sent as disk references.
 * Until this is called none are: while the initial disk copy runs, the
 * backup's disk lacks the blocks the copy has not reached, so a reference
 * to one would fail its check there and cost a resend.  The caller passes
 * the epoch whose stream carries the copy's end (DISK_SYNC_DONE).  Safe
 * to call from the loop while the worker encodes.
 */
void asc_encoder_allow_disk_refs_from(struct page_encoder *enc, uint64_t epoch);

#endif
