/* What `status` and `reset-stats` show of a protection (protection.h). */
#include <string.h>

#include "primary/protection_internal.h"

bool protection_finished(const struct protection *p)
{
	return p->state == ST_UNPROTECTED || p->state == ST_FENCED || p->state == ST_FAILED;
}

bool protection_checkpointing(const struct protection *p)
{
	return (p->state == ST_SYNCING || p->state == ST_PROTECTED) && p->source;
}

void protection_reset_stats(struct protection *p)
{
	protection_stats_reset(p);
	protection_link_reset_stats(p);
	protection_coding_reset_stats(p);
}

/* What commit protection did with the guest's frames (null when it is off). */
static json_t *commit_protection_json(const struct protection *p)
{
	struct output_commit_cp_stats c;

	if (!p->oc || !output_commit_cp_enabled(p->oc))
		return json_null();
	output_commit_get_cp_stats(p->oc, &c);
	return json_pack("{s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
			 "dscp", (int)c.dscp,
			 "marked_held", (json_int_t)c.marked_held,
			 "held_behind_their_flow", (json_int_t)c.held_behind,
			 "held_nic_busy", (json_int_t)c.held_sink_busy,
			 "released_at_once", (json_int_t)c.released_at_once,
			 "marked_dropped", (json_int_t)c.marked_dropped,
			 "flow_table_failures", (json_int_t)c.flow_table_failures,
			 "flows_holding", (json_int_t)c.flows_holding,
			 "flows_tracked", (json_int_t)c.flows_tracked,
			 "ahead_notices", (json_int_t)c.ahead_notices,
			 "flow_records", (json_int_t)c.flow_records);
}

/*
 * What the protection holds in the daemon's memory, beside the guest's
 * own RAM: the pipeline's epochs (raw pages kept until the backup
 * acknowledges them, coded frames, pooled jobs), the frames the
 * sequencer holds for wire order, the compression cache, the guest's
 * held output and the link's unsent backlog.  The pipeline
 * is the part without a bound (an epoch may dirty every page), hence its
 * peak.
 */
static json_t *memory_json(const struct protection *p, const struct protection_epoch_progress *g,
			   const struct output_queue_stats *q, struct repl_conn *conn)
{
	const struct page_encoder *enc = protection_coding_encoder(p);
	uint64_t cache = enc && enc->memory_bytes ? enc->memory_bytes(enc->ctx) : 0;
	uint64_t backlog = conn ? repl_conn_backlog(conn) : 0;

	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
			 "held_bytes", (json_int_t)(g->pipeline_bytes + g->held_for_order + cache +
						    q->bytes_held + backlog),
			 "pipeline_bytes", (json_int_t)g->pipeline_bytes,
			 "pipeline_peak_bytes", (json_int_t)g->pipeline_peak_bytes,
			 "held_for_order_bytes", (json_int_t)g->held_for_order,
			 "compress_cache_bytes", (json_int_t)cache,
			 "output_held_bytes", (json_int_t)q->bytes_held,
			 "send_backlog_bytes", (json_int_t)backlog);
}

json_t *protection_status_json(const struct protection *p)
{
	struct output_queue_stats q = { 0 };
	struct protection_epoch_progress g = protection_epoch_progress(p);
	struct protection_stats_summary s = protection_stats_summary(p);
	struct repl_conn *conn = protection_conn(p);
	int64_t now = monotonic_us();

	if (p->oc)
		output_commit_get_stats(p->oc, &q);
	json_t *o = json_pack("{s:s, s:s, s:s, s:I, s:I, s:I, s:f, s:f, s:f, s:I, s:I,"
			      " s:I, s:I, s:I, s:i, s:I, s:b, s:{s:b, s:I, s:I}, s:s,"
			      " s:I, s:I}",
			      "role", "primary", "state", protection_state_names[p->state],
			      "peer", p->backup,
			      "epoch", (json_int_t)g.sent,
			      "acked_epoch", (json_int_t)g.acked,
			      "in_flight", (json_int_t)g.in_flight,
			      "pause_ms_p50", s.pause_ms_p50,
			      "pause_ms_p99", s.pause_ms_p99,
			      "bytes_per_epoch_mean", s.bytes_per_epoch_mean,
			      "dirty_pages_last", (json_int_t)s.dirty_pages_last,
			      "epochs", (json_int_t)s.epochs,
			      "backpressure_events", (json_int_t)s.backpressure_events,
			      "held_frames", (json_int_t)q.frames_held,
			      "held_bytes", (json_int_t)q.bytes_held,
			      "interval_ms", (int)p->interval_ms,
			      "generation", (json_int_t)protection_arbiter_generation(p),
			      "output_commit", p->output_commit,
			      "disk_sync", "done", p->disk && disk_copy_done(p->disk),
			      "bytes", (json_int_t)(p->disk ? disk_copy_bytes(p->disk) : 0),
			      "total", (json_int_t)(p->disk ? disk_copy_size(p->disk) : 0),
			      "checkpoint_source",
			      p->source ? checkpoint_source_state(p->source) : "none",
			      "bytes_sent", (json_int_t)(conn ? repl_conn_bytes_sent(conn) : 0),
			      "frames_released", (json_int_t)q.frames_released);
	if (!o)
		return NULL;
	json_object_set_new(o, "disk_copy", protection_disk_copy_json(p));
	json_object_set_new(o, "unsafe_release_early",
			    json_boolean(p->oc && output_commit_unsafe(p->oc)));
	json_object_set_new(o, "last_ack_age_ms", g.any_ack ?
			    json_integer((now - g.last_ack_us) / 1000) : json_null());
	json_object_set_new(o, "error", p->error[0] ? json_string(p->error) : json_null());
	uint16_t version = protection_link_version(p);
	json_object_set_new(o, "protocol", version ? json_integer(version) : json_null());
	json_object_set_new(o, "checkpoint_hold", protection_hold_json(p));
	json_object_set_new(o, "switchover", protection_switchover_json(p));
	json_object_set_new(o, "commit_protection", commit_protection_json(p));
	json_t *hb = protection_link_heartbeat_json(p);
	json_object_set_new(o, "max_peer_silence_ms", hb ? json_incref(json_object_get(hb,
			    "max_silence_ms")) : json_null());
	json_object_set_new(o, "heartbeat", hb ? hb : json_null());
	json_object_set_new(o, "stream_max_silence_ms",
			    json_integer(protection_link_stream_max_silence_ms(p)));
	protection_stats_dirty_json(p, o);
	json_object_set_new(o, "peer_timeout_ms", json_integer(p->settings->peer_timeout_ms));
	json_object_set_new(o, "pipeline", protection_stats_pipeline_json(p));
	json_object_set_new(o, "pause_histogram", protection_stats_histogram_json(p));
	json_object_set_new(o, "guest_pause_histogram", protection_stats_guest_histogram_json(p));
	json_object_set_new(o, "pause_parts", protection_stats_pause_parts_json(p));
	json_object_set_new(o, "pause_boost", pause_boost_json(&p->pause_boost));
	json_object_set_new(o, "reprotect", protection_reprotect_json(p));
	json_object_set_new(o, "memory", memory_json(p, &g, &q, conn));
	return o;
}
