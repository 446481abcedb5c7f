/*
 * compress-bench: single-threaded encode and decode speed, and compression
 * ratio, of four page codecs over a page trace (page_trace.h), as JSON on
 * stdout.  Run by `tools/remusdb-bench compress`.
 *
 *   xor_rle   our delta (page_delta.c) against the previous version
 *   lz4       LZ4 of the current page alone (the cache-miss path)
 *   lz4_xor   LZ4 of the XOR of the two versions
 *   xbzrle    QEMU's XBZRLE format, implemented here from its documentation
 *             (docs/devel/migration/xbzrle.rst; no QEMU code)
 *   asc       xor_rle, falling back to the miss path (LZ4 or raw) when the
 *             delta is not smaller: what the daemon sends for a cache hit
 *
 * Every codec falls back to the raw page when its output would not be
 * smaller, as the daemon does, and that fallback (a copy of the page into
 * the output) is part of its time.  Outputs are packed one after the other
 * in one buffer, like a send buffer.  Decoding works as the backup does:
 * into its copy of the previous version, in place, for the three codecs
 * that need it; LZ4 alone writes the page.  The copy of the previous
 * versions made before each decode pass is not timed.  Every decode is
 * checked against the trace after timing.
 *
 * GB/s counts raw page bytes (records x 4096) per second of this thread's
 * CPU time (per core; *_wall: per second of wall-clock time); each figure is
 * the best of --passes passes (default 10) over the whole trace, the
 * codecs taking turns within each pass, so a passing hiccup of the machine
 * does not count and does not favour one codec.
 *
 * Usage: compress-bench [--passes N] TRACE
 */
#include <lz4.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codec/page_delta.h"
#include "codec/page_trace.h"

#define PG PAGE_DELTA_PAGE

struct trace {
	size_t n;
	uint8_t *prev, *cur; /* n pages each */
};

struct coded {
	uint8_t *buf;   /* packed outputs */
	size_t *off, *len;
	uint8_t *form;  /* 0 encoded, 1 raw fallback */
};

struct codec {
	const char *name;
	/*
	 * Encodes page i into out (cap 4095): length, or -1 for raw; *alt set
	 * when a codec's second choice made it (asc: LZ4 instead of a delta).
	 */
	int (*encode)(const uint8_t *cur, const uint8_t *prev, uint8_t *out, bool *alt);
	/* Decodes into page, which holds the previous version. 0 or -1. */
	int (*decode)(const uint8_t *in, size_t len, uint8_t *page, bool alt);
};

/* ---- xor_rle ---- */

static int xor_rle_encode(const uint8_t *cur, const uint8_t *prev, uint8_t *out, bool *alt)
{
	return page_delta_encode(cur, prev, out, PAGE_ENCODED_MAX);
}

static int xor_rle_decode(const uint8_t *in, size_t len, uint8_t *page, bool alt)
{
	const char *err;

	return page_delta_decode(in, len, page, page, &err);
}

/* ---- lz4 ---- */

static int lz4_encode(const uint8_t *cur, const uint8_t *prev, uint8_t *out, bool *alt)
{
	size_t len;

	return page_encode_miss(cur, out, PAGE_ENCODED_MAX, &len) == PAGE_CODEC_LZ4 ? (int)len : -1;
}

static int lz4_decode(const uint8_t *in, size_t len, uint8_t *page, bool alt)
{
	return LZ4_decompress_safe((const char *)in, (char *)page, (int)len, PG) == PG ? 0 : -1;
}

/*
 * ---- asc ----
 * The whole pipeline for a cache hit as the daemon would run it: the
 * delta, and when that is not smaller, the miss path (LZ4 or raw).
 */

static int asc_encode(const uint8_t *cur, const uint8_t *prev, uint8_t *out, bool *alt)
{
	int n = page_delta_encode(cur, prev, out, PAGE_ENCODED_MAX);

	if (n >= 0)
		return n;
	*alt = true;
	return lz4_encode(cur, prev, out, alt);
}

static int asc_decode(const uint8_t *in, size_t len, uint8_t *page, bool alt)
{
	return alt ? lz4_decode(in, len, page, alt) : xor_rle_decode(in, len, page, alt);
}

/* ---- lz4_xor ---- */

