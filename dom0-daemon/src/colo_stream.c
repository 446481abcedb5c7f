/*
 * Push parser for QEMU's COLO migration stream; see colo_stream.h for the
 * byte sequence.
 *
 * Shape: every item is read as a fixed-size "field" (gather() collects it
 * in scratch when it straddles feed calls, or points into the input when
 * it does not), then dispatch() decides the next field from its contents.
 * Two states do not fit that mould and stream instead: the bulk device
 * blob, which has no length and is scanned for its terminator, and a
 * checkpoint's device blob, which is passed through by length.
 *
 * Finding the end of the bulk device blob.  QEMU writes the device
 * sections (FULL) without lengths; only vmstate definitions could walk
 * them.  What follows them is fixed:
 *
 *     00 (EOF)  06 (VMDESCRIPTION)  be32 n  n bytes of JSON
 *
 * and then the source sends nothing until we answer CHECKPOINT_READY.  We
 * scan the blob for 00 06, and treat it as the terminator only if all of
 * this holds (anything else makes the candidate device data again):
 *   - 14 <= n <= max_vmdesc;
 *   - the JSON starts with {"page_size": (QEMU's writer always emits that
 *     key first: savevm.c:qemu_savevm_state_complete_precopy_non_iterable);
 *   - it is structurally valid: only JSON token characters outside strings,
 *     no control characters anywhere (QEMU's writer escapes them), brackets
 *     balanced and matched, and the outer object closes on exactly byte n;
 *   - optionally (strict_bulk_pause) no byte follows it in the same read.
 * A false match needs device data that contains 00 06, a plausible length
 * and then that exact key and a balanced JSON object ending exactly at
 * that length; device state is registers and small buffers, so this is
 * unlikely, though a guest that controls device buffers (a NIC's or a
 * serial port's) could craft it in principle.  The cure if it ever
 * matters is to walk the device sections with the VMDESCRIPTION of the
 * previous run; the strict pause check turns most such crafts into a
 * clean error instead of a corrupt blob.
 *
 * Cost of a rejected candidate: its bytes are held, then re-scanned from
 * the byte after its 00.  A 00 inside the JSON region rejects at once, so
 * a new candidate can only start within the 6 header bytes or at the
 * rejecting byte; each held byte is re-scanned a bounded number of times.
 */
#include "colo_stream.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VMDESC_PREFIX "{\"page_size\":"
#define VMDESC_PREFIX_LEN (sizeof(VMDESC_PREFIX) - 1)
#define JSON_MAX_DEPTH 256
#define MAX_REPLAY_DEPTH 16
#define MAX_CAPABILITIES 64

enum state {
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
	ST_DEVICE_BLOB,    /* streamed: scan_blob() */
	ST_COLO_MSG,       /* 4 */
	ST_COLO_SIZE,      /* 8 */
	ST_CKPT_TOP,       /* 1: item type inside a checkpoint */
	ST_CKPT_BLOB,      /* streamed: pass_checkpoint_blob() */
	ST_FAILED,
};

enum scan_state { SCAN_DATA, SCAN_HEADER, SCAN_JSON };

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
	enum state state;
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

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static int fail(struct colo_stream *s, const char *fmt, ...)
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

static void expect(struct colo_stream *s, enum state state, size_t want)
{
	s->state = state;
	s->want = want;
	s->have = 0;
	s->field_off = s->offset;
}

struct colo_stream *colo_stream_new(const struct colo_stream_callbacks *cb,
				    const struct colo_stream_limits *limits)
{
	struct colo_stream *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	if (cb)
		s->cb = *cb;
	if (limits) {
		s->lim = *limits;
	} else {
		s->lim.max_vmdesc = COLO_STREAM_DEFAULT_MAX_VMDESC;
		s->lim.max_device_blob = COLO_STREAM_DEFAULT_MAX_DEVICE_BLOB;
	}
	buffer_init(&s->scan.json);
	s->cur_block = -1;
	expect(s, ST_MAGIC, 8);
	return s;
}

void colo_stream_free(struct colo_stream *s)
{
	if (!s)
		return;
	buffer_free(&s->scan.json);
	free(s);
}

/* Returns the current field once all of it is in, else NULL. */
static const uint8_t *gather(struct colo_stream *s, const uint8_t **p,
			     const uint8_t *end)
{
	size_t avail = (size_t)(end - *p);

	if (s->want == 0)
		return s->scratch;
	if (s->have == 0 && avail >= s->want) {
		const uint8_t *field = *p;

		*p += s->want;
		s->offset += s->want;
		return field;
	}
	size_t n = s->want - s->have < avail ? s->want - s->have : avail;
	memcpy(s->scratch + s->have, *p, n);
	s->have += n;
	*p += n;
	s->offset += n;
	if (s->have < s->want)
		return NULL;
	s->have = 0;
	return s->scratch;
}

