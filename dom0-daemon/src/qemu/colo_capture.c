/*
 * The checkpoint source over QEMU 7.2's COLO migration (`x-colo`): we play
 * COLO's secondary side on the primary host.  QEMU migrates to a unix
 * socket we serve; colo_stream.c parses what arrives, and this file turns
 * the parser's callbacks into checkpoint_source events and answers QEMU
 * (docs/architecture.md, "The COLO stream, as recorded"):
 *
 *   bulk stream complete           -> CHECKPOINT_READY
 *   CHECKPOINT_REQUEST             -> CHECKPOINT_REPLY (at once, or when
 *                                     the owner lets the checkpoint go)
 *   last byte of the device state  -> VMSTATE_RECEIVED, VMSTATE_LOADED
 *
 * Why it reads the way it does:
 *   - Inside a checkpoint the VM is stopped until our LOADED, so the
 *     socket is read in 256 KiB chunks until it is empty, and nothing is
 *     copied: pages go to the owner straight from the read buffer.
 *   - In the bulk copy the VM runs, so there is no hurry: one chunk per
 *     wakeup, and none while the owner says its backlog is too long
 *     (QEMU then blocks on the socket and the VM runs on).
 *   - Replies are a few bytes and QEMU waits for them, so they are written
 *     at once; only a full socket buffer (never seen) makes them wait.
 *
 * QMP commands go one after the other, each on the previous one's
 * success: migrating without x-colo would run a plain migration into us
 * and QEMU would stop the VM at its end.
 *
 * The owner may destroy the source from inside any event.  Every entry
 * point (fd handlers, QMP replies, public calls) counts itself in `busy`;
 * destroy only marks the source then, and the last entry point to leave
 * frees it.  A callback that finds the source gone makes the parser stop.
 */
#include "qemu/checkpoint_source.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/buffer.h"
#include "base/log.h"
#include "qemu/migration_writer.h"
#include "qemu/qmp.h"
#include "base/unix_socket.h"

#define READ_CHUNK (256u * 1024)
#define MIN_BULK_CHUNK (64u * 1024)
/*
 * Inside a checkpoint we read until the socket is empty, but give the
 * loop back after this much (1 GiB) so that a peer streaming without end
 * cannot starve the daemon's other connections.
 */
#define MAX_READS_PER_WAKEUP 4096
/* Our replies are 4-8 bytes; this much unsent means QEMU stopped reading. */
#define MAX_PENDING_OUTPUT (64u * 1024)

enum source_state {
	SRC_WAITING,
	SRC_BULK,
	SRC_RUNNING,
	SRC_HELD,
	SRC_CHECKPOINT,
	SRC_FAILED,
	SRC_ABANDONED,
};

static const char *const state_names[] = {
	[SRC_WAITING] = "waiting-for-qemu", [SRC_BULK] = "bulk",
	[SRC_RUNNING] = "running",          [SRC_HELD] = "held",
	[SRC_CHECKPOINT] = "checkpoint",    [SRC_FAILED] = "failed",
	[SRC_ABANDONED] = "abandoned",
};

enum qmp_step_kind {
	STEP_CAPABILITIES,
	STEP_PARAMETERS,
	STEP_MIGRATE,
	STEP_LOST_HEARTBEAT,
};

static const char *const step_commands[] = {
	[STEP_CAPABILITIES] = "migrate-set-capabilities",
	[STEP_PARAMETERS] = "migrate-set-parameters",
	[STEP_MIGRATE] = "migrate",
	[STEP_LOST_HEARTBEAT] = "x-colo-lost-heartbeat",
};

/*
 * One QMP command in flight.  The QMP client owns it until the reply
 * callback frees it; a source that goes away first only clears `src`.
 */
struct qmp_step {
	struct checkpoint_source *src; /* NULL: just log the reply */
	struct qmp_step *next;         /* in src->steps */
	enum qmp_step_kind kind;
	char vm_name[64];
};

