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
 *     socket is read in 256 KiB chunks until it is empty, 1 MiB per turn
 *     of the loop (the other VMs' checkpoints wait meanwhile:
 *     colo_capture_socket.c), and nothing is copied: pages go to the
 *     owner straight from the read buffer.
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
 *
 * This file holds the source's life and its public calls; the socket,
 * the parser's callbacks and the QMP commands have a file each
 * (colo_capture_internal.h).
 */
#include "qemu/checkpoint_source.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/buffer.h"
#include "base/log.h"
#include "base/unix_socket.h"
#include "qemu/colo_capture_internal.h"

#define MIN_BULK_CHUNK (64u * 1024)

static const char *const state_names[] = {
	[SRC_WAITING] = "waiting-for-qemu", [SRC_BULK] = "bulk",
	[SRC_RUNNING] = "running",          [SRC_HELD] = "held",
	[SRC_CHECKPOINT] = "checkpoint",    [SRC_FAILED] = "failed",
	[SRC_ABANDONED] = "abandoned",
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

void capture_enter(struct checkpoint_source *src)
{
	src->busy++;
}

void capture_leave(struct checkpoint_source *src)
{
	if (--src->busy == 0 && src->destroyed)
		free_source(src);
}

bool capture_gone(const struct checkpoint_source *src)
{
	return src->destroyed || src->state == SRC_FAILED ||
	       src->state == SRC_ABANDONED;
}

void capture_close_stream(struct checkpoint_source *src)
{
	if (src->conn_fd >= 0) {
		event_loop_unwatch(src->loop, src->conn_fd);
		close(src->conn_fd);
		src->conn_fd = -1;
	}
	buffer_clear(&src->out);
}

void capture_close_listener(struct checkpoint_source *src)
{
	if (src->listen_fd < 0)
		return;
	event_loop_unwatch(src->loop, src->listen_fd);
	close(src->listen_fd);
	src->listen_fd = -1;
	unlink(src->path);
}

void capture_fail(struct checkpoint_source *src, const char *fmt, ...)
{
	va_list ap;

	if (capture_gone(src))
		return;
	va_start(ap, fmt);
	vsnprintf(src->error, sizeof(src->error), fmt, ap);
	va_end(ap);
	log_error("vm %s: checkpoint source failed: %s", src->vm_name, src->error);
	capture_close_stream(src);
	capture_close_listener(src);
	src->state = SRC_FAILED;
	if (src->ev.on_failed)
		src->ev.on_failed(src->ev.opaque, src->error);
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
	const struct colo_stream_callbacks cb = capture_parser_callbacks(src);
	src->parser = colo_stream_new(&cb, &limits);
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
	if (event_loop_watch(loop, src->listen_fd, EV_READABLE, capture_on_listen_readable,
			     src) < 0) {
		snprintf(err, errlen, "cannot watch %s: %s", src->path, strerror(errno));
		capture_close_listener(src);
		free_source(src);
		return NULL;
	}
	src->previous_migration_wait_ms = cfg->previous_migration_wait_ms ?
					  cfg->previous_migration_wait_ms :
					  CHECKPOINT_SOURCE_PREVIOUS_MIGRATION_WAIT_MS;
	src->previous_migration_deadline_us = monotonic_us() +
					      (int64_t)src->previous_migration_wait_ms * 1000;
	if (src->qmp && capture_issue_step(src, STEP_YANK_CHECK) < 0) {
		snprintf(err, errlen, "cannot queue QMP %s",
			 capture_step_name(STEP_YANK_CHECK));
		capture_close_listener(src);
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
	capture_enter(src);
	capture_answer_request(src);
	capture_leave(src);
}

int checkpoint_source_hold_next(struct checkpoint_source *src)
{
	if (!src || capture_gone(src) || src->hold_armed || src->held_epoch)
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
	if (!src->held_epoch || capture_gone(src))
		return;
	capture_enter(src);
	log_info("vm %s: checkpoint %llu: the VM resumes after its consistency check",
		 src->vm_name, (unsigned long long)src->held_epoch);
	src->held_epoch = 0;
	capture_send_messages(src, &loaded, 1); /* a failure is reported through on_failed */
	capture_leave(src);
}

uint64_t checkpoint_source_held_epoch(const struct checkpoint_source *src)
{
	return src ? src->held_epoch : 0;
}

void checkpoint_source_set_bulk_paused(struct checkpoint_source *src, bool paused)
{
	if (!src || capture_gone(src) || src->bulk_paused == paused)
		return;
	if (paused && src->state != SRC_WAITING && src->state != SRC_BULK)
		return; /* not in the bulk: nothing to pause */
	capture_enter(src);
	src->bulk_paused = paused;
	capture_update_mask(src);
	capture_leave(src);
}

void checkpoint_source_abandon(struct checkpoint_source *src)
{
	if (!src || src->destroyed || src->state == SRC_ABANDONED)
		return;
	capture_enter(src);
	capture_close_stream(src);
	capture_close_listener(src);
	log_info("vm %s: checkpoint stream abandoned in state %s after checkpoint "
		 "%llu%s", src->vm_name, state_names[src->state],
		 (unsigned long long)src->epoch,
		 src->migrate_issued ? "; asking QEMU to leave COLO" : "");
	src->state = SRC_ABANDONED;
	/* Without it QEMU waits for us forever, the VM paused if mid-checkpoint. */
	if (src->qmp && src->migrate_issued &&
	    capture_issue_step(src, STEP_LOST_HEARTBEAT) < 0)
		log_error("vm %s: cannot send x-colo-lost-heartbeat: QEMU stays in "
			  "COLO until it gets one", src->vm_name);
	src->migrate_issued = false;
	capture_orphan_steps(src);
	capture_leave(src);
}

void checkpoint_source_destroy(struct checkpoint_source *src)
{
	if (!src || src->destroyed)
		return;
	capture_cancel_yank_retry(src);
	capture_close_stream(src);
	capture_close_listener(src);
	capture_orphan_steps(src);
	src->destroyed = true;
	if (src->busy == 0)
		free_source(src);
}

const char *checkpoint_source_state(const struct checkpoint_source *src)
{
	return state_names[src->state];
}

bool checkpoint_source_colo_entered(const struct checkpoint_source *src)
{
	return src->colo_entered;
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