/* ---- the bulk device blob ---------------------------------------------- */

static int emit_blob(struct colo_stream *s, const uint8_t *data, size_t len)
{
	if (len == 0)
		return 0;
	if (len > s->lim.max_device_blob - s->scan.blob_len)
		return fail(s, "device state too large: more than %zu bytes "
			       "(max configurable)", s->lim.max_device_blob);
	s->scan.blob_len += len;
	return CALLBACK(s, on_device_blob_chunk, data, len);
}

static size_t scan_blob(struct colo_stream *s, const uint8_t *p, size_t n);

/*
 * The candidate turned out to be device data: its first byte (the 00) is
 * blob, and the rest must be scanned again since a real terminator may
 * start inside it.  `tail` is the part of the held bytes that is not yet
 * in s->scan.json (the byte that rejected a header).
 */
static int reject_candidate(struct colo_stream *s, const uint8_t *tail,
			    size_t tail_len)
{
	struct blob_scanner *sc = &s->scan;
	uint8_t header[6];
	size_t header_len = sc->header_len;
	struct buffer json = sc->json;

	memcpy(header, sc->header, header_len);
	buffer_init(&sc->json); /* the held JSON is ours now */
	sc->state = SCAN_DATA;
	sc->header_len = 0;
	if (++sc->replay_depth > MAX_REPLAY_DEPTH) {
		buffer_free(&json);
		return fail(s, "internal error: device blob re-scan too deep");
	}
	int rc = emit_blob(s, header, 1);
	/* buffer_head() of an empty buffer would be NULL + 0. */
	const uint8_t *held = buffer_len(&json) ? buffer_head(&json) : NULL;
	const uint8_t *parts[3] = { header + 1, held, tail };
	size_t lens[3] = { header_len - 1, buffer_len(&json), tail_len };
	for (int i = 0; i < 3 && rc == 0; i++) {
		if (lens[i] == 0)
			continue;
		size_t done = scan_blob(s, parts[i], lens[i]);
		if (s->state == ST_FAILED)
			rc = -1;
		else if (s->state != ST_DEVICE_BLOB || done != lens[i])
			/* Cannot happen with the prefix check; see top. */
			rc = fail(s, "ambiguous end of device state near "
				     "offset %llu", (unsigned long long)s->offset);
	}
	sc->replay_depth--;
	buffer_free(&json);
	return rc;
}

static void json_reset(struct blob_scanner *sc)
{
	sc->depth = 0;
	sc->in_string = false;
	sc->escaped = false;
	buffer_clear(&sc->json);
}

/*
 * One byte of the candidate VMDESCRIPTION.  Returns -1 when it cannot be
 * QEMU's JSON, 1 when `last` completes a valid object, else 0.
 */
static int json_step(struct blob_scanner *sc, size_t pos, uint8_t c, bool last)
{
	if (pos < VMDESC_PREFIX_LEN && c != (uint8_t)VMDESC_PREFIX[pos])
		return -1;
	if (c < 0x20 && (sc->in_string || (c != '\t' && c != '\n' && c != '\r')))
		return -1;
	if (sc->in_string) {
		if (sc->escaped)
			sc->escaped = false;
		else if (c == '\\')
			sc->escaped = true;
		else if (c == '"')
			sc->in_string = false;
	} else if (c == '{' || c == '[') {
		if (sc->depth == JSON_MAX_DEPTH)
			return -1;
		if (c == '[')
			sc->is_array[sc->depth / 8] |= (uint8_t)(1u << (sc->depth % 8));
		else
			sc->is_array[sc->depth / 8] &= (uint8_t)~(1u << (sc->depth % 8));
		sc->depth++;
	} else if (c == '}' || c == ']') {
		if (sc->depth == 0)
			return -1;
		sc->depth--;
		bool array = sc->is_array[sc->depth / 8] >> (sc->depth % 8) & 1;
		if (array != (c == ']') || (sc->depth == 0 && !last))
			return -1;
	} else if (c == '"') {
		sc->in_string = true;
	} else if (!strchr(",:-+.0123456789eEtrufalsn \t\n\r", c) || c == 0) {
		return -1;
	}
	if (last)
		return sc->depth == 0 && !sc->in_string ? 1 : -1;
	return 0;
}