static void xor_into(uint8_t *dst, const uint8_t *a, const uint8_t *b)
{
	for (int i = 0; i < PG; i += 8) {
		uint64_t x, y;

		memcpy(&x, a + i, 8);
		memcpy(&y, b + i, 8);
		x ^= y;
		memcpy(dst + i, &x, 8);
	}
}

static int lz4_xor_encode(const uint8_t *cur, const uint8_t *prev, uint8_t *out, bool *alt)
{
	uint8_t delta[PG];

	xor_into(delta, cur, prev);
	int n = LZ4_compress_default((const char *)delta, (char *)out, PG, PAGE_ENCODED_MAX);

	return n > 0 ? n : -1;
}

static int lz4_xor_decode(const uint8_t *in, size_t len, uint8_t *page, bool alt)
{
	uint8_t delta[PG];

	if (LZ4_decompress_safe((const char *)in, (char *)delta, (int)len, PG) != PG)
		return -1;
	xor_into(page, page, delta);
	return 0;
}

/*
 * ---- xbzrle ----
 * The documented format: page = zrun nzrun | zrun nzrun page, where zrun
 * is the ULEB128 length of a run of unchanged bytes (zero in the XOR of
 * the two versions) and nzrun a ULEB128 length followed by that many new
 * bytes; a final unchanged run is not sent.  Scanning a word at a time, as
 * the documentation says a sender may.
 */

static size_t uleb128_put(uint8_t *p, uint32_t v)
{
	size_t n = 0;

	do {
		uint8_t b = v & 0x7f;

		v >>= 7;
		p[n++] = (uint8_t)(b | (v ? 0x80 : 0));
	} while (v);
	return n;
}

/* A word's bytes are all nonzero: the classic "has a zero byte" test. */
static inline bool no_zero_byte(uint64_t x)
{
	return !((x - 0x0101010101010101ULL) & ~x & 0x8080808080808080ULL);
}

static int xbzrle_encode(const uint8_t *cur, const uint8_t *prev, uint8_t *out, bool *alt)
{
	size_t i = 0, d = 0;

	while (i < PG) {
		size_t z = i;

		while (z < PG && z % 8 && cur[z] == prev[z])
			z++;
		while (z + 8 <= PG) {
			uint64_t a, b;

			memcpy(&a, cur + z, 8);
			memcpy(&b, prev + z, 8);
			if (a != b)
				break;
			z += 8;
		}
		while (z < PG && cur[z] == prev[z])
			z++;
		if (z == PG)
			break; /* the last unchanged run is implied */
		size_t nz = z;

		while (nz < PG && nz % 8 && cur[nz] != prev[nz])
			nz++;
		while (nz + 8 <= PG) {
			uint64_t a, b;

			memcpy(&a, cur + nz, 8);
			memcpy(&b, prev + nz, 8);
			if (!no_zero_byte(a ^ b))
				break;
			nz += 8;
		}
		while (nz < PG && cur[nz] != prev[nz])
			nz++;
		if (d + 6 + (nz - z) > PAGE_ENCODED_MAX)
			return -1;
		d += uleb128_put(out + d, (uint32_t)(z - i));
		d += uleb128_put(out + d, (uint32_t)(nz - z));
		memcpy(out + d, cur + z, nz - z);
		d += nz - z;
		i = nz;
	}
	return (int)d;
}

static bool uleb128_get(const uint8_t *in, size_t len, size_t *i, uint32_t *v)
{
	uint32_t x = 0;

	for (int shift = 0; shift < 21; shift += 7) {
		if (*i >= len)
			return false;
		uint8_t b = in[(*i)++];

		x |= (uint32_t)(b & 0x7f) << shift;
		if (!(b & 0x80)) {
			*v = x;
			return true;
		}
	}
	return false;
}

static int xbzrle_decode(const uint8_t *in, size_t len, uint8_t *page, bool alt)
{
	size_t i = 0, pos = 0;

	while (i < len) {
		uint32_t z, nz;

		if (!uleb128_get(in, len, &i, &z) || !uleb128_get(in, len, &i, &nz) ||
		    z > PG - pos || nz > PG - pos - z || nz > len - i)
			return -1;
		pos += z;
		memcpy(page + pos, in + i, nz);
		pos += nz;
		i += nz;
	}
	return 0;
}

