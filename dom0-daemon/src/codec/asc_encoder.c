/* ASC and RT as the checkpoint pipeline's page encoder (asc_encoder.h). */
#include "codec/asc_encoder.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/be.h"
#include "codec/page_cache.h"
#include "base/log.h"
#include "codec/page_delta.h"
#include "codec/page_trace.h"
#include "nbd/read_index.h"
#include "wire/repl_proto.h"

_Static_assert(PAGE_DELTA_PAGE == REPL_PAGE_SIZE, "one page size for the codec and the wire");
_Static_assert(PAGE_CACHE_PAGE == REPL_PAGE_SIZE, "one page size for the cache and the wire");
_Static_assert(PAGE_ENCODED_MAX <= REPL_CODED_MAX, "every codec output fits a coded record");
_Static_assert(READ_INDEX_BLOCK_SIZE == REPL_PAGE_SIZE, "a disk reference names one page");

/* What the worker counts; the status hook reads them from the loop. */
struct asc_counters {
	_Atomic uint64_t xor_rle, lz4, raw, zero, disk_refs;
	_Atomic uint64_t xor_too_big;  /* cached, but the delta was no smaller than the page */
	_Atomic uint64_t rt_hits_differing; /* hash matched, the disk block's bytes did not */
	_Atomic uint64_t rt_unreadable;     /* the disk block could not be read */
	_Atomic uint64_t rt_before_copy;    /* not looked up: the disk copy was not done */
};

struct asc_encoder {
	struct page_encoder hook; /* first: the pipeline only sees this */
	bool compress;
	uint64_t cache_bytes;     /* as asked for; 0 = cache_percent of guest RAM */
	unsigned cache_percent;
	struct page_cache *cache; /* worker only, once created */
	struct read_index *index;
	_Atomic uint64_t refs_from_epoch; /* no disk references before it (the disk copy) */
	int disk_fd;
	uint8_t scratch[PAGE_ENCODED_MAX];
	uint8_t block_buf[REPL_PAGE_SIZE];
	struct asc_counters n;
	struct page_trace *trace; /* worker only; NULL when not recording */
	uint64_t trace_left;
	_Atomic uint64_t traced;
	/* The cache's statistics as of the last coded epoch, for status. */
	pthread_mutex_t snapshot_lock;
	struct page_cache_stats cache_snapshot;
	/*
	 * Loop only: every counter as of the last reset-stats.  Status shows
	 * the difference, so the worker's counters are never written from
	 * the loop.
	 */
	struct asc_reset_point {
		uint64_t xor_rle, lz4, raw, zero, disk_refs, xor_too_big;
		uint64_t rt_hits_differing, rt_unreadable, rt_before_copy, traced;
		uint64_t cache_hits, cache_misses, cache_evictions;
		uint64_t index_lookups, index_hits;
	} at_reset;
};

static const uint8_t zero_page[REPL_PAGE_SIZE];

static void count(_Atomic uint64_t *c)
{
	atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
}

static uint64_t load(_Atomic uint64_t *c)
{
	return atomic_load_explicit(c, memory_order_relaxed);
}

/* The backup's copy of the page is now `page`: keep the cache in step with it. */
static void remember(struct asc_encoder *a, unsigned block, uint64_t index, const uint8_t *page)
{
	if (a->cache)
		page_cache_store(a->cache, (uint16_t)block, index, page);
}

/*
 * RT: 1 with the 24-byte DISK_REF record data in out when the page equals
 * a block the guest read and has not written since, else 0.
 */