/* The terminator is confirmed: the blob (with its EOF byte) is complete. */
static int finish_bulk(struct colo_stream *s)
{
	struct blob_scanner *sc = &s->scan;
	const uint8_t eof = MIG_EOF;

	if (emit_blob(s, &eof, 1) < 0 ||
	    CALLBACK(s, on_device_blob_complete, sc->blob_len) < 0 ||
	    CALLBACK(s, on_vmdescription, (const char *)buffer_head(&sc->json),
		     buffer_len(&sc->json)) < 0)
		return -1;
	buffer_free(&sc->json); /* up to max_vmdesc: give it back */
	s->bulk_done = true;
	s->expect_msg = COLO_MSG_CHECKPOINT_REQUEST;
	if (s->cb.on_bulk_complete && s->cb.on_bulk_complete(s->cb.opaque))
		return fail(s, "callback failed: on_bulk_complete");
	expect(s, ST_COLO_MSG, 4);
	return 0;
}

/*
 * Scans n bytes of the bulk device blob.  Returns how many it used: all of
 * them, unless the terminator ended inside (then the stream moved on to
 * ST_COLO_MSG) or the stream failed.
 */
static size_t scan_blob(struct colo_stream *s, const uint8_t *p, size_t n)
{
	struct blob_scanner *sc = &s->scan;
	size_t i = 0;

	while (i < n && s->state == ST_DEVICE_BLOB) {
		if (sc->state == SCAN_DATA) {
			/* Skip 00s not followed by 06 without splitting chunks. */
			size_t run = i;
			const uint8_t *z;

			for (;;) {
				z = memchr(p + run, 0, n - run);
				if (!z || z + 1 == p + n || z[1] == MIG_VMDESCRIPTION)
					break;
				run = (size_t)(z - p) + 1;
			}
			size_t stop = z ? (size_t)(z - p) : n;
			if (emit_blob(s, p + i, stop - i) < 0)
				return i;
			i = stop;
			if (z) {
				sc->state = SCAN_HEADER;
				sc->header[0] = 0;
				sc->header_len = 1;
				i++;
			}
		} else if (sc->state == SCAN_HEADER) {
			uint8_t c = p[i++];

			sc->header[sc->header_len++] = c;
			if (sc->header_len == 2 && c != MIG_VMDESCRIPTION) {
				sc->header_len = 1; /* c gets re-scanned */
				if (reject_candidate(s, &c, 1) < 0)
					return i;
				continue;
			}
			if (sc->header_len < 6)
				continue;
			sc->json_len = mig_be32(sc->header + 2);
			if (sc->json_len <= VMDESC_PREFIX_LEN ||
			    sc->json_len > s->lim.max_vmdesc) {
				sc->header_len = 5;
				if (reject_candidate(s, &c, 1) < 0)
					return i;
				continue;
			}
			json_reset(sc);
			sc->state = SCAN_JSON;
		} else {
			size_t start = i, pos = buffer_len(&sc->json);
			int verdict = 0;

			while (i < n && verdict == 0) {
				verdict = json_step(sc, pos, p[i],
						    pos + 1 == sc->json_len);
				pos++;
				i++;
			}
			if (buffer_append(&sc->json, p + start, i - start) < 0) {
				fail(s, "out of memory holding VMDESCRIPTION");
				return i;
			}
			if (verdict < 0) {
				if (reject_candidate(s, NULL, 0) < 0)
					return i;
			} else if (verdict > 0) {
				if (finish_bulk(s) < 0)
					return i;
			}
		}
	}
	return i;
}

/* ---- checkpoints ------------------------------------------------------- */

/*
 * Passes up to `avail` bytes of a checkpoint's device state through.
 * Returns how many it consumed; on error the stream is failed.
 */
static size_t pass_checkpoint_blob(struct colo_stream *s, const uint8_t *p,
				   size_t avail)
{
	size_t n = avail < s->blob_left ? avail : (size_t)s->blob_left;

	/* Cheap sanity checks that QEMU's qemu_save_device_state() meets. */
	if (s->blob_left == s->blob_size && p[0] != MIG_SECTION_FULL &&
	    p[0] != MIG_EOF) {
		fail(s, "checkpoint device state starts with 0x%02x, not a FULL "
			"section, at offset %llu", p[0],
		     (unsigned long long)s->offset);
		return 0;
	}
	s->offset += n;
	s->blob_left -= n;
	if (CALLBACK(s, on_checkpoint_device_blob, p, n) < 0 || s->blob_left)
		return n;
	if (p[n - 1] != MIG_EOF) {
		fail(s, "checkpoint device state does not end with EOF (offset "
			"%llu)", (unsigned long long)s->offset - 1);
		return n;
	}
	s->checkpoints++;
	s->expect_msg = COLO_MSG_CHECKPOINT_REQUEST;
	expect(s, ST_COLO_MSG, 4);
	CALLBACK(s, on_checkpoint_complete, s->checkpoints, s->blob_size);
	return n;
}

