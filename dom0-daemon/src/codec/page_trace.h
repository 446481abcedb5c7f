/*
 * Page traces: files of (previous version, current version) pairs of
 * dirty guest pages, the input of `tools/remusdb-bench compress`.  The
 * daemon records one from a real guest by calling page_trace_append() for
 * each dirty page whose previous version it holds; the benchmark and the
 * synthetic generator (tools/lib/remusdb/bench/compress.py) use the same
 * format.
 *
 * Format (all integers big-endian, like every format of the daemon):
 *   header, 16 bytes: "RDBTRACE", be32 version (1), be32 page size (4096)
 *   records, 8202 bytes each, to the end of the file:
 *     be16 RAM block index, be64 page index, 4096 bytes previous version,
 *     4096 bytes current version
 *
 * Writes go through stdio with a large buffer and block on the disk: record
 * while benchmarking, not in production.  Not thread-safe: one writer per
 * trace, called from one thread.
 */
#ifndef REMUSDB_PAGE_TRACE_H
#define REMUSDB_PAGE_TRACE_H

#include <stdint.h>

#define PAGE_TRACE_MAGIC "RDBTRACE"
#define PAGE_TRACE_VERSION 1
#define PAGE_TRACE_PAGE 4096
#define PAGE_TRACE_HEADER 16
#define PAGE_TRACE_RECORD (2 + 8 + 2 * PAGE_TRACE_PAGE)

struct page_trace;

struct page_trace_record {
	uint16_t block;
	uint64_t page;
	uint8_t prev[PAGE_TRACE_PAGE];
	uint8_t cur[PAGE_TRACE_PAGE];
};

/* Creates (truncates) path and writes the header.  NULL with *err set. */
struct page_trace *page_trace_create(const char *path, const char **err);

/* Appends one record.  0, or -1 with *err set (the trace is then unusable). */
int page_trace_append(struct page_trace *t, uint16_t block, uint64_t page,
		      const uint8_t prev[PAGE_TRACE_PAGE], const uint8_t cur[PAGE_TRACE_PAGE],
		      const char **err);

/* Opens path for reading and checks the header.  NULL with *err set. */
struct page_trace *page_trace_open(const char *path, const char **err);

/* The next record: 1, 0 at the end, or -1 with *err set (truncated file). */
int page_trace_next(struct page_trace *t, struct page_trace_record *rec, const char **err);

/*
 * Closes the trace; for a trace being written, flushes it first.  0, or -1
 * with *err set when a buffered write failed.
 */
int page_trace_close(struct page_trace *t, const char **err);

#endif
