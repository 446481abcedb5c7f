/*
 * After the bulk stream, COLO checkpoints: the COLO messages
 * CHECKPOINT_REQUEST, VMSTATE_SEND and VMSTATE_SIZE in that order, and
 * the device state whose size VMSTATE_SIZE announced, passed through as it
 * arrives.  The ram END section and EOF between VMSTATE_SEND and
 * VMSTATE_SIZE are walked by colo_top_items.c and colo_ram_records.c.
 */
#include "qemu/colo_stream_internal.h"

/*
 * Passes up to `avail` bytes of a checkpoint's device state through.
 * Returns how many it consumed; on error the stream is failed.
 */
size_t colo_checkpoint_blob_feed(struct colo_stream *s, const uint8_t *p,
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

int colo_checkpoint_field(struct colo_stream *s, const uint8_t *f)
{
	switch (s->state) {
	case ST_COLO_MSG:
		return colo_message(s, load_be32(f));
	case ST_COLO_SIZE:
		return vmstate_size(s, load_be64(f));
	default:
		return fail(s, "internal error: state %d", (int)s->state);
	}
}