static int colo_message(struct colo_stream *s, uint32_t msg)
{
	if (msg >= COLO_MSG_COUNT)
		return fail(s, "unknown COLO message %u at offset %llu", msg,
			    (unsigned long long)s->field_off);
	if (msg != s->expect_msg)
		return fail(s, "unexpected COLO message %s at offset %llu "
			       "(expected %s)", colo_message_name(msg),
			    (unsigned long long)s->field_off,
			    colo_message_name(s->expect_msg));
	switch (msg) {
	case COLO_MSG_CHECKPOINT_REQUEST:
		s->expect_msg = COLO_MSG_VMSTATE_SEND;
		expect(s, ST_COLO_MSG, 4);
		break;
	case COLO_MSG_VMSTATE_SEND:
		s->in_checkpoint = true;
		s->checkpoint_ram = false;
		expect(s, ST_CKPT_TOP, 1);
		break;
	default: /* VMSTATE_SIZE: report it with its value */
		expect(s, ST_COLO_SIZE, 8);
		return 0;
	}
	return CALLBACK(s, on_colo_message, (enum colo_message)msg, 0);
}

static int vmstate_size(struct colo_stream *s, uint64_t size)
{
	if (size == 0)
		return fail(s, "empty device state at offset %llu",
			    (unsigned long long)s->field_off);
	if (size > s->lim.max_device_blob)
		return fail(s, "vmstate size too large: %llu bytes at offset "
			       "%llu (max %zu, configurable)",
			    (unsigned long long)size,
			    (unsigned long long)s->field_off,
			    s->lim.max_device_blob);
	s->blob_size = s->blob_left = size;
	s->state = ST_CKPT_BLOB;
	return CALLBACK(s, on_colo_message, COLO_MSG_VMSTATE_SIZE, size);
}

/* ---- sections ---------------------------------------------------------- */

static void section_done(struct colo_stream *s)
{
	expect(s, s->in_checkpoint ? ST_CKPT_TOP : ST_TOP, 1);
}

/* The first byte of the bulk device blob was read as an item type. */
static int begin_device_blob(struct colo_stream *s, uint8_t type)
{
	if (!s->ram_done)
		return fail(s, "device state at offset %llu before the ram END "
			       "section", (unsigned long long)s->field_off);
	s->state = ST_DEVICE_BLOB;
	s->scan.state = SCAN_DATA;
	s->scan.blob_len = 0;
	scan_blob(s, &type, 1);
	return s->state == ST_FAILED ? -1 : 0;
}

static int top_item(struct colo_stream *s, uint8_t type, bool checkpoint)
{
	bool subsection_ok = s->subsection_ok, footer_ok = s->footer_ok;

	s->subsection_ok = s->footer_ok = false;
	if (type == MIG_SECTION_FOOTER) {
		if (!footer_ok)
			return fail(s, "unexpected section footer at offset %llu",
				    (unsigned long long)s->field_off);
		expect(s, ST_FOOTER_ID, 4);
		return 0;
	}
	if (checkpoint) {
		if (type == MIG_SECTION_END && !s->checkpoint_ram) {
			s->section_type = type;
			expect(s, ST_PART_ID, 4);
		} else if (type == MIG_EOF && s->checkpoint_ram) {
			s->in_checkpoint = false;
			s->expect_msg = COLO_MSG_VMSTATE_SIZE;
			expect(s, ST_COLO_MSG, 4);
		} else {
			return fail(s, "unexpected section type 0x%02x in checkpoint "
				       "at offset %llu", type,
				    (unsigned long long)s->field_off);
		}
		return 0;
	}
	switch (type) {
	case MIG_CONFIGURATION:
		if (s->config_seen)
			return fail(s, "second CONFIGURATION at offset %llu",
				    (unsigned long long)s->field_off);
		s->config_seen = true;
		expect(s, ST_CONFIG_LEN, 4);
		return 0;
	case MIG_SUBSECTION:
		if (!subsection_ok)
			return fail(s, "unexpected subsection at offset %llu",
				    (unsigned long long)s->field_off);
		expect(s, ST_SUB_NAME_LEN, 1);
		return 0;
	case MIG_COMMAND:
		expect(s, ST_CMD_HDR, 4);
		return 0;
	case MIG_SECTION_START:
		expect(s, ST_START_HDR, 5);
		return 0;
	case MIG_SECTION_PART:
	case MIG_SECTION_END:
		s->section_type = type;
		expect(s, ST_PART_ID, 4);
		return 0;
	case MIG_SECTION_FULL:
	case MIG_EOF:
		return begin_device_blob(s, type);
	case MIG_VMDESCRIPTION:
		return fail(s, "VMDESCRIPTION without EOF at offset %llu",
			    (unsigned long long)s->field_off);
	default:
		return fail(s, "unknown section type 0x%02x at offset %llu", type,
			    (unsigned long long)s->field_off);
	}
}