struct checkpoint_source {
	event_loop *loop;
	struct checkpoint_source_events ev;
	struct qmp_client *qmp;
	char vm_name[64];
	char *path;
	unsigned interval_ms;
	size_t bulk_chunk;

	enum source_state state;
	int listen_fd, conn_fd;
	struct colo_stream *parser;
	uint8_t *rbuf;       /* READ_CHUNK bytes */
	struct buffer out;   /* replies the socket did not take yet */
	bool bulk_paused;
	bool migrate_issued; /* QEMU may be in COLO: abandon needs lost-heartbeat */
	struct qmp_step *steps;

	/* bulk */
	char machine_type[256];
	bool layout_sent;
	uint64_t bulk_pages, bulk_zero_pages;
	int64_t connected_us;

	/* checkpoints */
	uint64_t epoch;      /* last completed */
	uint64_t page_epoch; /* epoch of the pages being parsed */
	struct checkpoint_stats cur;
	uint64_t request_off;
	int64_t request_us, reply_us;
	uint64_t device_off;
	/* checkpoint_source_hold_next(): hold the next checkpoint's LOADED */
	bool hold_armed;
	uint64_t held_epoch; /* LOADED not sent for it yet; 0 = none */

	char error[512];
	char stop_reason[384]; /* why one of our parser callbacks said stop */
	int busy;
	bool destroyed;
};

/* ---- life ---------------------------------------------------------- */

static void free_source(struct checkpoint_source *src)
{
	colo_stream_free(src->parser);
	buffer_free(&src->out);
	free(src->rbuf);
	free(src->path);
	free(src);
}

static void enter(struct checkpoint_source *src)
{
	src->busy++;
}

static void leave(struct checkpoint_source *src)
{
	if (--src->busy == 0 && src->destroyed)
		free_source(src);
}

/* Nothing more may happen: no events, no replies, no parsing. */
static bool gone(const struct checkpoint_source *src)
{
	return src->destroyed || src->state == SRC_FAILED ||
	       src->state == SRC_ABANDONED;
}

static void close_stream(struct checkpoint_source *src)
{
	if (src->conn_fd >= 0) {
		event_loop_unwatch(src->loop, src->conn_fd);
		close(src->conn_fd);
		src->conn_fd = -1;
	}
	buffer_clear(&src->out);
}

/* Also unlinks the socket: a later source may listen on the same path. */
static void close_listener(struct checkpoint_source *src)
{
	if (src->listen_fd < 0)
		return;
	event_loop_unwatch(src->loop, src->listen_fd);
	close(src->listen_fd);
	src->listen_fd = -1;
	unlink(src->path);
}

static void orphan_steps(struct checkpoint_source *src)
{
	for (struct qmp_step *step = src->steps; step; step = step->next)
		step->src = NULL;
	src->steps = NULL;
}

/*
 * The source is dead: close everything and tell the owner.  Only called
 * with an entry point on the stack (busy > 0), so the owner may destroy
 * the source from on_failed and the caller can still look at it.
 */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void fail(struct checkpoint_source *src, const char *fmt, ...)
{
	va_list ap;

	if (gone(src))
		return;
	va_start(ap, fmt);
	vsnprintf(src->error, sizeof(src->error), fmt, ap);
	va_end(ap);
	log_error("vm %s: checkpoint source failed: %s", src->vm_name, src->error);
	close_stream(src);
	close_listener(src);
	src->state = SRC_FAILED;
	if (src->ev.on_failed)
		src->ev.on_failed(src->ev.opaque, src->error);
}

/* ---- output ---------------------------------------------------------- */

static void on_stream_io(event_loop *loop, int fd, void *data, int ready);