static int disk_reference(struct asc_encoder *a, const uint8_t *page, uint8_t out[REPL_DISK_REF_SIZE])
{
	XXH128_hash_t hash = read_index_hash(page);
	uint64_t block;

	if (!read_index_lookup(a->index, hash, &block))
		return 0;
	/*
	 * The index says the hashes match; the bytes must, or a collision
	 * would hand the backup a page the guest never had.  The block is
	 * in the host's page cache (the guest just read it).
	 */
	uint64_t offset = block * REPL_PAGE_SIZE;
	ssize_t got = pread(a->disk_fd, a->block_buf, REPL_PAGE_SIZE, (off_t)offset);
	if (got != REPL_PAGE_SIZE) {
		count(&a->n.rt_unreadable);
		return 0;
	}
	if (memcmp(a->block_buf, page, REPL_PAGE_SIZE) != 0) {
		count(&a->n.rt_hits_differing);
		return 0;
	}
	XXH128_canonical_t canon;
	XXH128_canonicalFromHash(&canon, hash);
	store_be64(out, offset);
	memcpy(out + 8, canon.digest, sizeof(canon.digest));
	return 1;
}

/* Benchmark input: the page and the version the backup holds of it. */
static void record_pair(struct asc_encoder *a, unsigned block, uint64_t index,
			const uint8_t *prev, const uint8_t *page)
{
	const char *err;

	if (page_trace_append(a->trace, (uint16_t)block, index, prev, page, &err) < 0) {
		log_error("page trace: %s; recording stopped", err);
		(void)page_trace_close(a->trace, &err);
		a->trace = NULL;
		return;
	}
	atomic_fetch_add_explicit(&a->traced, 1, memory_order_relaxed);
	if (--a->trace_left == 0) {
		if (page_trace_close(a->trace, &err) < 0)
			log_error("page trace: %s", err);
		a->trace = NULL;
	}
}

static int encode_page(void *ctx, uint64_t epoch, unsigned block, uint64_t index,
		       const uint8_t *page, struct buffer *out)
{
	struct asc_encoder *a = ctx;
	uint8_t ref[REPL_DISK_REF_SIZE];

	if (!page) {
		count(&a->n.zero);
		remember(a, block, index, zero_page);
		return repl_put_coded_page(out, index, REPL_KIND_ZERO, page_checksum(NULL), NULL, 0);
	}
	uint64_t sum = page_checksum(page);
	bool refs_allowed = a->index &&
		epoch >= atomic_load_explicit(&a->refs_from_epoch, memory_order_acquire);
	if (a->index && !refs_allowed)
		count(&a->n.rt_before_copy);
	if (refs_allowed && disk_reference(a, page, ref)) {
		count(&a->n.disk_refs);
		remember(a, block, index, page);
		return repl_put_coded_page(out, index, REPL_KIND_DISK_REF, sum, ref, sizeof(ref));
	}
	if (!a->compress) {
		count(&a->n.raw);
		return repl_put_coded_page(out, index, REPL_KIND_RAW, sum, page, REPL_PAGE_SIZE);
	}
	const uint8_t *prev = a->cache ? page_cache_lookup(a->cache, (uint16_t)block, index) : NULL;
	int rc;
	if (prev && a->trace)
		record_pair(a, block, index, prev, page);
	if (prev) {
		int n = page_delta_encode(page, prev, a->scratch, sizeof(a->scratch));
		if (n >= 0) {
			count(&a->n.xor_rle);
			rc = repl_put_coded_page(out, index, REPL_KIND_XOR_RLE, sum, a->scratch,
						 (uint32_t)n);
			remember(a, block, index, page);
			return rc;
		}
		count(&a->n.xor_too_big);
	}
	size_t len;
	if (page_encode_miss(page, a->scratch, sizeof(a->scratch), &len) == PAGE_CODEC_LZ4) {
		count(&a->n.lz4);
		rc = repl_put_coded_page(out, index, REPL_KIND_LZ4, sum, a->scratch, (uint32_t)len);
	} else {
		count(&a->n.raw);
		rc = repl_put_coded_page(out, index, REPL_KIND_RAW, sum, page, REPL_PAGE_SIZE);
	}
	remember(a, block, index, page);
	return rc;
}