static int ram_section(struct colo_stream *s, uint32_t id, uint32_t instance,
		       uint32_t version)
{
	struct colo_section section = {
		.type = s->section_type,
		.id = id,
		.idstr = "ram",
		.instance = instance,
		.version = version,
		.checkpoint = s->in_checkpoint,
	};

	expect(s, ST_RAM_RECORD, 8);
	return CALLBACK(s, on_section, &section);
}

static int start_section(struct colo_stream *s, const uint8_t *f)
{
	uint32_t id = s->section_id;
	char idstr[256];

	memcpy(idstr, f, s->name_len);
	idstr[s->name_len] = '\0';
	uint32_t instance = mig_be32(f + s->name_len);
	uint32_t version = mig_be32(f + s->name_len + 4);
	if (strcmp(idstr, "ram") != 0)
		return fail(s, "unsupported iterable section '%s' at offset %llu "
			       "(only ram is walked)", idstr,
			    (unsigned long long)s->field_off);
	if (s->ram_seen)
		return fail(s, "second ram START section at offset %llu",
			    (unsigned long long)s->field_off);
	if (version != MIG_RAM_SECTION_VERSION)
		return fail(s, "ram section version %u unsupported (need 4)",
			    version);
	s->ram_seen = true;
	s->ram_id = id;
	s->section_type = MIG_SECTION_START;
	return ram_section(s, id, instance, version);
}

static int part_section(struct colo_stream *s, uint32_t id)
{
	const char *what = s->section_type == MIG_SECTION_END ? "END" : "PART";

	if (!s->ram_seen || id != s->ram_id)
		return fail(s, "%s for section %u at offset %llu, which is not "
			       "the ram section", what, id,
			    (unsigned long long)s->field_off - 1);
	if (s->ram_done && !s->in_checkpoint)
		return fail(s, "ram %s after the ram END section at offset %llu",
			    what, (unsigned long long)s->field_off - 1);
	if (s->in_checkpoint)
		s->checkpoint_ram = true;
	else if (s->section_type == MIG_SECTION_END)
		s->ram_done = true;
	return ram_section(s, id, 0, MIG_RAM_SECTION_VERSION);
}

/* ---- RAM records ------------------------------------------------------- */

static int find_block(const struct colo_stream *s, const char *name)
{
	for (size_t i = 0; i < s->block_count; i++)
		if (strcmp(s->blocks[i].name, name) == 0)
			return (int)i;
	return -1;
}

/* The block is known: check the offset, then read the payload. */
static int page_target(struct colo_stream *s)
{
	const struct colo_ram_block *b = &s->blocks[s->cur_block];

	if (s->rec_offset >= b->length)
		return fail(s, "page offset 0x%llx beyond block %s (length "
			       "0x%llx) at offset %llu",
			    (unsigned long long)s->rec_offset, b->name,
			    (unsigned long long)b->length,
			    (unsigned long long)s->record_off);
	if (s->rec_flags == RAM_FLAG_PAGE)
		expect(s, ST_RAM_PAGE, MIG_PAGE_SIZE);
	else
		expect(s, ST_RAM_FILL, 1);
	return 0;
}

