/* Output commit: the epoch cut and the release rule for held guest frames (output_commit.h). */
#include "primary/output_commit.h"

#include <stdlib.h>
#include <string.h>

#include "relay/cp_flow_frame.h"
#include "relay/cp_flow_table.h"

struct output_commit {
	struct output_queue *held;
	uint64_t open_epoch;
	uint64_t acked;          /* the last epoch acknowledged (0: none) */
	bool dropping;
	bool unsafe_release_early;
	uint64_t sent_unheld;    /* the negative control's frames that skipped the queue */
	output_queue_sink sink;
	void *sink_opaque;
	/* Commit protection (NULL: Remus, every frame held). */
	struct cp_flow_table *flows;
	uint8_t cp_dscp;
	uint8_t *scratch;        /* a marked frame, its mark cleared */
	size_t scratch_cap;
	bool cp_degraded;        /* out of memory once: every frame held, as Remus */
	struct output_commit_cp_stats cp;
	struct output_commit_flow_sink flow_sink;
	struct cp_flow_msg_record *records; /* a cut's FLOW_STATE, being built */
	uint32_t record_count, record_cap;
	bool records_failed;
};

/*
 * A flow without frames for this many cuts is forgotten (and the backup
 * told so): 6,000 is five minutes at 50 ms epochs.  Its next frame
 * starts it again, with no known cut, which makes that frame's release
 * "ahead": forgetting can only cost a reset, never miss one.
 */
#define FLOW_IDLE_CUTS 6000

struct output_commit *output_commit_create(size_t max_bytes, bool unsafe_release_early,
					   output_queue_sink sink, void *sink_opaque)
{
	struct output_commit *oc = calloc(1, sizeof(*oc));

	if (!oc)
		return NULL;
	oc->held = output_queue_create(max_bytes);
	if (!oc->held) {
		free(oc);
		return NULL;
	}
	oc->unsafe_release_early = unsafe_release_early;
	oc->sink = sink;
	oc->sink_opaque = sink_opaque;
	return oc;
}

void output_commit_destroy(struct output_commit *oc)
{
	if (!oc)
		return;
	output_queue_destroy(oc->held);
	cp_flow_table_destroy(oc->flows);
	free(oc->scratch);
	free(oc->records);
	free(oc);
}

int output_commit_enable_cp(struct output_commit *oc, uint8_t dscp)
{
	if (!oc->flows && !(oc->flows = cp_flow_table_create()))
		return -1;
	oc->cp_dscp = dscp;
	return 0;
}

bool output_commit_cp_enabled(const struct output_commit *oc)
{
	return oc->flows != NULL;
}

void output_commit_set_flow_sink(struct output_commit *oc,
				 const struct output_commit_flow_sink *sink)
{
	oc->flow_sink = *sink;
}

/*
 * Follows the guest's side of a flow: how far it sent and acknowledged.
 * -1 when out of memory (the caller holds everything from then on).
 */
static int track_sent(struct output_commit *oc, const struct cp_flow_frame *f)
{
	struct cp_flow_seq *s = cp_flow_table_seq(oc->flows, &f->key);
	uint32_t end = f->seq + f->seg_len;

	if (!s)
		return -1;
	if (!s->seen || cp_flow_frame_seq_after(end, s->sent_end))
		s->sent_end = end;
	if (f->tcp_flags & CP_TCP_ACK) {
		s->ack = f->ack;
		s->ack_seen = true;
	}
	s->seen = true;
	s->changed = true;
	s->last_epoch = oc->open_epoch;
	memcpy(s->guest_mac, f->src_mac, 6);
	memcpy(s->peer_mac, f->dst_mac, 6);
	return 0;
}

/*
 * A frame of the guest's is leaving at once.  When it carries bytes
 * beyond what the guest had sent at the last cut, or acknowledges client
 * bytes beyond what it had acknowledged then, a failover to that
 * checkpoint would leave the client ahead of the guest: the backup is
 * told first (FLOW_AHEAD), so that it can reset the flow.
 *
 * Why the acknowledgement too: a bare ACK of a request (sent before the
 * reply, which commit protection may hold) tells the client's TCP that
 * the request arrived.  The restored guest never received it, the client
 * never resends it, and each waits for the other: the drill's clients
 * that stalled past the load's end (2026-11-26) had requests in flight at
 * the cut, and the backup had verified their flows as consistent (their
 * clients had received nothing beyond the cut).
 */
