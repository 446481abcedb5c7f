/*
 * Page encodings for checkpoint compression: the XOR_RLE page delta, the
 * LZ4-or-raw choice for cache misses, and the page checksum.
 * docs/protocol.md ("Page encodings") has the format byte by byte.
 *
 * Why the encoder works from a bitmap: comparing the two pages 32 (AVX2)
 * or 16 (SSE2) bytes at a time yields one bit per byte in a few hundred
 * cycles, and everything after that (folding short gaps, bounding the
 * output size, finding the runs) is word arithmetic on 64 words instead of
 * a byte loop.  The cost of a page is then the comparison plus one step per
 * run, however the changes are spread.
 *
 * Why changed bytes are carried as their new value, not XORed: the
 * decoder copies instead of read-XOR-writing, and works in place.  The
 * "XOR" in the name is the comparison; a zero XOR is an unchanged byte.
 */
#include "codec/page_delta.h"

#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include <lz4.h>

#define MASK_WORDS (PAGE_DELTA_PAGE / 64)

/* bit i of the bitmap (word i / 64, bit i % 64) = byte i differs. */
typedef uint64_t change_map[MASK_WORDS];

static void diff_map_sse2(const uint8_t *a, const uint8_t *b, change_map map)
{
	for (int w = 0; w < MASK_WORDS; w++) {
		uint64_t same = 0;

		for (int k = 0; k < 4; k++) {
			__m128i x = _mm_loadu_si128((const __m128i *)(a + w * 64 + k * 16));
			__m128i y = _mm_loadu_si128((const __m128i *)(b + w * 64 + k * 16));

			same |= (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(x, y)) << (k * 16);
		}
		map[w] = ~same;
	}
}

__attribute__((target("avx2")))
static void diff_map_avx2(const uint8_t *a, const uint8_t *b, change_map map)
{
	for (int w = 0; w < MASK_WORDS; w++) {
		__m256i x0 = _mm256_loadu_si256((const __m256i *)(a + w * 64));
		__m256i y0 = _mm256_loadu_si256((const __m256i *)(b + w * 64));
		__m256i x1 = _mm256_loadu_si256((const __m256i *)(a + w * 64 + 32));
		__m256i y1 = _mm256_loadu_si256((const __m256i *)(b + w * 64 + 32));
		uint64_t lo = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(x0, y0));
		uint64_t hi = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(x1, y1));

		map[w] = ~(lo | hi << 32);
	}
}

typedef void (*diff_map_fn)(const uint8_t *, const uint8_t *, change_map);

/*
 * Chosen once: the CPU does not change under us.  A data race between two
 * first callers would store the same value, so a relaxed atomic suffices.
 */
static diff_map_fn chosen;

void page_delta_force_sse2(bool on)
{
	__atomic_store_n(&chosen, on ? diff_map_sse2 : NULL, __ATOMIC_RELAXED);
}

static diff_map_fn pick_diff_map(void)
{
	diff_map_fn fn = __atomic_load_n(&chosen, __ATOMIC_RELAXED);

	if (!fn) {
		__builtin_cpu_init();
		fn = __builtin_cpu_supports("avx2") ? diff_map_avx2 : diff_map_sse2;
		__atomic_store_n(&chosen, fn, __ATOMIC_RELAXED);
	}
	return fn;
}

/* Bit i of the result = bit i - k of the map (k = 1, 2), zeros shifted in. */
static inline uint64_t from_below(const change_map m, int w, int k)
{
	return m[w] << k | (w ? m[w - 1] >> (64 - k) : 0);
}

/* Bit i of the result = bit i + k of the map (k = 1, 2), zeros shifted in. */
static inline uint64_t from_above(const change_map m, int w, int k)
{
	return m[w] >> k | (w + 1 < MASK_WORDS ? m[w + 1] << (64 - k) : 0);
}

/*
 * Folds every gap of one or two unchanged bytes between changed bytes into
 * the changed run, and returns a lower bound of the encoded size: one byte
 * per changed byte plus two length bytes per run.  Why fold: such a gap
 * costs two length bytes to skip and at most two to send, so sending it
 * costs at most one byte (when the merged run's length needs a second
 * byte) and halves the runs that both sides walk.
 */