static int ram_record(struct colo_stream *s, uint64_t word)
{
	uint32_t flags = (uint32_t)(word & MIG_RAM_FLAG_MASK);
	uint64_t addr = word & ~(uint64_t)MIG_RAM_FLAG_MASK;
	unsigned long long at = (unsigned long long)s->field_off;

	s->record_off = s->field_off;
	if (flags & RAM_FLAG_XBZRLE)
		return fail(s, "XBZRLE page at offset %llu: the xbzrle "
			       "capability is not supported", at);
	if (flags & RAM_FLAG_COMPRESS_PAGE)
		return fail(s, "compressed page at offset %llu: the compress "
			       "capability is not supported", at);
	if (flags & RAM_FLAG_HOOK)
		return fail(s, "RDMA hook record at offset %llu: rdma is not "
			       "supported", at);
	switch (flags & ~(uint32_t)RAM_FLAG_CONTINUE) {
	case RAM_FLAG_MEM_SIZE:
		if (flags != RAM_FLAG_MEM_SIZE || s->blocks_seen ||
		    s->section_type != MIG_SECTION_START)
			return fail(s, "unexpected MEM_SIZE record at offset %llu",
				    at);
		s->blocks_seen = true;
		s->mem_size_left = addr;
		if (addr)
			expect(s, ST_MEMSZ_NAME_LEN, 1);
		else
			expect(s, ST_RAM_RECORD, 8);
		return 0;
	case RAM_FLAG_EOS:
		if (word != RAM_FLAG_EOS)
			return fail(s, "malformed EOS record 0x%llx at offset %llu",
				    (unsigned long long)word, at);
		s->footer_ok = true;
		s->footer_id = s->ram_id;
		section_done(s);
		return 0;
	case RAM_FLAG_ZERO:
	case RAM_FLAG_PAGE:
		s->rec_flags = flags & ~(uint32_t)RAM_FLAG_CONTINUE;
		s->rec_offset = addr;
		if (!(flags & RAM_FLAG_CONTINUE)) {
			expect(s, ST_RAM_NAME_LEN, 1);
			return 0;
		}
		if (s->cur_block < 0)
			return fail(s, "unknown RAM block: CONTINUE record at "
				       "offset %llu before any block name", at);
		return page_target(s);
	default:
		return fail(s, "unknown RAM record flags 0x%x at offset %llu",
			    flags, at);
	}
}

static int mem_size_block(struct colo_stream *s, const uint8_t *f)
{
	struct colo_ram_block *b = &s->blocks[s->block_count];

	memcpy(b->name, f, s->name_len);
	b->name[s->name_len] = '\0';
	b->length = mig_be64(f + s->name_len);
	b->index = (unsigned)s->block_count;
	if (find_block(s, b->name) >= 0)
		return fail(s, "duplicate RAM block '%s' in MEM_SIZE", b->name);
	if (b->length == 0 || b->length % MIG_PAGE_SIZE)
		return fail(s, "RAM block %s length 0x%llx is not a positive "
			       "multiple of the page size", b->name,
			    (unsigned long long)b->length);
	if (b->length > s->mem_size_left)
		return fail(s, "RAM block sizes exceed the MEM_SIZE total at "
			       "block %s", b->name);
	s->block_count++;
	s->mem_size_left -= b->length;
	if (s->mem_size_left)
		expect(s, ST_MEMSZ_NAME_LEN, 1);
	else
		expect(s, ST_RAM_RECORD, 8);
	return CALLBACK(s, on_ram_block, b);
}

/* ---- configuration ----------------------------------------------------- */

static void subsection_done(struct colo_stream *s)
{
	s->subsection_ok = true;
	expect(s, ST_TOP, 1);
}

static int config_subsection(struct colo_stream *s, const uint8_t *f)
{
	char name[256];

	memcpy(name, f, s->name_len);
	name[s->name_len] = '\0';
	uint32_t version = mig_be32(f + s->name_len);
	if (version != 1)
		return fail(s, "configuration subsection %s version %u", name,
			    version);
	if (strcmp(name, "configuration/target-page-bits") == 0)
		expect(s, ST_SUB_PAGE_BITS, 4);
	else if (strcmp(name, "configuration/capabilities") == 0)
		expect(s, ST_SUB_CAPS_COUNT, 4);
	else if (strcmp(name, "configuration/uuid") == 0)
		expect(s, ST_SUB_UUID, 16);
	else
		return fail(s, "unknown configuration subsection '%s' at offset "
			       "%llu", name, (unsigned long long)s->field_off);
	return 0;
}

static int capability(struct colo_stream *s, const uint8_t *f)
{
	char name[256];

	memcpy(name, f, s->want);
	name[s->want] = '\0';
	/* It adds a be64 address per block to MEM_SIZE, which we do not read. */
	if (strcmp(name, "x-ignore-shared") == 0)
		return fail(s, "capability x-ignore-shared is not supported");
	if (--s->caps_left)
		expect(s, ST_SUB_CAP_LEN, 1);
	else
		subsection_done(s);
	return 0;
}