static void epoch_done(void *ctx, uint64_t epoch)
{
	struct asc_encoder *a = ctx;
	struct page_cache_stats s = { 0 };

	if (a->cache)
		page_cache_get_stats(a->cache, &s);
	pthread_mutex_lock(&a->snapshot_lock);
	a->cache_snapshot = s;
	pthread_mutex_unlock(&a->snapshot_lock);
}

/* Every counter status shows, as it is now (on the loop). */
static struct asc_reset_point counters_now(struct asc_encoder *a)
{
	struct asc_reset_point c = {
		.xor_rle = load(&a->n.xor_rle), .lz4 = load(&a->n.lz4), .raw = load(&a->n.raw),
		.zero = load(&a->n.zero), .disk_refs = load(&a->n.disk_refs),
		.xor_too_big = load(&a->n.xor_too_big),
		.rt_hits_differing = load(&a->n.rt_hits_differing),
		.rt_unreadable = load(&a->n.rt_unreadable),
		.rt_before_copy = load(&a->n.rt_before_copy), .traced = load(&a->traced),
	};
	pthread_mutex_lock(&a->snapshot_lock);
	c.cache_hits = a->cache_snapshot.hits;
	c.cache_misses = a->cache_snapshot.misses;
	c.cache_evictions = a->cache_snapshot.evictions;
	pthread_mutex_unlock(&a->snapshot_lock);
	if (a->index) {
		struct read_index_stats s;
		read_index_get_stats(a->index, &s);
		c.index_lookups = s.lookups;
		c.index_hits = s.hits;
	}
	return c;
}

static void reset_stats(void *ctx)
{
	struct asc_encoder *a = ctx;

	a->at_reset = counters_now(a);
}

static double rate(uint64_t part, uint64_t whole)
{
	return whole ? (double)part / (double)whole : 0.0;
}

/* The cache's whole allocation, made once at asc_encoder_set_guest_ram(). */
static uint64_t memory_bytes(void *ctx)
{
	struct asc_encoder *a = ctx;

	pthread_mutex_lock(&a->snapshot_lock);
	uint64_t bytes = a->cache_snapshot.memory_bytes;
	pthread_mutex_unlock(&a->snapshot_lock);
	return bytes;
}

/* Counters since the last reset-stats; sizes and budgets as they are now. */
static void status(void *ctx, json_t *obj)
{
	struct asc_encoder *a = ctx;
	struct page_cache_stats c;
	struct asc_reset_point now = counters_now(a), *r = &a->at_reset;

	pthread_mutex_lock(&a->snapshot_lock);
	c = a->cache_snapshot;
	pthread_mutex_unlock(&a->snapshot_lock);
	uint64_t hits = now.cache_hits - r->cache_hits, misses = now.cache_misses - r->cache_misses;
	json_t *asc = json_pack("{s:b, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:I, s:I, s:I, s:I}",
				"enabled", a->compress,
				"cache_budget_bytes", (json_int_t)c.budget_bytes,
				"cache_pages", (json_int_t)c.pages,
				"cache_hits", (json_int_t)hits,
				"cache_misses", (json_int_t)misses,
				"cache_evictions",
				(json_int_t)(now.cache_evictions - r->cache_evictions),
				"cache_hit_rate", rate(hits, hits + misses),
				"pages_xor_rle", (json_int_t)(now.xor_rle - r->xor_rle),
				"pages_lz4", (json_int_t)(now.lz4 - r->lz4),
				"pages_raw", (json_int_t)(now.raw - r->raw),
				"pages_zero", (json_int_t)(now.zero - r->zero),
				"xor_no_smaller", (json_int_t)(now.xor_too_big - r->xor_too_big));
	/* The trace's length is the file's, so it is not reset. */
	json_object_set_new(asc, "pages_traced", json_integer((json_int_t)now.traced));
	json_t *rt;
	if (a->index) {
		struct read_index_stats s;
		read_index_get_stats(a->index, &s);
		uint64_t lookups = now.index_lookups - r->index_lookups;
		rt = json_pack("{s:b, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:I, s:I}",
			       "enabled", 1,
			       "annotations", (json_int_t)(now.disk_refs - r->disk_refs),
			       "hash_hits_bytes_differ",
			       (json_int_t)(now.rt_hits_differing - r->rt_hits_differing),
			       "disk_unreadable", (json_int_t)(now.rt_unreadable - r->rt_unreadable),
			       "pages_before_disk_copy",
			       (json_int_t)(now.rt_before_copy - r->rt_before_copy),
			       "index_lookups", (json_int_t)lookups,
			       "index_hit_rate", rate(now.index_hits - r->index_hits, lookups),
			       "index_entries", (json_int_t)s.entries,
			       "index_capacity", (json_int_t)s.capacity,
			       "index_bytes", (json_int_t)s.bytes);
	} else {
		rt = json_pack("{s:b}", "enabled", 0);
	}
	json_object_set_new(obj, "compression", asc);
	json_object_set_new(obj, "read_tracking", rt);
}

