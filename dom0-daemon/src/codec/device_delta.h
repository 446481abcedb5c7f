/*
 * The per-epoch device state blob (QEMU's vmstate of every device but
 * RAM, 100-250 KB) coded against the previous epoch's blob with the page
 * codec's XOR+RLE (page_delta.h).  Most of it (PCI config space, device
 * registers, timers that did not fire) is the same from one epoch to the
 * next, so the delta is a few KB where the blob is a few hundred.
 *
 * The blob is cut into 4 KiB chunks; chunk i of the new blob is coded
 * against chunk i of the base, both read as zero past their end.  Per
 * chunk, one record:
 *   u8 0 (RAW)      then the chunk's bytes (4096, or fewer for the last)
 *   u8 2 (XOR_RLE)  then be16 n and an n-byte page_delta encoding
 *                   (n <= PAGE_ENCODED_MAX; 0: the chunk did not change)
 * Records carry no chunk index: there is exactly one per chunk, in order.
 * docs/protocol.md ("DEVICE_DELTA") is the byte-level reference.
 *
 * Pure functions; error strings are static.
 */
#ifndef REMUSDB_DEVICE_DELTA_H
#define REMUSDB_DEVICE_DELTA_H

#include <stddef.h>
#include <stdint.h>

#include "base/buffer.h"

#define DEVICE_DELTA_CHUNK 4096u
/*
 * Larger blobs are sent whole: 4 MiB of chunks coded RAW still fit one
 * frame, and QEMU's blob for a database VM is a few hundred KB.
 */
#define DEVICE_DELTA_MAX_BLOB (4u << 20)

enum device_delta_record { DEVICE_DELTA_RAW = 0, DEVICE_DELTA_XOR_RLE = 2 };

/*
 * Appends the records coding cur (1..DEVICE_DELTA_MAX_BLOB bytes) against
 * base (any length, may be 0) to out.  0, or -1 (out of memory, or cur
 * empty or too large).
 */
int device_delta_encode(const uint8_t *cur, size_t cur_len, const uint8_t *base,
			size_t base_len, struct buffer *out);

/*
 * Decodes records rec[0..rec_len) against base into out, which receives
 * exactly total bytes (1..DEVICE_DELTA_MAX_BLOB).  Every record is checked
 * (kind, lengths, the delta itself) and the records must end exactly
 * after the last chunk.  0, or -1 with *err set (out's content is then
 * undefined: the caller discards it).
 */
int device_delta_decode(const uint8_t *rec, size_t rec_len, const uint8_t *base,
			size_t base_len, uint8_t *out, size_t total, const char **err);

#endif