/* Reading stops only while the bulk is paused; writing while replies wait. */
static void update_mask(struct checkpoint_source *src)
{
	int mask = buffer_len(&src->out) ? EV_WRITABLE : EV_NONE;

	if (src->conn_fd < 0)
		return;
	if (!(src->state == SRC_BULK && src->bulk_paused))
		mask |= EV_READABLE;
	if (event_loop_watch(src->loop, src->conn_fd, mask, on_stream_io, src) < 0)
		fail(src, "cannot watch the checkpoint socket: %s", strerror(errno));
}

/* Returns -1 if the source failed. */
static int flush_output(struct checkpoint_source *src)
{
	while (buffer_len(&src->out) > 0) {
		/* MSG_NOSIGNAL: QEMU going away must not SIGPIPE the daemon. */
		ssize_t n = send(src->conn_fd, buffer_head(&src->out),
				 buffer_len(&src->out), MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			fail(src, "cannot answer QEMU on the checkpoint socket: %s",
			     strerror(errno));
			return -1;
		}
		buffer_consume(&src->out, (size_t)n);
	}
	update_mask(src);
	return gone(src) ? -1 : 0;
}

/* Sends COLO messages (be32 each), in order.  Returns -1 if the source failed. */
static int send_messages(struct checkpoint_source *src, const enum colo_message *msgs,
			 size_t count)
{
	uint8_t bytes[16];

	for (size_t i = 0; i < count; i++)
		store_be32(bytes + 4 * i, (uint32_t)msgs[i]);
	if (buffer_append(&src->out, bytes, 4 * count) < 0) {
		fail(src, "out of memory queueing %s for QEMU",
		     colo_message_name(msgs[0]));
		return -1;
	}
	if (flush_output(src) < 0)
		return -1;
	if (buffer_len(&src->out) > MAX_PENDING_OUTPUT) {
		fail(src, "QEMU does not read our COLO replies (%zu bytes pending)",
		     buffer_len(&src->out));
		return -1;
	}
	return 0;
}

/* ---- parser callbacks --------------------------------------------------- */

/* Parser callbacks return this: nonzero makes the parser stop. */
static int keep_going(const struct checkpoint_source *src)
{
	return gone(src) ? -1 : 0;
}

/* A reason of ours to stop the parser; fail() reports it after the feed. */
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

static int deliver_page(struct checkpoint_source *src, const struct colo_ram_block *block,
			uint64_t offset, const uint8_t *data)
{
	if (emit_layout(src) < 0)
		return -1;
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

	if (emit_layout(src) < 0)
		return -1;
	src->state = SRC_RUNNING;
	src->bulk_paused = false; /* meaningless from now on */
	if (send_messages(src, &ready, 1) < 0)
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
	if (send_messages(src, &reply, 1) < 0)
		return -1;
	src->reply_us = monotonic_us();
	src->cur.request_wait_us = src->reply_us - src->request_us;
	return 0;
}

