/*
 * The bulk device blob: everything from the first FULL device section (or
 * the EOF, if there is none) through the EOF before VMDESCRIPTION, passed
 * on in chunks, and the VMDESCRIPTION after it.
 *
 * Finding the blob's end.  QEMU writes the device
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
#include "qemu/colo_stream_internal.h"

#include <string.h>

#define VMDESC_PREFIX "{\"page_size\":"
#define VMDESC_PREFIX_LEN (sizeof(VMDESC_PREFIX) - 1)
/* reject_candidate() and scan_blob() recurse; the bound is a safety net. */
#define MAX_REPLAY_DEPTH 16

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

static size_t scan_blob(struct colo_stream *s, const uint8_t *p, size_t n,
			bool fresh);

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
		size_t done = scan_blob(s, parts[i], lens[i], false);
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
	/* Before the callback, so it sees the IDLE phase it is told about. */
	expect(s, ST_COLO_MSG, 4);
	if (s->cb.on_bulk_complete && s->cb.on_bulk_complete(s->cb.opaque))
		return fail(s, "callback failed: on_bulk_complete");
	return 0;
}

/*
 * Scans n bytes of the bulk device blob.  Returns how many it used: all of
 * them, unless the terminator ended inside (then the stream moved on to
 * ST_COLO_MSG) or the stream failed.
 *
 * `fresh`: the bytes come from the caller's input and are not yet counted
 * in s->offset; they are counted as they are consumed, before any
 * callback, so colo_stream_offset() in on_device_blob_chunk(),
 * on_device_blob_complete(), on_vmdescription() and on_bulk_complete() is
 * the end of what was consumed (for on_bulk_complete, the end of the bulk
 * stream).  Bytes re-scanned by reject_candidate() and the type byte
 * gather() read were counted already.  (A terminator completed during a
 * re-scan fails as ambiguous in reject_candidate(), so only fresh bytes
 * end the bulk stream.)
 */
static size_t scan_blob(struct colo_stream *s, const uint8_t *p, size_t n,
			bool fresh)
{
	struct blob_scanner *sc = &s->scan;
	size_t i = 0;
	uint64_t counted = s->offset;
#define CONSUMED(upto)                                                     \
	do {                                                               \
		if (fresh)                                                 \
			s->offset = counted + (upto);                      \
	} while (0)

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
			CONSUMED(stop);
			if (emit_blob(s, p + i, stop - i) < 0)
				return stop;
			i = stop;
			if (z) {
				sc->state = SCAN_HEADER;
				sc->header[0] = 0;
				sc->header_len = 1;
				i++;
				CONSUMED(i);
			}
		} else if (sc->state == SCAN_HEADER) {
			uint8_t c = p[i++];

			CONSUMED(i);
			sc->header[sc->header_len++] = c;
			if (sc->header_len == 2 && c != MIG_VMDESCRIPTION) {
				sc->header_len = 1; /* c gets re-scanned */
				if (reject_candidate(s, &c, 1) < 0)
					return i;
				continue;
			}
			if (sc->header_len < 6)
				continue;
			sc->json_len = load_be32(sc->header + 2);
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
			CONSUMED(i);
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
#undef CONSUMED
}

int colo_bulk_blob_begin(struct colo_stream *s, uint8_t type)
{
	s->state = ST_DEVICE_BLOB;
	s->scan.state = SCAN_DATA;
	s->scan.blob_len = 0;
	scan_blob(s, &type, 1, false); /* gather() counted it */
	return s->state == ST_FAILED ? -1 : 0;
}

/* scan_blob() counts the stream offset as it consumes. */
size_t colo_bulk_blob_feed(struct colo_stream *s, const uint8_t *p, size_t n)
{
	size_t used = scan_blob(s, p, n, true);

	if (s->state == ST_COLO_MSG) {
		if (s->lim.strict_bulk_pause && used != n)
			fail(s, "data after VMDESCRIPTION at offset %llu: QEMU "
				"waits for CHECKPOINT_READY there (false "
				"end-of-device-state match?)",
			     (unsigned long long)s->offset);
	}
	return used;
}
