/*
 * How one 4 KiB guest page is encoded for asynchronous checkpoint
 * compression (ASC, issue 9): pure functions over byte buffers, no state.
 *
 * - XOR_RLE: a page found in the primary's cache of sent pages
 *   (page_cache.c) is sent as the runs of bytes that differ from the
 *   cached version.  The backup applies them to its own copy.
 * - LZ4: a page not in the cache is sent LZ4-compressed when that is
 *   smaller, else RAW.
 * (The page checksum that catches a backup copy diverging from the
 * primary's is page_checksum() in page_coding.h.)
 *
 * docs/protocol.md ("Page encodings") is the byte-level reference.  Every
 * encoding is strictly smaller than a raw page or not used at all: an
 * encoder reports "not smaller" and the caller sends the page RAW, so no
 * page ever costs more than 4096 bytes plus the caller's per-page header.
 *
 * Decoders validate their whole input before writing anything, so a
 * malformed delta leaves the output page (possibly the base itself, when
 * decoding in place) untouched.  Error strings are static.
 *
 * Why not XBZRLE, QEMU's format: ours is its close cousin (alternating
 * unchanged/changed runs, ULEB128 lengths, new bytes carried literally),
 * made canonical and bounded (lengths of at most two bytes, no empty runs
 * after the first) and encoded from a SIMD bitmap of changed bytes, with
 * gaps of one or two unchanged bytes folded into the changed run; see
 * page_delta.c for why each of these pays.
 */
#ifndef REMUSDB_PAGE_DELTA_H
#define REMUSDB_PAGE_DELTA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PAGE_DELTA_PAGE 4096
/* The longest encoding any encoder here emits: always less than a page. */
#define PAGE_ENCODED_MAX (PAGE_DELTA_PAGE - 1)

/*
 * Values proposed for enum repl_encoding when the integrator puts these
 * on the wire (RAW and ZERO exist in version 1 already).
 */
enum page_codec {
	PAGE_CODEC_RAW = 0,
	PAGE_CODEC_XOR_RLE = 2,
	PAGE_CODEC_LZ4 = 3,
};

/*
 * Encodes cur against prev into out (out_cap bytes).  Returns the
 * encoding's length, 0..min(out_cap, PAGE_ENCODED_MAX) (0: the pages are
 * identical), or -1 when the delta would not fit: send cur RAW then.
 * cur, prev and out must not overlap.
 */
int page_delta_encode(const uint8_t cur[PAGE_DELTA_PAGE], const uint8_t prev[PAGE_DELTA_PAGE],
		      uint8_t *out, size_t out_cap);

/*
 * Applies the delta in[0..len) to base, writing the page into out; out may
 * be base itself (in place).  Returns 0, or -1 with *err set and out
 * untouched when the delta is malformed.
 */
int page_delta_decode(const uint8_t *in, size_t len, const uint8_t base[PAGE_DELTA_PAGE],
		      uint8_t out[PAGE_DELTA_PAGE], const char **err);

/*
 * A cache miss: LZ4 when the compressed page is at most
 * min(out_cap, PAGE_ENCODED_MAX) bytes (returns PAGE_CODEC_LZ4, the block in
 * out, *len its length), else PAGE_CODEC_RAW with *len = 4096: the data to
 * send is the page itself, out is not written.
 */
enum page_codec page_encode_miss(const uint8_t page[PAGE_DELTA_PAGE], uint8_t *out,
				 size_t out_cap, size_t *len);

/*
 * Decodes one page of any codec into out.  base is the receiver's copy of
 * the page, needed by XOR_RLE only (may be NULL otherwise; may equal out).
 * RAW must be exactly 4096 bytes, LZ4 1..PAGE_ENCODED_MAX bytes that
 * decompress to exactly one page.  Returns 0, or -1 with *err set and out
 * untouched.
 */
int page_decode(enum page_codec codec, const uint8_t *in, size_t len,
		const uint8_t *base, uint8_t out[PAGE_DELTA_PAGE], const char **err);

/*
 * Restricts the encoder to its SSE2 comparison (true) or lets it pick AVX2
 * when the CPU has it (false, the default): so that tests cover both on
 * an AVX2 machine.  Not for the daemon.
 */
void page_delta_force_sse2(bool on);

#endif