/* REQUEST is in: reply now, or hold it until the owner kicks. */
static int answer_request(struct checkpoint_source *src)
{
	bool may = true;

	if (src->ev.may_checkpoint) {
		may = src->ev.may_checkpoint(src->ev.opaque);
		if (gone(src))
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
		return answer_request(src);
	case COLO_MSG_VMSTATE_SEND:
		if (src->state != SRC_CHECKPOINT)
			return stop_parser(src, "QEMU sent VMSTATE_SEND at offset %llu "
					   "before our CHECKPOINT_REPLY",
					   (unsigned long long)offset - 4);
		src->cur.epoch = src->epoch + 1;
		src->page_epoch = src->cur.epoch;
		if (src->ev.on_checkpoint_begin)
			src->ev.on_checkpoint_begin(src->ev.opaque, src->cur.epoch);
		return keep_going(src);
	case COLO_MSG_VMSTATE_SIZE:
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
	/* First the answer: the VM is paused until QEMU reads LOADED. */
	if (send_messages(src, done, src->hold_armed ? 1 : 2) < 0)
		return -1;
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

/* ---- input ------------------------------------------------------------ */

static void feed(struct checkpoint_source *src, const uint8_t *data, size_t len)
{
	const char *err = NULL;

	src->stop_reason[0] = '\0';
	if (colo_stream_feed(src->parser, data, len, &err) == COLO_STREAM_NEED_MORE)
		return;
	if (gone(src))
		return; /* stopped by the owner, or failed and said so */
	if (src->stop_reason[0])
		fail(src, "%s", src->stop_reason);
	else
		fail(src, "QEMU's checkpoint stream is malformed: %s",
		     err ? err : "(no detail)");
}

static void stream_ended(struct checkpoint_source *src, const char *sys_error)
{
	uint64_t offset = colo_stream_offset(src->parser);
	const char *err = NULL;

	if (colo_stream_finish(src->parser, &err) == 0)
		fail(src, "QEMU closed the checkpoint stream at offset %llu (%s%sat a "
		     "checkpoint boundary, after checkpoint %llu)",
		     (unsigned long long)offset, sys_error ? sys_error : "",
		     sys_error ? "; " : "", (unsigned long long)src->epoch);
	else
		fail(src, "QEMU closed the checkpoint stream at offset %llu (%s%s%s)",
		     (unsigned long long)offset, sys_error ? sys_error : "",
		     sys_error ? "; " : "", err ? err : "truncated");
}

static void read_stream(struct checkpoint_source *src)
{
	for (int i = 0; i < MAX_READS_PER_WAKEUP; i++) {
		if (gone(src) || src->conn_fd < 0)
			return;
		if (src->state == SRC_BULK && src->bulk_paused)
			return;
		size_t want = src->state == SRC_BULK ? src->bulk_chunk : READ_CHUNK;
		ssize_t n = recv(src->conn_fd, src->rbuf, want, MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				stream_ended(src, strerror(errno));
			return;
		}
		if (n == 0) {
			stream_ended(src, NULL);
			return;
		}
		bool bulk = src->state == SRC_BULK;
		feed(src, src->rbuf, (size_t)n);
		if (bulk)
			return; /* one chunk per wakeup: see bulk_chunk */
	}
}

static void on_stream_io(event_loop *loop, int fd, void *data, int ready)
{
	struct checkpoint_source *src = data;

	enter(src);
	if (ready & EV_WRITABLE)
		flush_output(src);
	if ((ready & EV_READABLE) && !gone(src))
		read_stream(src);
	leave(src);
}

static void on_listen_readable(event_loop *loop, int fd, void *data, int ready)
{
	struct checkpoint_source *src = data;

	enter(src);
	while (!gone(src) && src->listen_fd >= 0) {
		int conn = unix_accept(src->listen_fd);

		if (conn < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			if (src->state == SRC_WAITING) {
				fail(src, "cannot accept QEMU's connection on %s: %s",
				     src->path, strerror(errno));
			} else {
				/* Connected already: just stop refusing extras. */
				log_warn("vm %s: accept on %s: %s; no longer listening",
					 src->vm_name, src->path, strerror(errno));
				close_listener(src);
			}
			break;
		}
		if (src->state != SRC_WAITING) {
			log_warn("vm %s: refused a second connection to the checkpoint "
				 "socket %s: QEMU is already connected", src->vm_name,
				 src->path);
			close(conn);
			continue;
		}
		src->conn_fd = conn;
		src->state = SRC_BULK;
		src->connected_us = monotonic_us();
		log_info("vm %s: QEMU connected to %s; receiving the bulk copy",
			 src->vm_name, src->path);
		update_mask(src);
	}
	leave(src);
}

/* ---- QMP ----------------------------------------------------------------- */

static void on_qmp_reply(struct qmp_client *qmp, json_t *reply, void *data);

static json_t *step_arguments(const struct checkpoint_source *src, enum qmp_step_kind kind)
{
	switch (kind) {
	case STEP_CAPABILITIES:
		/* return-path off: COLO reads our replies from the stream socket. */
		return json_pack("{s:[{s:s,s:b},{s:s,s:b}]}", "capabilities",
				 "capability", "x-colo", "state", 1,
				 "capability", "return-path", "state", 0);
	case STEP_PARAMETERS:
		return json_pack("{s:I}", "x-checkpoint-delay",
				 (json_int_t)src->interval_ms);
	case STEP_MIGRATE: {
		size_t len = strlen(src->path) + sizeof("unix:");
		char *uri = malloc(len);
		json_t *args = NULL;

		if (uri) {
			snprintf(uri, len, "unix:%s", src->path);
			args = json_pack("{s:s}", "uri", uri);
		}
		free(uri);
		return args;
	}
	default:
		return NULL;
	}
}

/* Returns 0, or -1 (out of memory, or the QMP client refused). */
static int issue_step(struct checkpoint_source *src, enum qmp_step_kind kind)
{
	struct qmp_step *step = calloc(1, sizeof(*step));
	json_t *args = NULL;

	if (!step)
		return -1;
	step->kind = kind;
	snprintf(step->vm_name, sizeof(step->vm_name), "%s", src->vm_name);
	if (kind != STEP_LOST_HEARTBEAT && !(args = step_arguments(src, kind))) {
		free(step);
		return -1;
	}
	/* qmp_execute() takes args even when it fails. */
	if (qmp_execute(src->qmp, step_commands[kind], args, on_qmp_reply, step) < 0) {
		free(step);
		return -1;
	}
	if (kind == STEP_LOST_HEARTBEAT)
		return 0; /* nobody waits for its answer: it is only logged */
	step->src = src;
	step->next = src->steps;
	src->steps = step;
	if (kind == STEP_MIGRATE)
		src->migrate_issued = true;
	return 0;
}

static void unlink_step(struct checkpoint_source *src, struct qmp_step *step)
{
	for (struct qmp_step **link = &src->steps; *link; link = &(*link)->next) {
		if (*link == step) {
			*link = step->next;
			return;
		}
	}
}

static const char *error_text(json_t *error)
{
	const char *desc = json_string_value(json_object_get(error, "desc"));

	return desc ? desc : "(no description)";
}

/* A reply nobody waits for: say what happened and forget it. */
static void log_orphan_reply(const struct qmp_step *step, json_t *reply)
{
	const char *command = step_commands[step->kind];
	json_t *error = json_object_get(reply, "error");

	if (!reply)
		log_warn("vm %s: QMP connection lost before %s was answered",
			 step->vm_name, command);
	else if (error)
		log_warn("vm %s: QMP %s: %s", step->vm_name, command,
			 error_text(error));
	else if (step->kind == STEP_LOST_HEARTBEAT)
		log_info("vm %s: QEMU left COLO (x-colo-lost-heartbeat); the VM runs "
			 "unprotected", step->vm_name);
}

static void on_qmp_reply(struct qmp_client *qmp, json_t *reply, void *data)
{
	struct qmp_step *step = data;
	struct checkpoint_source *src = step->src;
	enum qmp_step_kind kind = step->kind;
	const char *command = step_commands[kind];
	json_t *error = json_object_get(reply, "error");

	if (!src || gone(src)) {
		if (src)
			unlink_step(src, step);
		log_orphan_reply(step, reply);
		free(step);
		return;
	}
	unlink_step(src, step);
	free(step);
	enter(src);
	if (!reply) {
		fail(src, "the QMP connection to QEMU was lost before %s was answered",
		     command);
	} else if (error) {
		if (kind == STEP_MIGRATE)
			src->migrate_issued = false; /* no migration: nothing to leave */
		fail(src, "QEMU refused %s: %s", command, error_text(error));
	} else if (kind == STEP_CAPABILITIES || kind == STEP_PARAMETERS) {
		enum qmp_step_kind next = kind == STEP_CAPABILITIES ?
						  STEP_PARAMETERS : STEP_MIGRATE;

		if (issue_step(src, next) < 0)
			fail(src, "cannot queue QMP %s", step_commands[next]);
	} else if (kind == STEP_MIGRATE) {
		log_info("vm %s: QEMU is migrating to unix:%s with x-colo (%u ms "
			 "checkpoints)", src->vm_name, src->path, src->interval_ms);
	}
	leave(src);
}

/* ---- public ----------------------------------------------------------- */

static bool valid_config(const struct checkpoint_source_config *cfg, char *err,
			 size_t errlen)
{
	if (!cfg || !cfg->listen_path || !cfg->listen_path[0]) {
		snprintf(err, errlen, "checkpoint source: no socket path to listen on");
		return false;
	}
	if (cfg->interval_ms < CHECKPOINT_SOURCE_MIN_INTERVAL_MS ||
	    cfg->interval_ms > CHECKPOINT_SOURCE_MAX_INTERVAL_MS) {
		snprintf(err, errlen, "checkpoint interval %u ms is outside %u..%u ms",
			 cfg->interval_ms, CHECKPOINT_SOURCE_MIN_INTERVAL_MS,
			 CHECKPOINT_SOURCE_MAX_INTERVAL_MS);
		return false;
	}
	return true;
}

static size_t bulk_chunk_for(size_t high_water)
{
	size_t chunk = high_water / 4;

	if (high_water == 0 || chunk > READ_CHUNK)
		return READ_CHUNK;
	return chunk < MIN_BULK_CHUNK ? MIN_BULK_CHUNK : chunk;
}

struct checkpoint_source *checkpoint_source_open(event_loop *loop,
						 const struct checkpoint_source_config *cfg,
						 const struct checkpoint_source_events *ev,
						 char *err, size_t errlen)
{
	const struct colo_stream_callbacks cb = {
		.on_configuration = cb_configuration,
		.on_page = cb_page,
		.on_zero_page = cb_zero_page,
		.on_bulk_complete = cb_bulk_complete,
		.on_colo_message = cb_colo_message,
		.on_checkpoint_device_blob = cb_checkpoint_device_blob,
		.on_checkpoint_complete = cb_checkpoint_complete,
	};
	const struct colo_stream_limits limits = {
		.max_vmdesc = COLO_STREAM_DEFAULT_MAX_VMDESC,
		.max_device_blob = COLO_STREAM_DEFAULT_MAX_DEVICE_BLOB,
		.strict_bulk_pause = true, /* QEMU waits for READY: we are live */
	};
	struct checkpoint_source *src;

	if (!valid_config(cfg, err, errlen))
		return NULL;
	src = calloc(1, sizeof(*src));
	if (!src) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	src->loop = loop;
	if (ev)
		src->ev = *ev;
	src->qmp = cfg->qmp;
	snprintf(src->vm_name, sizeof(src->vm_name), "%s",
		 cfg->vm_name ? cfg->vm_name : "?");
	src->interval_ms = cfg->interval_ms;
	src->bulk_chunk = bulk_chunk_for(cfg->bulk_high_water);
	src->listen_fd = src->conn_fd = -1;
	buffer_init(&src->out);
	src->path = strdup(cfg->listen_path);
	src->rbuf = malloc(READ_CHUNK);
	struct colo_stream_callbacks with_opaque = cb;
	with_opaque.opaque = src;
	src->parser = colo_stream_new(&with_opaque, &limits);
	if (!src->path || !src->rbuf || !src->parser) {
		snprintf(err, errlen, "out of memory");
		free_source(src);
		return NULL;
	}
	src->listen_fd = unix_listen(src->path, err, errlen);
	if (src->listen_fd < 0) {
		free_source(src);
		return NULL;
	}
	if (event_loop_watch(loop, src->listen_fd, EV_READABLE, on_listen_readable,
			     src) < 0) {
		snprintf(err, errlen, "cannot watch %s: %s", src->path, strerror(errno));
		close_listener(src);
		free_source(src);
		return NULL;
	}
	if (src->qmp && issue_step(src, STEP_CAPABILITIES) < 0) {
		snprintf(err, errlen, "cannot queue QMP %s",
			 step_commands[STEP_CAPABILITIES]);
		close_listener(src);
		free_source(src);
		return NULL;
	}
	log_info("vm %s: waiting for QEMU's checkpoint stream on %s%s", src->vm_name,
		 src->path, src->qmp ? "" : " (no QMP: not starting the migration)");
	return src;
}

void checkpoint_source_kick(struct checkpoint_source *src)
{
	if (!src || src->destroyed || src->state != SRC_HELD)
		return;
	enter(src);
	answer_request(src);
	leave(src);
}

int checkpoint_source_hold_next(struct checkpoint_source *src)
{
	if (!src || gone(src) || src->hold_armed || src->held_epoch)
		return -1;
	src->hold_armed = true;
	return 0;
}

void checkpoint_source_release(struct checkpoint_source *src)
{
	const enum colo_message loaded = COLO_MSG_VMSTATE_LOADED;

	if (!src)
		return;
	src->hold_armed = false;
	if (!src->held_epoch || gone(src))
		return;
	enter(src);
	log_info("vm %s: checkpoint %llu: the VM resumes after its consistency check",
		 src->vm_name, (unsigned long long)src->held_epoch);
	src->held_epoch = 0;
	send_messages(src, &loaded, 1); /* a failure is reported through on_failed */
	leave(src);
}

uint64_t checkpoint_source_held_epoch(const struct checkpoint_source *src)
{
	return src ? src->held_epoch : 0;
}

void checkpoint_source_set_bulk_paused(struct checkpoint_source *src, bool paused)
{
	if (!src || gone(src) || src->bulk_paused == paused)
		return;
	if (paused && src->state != SRC_WAITING && src->state != SRC_BULK)
		return; /* not in the bulk: nothing to pause */
	enter(src);
	src->bulk_paused = paused;
	update_mask(src);
	leave(src);
}

void checkpoint_source_abandon(struct checkpoint_source *src)
{
	if (!src || src->destroyed || src->state == SRC_ABANDONED)
		return;
	enter(src);
	close_stream(src);
	close_listener(src);
	log_info("vm %s: checkpoint stream abandoned in state %s after checkpoint "
		 "%llu%s", src->vm_name, state_names[src->state],
		 (unsigned long long)src->epoch,
		 src->migrate_issued ? "; asking QEMU to leave COLO" : "");
	src->state = SRC_ABANDONED;
	/* Without it QEMU waits for us forever, the VM paused if mid-checkpoint. */
	if (src->qmp && src->migrate_issued &&
	    issue_step(src, STEP_LOST_HEARTBEAT) < 0)
		log_error("vm %s: cannot send x-colo-lost-heartbeat: QEMU stays in "
			  "COLO until it gets one", src->vm_name);
	src->migrate_issued = false;
	orphan_steps(src);
	leave(src);
}

void checkpoint_source_destroy(struct checkpoint_source *src)
{
	if (!src || src->destroyed)
		return;
	close_stream(src);
	close_listener(src);
	orphan_steps(src);
	src->destroyed = true;
	if (src->busy == 0)
		free_source(src);
}

const char *checkpoint_source_state(const struct checkpoint_source *src)
{
	return state_names[src->state];
}

uint64_t checkpoint_source_epoch(const struct checkpoint_source *src)
{
	return src->epoch;
}

const char *checkpoint_source_error(const struct checkpoint_source *src)
{
	return src->state == SRC_FAILED ? src->error : NULL;
}

uint64_t checkpoint_source_stream_offset(const struct checkpoint_source *src)
{
	return colo_stream_offset(src->parser);
}
