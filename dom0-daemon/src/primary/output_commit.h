/*
 * Output commit on the primary (Remus): the guest's outgoing frames are
 * held, tagged with the epoch that was open when they left the guest, and
 * released only once the backup acknowledged that epoch.  A checkpoint's
 * begin is the cut: frames from then on belong to the next epoch, whose
 * state the acknowledged checkpoint does not contain.
 *
 * The held frames live in an output_queue (output_queue.h); this unit adds
 * the epoch cut, the release rule and the fenced state in which frames go
 * nowhere.  protection.c drives it; tests/unit/test_output_commit.c drives
 * the same functions.
 *
 * unsafe_release_early is a DEBUG negative control for the drill: output
 * commit runs one epoch behind.  Once epoch N is acknowledged, every frame
 * of epoch N+1 leaves, those already held and those the guest sends later
 * alike, so a failover can expose output the resumed backup never
 * produced.  (Releasing only the N+1 frames held when N's ack arrives
 * would expose just the few milliseconds between a cut and its ack, a
 * bug too small for the drill to show.)
 */
#ifndef REMUSDB_OUTPUT_COMMIT_H
#define REMUSDB_OUTPUT_COMMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "primary/output_queue.h"
#include "wire/cp_flow_msg.h"

struct output_commit;

/*
 * Held frames beyond max_bytes are dropped like a full NIC queue.  sink
 * receives released frames (as output_queue_sink).  NULL when out of memory.
 */
struct output_commit *output_commit_create(size_t max_bytes, bool unsafe_release_early,
					   output_queue_sink sink, void *sink_opaque);
void output_commit_destroy(struct output_commit *oc); /* NULL is a no-op */

/*
 * The guest's output hook (net_relay_output_hook): holds frame under the
 * open epoch, or drops it once fenced.  Returns 1: the frame is taken.
 */
int output_commit_hold(void *oc, const uint8_t *frame, uint32_t len);
/* Checkpoint `epoch` begins: frames from now on belong to epoch + 1. */
void output_commit_cut(struct output_commit *oc, uint64_t epoch);
/* The epoch that frames (and disk writes) now belong to. */
uint64_t output_commit_open_epoch(const struct output_commit *oc);
/* The backup acknowledged `epoch`: its frames, and all before, leave. */
void output_commit_ack(struct output_commit *oc, uint64_t epoch);
/* Running unprotected: everything held leaves. */
void output_commit_release_all(struct output_commit *oc);
/* Fenced: everything held, and everything the guest sends later, is dropped. */
void output_commit_drop_all(struct output_commit *oc);
bool output_commit_unsafe(const struct output_commit *oc);

/*
 * Commit protection (RemusDB): from now on only frames the guest's
 * remusdb_cp module marked with `dscp` wait for their epoch (with the
 * mark cleared: DSCP 0); an unmarked frame waits only behind a held frame
 * of its own TCP flow, so each connection's bytes stay in order; all else
 * leaves at once.  Without it every frame waits (Remus).  -1: out of
 * memory (nothing changed).
 */
int output_commit_enable_cp(struct output_commit *oc, uint8_t dscp);
bool output_commit_cp_enabled(const struct output_commit *oc);

/*
 * Where commit protection's flow positions go (the backup, through the
 * protection; cp_flow_msg.h says why).  state: at the cut of `epoch`,
 * the flows whose position moved during it, and those forgotten (idle
 * for long); 0, or -1 when they could not be queued.  ahead: bytes of
 * a flow are about to leave beyond its position at cut `a->epoch`; it
 * is called before they leave.
 */
struct output_commit_flow_sink {
	void *opaque;
	int (*state)(void *opaque, uint64_t epoch, const struct cp_flow_msg_record *r,
		     uint32_t count);
	void (*ahead)(void *opaque, const struct cp_flow_msg_ahead *a);
};
void output_commit_set_flow_sink(struct output_commit *oc,
				 const struct output_commit_flow_sink *sink);

struct output_commit_cp_stats {
	uint64_t marked_held;        /* marked frames held for their epoch */
	uint64_t held_behind;        /* unmarked, held behind their flow's held frames */
	uint64_t held_sink_busy;     /* unmarked, held because the NIC could not take them */
	uint64_t released_at_once;   /* unmarked, sent without waiting */
	uint64_t marked_dropped;     /* no memory to clear a mark: dropped */
	uint64_t flow_table_failures;/* no memory to count a flow: every frame held since */
	uint64_t flows_holding;      /* now: flows with frames held */
	uint64_t flows_tracked;      /* now: flows known (positions tracked or frames held) */
	uint64_t ahead_notices;      /* FLOW_AHEAD: releases beyond the last cut */
	uint64_t flow_records;       /* FLOW_STATE records sent */
	unsigned dscp;               /* the mark */
};
void output_commit_get_cp_stats(const struct output_commit *oc,
				struct output_commit_cp_stats *out);
void output_commit_get_stats(const struct output_commit *oc, struct output_queue_stats *out);

#endif