static int command(struct colo_stream *s, const uint8_t *f)
{
	s->cmd = mig_be16(f);
	uint16_t len = mig_be16(f + 2);

	/*
	 * Postcopy and packaged commands change the stream's shape; the
	 * capabilities behind them are not enabled by remusdbd.
	 */
	if (s->cmd != MIG_CMD_ENABLE_COLO && s->cmd != MIG_CMD_PING &&
	    s->cmd != 1 /* open return path */)
		return fail(s, "unsupported command %u at offset %llu", s->cmd,
			    (unsigned long long)s->field_off - 1);
	if (len > COLO_STREAM_MAX_COMMAND)
		return fail(s, "command %u too long (%u bytes)", s->cmd, len);
	expect(s, ST_CMD_DATA, len);
	return 0;
}

/* ---- dispatch ---------------------------------------------------------- */

static int dispatch(struct colo_stream *s, const uint8_t *f)
{
	char name[256];
	uint32_t v;

	switch (s->state) {
	case ST_MAGIC:
		if (mig_be32(f) != MIG_FILE_MAGIC)
			return fail(s, "bad magic 0x%08x at offset 0 (expected "
				       "0x%08x)", mig_be32(f), MIG_FILE_MAGIC);
		if (mig_be32(f + 4) != MIG_FILE_VERSION)
			return fail(s, "unsupported stream version %u",
				    mig_be32(f + 4));
		expect(s, ST_TOP, 1);
		return 0;
	case ST_TOP:
		return top_item(s, f[0], false);
	case ST_CKPT_TOP:
		return top_item(s, f[0], true);
	case ST_CONFIG_LEN:
		v = mig_be32(f);
		if (v == 0 || v > 255)
			return fail(s, "machine type length %u out of range", v);
		expect(s, ST_CONFIG_NAME, v);
		return 0;
	case ST_CONFIG_NAME:
		memcpy(name, f, s->want);
		name[s->want] = '\0';
		subsection_done(s);
		return CALLBACK(s, on_configuration, name);
	case ST_SUB_NAME_LEN:
		if (f[0] == 0)
			return fail(s, "empty subsection name at offset %llu",
				    (unsigned long long)s->field_off);
		s->name_len = f[0];
		expect(s, ST_SUB_NAME, f[0] + 4u);
		return 0;
	case ST_SUB_NAME:
		return config_subsection(s, f);
	case ST_SUB_PAGE_BITS:
		if (mig_be32(f) != 12)
			return fail(s, "target page bits %u unsupported (need 12)",
				    mig_be32(f));
		subsection_done(s);
		return 0;
	case ST_SUB_CAPS_COUNT:
		s->caps_left = mig_be32(f);
		if (s->caps_left > MAX_CAPABILITIES)
			return fail(s, "%u capabilities in configuration",
				    s->caps_left);
		if (s->caps_left)
			expect(s, ST_SUB_CAP_LEN, 1);
		else
			subsection_done(s);
		return 0;
	case ST_SUB_CAP_LEN:
		expect(s, ST_SUB_CAP_NAME, f[0]);
		return 0;
	case ST_SUB_CAP_NAME:
		return capability(s, f);
	case ST_SUB_UUID:
		subsection_done(s);
		return 0;
	case ST_CMD_HDR:
		return command(s, f);
	case ST_CMD_DATA:
		v = (uint32_t)s->want;
		expect(s, ST_TOP, 1);
		return CALLBACK(s, on_command, s->cmd, f, (uint16_t)v);
	case ST_START_HDR:
		if (f[4] == 0)
			return fail(s, "empty section name at offset %llu",
				    (unsigned long long)s->field_off);
		s->name_len = f[4];
		s->section_id = mig_be32(f);
		expect(s, ST_START_IDSTR, f[4] + 8u);
		return 0;
	case ST_START_IDSTR:
		return start_section(s, f);
	case ST_PART_ID:
		return part_section(s, mig_be32(f));
	case ST_FOOTER_ID:
		if (mig_be32(f) != s->footer_id)
			return fail(s, "footer for section %u at offset %llu, "
				       "expected %u", mig_be32(f),
				    (unsigned long long)s->field_off - 1,
				    s->footer_id);
		section_done(s);
		return 0;
	case ST_RAM_RECORD:
		return ram_record(s, mig_be64(f));
	case ST_RAM_NAME_LEN:
		if (f[0] == 0)
			return fail(s, "empty RAM block name at offset %llu",
				    (unsigned long long)s->record_off);
		expect(s, ST_RAM_NAME, f[0]);
		return 0;
	case ST_RAM_NAME:
		memcpy(name, f, s->want);
		name[s->want] = '\0';
		s->cur_block = find_block(s, name);
		if (s->cur_block < 0)
			return fail(s, "unknown RAM block '%s' at offset %llu",
				    name, (unsigned long long)s->record_off);
		return page_target(s);
	case ST_RAM_FILL:
		expect(s, ST_RAM_RECORD, 8);
		return CALLBACK(s, on_zero_page, &s->blocks[s->cur_block],
				s->rec_offset, f[0]);
	case ST_RAM_PAGE:
		expect(s, ST_RAM_RECORD, 8);
		return CALLBACK(s, on_page, &s->blocks[s->cur_block],
				s->rec_offset, f);
	case ST_MEMSZ_NAME_LEN:
		if (f[0] == 0)
			return fail(s, "empty RAM block name in MEM_SIZE at "
				       "offset %llu",
				    (unsigned long long)s->field_off);
		if (s->block_count == COLO_STREAM_MAX_BLOCKS)
			return fail(s, "more than %d RAM blocks",
				    COLO_STREAM_MAX_BLOCKS);
		s->name_len = f[0];
		expect(s, ST_MEMSZ_NAME, f[0] + 8u);
		return 0;
	case ST_MEMSZ_NAME:
		return mem_size_block(s, f);
	case ST_COLO_MSG:
		return colo_message(s, mig_be32(f));
	case ST_COLO_SIZE:
		return vmstate_size(s, mig_be64(f));
	default:
		return fail(s, "internal error: state %d", (int)s->state);
	}
}