static size_t fold_gaps(const change_map in, change_map out)
{
	size_t bytes = 0;

	for (int w = 0; w < MASK_WORDS; w++) {
		/*
		 * Most words of a sparse delta are unchanged and so are the two
		 * bits either side of them: nothing to fold or count.
		 */
		if (!in[w] && (w == 0 || !(in[w - 1] >> 62)) &&
		    (w + 1 == MASK_WORDS || !(in[w + 1] & 3))) {
			out[w] = 0;
			continue;
		}
		uint64_t b1 = from_below(in, w, 1), b2 = from_below(in, w, 2);
		uint64_t a1 = from_above(in, w, 1), a2 = from_above(in, w, 2);

		out[w] = in[w] | (b1 & (a1 | a2)) | (b2 & a1);
	}
	for (int w = 0; w < MASK_WORDS; w++) {
		if (!out[w])
			continue;
		uint64_t starts = out[w] & ~from_below(out, w, 1);

		bytes += (size_t)__builtin_popcountll(out[w]) +
			 2 * (size_t)__builtin_popcountll(starts);
	}
	return bytes;
}

/* The first bit >= from whose value is `set`, or PAGE_DELTA_PAGE. */
static inline unsigned next_bit(const change_map m, unsigned from, bool set)
{
	if (from >= PAGE_DELTA_PAGE)
		return PAGE_DELTA_PAGE; /* the last run ended with the page */
	unsigned w = from / 64;
	uint64_t x = (set ? m[w] : ~m[w]) & (~0ULL << (from % 64));

	while (!x) {
		if (++w == MASK_WORDS)
			return PAGE_DELTA_PAGE;
		x = set ? m[w] : ~m[w];
	}
	return w * 64 + (unsigned)__builtin_ctzll(x);
}

/*
 * memcpy for the short runs most deltas are made of: fixed-size copies the
 * compiler inlines (two overlapping ones cover any length in a range)
 * instead of a libc call per run.
 */
static inline void copy_run(uint8_t *d, const uint8_t *s, size_t n)
{
	if (n >= 16) {
		memcpy(d, s, n);
	} else if (n >= 8) {
		memcpy(d, s, 8);
		memcpy(d + n - 8, s + n - 8, 8);
	} else if (n >= 4) {
		memcpy(d, s, 4);
		memcpy(d + n - 4, s + n - 4, 4);
	} else if (n) {
		d[0] = s[0];
		d[n / 2] = s[n / 2];
		d[n - 1] = s[n - 1];
	}
}

static inline size_t put_len(uint8_t *p, unsigned v)
{
	if (v < 0x80) {
		p[0] = (uint8_t)v;
		return 1;
	}
	p[0] = (uint8_t)(0x80 | (v & 0x7f));
	p[1] = (uint8_t)(v >> 7);
	return 2;
}

int page_delta_encode(const uint8_t cur[PAGE_DELTA_PAGE], const uint8_t prev[PAGE_DELTA_PAGE],
		      uint8_t *out, size_t out_cap)
{
	change_map raw, map;
	size_t cap = out_cap < PAGE_ENCODED_MAX ? out_cap : PAGE_ENCODED_MAX;
	size_t o = 0;
	unsigned pos = 0;

	pick_diff_map()(cur, prev, raw);
	if (fold_gaps(raw, map) > cap)
		return -1; /* dense changes: known too big before any copying */
	for (;;) {
		unsigned start = next_bit(map, pos, true);

		if (start == PAGE_DELTA_PAGE)
			return (int)o;
		unsigned end = next_bit(map, start, false);
		unsigned zrun = start - pos, nzrun = end - start;

		if (o + (zrun < 0x80 ? 1u : 2u) + (nzrun < 0x80 ? 1u : 2u) + nzrun > cap)
			return -1;
		o += put_len(out + o, zrun);
		o += put_len(out + o, nzrun);
		copy_run(out + o, cur + start, nzrun);
		o += nzrun;
		pos = end;
	}
}

/*
 * Reads one canonical length (one byte below 0x80, or two bytes whose
 * second is 1..0x7f) at in[*i].  Returns false on a truncated, overlong or
 * three-byte length.
 */
static inline bool get_len(const uint8_t *in, size_t len, size_t *i, unsigned *v)
{
	if (*i >= len)
		return false;
	uint8_t b0 = in[(*i)++];

	if (b0 < 0x80) {
		*v = b0;
		return true;
	}
	if (*i >= len)
		return false;
	uint8_t b1 = in[(*i)++];

	if (b1 == 0 || b1 >= 0x80)
		return false;
	*v = (unsigned)(b0 & 0x7f) | (unsigned)b1 << 7;
	return true;
}