static void note_release_at_once(struct output_commit *oc, const struct cp_flow_frame *f)
{
	struct cp_flow_seq *s = f->seq_valid ? cp_flow_table_find_seq(oc->flows, &f->key) : NULL;
	uint32_t end = f->seq + f->seg_len;

	if (!s)
		return;
	if (!s->released_any || cp_flow_frame_seq_after(end, s->released_end))
		s->released_end = end;
	s->released_any = true;
	bool bytes_ahead = f->seg_len > 0 &&
			   (!s->cut_known || cp_flow_frame_seq_after(end, s->cut_end));
	bool ack_ahead = (f->tcp_flags & CP_TCP_ACK) &&
			 (!s->cut_ack_known || cp_flow_frame_seq_after(f->ack, s->cut_ack));
	if (!bytes_ahead && !ack_ahead)
		return;
	if (oc->flow_sink.ahead) {
		struct cp_flow_msg_ahead a = { .epoch = oc->open_epoch ? oc->open_epoch - 1 : 0,
					     .key = f->key, .released_end = s->released_end };
		memcpy(a.guest_mac, s->guest_mac, 6);
		memcpy(a.peer_mac, s->peer_mac, 6);
		oc->flow_sink.ahead(oc->flow_sink.opaque, &a);
	}
	oc->cp.ahead_notices++;
}

/*
 * Held frames leave through here: the flow's count goes down only once
 * the sink took the frame (a sink that refuses keeps it at the head).
 */
static int release_held(void *opaque, const uint8_t *frame, size_t len)
{
	struct output_commit *oc = opaque;
	int rc = oc->sink(oc->sink_opaque, frame, len);

	if (rc == 0 && oc->flows) {
		struct cp_flow_frame f;
		cp_flow_frame_classify(frame, len, oc->cp_dscp, &f);
		if (f.tcp)
			cp_flow_table_remove(oc->flows, &f.key);
		struct cp_flow_seq *s =
			f.seq_valid ? cp_flow_table_find_seq(oc->flows, &f.key) : NULL;
		if (s && (!s->released_any ||
			  cp_flow_frame_seq_after(f.seq + f.seg_len, s->released_end))) {
			s->released_end = f.seq + f.seg_len;
			s->released_any = true;
		}
	}
	return rc;
}

/* Holds a frame under the open epoch, counting it for its flow. */
static void hold(struct output_commit *oc, const uint8_t *frame, uint32_t len,
		 const struct cp_flow_frame *f)
{
	/* Full (1) or out of memory (-1): dropped, counted by the queue. */
	if (output_queue_push(oc->held, oc->open_epoch, frame, len) != 0)
		return;
	if (f && f->tcp && cp_flow_table_add(oc->flows, &f->key) < 0) {
		/*
		 * The flow's count is wrong now, so an unmarked frame could
		 * overtake this one: hold everything from here on (Remus).
		 */
		oc->cp.flow_table_failures++;
		oc->cp_degraded = true;
	}
}

/*
 * Commit protection's rule: a marked frame waits for its epoch (with the
 * mark cleared, as the guest would have sent it); an unmarked frame
 * waits only behind a held frame of its own flow, or when the sink cannot
 * take it now; anything else leaves at once.
 */
static void hold_or_release(struct output_commit *oc, const uint8_t *frame, uint32_t len)
{
	struct cp_flow_frame f;

	if (oc->cp_degraded) {
		hold(oc, frame, len, NULL);
		return;
	}
	cp_flow_frame_classify(frame, len, oc->cp_dscp, &f);
	if (f.seq_valid && track_sent(oc, &f) < 0) {
		oc->cp.flow_table_failures++;
		oc->cp_degraded = true;
		hold(oc, frame, len, NULL);
		return;
	}
	if (f.marked) {
		if (oc->scratch_cap < len) {
			uint8_t *grown = realloc(oc->scratch, len);
			if (!grown) {
				oc->cp.marked_dropped++; /* as a full queue would: TCP resends it, marked */
				return;
			}
			oc->scratch = grown;
			oc->scratch_cap = len;
		}
		memcpy(oc->scratch, frame, len);
		cp_flow_frame_clear_mark(oc->scratch, &f);
		oc->cp.marked_held++;
		hold(oc, oc->scratch, len, &f);
		return;
	}
	if (f.tcp && cp_flow_table_held(oc->flows, &f.key) > 0) {
		oc->cp.held_behind++;
		hold(oc, frame, len, &f);
		return;
	}
	/* Told before the frame leaves; a refused frame is then merely held. */
	note_release_at_once(oc, &f);
	if (oc->sink(oc->sink_opaque, frame, len) != 0) {
		oc->cp.held_sink_busy++;
		hold(oc, frame, len, &f);
		return;
	}
	oc->cp.released_at_once++;
}

int output_commit_hold(void *opaque, const uint8_t *frame, uint32_t len)
{
	struct output_commit *oc = opaque;

	if (oc->dropping)
		return 1;
	/*
	 * The negative control: the epoch after the acknowledged one is not
	 * held at all.  Nothing earlier is held either (its ack released
	 * it), so sending at once keeps the frames in order.
	 */
	if (oc->unsafe_release_early && oc->open_epoch <= oc->acked + 1) {
		(void)oc->sink(oc->sink_opaque, frame, len);
		oc->sent_unheld++;
		return 1;
	}
	if (oc->flows)
		hold_or_release(oc, frame, len);
	else
		hold(oc, frame, len, NULL);
	return 1;
}

