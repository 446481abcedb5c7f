/*
 * Push parser for QEMU's COLO migration stream; see colo_stream.h for the
 * byte sequence, and colo_stream_internal.h for which file parses what.
 *
 * Shape: every item is read as a fixed-size "field" (gather() collects it
 * in scratch when it straddles feed calls, or points into the input when
 * it does not), then dispatch() hands it to the file that owns its state,
 * which decides the next field from its contents.  Two states do not fit
 * that mould and stream instead: the bulk device blob, which has no length
 * and is scanned for its terminator (colo_bulk_blob.c), and a checkpoint's
 * device blob, which is passed through by length (colo_checkpoint.c).
 */
#include "qemu/colo_stream_internal.h"

#include <stdlib.h>
#include <string.h>

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

/* ---- dispatch ---------------------------------------------------------- */

static int dispatch(struct colo_stream *s, const uint8_t *f)
{
	switch (s->state) {
	case ST_MAGIC:
		if (load_be32(f) != MIG_FILE_MAGIC)
			return fail(s, "bad magic 0x%08x at offset 0 (expected "
				       "0x%08x)", load_be32(f), MIG_FILE_MAGIC);
		if (load_be32(f + 4) != MIG_FILE_VERSION)
			return fail(s, "unsupported stream version %u",
				    load_be32(f + 4));
		expect(s, ST_TOP, 1);
		return 0;
	case ST_TOP:
		return colo_top_item(s, f[0], false);
	case ST_CKPT_TOP:
		return colo_top_item(s, f[0], true);
	case ST_CMD_HDR:
	case ST_CMD_DATA:
	case ST_START_HDR:
	case ST_START_IDSTR:
	case ST_PART_ID:
	case ST_FOOTER_ID:
		return colo_top_item_field(s, f);
	case ST_CONFIG_LEN:
	case ST_CONFIG_NAME:
	case ST_SUB_NAME_LEN:
	case ST_SUB_NAME:
	case ST_SUB_PAGE_BITS:
	case ST_SUB_CAPS_COUNT:
	case ST_SUB_CAP_LEN:
	case ST_SUB_CAP_NAME:
	case ST_SUB_UUID:
		return colo_configuration_field(s, f);
	case ST_RAM_RECORD:
	case ST_RAM_NAME_LEN:
	case ST_RAM_NAME:
	case ST_RAM_FILL:
	case ST_RAM_PAGE:
	case ST_MEMSZ_NAME_LEN:
	case ST_MEMSZ_NAME:
		return colo_ram_field(s, f);
	case ST_COLO_MSG:
	case ST_COLO_SIZE:
		return colo_checkpoint_field(s, f);
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
			p += colo_bulk_blob_feed(s, p, (size_t)(end - p));
			continue;
		}
		if (s->state == ST_CKPT_BLOB) {
			if (p == end)
				break;
			p += colo_checkpoint_blob_feed(s, p, (size_t)(end - p));
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