/* A length check_delta() has already validated. */
static inline unsigned take_len(const uint8_t *in, size_t *i)
{
	unsigned v = in[(*i)++];

	if (v >= 0x80)
		v = (v & 0x7f) | (unsigned)in[(*i)++] << 7;
	return v;
}

/* Checks the whole delta; the apply pass then trusts it. */
static int check_delta(const uint8_t *in, size_t len, const char **err)
{
	size_t i = 0;
	unsigned pos = 0;

	while (i < len) {
		unsigned zrun, nzrun;

		if (!get_len(in, len, &i, &zrun) || !get_len(in, len, &i, &nzrun)) {
			*err = "XOR_RLE: truncated, overlong or missing run length";
			return -1;
		}
		if (zrun == 0 && pos != 0) {
			*err = "XOR_RLE: empty unchanged run after the first run";
			return -1;
		}
		if (nzrun == 0) {
			*err = "XOR_RLE: empty changed run";
			return -1;
		}
		if (zrun > PAGE_DELTA_PAGE - pos || nzrun > PAGE_DELTA_PAGE - pos - zrun) {
			*err = "XOR_RLE: runs go past the end of the page";
			return -1;
		}
		if (nzrun > len - i) {
			*err = "XOR_RLE: changed run truncated";
			return -1;
		}
		pos += zrun + nzrun;
		i += nzrun;
	}
	return 0;
}

int page_delta_decode(const uint8_t *in, size_t len, const uint8_t base[PAGE_DELTA_PAGE],
		      uint8_t out[PAGE_DELTA_PAGE], const char **err)
{
	if (check_delta(in, len, err) < 0)
		return -1;
	if (out != base)
		memcpy(out, base, PAGE_DELTA_PAGE);
	size_t i = 0;
	unsigned pos = 0;

	while (i < len) {
		pos += take_len(in, &i);
		unsigned nzrun = take_len(in, &i);

		copy_run(out + pos, in + i, nzrun);
		pos += nzrun;
		i += nzrun;
	}
	return 0;
}

enum page_codec page_encode_miss(const uint8_t page[PAGE_DELTA_PAGE], uint8_t *out,
				 size_t out_cap, size_t *len)
{
	size_t cap = out_cap < PAGE_ENCODED_MAX ? out_cap : PAGE_ENCODED_MAX;
	/* LZ4 returns 0 when the block does not fit in cap: not smaller. */
	int n = LZ4_compress_default((const char *)page, (char *)out, PAGE_DELTA_PAGE, (int)cap);

	if (n <= 0) {
		*len = PAGE_DELTA_PAGE;
		return PAGE_CODEC_RAW;
	}
	*len = (size_t)n;
	return PAGE_CODEC_LZ4;
}

int page_decode(enum page_codec codec, const uint8_t *in, size_t len,
		const uint8_t *base, uint8_t out[PAGE_DELTA_PAGE], const char **err)
{
	switch (codec) {
	case PAGE_CODEC_RAW:
		if (len != PAGE_DELTA_PAGE) {
			*err = "RAW: page is not 4096 bytes";
			return -1;
		}
		memmove(out, in, PAGE_DELTA_PAGE);
		return 0;
	case PAGE_CODEC_XOR_RLE:
		if (!base) {
			*err = "XOR_RLE: no base page";
			return -1;
		}
		return page_delta_decode(in, len, base, out, err);
	case PAGE_CODEC_LZ4: {
		/* Into a scratch page first, so that a bad block leaves out alone. */
		uint8_t page[PAGE_DELTA_PAGE];

		if (len == 0 || len > PAGE_ENCODED_MAX) {
			*err = "LZ4: block length out of 1..4095";
			return -1;
		}
		if (LZ4_decompress_safe((const char *)in, (char *)page, (int)len,
					PAGE_DELTA_PAGE) != PAGE_DELTA_PAGE) {
			*err = "LZ4: malformed block or not exactly one page";
			return -1;
		}
		memcpy(out, page, PAGE_DELTA_PAGE);
		return 0;
	}
	}
	*err = "unknown page codec";
	return -1;
}
