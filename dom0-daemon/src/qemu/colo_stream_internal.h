/*
 * Internals shared by the COLO stream parser's files.  colo_stream.c owns
 * the parser's life, the field gathering and the feed loop; each other
 * file parses one kind of item and moves the parser on with expect().
 * Only those files include this header.
 *
 *   colo_top_items.c     item types, COMMANDs, ram section headers/footers
 *   colo_configuration.c CONFIGURATION and its subsections
 *   colo_ram_records.c   the records inside the ram section
 *   colo_bulk_blob.c     the bulk device blob and its VMDESCRIPTION end
 *   colo_checkpoint.c    COLO messages and a checkpoint's device blob
 */
#ifndef REMUSDB_COLO_STREAM_INTERNAL_H
#define REMUSDB_COLO_STREAM_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/buffer.h"
#include "qemu/colo_stream.h"
#include "qemu/migration_writer.h"

/* Deeper nesting than this rejects a VMDESCRIPTION candidate. */
#define JSON_MAX_DEPTH 256

/*
 * What the parser reads next.  The number after each is the size of the
 * field gathered for it; "streamed" states take bytes as they come.
 */
enum stream_state {
	ST_MAGIC,          /* 8: magic, version */
	ST_TOP,            /* 1: item type, bulk stream */
	ST_CONFIG_LEN,     /* 4 */
	ST_CONFIG_NAME,    /* len */
	ST_SUB_NAME_LEN,   /* 1: configuration subsection */
	ST_SUB_NAME,       /* len + be32 version */
	ST_SUB_PAGE_BITS,  /* 4 */
	ST_SUB_CAPS_COUNT, /* 4 */
	ST_SUB_CAP_LEN,    /* 1 */
	ST_SUB_CAP_NAME,   /* len */
	ST_SUB_UUID,       /* 16 */
	ST_CMD_HDR,        /* 4: be16 cmd, be16 len */
	ST_CMD_DATA,       /* len */
	ST_START_HDR,      /* 5: be32 id, u8 idstr len */
	ST_START_IDSTR,    /* len + be32 instance + be32 version */
	ST_PART_ID,        /* 4 (PART and END) */
	ST_FOOTER_ID,      /* 4 */
	ST_RAM_RECORD,     /* 8: be64 offset|flags */
	ST_RAM_NAME_LEN,   /* 1 */
	ST_RAM_NAME,       /* len */
	ST_RAM_FILL,       /* 1 */
	ST_RAM_PAGE,       /* 4096 */
	ST_MEMSZ_NAME_LEN, /* 1 */
	ST_MEMSZ_NAME,     /* len + be64 length */
	ST_DEVICE_BLOB,    /* streamed: colo_bulk_blob_feed() */
	ST_COLO_MSG,       /* 4 */
	ST_COLO_SIZE,      /* 8 */
	ST_CKPT_TOP,       /* 1: item type inside a checkpoint */
	ST_CKPT_BLOB,      /* streamed: colo_checkpoint_blob_feed() */
	ST_FAILED,
};

enum scan_state { SCAN_DATA, SCAN_HEADER, SCAN_JSON };

/* Where colo_bulk_blob.c is in its search for the blob's terminator. */
struct blob_scanner {
	enum scan_state state;
	uint8_t header[6]; /* 00 06 be32 */
	size_t header_len;
	uint32_t json_len;
	struct buffer json; /* candidate JSON so far */
	/* JSON structure check */
	unsigned depth;
	bool in_string, escaped;
	uint8_t is_array[JSON_MAX_DEPTH / 8];
	uint64_t blob_len;
	int replay_depth;
};

struct colo_stream {
	struct colo_stream_callbacks cb;
	struct colo_stream_limits lim;
	enum stream_state state;
	size_t want, have;   /* current field: size, bytes in scratch */
	uint64_t offset;     /* stream bytes consumed */
	uint64_t field_off;  /* where the current field started */
	uint64_t record_off; /* where the current RAM record started */
	char err[256];

	bool config_seen, subsection_ok;
	bool footer_ok;
	uint32_t footer_id;
	bool ram_seen, ram_done, blocks_seen;
	uint32_t ram_id;
	uint8_t section_type; /* of the ram section being read */
	uint32_t section_id;  /* of a START header being read */
	uint8_t name_len;
	uint32_t caps_left;
	uint16_t cmd;

	struct colo_ram_block blocks[COLO_STREAM_MAX_BLOCKS];
	size_t block_count;
	uint64_t mem_size_left;
	int cur_block; /* CONTINUE target, -1 until a name was sent */
	uint32_t rec_flags;
	uint64_t rec_offset;

	bool bulk_done, in_checkpoint, checkpoint_ram;
	uint32_t expect_msg;
	uint64_t checkpoints;
	uint64_t blob_size, blob_left;

	struct blob_scanner scan;
	uint8_t scratch[MIG_PAGE_SIZE];
};

/* Fails the stream and returns -1. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static inline int fail(struct colo_stream *s, const char *fmt, ...)
{
	va_list ap;

	if (s->state == ST_FAILED)
		return -1; /* keep the first, most specific message */
	va_start(ap, fmt);
	vsnprintf(s->err, sizeof(s->err), fmt, ap);
	va_end(ap);
	s->state = ST_FAILED;
	return -1;
}

/* Calls an optional callback; a nonzero return kills the stream. */
#define CALLBACK(s, name, ...)                                             \
	((s)->cb.name && (s)->cb.name((s)->cb.opaque, __VA_ARGS__) != 0 ?  \
		 fail((s), "callback failed: %s", #name) :                 \
		 0)

/* The next field is `want` bytes, read in `state`. */
static inline void expect(struct colo_stream *s, enum stream_state state,
			  size_t want)
{
	s->state = state;
	s->want = want;
	s->have = 0;
	s->field_off = s->offset;
}

/*
 * Each *_field() below takes the gathered field `f` of one of its own
 * states, and returns 0 or -1 (the stream failed).
 */

/* ---- colo_top_items.c --------------------------------------------------- */

int colo_top_item(struct colo_stream *s, uint8_t type, bool checkpoint);
int colo_top_item_field(struct colo_stream *s, const uint8_t *f);
/* A section ended: the next byte is an item type again. */
void colo_section_done(struct colo_stream *s);

/* ---- colo_configuration.c ----------------------------------------------- */

int colo_configuration_field(struct colo_stream *s, const uint8_t *f);

/* ---- colo_ram_records.c ------------------------------------------------- */

int colo_ram_field(struct colo_stream *s, const uint8_t *f);

/* ---- colo_bulk_blob.c --------------------------------------------------- */

/* `type`, read as an item type, is the bulk device blob's first byte. */
int colo_bulk_blob_begin(struct colo_stream *s, uint8_t type);
/* Consumes up to n bytes of the blob; returns how many. */
size_t colo_bulk_blob_feed(struct colo_stream *s, const uint8_t *p, size_t n);

/* ---- colo_checkpoint.c -------------------------------------------------- */

int colo_checkpoint_field(struct colo_stream *s, const uint8_t *f);
/* Consumes up to `avail` bytes of a checkpoint's device blob. */
size_t colo_checkpoint_blob_feed(struct colo_stream *s, const uint8_t *p,
				 size_t avail);

#endif
