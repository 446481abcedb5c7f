/*
 * Internals of the COLO checkpoint source (checkpoint_source.h), shared by
 * its files and included by no other:
 *
 *   colo_capture.c         the source's life, its public calls, failing
 *   colo_capture_socket.c  the migration socket: accept, read, replies
 *   colo_capture_events.c  the parser's callbacks: pages, COLO messages,
 *                          checkpoints, turned into the owner's events
 *   colo_capture_qmp.c     the QMP commands that start and end COLO
 */
#ifndef REMUSDB_COLO_CAPTURE_INTERNAL_H
#define REMUSDB_COLO_CAPTURE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buffer.h"
#include "base/event_loop.h"
#include "qemu/checkpoint_source.h"
#include "qemu/colo_stream.h"

#define READ_CHUNK (256u * 1024)

enum source_state {
	SRC_WAITING,
	SRC_BULK,
	SRC_RUNNING,
	SRC_HELD,
	SRC_CHECKPOINT,
	SRC_FAILED,
	SRC_ABANDONED,
};

enum qmp_step_kind {
	STEP_YANK_CHECK, /* query-yank: has QEMU's previous migration ended? */
	STEP_CAPABILITIES,
	STEP_PARAMETERS,
	STEP_MIGRATE,
	STEP_LOST_HEARTBEAT,
};

struct qmp_step;

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
	bool colo_entered;   /* the bulk copy ended: QEMU's migration is in COLO */
	struct qmp_step *steps;
	/* While QEMU's previous migration still ends: when to give up, the next look. */
	int64_t previous_migration_deadline_us;
	unsigned previous_migration_wait_ms;
	bool previous_migration_seen;
	long long yank_retry_timer; /* 0: none */

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
	/* When VMSTATE_SEND was read; 0 once the checkpoint's first page (or VMSTATE_SIZE) came. */
	int64_t vmstate_send_us;
	uint64_t device_off;
	/* checkpoint_source_hold_next(): hold the next checkpoint's LOADED */
	bool hold_armed;
	uint64_t held_epoch; /* LOADED not sent for it yet; 0 = none */

	char error[512];
	char stop_reason[384]; /* why one of our parser callbacks said stop */
	int busy;
	bool destroyed;
};

/* colo_capture.c */
/*
 * Every entry point (fd handlers, QMP replies, public calls) brackets its
 * work with enter/leave, so that a destroy from inside an event frees the
 * source only when the last one leaves.
 */
void capture_enter(struct checkpoint_source *src);
void capture_leave(struct checkpoint_source *src);
/* Nothing more may happen: no events, no replies, no parsing. */
bool capture_gone(const struct checkpoint_source *src);
void capture_close_stream(struct checkpoint_source *src);
/* Also unlinks the socket: a later source may listen on the same path. */
void capture_close_listener(struct checkpoint_source *src);
/*
 * The source is dead: close everything and tell the owner.  Only called
 * with an entry point on the stack (busy > 0), so the owner may destroy
 * the source from on_failed and the caller can still look at it.
 */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
void capture_fail(struct checkpoint_source *src, const char *fmt, ...);

/* colo_capture_socket.c */
/* Reading stops only while the bulk is paused; writing while replies wait. */
void capture_update_mask(struct checkpoint_source *src);
/* Sends COLO messages (be32 each), in order.  Returns -1 if the source failed. */
int capture_send_messages(struct checkpoint_source *src, const enum colo_message *msgs,
			  size_t count);
/* The listening socket's handler: QEMU's one connection. */
void capture_on_listen_readable(event_loop *loop, int fd, void *data, int ready);

/* colo_capture_events.c */
/* The parser's callbacks, with src as their opaque. */
struct colo_stream_callbacks capture_parser_callbacks(struct checkpoint_source *src);
/* REQUEST is in: reply now, or hold it until the owner kicks. */
int capture_answer_request(struct checkpoint_source *src);

/* colo_capture_qmp.c */
/* Returns 0, or -1 (out of memory, or the QMP client refused). */
int capture_issue_step(struct checkpoint_source *src, enum qmp_step_kind kind);
/* The QMP command a step sends. */
const char *capture_step_name(enum qmp_step_kind kind);
/* The replies still to come are only logged: the source goes away. */
void capture_orphan_steps(struct checkpoint_source *src);
/* Drops a pending second look at query-yank (the source goes away). */
void capture_cancel_yank_retry(struct checkpoint_source *src);

#endif