int colo_stream_feed(struct colo_stream *s, const uint8_t *data, size_t len,
		     const char **err)
{
	if (s->state != ST_FAILED && len == 0)
		return COLO_STREAM_NEED_MORE; /* and no arithmetic on NULL */

	const uint8_t *p = data, *end = data + len;

	while (s->state != ST_FAILED) {
		if (s->state == ST_DEVICE_BLOB) {
			if (p == end)
				break;
			size_t used = scan_blob(s, p, (size_t)(end - p));
			p += used;
			s->offset += used;
			if (s->state == ST_COLO_MSG) {
				s->field_off = s->offset;
				if (s->lim.strict_bulk_pause && p != end)
					fail(s, "data after VMDESCRIPTION at "
						"offset %llu: QEMU waits for "
						"CHECKPOINT_READY there (false "
						"end-of-device-state match?)",
					     (unsigned long long)s->offset);
			}
			continue;
		}
		if (s->state == ST_CKPT_BLOB) {
			if (p == end)
				break;
			p += pass_checkpoint_blob(s, p, (size_t)(end - p));
			continue;
		}
		if (s->want > s->have && p == end)
			break;
		const uint8_t *field = gather(s, &p, end);
		if (!field)
			break;
		dispatch(s, field);
	}
	if (s->state == ST_FAILED) {
		if (err)
			*err = s->err;
		return COLO_STREAM_ERROR;
	}
	return COLO_STREAM_NEED_MORE;
}

int colo_stream_finish(struct colo_stream *s, const char **err)
{
	if (colo_stream_at_boundary(s))
		return 0;
	if (!s->bulk_done)
		fail(s, "truncated: stream ended at offset %llu in the bulk "
			"migration", (unsigned long long)s->offset);
	else
		fail(s, "truncated: stream ended at offset %llu inside checkpoint "
			"%llu", (unsigned long long)s->offset,
		     (unsigned long long)s->checkpoints + 1);
	if (err)
		*err = s->err;
	return COLO_STREAM_ERROR;
}

enum colo_stream_phase colo_stream_phase(const struct colo_stream *s)
{
	if (s->state == ST_FAILED)
		return COLO_PHASE_FAILED;
	if (!s->bulk_done)
		return COLO_PHASE_BULK;
	if (s->state == ST_COLO_MSG && s->have == 0 &&
	    s->expect_msg == COLO_MSG_CHECKPOINT_REQUEST)
		return COLO_PHASE_IDLE;
	return COLO_PHASE_CHECKPOINT;
}

bool colo_stream_at_boundary(const struct colo_stream *s)
{
	return colo_stream_phase(s) == COLO_PHASE_IDLE;
}

const char *colo_stream_error(const struct colo_stream *s)
{
	return s->state == ST_FAILED ? s->err : NULL;
}

uint64_t colo_stream_offset(const struct colo_stream *s)
{
	return s->offset;
}

uint64_t colo_stream_checkpoints(const struct colo_stream *s)
{
	return s->checkpoints;
}

const struct colo_ram_block *colo_stream_blocks(const struct colo_stream *s,
						size_t *count)
{
	*count = s->block_count;
	return s->blocks;
}

bool colo_stream_ram_section_id(const struct colo_stream *s, uint32_t *id)
{
	if (s->ram_seen)
		*id = s->ram_id;
	return s->ram_seen;
}