struct page_encoder *asc_encoder_create(const struct asc_options *opt, char *err,
					size_t errlen)
{
	struct asc_encoder *a = calloc(1, sizeof(*a));

	if (!a) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	a->disk_fd = -1;
	a->compress = opt->compress;
	a->cache_bytes = opt->cache_bytes;
	a->cache_percent = opt->cache_percent ? opt->cache_percent : 10;
	a->index = opt->index;
	atomic_init(&a->refs_from_epoch, UINT64_MAX);
	if (a->index) {
		a->disk_fd = open(opt->disk_path, O_RDONLY | O_CLOEXEC);
		if (a->disk_fd < 0) {
			snprintf(err, errlen, "read tracking: cannot open %.200s: %s",
				 opt->disk_path, strerror(errno));
			free(a);
			return NULL;
		}
	}
	if (opt->trace_path) {
		const char *terr;
		a->trace = page_trace_create(opt->trace_path, &terr);
		if (!a->trace) {
			snprintf(err, errlen, "page trace %.200s: %s", opt->trace_path, terr);
			if (a->disk_fd >= 0)
				close(a->disk_fd);
			free(a);
			return NULL;
		}
		a->trace_left = opt->trace_max_records ? opt->trace_max_records : UINT64_MAX;
	}
	pthread_mutex_init(&a->snapshot_lock, NULL);
	a->hook.ctx = a;
	a->hook.encode_page = encode_page;
	a->hook.epoch_done = epoch_done;
	a->hook.status = status;
	a->hook.memory_bytes = memory_bytes;
	a->hook.reset_stats = reset_stats;
	return &a->hook;
}

int asc_encoder_set_guest_ram(struct page_encoder *enc, uint64_t bytes)
{
	struct asc_encoder *a = enc->ctx;

	if (!a->compress || a->cache)
		return 0;
	/* RemusDB's default: a tenth of guest memory holds the hot pages. */
	uint64_t budget = a->cache_bytes ? a->cache_bytes : bytes / 100 * a->cache_percent;
	a->cache = page_cache_create(budget);
	if (!a->cache)
		return -1;
	epoch_done(a, 0); /* status shows the budget from the start */
	return 0;
}

void asc_encoder_destroy(struct page_encoder *enc)
{
	if (!enc)
		return;
	struct asc_encoder *a = enc->ctx;
	page_cache_destroy(a->cache);
	if (a->trace) {
		const char *err;
		if (page_trace_close(a->trace, &err) < 0)
			log_error("page trace: %s", err);
	}
	if (a->disk_fd >= 0)
		close(a->disk_fd);
	pthread_mutex_destroy(&a->snapshot_lock);
	free(a);
}

void asc_encoder_allow_disk_refs_from(struct page_encoder *enc, uint64_t epoch)
{
	struct asc_encoder *a = enc->ctx;

	atomic_store_explicit(&a->refs_from_epoch, epoch, memory_order_release);
}