/* Appends one FLOW_STATE record; false (and records_failed) when out of memory. */
static bool add_record(struct output_commit *oc, const struct cp_flow_key *k,
		       const struct cp_flow_seq *s, uint8_t flags)
{
	if (oc->record_count == oc->record_cap) {
		uint32_t cap = oc->record_cap ? oc->record_cap * 2 : 64;
		struct cp_flow_msg_record *grown = realloc(oc->records, cap * sizeof(*grown));
		if (!grown) {
			oc->records_failed = true;
			return false;
		}
		oc->records = grown;
		oc->record_cap = cap;
	}
	struct cp_flow_msg_record *r = &oc->records[oc->record_count++];
	r->key = *k;
	r->sent_end = s->sent_end;
	r->ack = s->ack;
	memcpy(r->guest_mac, s->guest_mac, 6);
	memcpy(r->peer_mac, s->peer_mac, 6);
	r->flags = flags;
	return true;
}

/* At a cut: the moved flows are recorded, their cut position taken, idle ones forgotten. */
static bool visit_at_cut(void *opaque, const struct cp_flow_key *k, struct cp_flow_seq *s)
{
	struct output_commit *oc = opaque;

	if (s->seen && oc->open_epoch - s->last_epoch > FLOW_IDLE_CUTS)
		return add_record(oc, k, s, CP_FLOW_MSG_FORGET); /* kept if not recorded */
	if (s->changed && !add_record(oc, k, s, 0))
		return false; /* stays changed: a later cut records it */
	s->changed = false;
	s->cut_end = s->sent_end;
	s->cut_known = s->seen;
	s->cut_ack = s->ack;
	s->cut_ack_known = s->ack_seen;
	return false;
}

static void send_flow_state(struct output_commit *oc, uint64_t epoch)
{
	oc->record_count = 0;
	oc->records_failed = false;
	cp_flow_table_each(oc->flows, visit_at_cut, oc);
	for (uint32_t at = 0; at < oc->record_count; at += CP_FLOW_MSG_STATE_MAX_RECORDS) {
		uint32_t n = oc->record_count - at;
		if (n > CP_FLOW_MSG_STATE_MAX_RECORDS)
			n = CP_FLOW_MSG_STATE_MAX_RECORDS;
		if (oc->flow_sink.state(oc->flow_sink.opaque, epoch, oc->records + at, n) < 0)
			return;
		oc->cp.flow_records += n;
	}
	if (oc->records_failed) {
		/*
		 * Some flow's cut position could not be recorded: its
		 * unmarked frames must not leave early, so hold all (Remus).
		 */
		oc->cp.flow_table_failures++;
		oc->cp_degraded = true;
	}
}

void output_commit_cut(struct output_commit *oc, uint64_t epoch)
{
	if (oc->flows && oc->flow_sink.state && epoch > 0)
		send_flow_state(oc, epoch);
	oc->open_epoch = epoch + 1;
}

uint64_t output_commit_open_epoch(const struct output_commit *oc)
{
	return oc->open_epoch;
}

void output_commit_ack(struct output_commit *oc, uint64_t epoch)
{
	uint64_t upto = epoch;

	if (epoch > oc->acked)
		oc->acked = epoch;
	if (oc->unsafe_release_early && epoch < UINT64_MAX)
		upto = epoch + 1; /* the negative control: one epoch early */
	output_queue_release(oc->held, upto, release_held, oc);
}

void output_commit_release_all(struct output_commit *oc)
{
	output_queue_release(oc->held, UINT64_MAX, release_held, oc);
}

void output_commit_drop_all(struct output_commit *oc)
{
	output_queue_drop_all(oc->held);
	if (oc->flows)
		cp_flow_table_clear(oc->flows);
	oc->dropping = true;
}

bool output_commit_unsafe(const struct output_commit *oc)
{
	return oc->unsafe_release_early;
}

void output_commit_get_stats(const struct output_commit *oc, struct output_queue_stats *out)
{
	output_queue_get_stats(oc->held, out);
	/* status counts every frame that left, held first or not */
	out->frames_released += oc->sent_unheld + oc->cp.released_at_once;
}

void output_commit_get_cp_stats(const struct output_commit *oc,
				struct output_commit_cp_stats *out)
{
	*out = oc->cp;
	out->flows_holding = oc->flows ? cp_flow_table_count(oc->flows) : 0;
	out->flows_tracked = oc->flows ? cp_flow_table_known(oc->flows) : 0;
	out->dscp = oc->cp_dscp;
}