/* ---- harness ---- */

/*
 * A pass is timed twice: by this thread's CPU time, the figure per core
 * (time the scheduler gave to other processes on this shared machine does
 * not count), and by the wall clock.
 */
struct span {
	double cpu, wall;
};

static struct span now(void)
{
	struct timespec c, w;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c);
	clock_gettime(CLOCK_MONOTONIC, &w);
	return (struct span){ (double)c.tv_sec + c.tv_nsec / 1e9,
			      (double)w.tv_sec + w.tv_nsec / 1e9 };
}

static struct span since(struct span t0)
{
	struct span t1 = now();

	return (struct span){ t1.cpu - t0.cpu, t1.wall - t0.wall };
}

static void keep_best(struct span *best, struct span s)
{
	if (s.cpu < best->cpu)
		best->cpu = s.cpu;
	if (s.wall < best->wall)
		best->wall = s.wall;
}

static void *xmalloc(size_t n)
{
	void *p = aligned_alloc(64, (n + 63) / 64 * 64);

	if (!p) {
		fprintf(stderr, "out of memory\n");
		exit(1);
	}
	return p;
}

static void load(const char *path, struct trace *t)
{
	const char *err;
	struct page_trace *f = page_trace_open(path, &err);
	static struct page_trace_record rec;
	size_t cap = 1024;
	int rc;

	if (!f) {
		fprintf(stderr, "%s: %s\n", path, err);
		exit(1);
	}
	t->n = 0;
	t->prev = xmalloc(cap * PG);
	t->cur = xmalloc(cap * PG);
	while ((rc = page_trace_next(f, &rec, &err)) == 1) {
		if (t->n == cap) {
			cap *= 2;
			uint8_t *p = xmalloc(cap * PG), *c = xmalloc(cap * PG);

			memcpy(p, t->prev, t->n * PG);
			memcpy(c, t->cur, t->n * PG);
			free(t->prev);
			free(t->cur);
			t->prev = p;
			t->cur = c;
		}
		memcpy(t->prev + t->n * PG, rec.prev, PG);
		memcpy(t->cur + t->n * PG, rec.cur, PG);
		t->n++;
	}
	page_trace_close(f, &err);
	if (rc < 0 || t->n == 0) {
		fprintf(stderr, "%s: %s\n", path, rc < 0 ? err : "no records");
		exit(1);
	}
}

struct result {
	struct span best_enc, best_dec;
	size_t total;
};

/* One timed encode pass of codec c over the trace into o. */
static struct span encode_pass(const struct codec *c, const struct trace *t, struct coded *o,
			  size_t *total)
{
	struct span t0 = now();
	size_t at = 0;

	for (size_t i = 0; i < t->n; i++) {
		const uint8_t *cur = t->cur + i * PG;
		bool alt = false;
		int n = c->encode(cur, t->prev + i * PG, o->buf + at, &alt);

		o->off[i] = at;
		if (n < 0) {
			memcpy(o->buf + at, cur, PG);
			o->len[i] = PG;
			o->form[i] = 1;
		} else {
			o->len[i] = (size_t)n;
			o->form[i] = alt ? 2 : 0;
		}
		at += o->len[i];
	}
	*total = at;
	return since(t0);
}

/* One timed decode pass into pages, which hold the previous versions. */
static struct span decode_pass(const struct codec *c, const struct trace *t, const struct coded *o,
			  uint8_t *pages)
{
	struct span t0 = now();

	for (size_t i = 0; i < t->n; i++) {
		uint8_t *page = pages + i * PG;
		const uint8_t *in = o->buf + o->off[i];

		if (o->form[i] == 1)
			memcpy(page, in, PG);
		else if (c->decode(in, o->len[i], page, o->form[i] == 2) < 0) {
			fprintf(stderr, "%s: decode of record %zu failed\n", c->name, i);
			exit(1);
		}
	}
	return since(t0);
}

