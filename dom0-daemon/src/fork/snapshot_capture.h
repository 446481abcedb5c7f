/*
 * A fork's memory snapshot, taken by letting the parent QEMU migrate into
 * us (a plain precopy migration, no COLO): the stream is parsed with the
 * COLO parser (the bulk part is the same byte sequence) into a ram_image
 * (ram_image.h) and the device state QEMU sends after stopping the VM.
 * The copy is ours: the parent resumes and moves on, the snapshot stays
 * as of the instant the migration completed.
 *
 * While parsing, pages QEMU sends more than once are the ones the guest
 * dirtied during the migration; the clones' background push sends them
 * first, most recently dirtied first (FlurryDB's working set, approximated
 * by what the database was writing at fork time).
 */
#ifndef REMUSDB_SNAPSHOT_CAPTURE_H
#define REMUSDB_SNAPSHOT_CAPTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "image/ram_image.h"

/* struct page_ref: ram_image.h */

struct snapshot_capture_stats {
	uint64_t stream_bytes;
	uint64_t pages;       /* PAGE records, resends included */
	uint64_t zero_pages;  /* ZERO records */
	uint64_t redirtied;   /* distinct pages sent more than once */
	uint64_t device_bytes;
};

struct snapshot_capture;

struct snapshot_capture *snapshot_capture_new(void);
void snapshot_capture_free(struct snapshot_capture *sc); /* NULL: no-op */

/*
 * Consumes a chunk of the migration stream.  0, or -1 with a message in
 * *err (valid until the capture is freed): a malformed stream, a layout
 * the image cannot hold, out of memory.  Errors are sticky.
 */
int snapshot_capture_feed(struct snapshot_capture *sc, const uint8_t *data,
			  size_t len, const char **err);
/* QEMU closed the stream: 0 when the snapshot is complete, else -1 + *err. */
int snapshot_capture_finish(struct snapshot_capture *sc, const char **err);
bool snapshot_capture_complete(const struct snapshot_capture *sc);

/* The image (owned by the capture; NULL before the layout arrived). */
struct ram_image *snapshot_capture_image(struct snapshot_capture *sc);
/* Redirtied pages, least recent first. */
const struct page_ref *snapshot_capture_redirtied(const struct snapshot_capture *sc,
						  size_t *count);
void snapshot_capture_get_stats(const struct snapshot_capture *sc,
				struct snapshot_capture_stats *out);

#endif
