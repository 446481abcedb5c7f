/*
 * Coded pages (PAGES_CODED) on the backup (coded_pages.c).  A
 * page that does not reproduce its checksum, a disk reference that does
 * not verify and a kind we cannot decode are asked for again
 * (PAGE_REQUEST); the epoch is committed and acknowledged only once every
 * such page came back (PAGE_RESEND), and frames of later epochs wait,
 * raw and in order, until then.
 */
#ifndef REMUSDB_CODED_PAGES_H
#define REMUSDB_CODED_PAGES_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buffer.h"
#include "wire/repl_proto.h"

struct page_decoder;
struct page_fixup;
struct replica;
struct session;

/*
 * Frames that arrive while an epoch waits for resent pages are kept, raw
 * and in order, up to this much; beyond it the primary is far ahead of
 * what we can commit and the link ends.
 */
#define REPLICA_DEFER_MAX (256u << 20)

struct replica_coded_pages {
	const struct page_decoder *decoder;
	struct page_fixup *fixups;   /* pages of the open epoch still to fill */
	size_t fixup_count, fixup_cap;
	size_t requests_outstanding; /* pages asked for, not yet resent */
	bool epoch_waiting;          /* EPOCH_END checked; waiting for resends */
	struct repl_epoch_end waiting_end;
	struct buffer deferred;      /* raw frames that came after it */
	struct {
		uint64_t checksum_mismatches, undecodable, disk_refs, disk_ref_fallbacks;
		uint64_t page_requests, page_resends, deferred_frames, epochs_waited;
		uint64_t device_deltas; /* device blobs received as DEVICE_DELTA */
	} counts;
};

void coded_pages_init(struct replica_coded_pages *c, const struct page_decoder *decoder);
void coded_pages_free(struct replica_coded_pages *c);
/* PAGES_CODED: decoded and checked against the committed image, failures asked for. */
int coded_pages_on_frame(struct session *ss, struct replica *r, const struct repl_frame *f);
/*
 * At EPOCH_END e, its digest checked: disk references resolved.  1 when
 * the epoch must wait for resent pages, 0 to commit it now, -1 on error.
 */
int coded_pages_at_epoch_end(struct session *ss, struct replica *r,
			     const struct repl_epoch_end *e);
/* PAGE_RESEND.  1 when it completed the waiting epoch, 0, or -1 on error. */
int coded_pages_on_resend(struct session *ss, struct replica *r, const struct repl_frame *f);
/* The epoch is being committed: its pages are all in. */
void coded_pages_forget(struct replica *r);
/*
 * The session is gone: an epoch waiting for resends never completes, and
 * the frames kept behind it are dropped (the staged epoch is discarded
 * by whoever takes over or starts again).
 */
void coded_pages_drop_pending(struct replica *r);
/* While an epoch waits, frames of this type wait behind it (coded_pages_defer). */
bool coded_pages_defers(const struct replica *r, uint16_t type);
int coded_pages_defer(struct session *ss, struct replica *r, const struct repl_frame *f);
bool coded_pages_waiting(const struct replica *r);
/* The waiting epoch's EPOCH_END; the epoch no longer waits. */
struct repl_epoch_end coded_pages_end_wait(struct replica *r);
/* The next kept frame, consumed: 1, 0 when none is left, -1 on error. */
int coded_pages_next_deferred(struct session *ss, struct replica *r, struct repl_frame *f);
void coded_pages_count_device_delta(struct replica *r);
/* Status: coded_pages. */
json_t *coded_pages_json(const struct replica *r);

#endif