static void print_result(const struct codec *c, const struct trace *t, const struct coded *o,
			 const struct result *r, bool first)
{
	size_t raw = 0, alts = 0, empty = 0;
	double bytes = (double)t->n * PG;

	for (size_t i = 0; i < t->n; i++) {
		raw += o->form[i] == 1;
		alts += o->form[i] == 2;
		empty += o->len[i] == 0;
	}
	printf("%s    \"%s\": {\"encode_gbps\": %.3f, \"decode_gbps\": %.3f, "
	       "\"encode_gbps_wall\": %.3f, \"decode_gbps_wall\": %.3f, "
	       "\"ratio\": %.3f, \"bytes_out\": %zu, \"raw_fallback_pages\": %zu, "
	       "\"lz4_fallback_pages\": %zu, \"empty_pages\": %zu, "
	       "\"encode_cpu_seconds\": %.6f, \"decode_cpu_seconds\": %.6f}",
	       first ? "" : ",\n", c->name, bytes / r->best_enc.cpu / 1e9,
	       bytes / r->best_dec.cpu / 1e9, bytes / r->best_enc.wall / 1e9,
	       bytes / r->best_dec.wall / 1e9, bytes / (double)r->total, r->total, raw, alts,
	       empty, r->best_enc.cpu, r->best_dec.cpu);
}

int main(int argc, char **argv)
{
	static const struct codec codecs[] = {
		{ "xor_rle", xor_rle_encode, xor_rle_decode },
		{ "lz4", lz4_encode, lz4_decode },
		{ "lz4_xor", lz4_xor_encode, lz4_xor_decode },
		{ "xbzrle", xbzrle_encode, xbzrle_decode },
		{ "asc", asc_encode, asc_decode },
	};
	int passes = 10;
	const char *path = NULL;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--passes") && i + 1 < argc)
			passes = atoi(argv[++i]);
		else if (!path && argv[i][0] != '-')
			path = argv[i];
		else
			path = NULL, i = argc;
	}
	if (!path || passes < 1) {
		fprintf(stderr, "usage: compress-bench [--passes N] TRACE\n");
		return 2;
	}
	struct trace t;

	load(path, &t);
	enum { NCODECS = sizeof(codecs) / sizeof(codecs[0]) };
	struct coded o[NCODECS];
	struct result r[NCODECS];
	uint8_t *pages = xmalloc(t.n * PG);

	for (size_t k = 0; k < NCODECS; k++) {
		o[k].buf = xmalloc(t.n * PG);
		o[k].off = xmalloc(t.n * sizeof(size_t));
		o[k].len = xmalloc(t.n * sizeof(size_t));
		o[k].form = xmalloc(t.n);
		r[k].best_enc = r[k].best_dec = (struct span){ 1e30, 1e30 };
	}
	/*
	 * Pass after pass, every codec in turn: a slow spell of the machine
	 * (another process on the core) then hits every codec alike, and the
	 * best of the passes is kept.
	 */
	for (int p = 0; p < passes; p++) {
		for (size_t k = 0; k < NCODECS; k++) {
			struct span e = encode_pass(&codecs[k], &t, &o[k], &r[k].total);

			memcpy(pages, t.prev, t.n * PG); /* the backup's copies: not timed */
			struct span d = decode_pass(&codecs[k], &t, &o[k], pages);

			if (memcmp(pages, t.cur, t.n * PG) != 0) {
				fprintf(stderr, "%s: decoded pages differ from the trace\n",
					codecs[k].name);
				return 1;
			}
			keep_best(&r[k].best_enc, e);
			keep_best(&r[k].best_dec, d);
		}
	}
	__builtin_cpu_init();
	printf("{\n  \"trace\": \"");
	for (const char *ch = path; *ch; ch++) /* a JSON string, whatever the path */
		printf((*ch == '"' || *ch == '\\') ? "\\%c" : (unsigned char)*ch < 0x20 ? "\\u%04x" : "%c",
		       *ch);
	printf("\",\n  \"records\": %zu,\n  \"passes\": %d,\n"
	       "  \"avx2\": %s,\n  \"codecs\": {\n",
	       t.n, passes, __builtin_cpu_supports("avx2") ? "true" : "false");
	for (size_t k = 0; k < NCODECS; k++)
		print_result(&codecs[k], &t, &o[k], &r[k], k == 0);
	printf("\n  }\n}\n");
	for (size_t k = 0; k < NCODECS; k++) {
		free(o[k].buf);
		free(o[k].off);
		free(o[k].len);
		free(o[k].form);
	}
	free(pages);
	free(t.prev);
	free(t.cur);
	return 0;
}
