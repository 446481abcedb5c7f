/*
 * remusdbd as the postcopy migration source of a fork's clones: one
 * session per clone QEMU (started with `-incoming defer`, `postcopy-ram`
 * on, listening), all serving the same frozen snapshot (ram_image.h).
 *
 * A session sends the preamble (postcopy_wire.h), after which the clone
 * runs at once; then it answers page requests first and pushes every
 * other page in the background, in working-set order:
 *   1. pages the parent dirtied during the snapshot, most recent first;
 *   2. pages earlier clones of this fork asked for, in the order asked
 *      (shared by the sessions through struct postcopy_fork);
 *   3. the rest, in address order.
 * When every page is sent it ends the stream (ram END, EOF) and waits for
 * QEMU to close the return path.
 *
 * Why a small output buffer: a requested page is queued behind whatever
 * background push already sits in the buffer, so the buffer's high-water
 * mark bounds the extra fault latency (128 KiB: well under a millisecond
 * on a LAN or unix socket).
 *
 * Service latency is measured from the request's arrival to the moment
 * the page's last byte was written to the socket.
 */
#ifndef REMUSDB_POSTCOPY_SOURCE_H
#define REMUSDB_POSTCOPY_SOURCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/event_loop.h"
#include "image/ram_image.h"
#include "fork/snapshot_capture.h"

struct postcopy_fork;
struct postcopy_session;

/* dirtied: least recent first (snapshot_capture_redirtied); copied. */
struct postcopy_fork *postcopy_fork_create(const struct ram_image *img,
					   const struct page_ref *dirtied,
					   size_t dirtied_count);
void postcopy_fork_destroy(struct postcopy_fork *f); /* after its sessions */
/*
 * Caps each session's background push at bytes_per_sec (0: no cap, the
 * default).  Requested pages are never held back.  Why: an operator may
 * not want N clones to saturate the parent host's link; and a slow push
 * keeps a clone depending on its page source longer (the page-source-
 * death test relies on that).
 */
void postcopy_fork_set_push_rate(struct postcopy_fork *f, uint64_t bytes_per_sec);

enum postcopy_session_state {
	PCS_CONNECTING,
	PCS_SENDING,   /* preamble sent or queued; pages on demand + push */
	PCS_FINISHING, /* every page sent; waiting for the clone to close */
	PCS_DONE,
	PCS_FAILED,
};
const char *postcopy_session_state_name(enum postcopy_session_state s);

struct postcopy_session_stats {
	enum postcopy_session_state state;
	uint64_t requests;        /* return-path page requests */
	uint64_t pages_requested; /* pages they named that were not yet sent */
	uint64_t pages_pushed;    /* sent by the background push */
	uint64_t pages_total;
	uint64_t bytes_sent;      /* written to the socket */
	int64_t started_us, running_us, done_us; /* monotonic; 0 = not yet */
	uint64_t latency_samples;
	uint32_t latency_p50_us, latency_p99_us, latency_max_us;
	char error[256];
};

/* ok false: reason says why (the session is failed, destroy it). */
typedef void (*postcopy_done_cb)(void *opaque, struct postcopy_session *s,
				 bool ok, const char *reason);

/*
 * fd: a non-blocking socket whose connect() to the clone is in progress
 * or done; the session owns it.  NULL with a reason when out of memory or
 * the snapshot cannot be served (no device state).
 */
struct postcopy_session *postcopy_session_start(event_loop *loop,
						struct postcopy_fork *f, int fd,
						postcopy_done_cb cb, void *opaque,
						char *err, size_t errlen);
void postcopy_session_destroy(struct postcopy_session *s); /* NULL: no-op */
void postcopy_session_get_stats(const struct postcopy_session *s,
				struct postcopy_session_stats *out);

#endif
