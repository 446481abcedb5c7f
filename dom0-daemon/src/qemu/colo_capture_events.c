/*
 * The COLO stream parser's callbacks (colo_stream.h) for the checkpoint
 * source: pages, the bulk's end, COLO messages and a checkpoint's device
 * state become the owner's events (checkpoint_source.h), and the COLO
 * handshake is answered: READY after the bulk, REPLY to a REQUEST (now or
 * when the owner lets the checkpoint go), RECEIVED and LOADED at its end.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "qemu/colo_capture_internal.h"
#include "qemu/migration_writer.h"

/* Parser callbacks return this: nonzero makes the parser stop. */
static int keep_going(const struct checkpoint_source *src)
{
	return capture_gone(src) ? -1 : 0;
}

/* A reason of ours to stop the parser; capture_fail() reports it after the feed. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static int stop_parser(struct checkpoint_source *src, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(src->stop_reason, sizeof(src->stop_reason), fmt, ap);
	va_end(ap);
	return -1;
}

static int cb_configuration(void *opaque, const char *machine_type)
{
	struct checkpoint_source *src = opaque;

	snprintf(src->machine_type, sizeof(src->machine_type), "%s", machine_type);
	return 0;
}

/* The layout goes out once, before the first page that refers to it. */
static int emit_layout(struct checkpoint_source *src)
{
	size_t count;
	const struct colo_ram_block *blocks = colo_stream_blocks(src->parser, &count);
	uint32_t section_id = 0;

	if (src->layout_sent)
		return 0;
	src->layout_sent = true;
	if (!colo_stream_ram_section_id(src->parser, &section_id) || count == 0)
		return stop_parser(src, "QEMU's bulk stream has no RAM block list "
				   "(ram START section with MEM_SIZE) before offset %llu",
				   (unsigned long long)colo_stream_offset(src->parser));
	log_info("vm %s: machine %s, %zu RAM blocks, ram section id %u",
		 src->vm_name, src->machine_type, count, section_id);
	if (src->ev.on_ram_layout)
		src->ev.on_ram_layout(src->ev.opaque, src->machine_type, section_id,
				      blocks, count);
	return keep_going(src);
}

/* The first sign of the checkpoint's data after VMSTATE_SEND ends its sync part. */
static void note_sync_done(struct checkpoint_source *src)
{
	if (!src->vmstate_send_us)
		return;
	src->cur.sync_us = monotonic_us() - src->vmstate_send_us;
	src->vmstate_send_us = 0;
}

static int deliver_page(struct checkpoint_source *src, const struct colo_ram_block *block,
			uint64_t offset, const uint8_t *data)
{
	if (emit_layout(src) < 0)
		return -1;
	note_sync_done(src);
	if (src->page_epoch == 0) {
		if (data)
			src->bulk_pages++;
		else
			src->bulk_zero_pages++;
	} else if (data) {
		src->cur.pages++;
	} else {
		src->cur.zero_pages++;
	}
	if (src->ev.on_page)
		src->ev.on_page(src->ev.opaque, src->page_epoch, block->index,
				offset / MIG_PAGE_SIZE, data);
	return keep_going(src);
}

static int cb_page(void *opaque, const struct colo_ram_block *block, uint64_t offset,
		   const uint8_t *data)
{
	return deliver_page(opaque, block, offset, data);
}

static int cb_zero_page(void *opaque, const struct colo_ram_block *block,
			uint64_t offset, uint8_t fill)
{
	struct checkpoint_source *src = opaque;

	if (emit_layout(src) < 0)
		return -1;
	/* QEMU 7.2 only sends zero pages with fill 0 (ram.c:save_zero_page). */
	if (fill != 0)
		return stop_parser(src, "QEMU sent a ZERO page record with fill byte "
				   "0x%02x (block %s, offset 0x%llx, stream offset "
				   "%llu); only fill 0 is expected", fill, block->name,
				   (unsigned long long)offset,
				   (unsigned long long)colo_stream_offset(src->parser));
	return deliver_page(src, block, offset, NULL);
}

static int cb_bulk_complete(void *opaque)
{
	struct checkpoint_source *src = opaque;
	const enum colo_message ready = COLO_MSG_CHECKPOINT_READY;
	double seconds = (double)(monotonic_us() - src->connected_us) / 1e6;

	/* QEMU set its migration to COLO before it sent the stream's end. */
	src->colo_entered = true;
	if (emit_layout(src) < 0)
		return -1;
	src->state = SRC_RUNNING;
	src->bulk_paused = false; /* meaningless from now on */
	if (capture_send_messages(src, &ready, 1) < 0)
		return -1;
	log_info("vm %s: bulk copy received (%llu bytes, %llu pages, %llu zero "
		 "pages, %.2f s); CHECKPOINT_READY sent", src->vm_name,
		 (unsigned long long)colo_stream_offset(src->parser),
		 (unsigned long long)src->bulk_pages,
		 (unsigned long long)src->bulk_zero_pages, seconds);
	if (src->ev.on_bulk_done)
		src->ev.on_bulk_done(src->ev.opaque);
	return keep_going(src);
}

