/*
 * Push parser for the stream QEMU 7.2's COLO source (`x-colo`) writes to
 * remusdbd: the bulk migration, then one checkpoint after another.  It does
 * no I/O; the caller feeds whatever the socket gave it, in chunks of any
 * size (one byte works), and hears about pages, blocks and device state
 * through callbacks as soon as each is complete.
 *
 * Byte sequence, as checked in QEMU 7.2's source:
 *
 *   bulk (migration.c:migration_thread, savevm.c):
 *     be32 magic, be32 3, CONFIGURATION [+ subsections],
 *     COMMAND enable-colo, ram START {MEM_SIZE + blocks, EOS} footer,
 *     ram PART {pages, EOS} footer ..., ram END {pages, EOS} footer,
 *     FULL device sections ..., EOF, VMDESCRIPTION (be32 len + JSON)
 *   then per checkpoint (colo.c:colo_do_checkpoint_transaction):
 *     be32 CHECKPOINT_REQUEST                  (source waits for REPLY)
 *     be32 VMSTATE_SEND
 *     ram END {dirty pages, EOS} footer, EOF   (savevm.c:qemu_savevm_live_state)
 *     be32 VMSTATE_SIZE, be64 n
 *     n bytes: FULL device sections, EOF       (savevm.c:qemu_save_device_state)
 *
 * Device sections are not length-prefixed, so in the bulk stream the parser
 * cannot walk them; it passes everything from the first FULL section (or
 * the EOF, if there is none) through the EOF that precedes VMDESCRIPTION as
 * one opaque "device blob", in the same shape as a checkpoint's blob (FULL
 * sections + EOF byte).  See colo_bulk_blob.c for how the end is found.
 *
 * Memory: a fixed scratch area for one page, plus, in the bulk device
 * blob only, the candidate VMDESCRIPTION being verified (bounded by
 * max_vmdesc).  Blobs are passed through in chunks, never accumulated.
 */
#ifndef REMUSDB_COLO_STREAM_H
#define REMUSDB_COLO_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qemu/migration_writer.h"

#define COLO_STREAM_MAX_BLOCKS 64
#define COLO_STREAM_DEFAULT_MAX_VMDESC (16u << 20)
#define COLO_STREAM_DEFAULT_MAX_DEVICE_BLOB (64u << 20)
/* Command payloads we accept; QEMU sends 0 (enable-colo) or 4 (ping). */
#define COLO_STREAM_MAX_COMMAND 4096

struct colo_stream;

struct colo_ram_block {
	char name[256];
	uint64_t length; /* bytes; a multiple of MIG_PAGE_SIZE */
	unsigned index;  /* order in the MEM_SIZE record */
};

struct colo_section {
	uint8_t type;  /* MIG_SECTION_START/PART/END */
	uint32_t id;
	const char *idstr; /* always "ram": the only section we walk */
	uint32_t instance;
	uint32_t version;
	bool checkpoint; /* inside a COLO checkpoint, not the bulk stream */
};

/*
 * Every callback is optional.  A nonzero return stops the parser: the
 * feed fails with "callback failed: <name>" and the stream is dead.
 * Pointers passed in are only valid during the call.
 */
struct colo_stream_callbacks {
	void *opaque;
	int (*on_configuration)(void *opaque, const char *machine_type);
	int (*on_command)(void *opaque, uint16_t cmd, const uint8_t *data,
			  uint16_t len);
	int (*on_section)(void *opaque, const struct colo_section *section);
	int (*on_ram_block)(void *opaque, const struct colo_ram_block *block);
	int (*on_page)(void *opaque, const struct colo_ram_block *block,
		       uint64_t offset, const uint8_t *data /* 4096 bytes */);
	int (*on_zero_page)(void *opaque, const struct colo_ram_block *block,
			    uint64_t offset, uint8_t fill);
	/* Bulk device state, in order; chunks of any size. */
	int (*on_device_blob_chunk)(void *opaque, const uint8_t *data,
				    size_t len);
	int (*on_device_blob_complete)(void *opaque, uint64_t total_len);
	/* The VMDESCRIPTION JSON (not NUL-terminated), after the blob. */
	int (*on_vmdescription)(void *opaque, const char *json, size_t len);
	/* End of the bulk stream: answer CHECKPOINT_READY now. */
	int (*on_bulk_complete)(void *opaque);
	/* value: the size for VMSTATE_SIZE, else 0. */
	int (*on_colo_message)(void *opaque, enum colo_message msg,
			       uint64_t value);
	/*
	 * A checkpoint's device state, delivered in chunks as it arrives
	 * (concatenated they are exactly VMSTATE_SIZE bytes), then
	 * on_checkpoint_complete once the last byte is in.
	 */
	int (*on_checkpoint_device_blob)(void *opaque, const uint8_t *data,
					 size_t len);
	int (*on_checkpoint_complete)(void *opaque, uint64_t seq,
				      uint64_t blob_len);
};

struct colo_stream_limits {
	size_t max_vmdesc;      /* VMDESCRIPTION JSON bytes */
	size_t max_device_blob; /* bulk device blob, and VMSTATE_SIZE */
	/*
	 * QEMU sends nothing after VMDESCRIPTION until it gets READY.  When
	 * set, bytes after the VMDESCRIPTION in the same feed call are an
	 * error: a found terminator that is not where the stream paused was a
	 * false match.  Off for callers that replay a recorded stream.
	 */
	bool strict_bulk_pause;
};

enum colo_stream_phase {
	COLO_PHASE_BULK,       /* in the first migration */
	COLO_PHASE_IDLE,       /* between checkpoints: a consistent point */
	COLO_PHASE_CHECKPOINT, /* inside a checkpoint */
	COLO_PHASE_FAILED,
};

enum { COLO_STREAM_NEED_MORE = 0, COLO_STREAM_ERROR = -1 };

/* limits NULL takes the defaults.  Returns NULL when out of memory. */
struct colo_stream *colo_stream_new(const struct colo_stream_callbacks *cb,
				    const struct colo_stream_limits *limits);
void colo_stream_free(struct colo_stream *s);

/*
 * Consumes all of data.  Returns COLO_STREAM_NEED_MORE (0) when it did
 * (whatever the phase), or COLO_STREAM_ERROR with *err (if err is not NULL)
 * set to a message naming the stream offset; errors are sticky.
 */
int colo_stream_feed(struct colo_stream *s, const uint8_t *data, size_t len,
		     const char **err);

/*
 * The peer closed the stream: returns 0 if it ended at a boundary, else
 * fails the stream with "truncated: ..." and returns COLO_STREAM_ERROR.
 */
int colo_stream_finish(struct colo_stream *s, const char **err);

enum colo_stream_phase colo_stream_phase(const struct colo_stream *s);
/* True between checkpoints with no partial item buffered: the stream may end here. */
bool colo_stream_at_boundary(const struct colo_stream *s);
const char *colo_stream_error(const struct colo_stream *s);
uint64_t colo_stream_offset(const struct colo_stream *s); /* bytes consumed */
uint64_t colo_stream_checkpoints(const struct colo_stream *s); /* completed */
/* The blocks of the MEM_SIZE record (count 0 before it). */
const struct colo_ram_block *colo_stream_blocks(const struct colo_stream *s,
						size_t *count);
/* The ram section's id, once its START section has been seen. */
bool colo_stream_ram_section_id(const struct colo_stream *s, uint32_t *id);

#endif
