/*
 * The migration stream that resumes a VM from the backup's committed image
 * (docs/architecture.md, "Remus: protection and takeover"):
 *
 *   header, CONFIGURATION (machine type),
 *   ram START section (the image's ram section id, "ram", instance 0,
 *     version 4): MEM_SIZE + block list, EOS, footer;
 *   ram END section (same id): every page of every block in order, a PAGE
 *     record for a non-zero page and a ZERO record (fill 0) for a zero or
 *     never-written one, the first record of each block naming it and the
 *     rest using CONTINUE; EOS, footer;
 *   the committed device blob verbatim (FULL sections, ending with EOF).
 *
 * There is no VMDESCRIPTION; QEMU 7.2 warns and loads anyway.
 *
 * Why incremental: the stream is the size of the guest's RAM (512 MiB to
 * 1 GiB here) and goes to a non-blocking socket on the failover critical
 * path; producing a bounded slice per writable event keeps memory flat and
 * lets the first bytes reach QEMU at once.  Never-written pages (bitmap in
 * ram_image.h) become ZERO records without touching their memory; written
 * pages are tested for zero a 64-bit word at a time.
 *
 * The stream reads the image's memory as it goes: the image must outlive
 * it and must not change meanwhile (after failover nothing commits).
 */
#ifndef REMUSDB_RESTORE_STREAM_H
#define REMUSDB_RESTORE_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "base/buffer.h"
#include "image/ram_image.h"

struct restore_stream;

/*
 * mapped_block (NULL: none) names a RAM block the restoring QEMU maps from
 * the image itself (failover_qemu.h): the stream still declares it, as
 * QEMU's loader checks every block's length, but carries none of its
 * pages, since QEMU's precopy load never requires a page to arrive and
 * leaves an unsent page as the memory holds it.
 *
 * NULL with a reason in err when the image cannot be restored: no device
 * blob committed yet, a blob that does not end with the EOF byte, ram
 * section id 0, a mapped_block the image does not have, or out of memory.
 */
struct restore_stream *restore_stream_create(const struct ram_image *img,
					     const char *mapped_block,
					     char *err, size_t errlen);
void restore_stream_destroy(struct restore_stream *rs); /* NULL: no-op */

/*
 * Appends about max_bytes more of the stream to out (it may overshoot by
 * one record, about 4 KiB; max_bytes 0 still makes progress).  Returns 1
 * while more remains, 0 once the whole stream has been appended, -1 when
 * out of memory (the stream is dead then; out may hold a partial record).
 */
int restore_stream_produce(struct restore_stream *rs, struct buffer *out,
			   size_t max_bytes);
/* Bytes appended so far. */
uint64_t restore_stream_bytes(const struct restore_stream *rs);

#endif