/* Returns -1 if the source failed. */
static int send_reply(struct checkpoint_source *src)
{
	const enum colo_message reply = COLO_MSG_CHECKPOINT_REPLY;

	src->state = SRC_CHECKPOINT;
	if (capture_send_messages(src, &reply, 1) < 0)
		return -1;
	src->reply_us = monotonic_us();
	src->cur.request_wait_us = src->reply_us - src->request_us;
	return 0;
}

int capture_answer_request(struct checkpoint_source *src)
{
	bool may = true;

	if (src->ev.may_checkpoint) {
		may = src->ev.may_checkpoint(src->ev.opaque);
		if (capture_gone(src))
			return -1;
	}
	if (!may) {
		if (src->state != SRC_HELD)
			log_debug("vm %s: checkpoint %llu held back", src->vm_name,
				  (unsigned long long)src->epoch + 1);
		src->state = SRC_HELD;
		return 0;
	}
	return send_reply(src);
}

static int cb_colo_message(void *opaque, enum colo_message msg, uint64_t value)
{
	struct checkpoint_source *src = opaque;
	uint64_t offset = colo_stream_offset(src->parser);

	switch (msg) {
	case COLO_MSG_CHECKPOINT_REQUEST:
		memset(&src->cur, 0, sizeof(src->cur));
		src->request_off = offset - 4;
		src->request_us = monotonic_us();
		return capture_answer_request(src);
	case COLO_MSG_VMSTATE_SEND:
		if (src->state != SRC_CHECKPOINT)
			return stop_parser(src, "QEMU sent VMSTATE_SEND at offset %llu "
					   "before our CHECKPOINT_REPLY",
					   (unsigned long long)offset - 4);
		src->cur.epoch = src->epoch + 1;
		src->page_epoch = src->cur.epoch;
		src->vmstate_send_us = monotonic_us();
		src->cur.stop_us = src->vmstate_send_us - src->reply_us;
		if (src->ev.on_checkpoint_begin)
			src->ev.on_checkpoint_begin(src->ev.opaque, src->cur.epoch);
		return keep_going(src);
	case COLO_MSG_VMSTATE_SIZE:
		note_sync_done(src);
		src->cur.device_bytes = value;
		src->device_off = 0;
		return 0;
	default: /* the parser refuses the others */
		return 0;
	}
}

static int cb_checkpoint_device_blob(void *opaque, const uint8_t *data, size_t len)
{
	struct checkpoint_source *src = opaque;
	uint64_t offset = src->device_off;

	src->device_off += len;
	if (src->ev.on_device_chunk)
		src->ev.on_device_chunk(src->ev.opaque, src->cur.epoch,
					src->cur.device_bytes, offset, data, len);
	return keep_going(src);
}

static int cb_checkpoint_complete(void *opaque, uint64_t seq, uint64_t blob_len)
{
	struct checkpoint_source *src = opaque;
	const enum colo_message done[] = { COLO_MSG_VMSTATE_RECEIVED,
					   COLO_MSG_VMSTATE_LOADED };

	if (seq != src->cur.epoch)
		return stop_parser(src, "internal error: checkpoint %llu completed "
				   "while expecting %llu", (unsigned long long)seq,
				   (unsigned long long)src->cur.epoch);
	/*
	 * Read before the send, not after: QEMU may read LOADED and stamp its
	 * RESUME while this thread waits for the CPU between the two, which
	 * made a stamp come out before our time (3 of 127 in a drill).
	 */
	int64_t loaded_wall_us = src->hold_armed ? 0 : wall_clock_us();

	/* First the answer: the VM is paused until QEMU reads LOADED. */
	if (capture_send_messages(src, done, src->hold_armed ? 1 : 2) < 0)
		return -1;
	src->cur.loaded_wall_us = loaded_wall_us;
	if (src->hold_armed) {
		src->hold_armed = false;
		src->held_epoch = seq;
		log_warn("vm %s: checkpoint %llu: the VM is held paused for a consistency check",
			 src->vm_name, (unsigned long long)seq);
	}
	src->cur.pause_us = monotonic_us() - src->reply_us;
	src->cur.stream_bytes = colo_stream_offset(src->parser) - src->request_off;
	src->epoch = seq;
	src->page_epoch = 0;
	src->state = SRC_RUNNING;
	log_debug("vm %s: checkpoint %llu: %llu pages, %llu zero pages, %llu "
		  "device bytes, paused %lld us", src->vm_name,
		  (unsigned long long)seq, (unsigned long long)src->cur.pages,
		  (unsigned long long)src->cur.zero_pages,
		  (unsigned long long)blob_len, (long long)src->cur.pause_us);
	if (src->ev.on_checkpoint_end) {
		struct checkpoint_stats st = src->cur;

		src->ev.on_checkpoint_end(src->ev.opaque, &st);
	}
	return keep_going(src);
}

struct colo_stream_callbacks capture_parser_callbacks(struct checkpoint_source *src)
{
	const struct colo_stream_callbacks cb = {
		.on_configuration = cb_configuration,
		.on_page = cb_page,
		.on_zero_page = cb_zero_page,
		.on_bulk_complete = cb_bulk_complete,
		.on_colo_message = cb_colo_message,
		.on_checkpoint_device_blob = cb_checkpoint_device_blob,
		.on_checkpoint_complete = cb_checkpoint_complete,
		.opaque = src,
	};

	return cb;
}
