/* What `status` and `reset-stats` show of a protection (protection.h). */
#include <string.h>

#include "primary/protection_internal.h"

bool protection_finished(const struct protection *p)
{
	return p->state == ST_UNPROTECTED || p->state == ST_FENCED || p->state == ST_FAILED;
}

void protection_reset_stats(struct protection *p)
{
	memset(&p->pause_ms, 0, sizeof(p->pause_ms));
	memset(&p->epoch_bytes, 0, sizeof(p->epoch_bytes));
	memset(&p->dirty_pages, 0, sizeof(p->dirty_pages));
	p->backpressure_events = 0;
	memset(&p->pl, 0, sizeof(p->pl));
	if (p->hb)
		heartbeat_link_reset_stats(p->hb);
	p->stream_max_silence_ms = 0;
	p->epochs_at_reset = p->epochs;
	dirty_census_reset(&p->census);
	if (p->encoder && p->encoder->reset_stats)
		p->encoder->reset_stats(p->encoder->ctx);
}

/*
 * The checkpoint pipeline: what plain Remus would have sent (raw dirty
 * bytes) beside what the page coding sent, per epoch and in total, the
 * worker's time per epoch and the pages of each kind.  An encoder adds
 * its own members (page_encoder.status) to the same object.
 */
static json_t *pipeline_json(const struct protection *p)
{
	json_t *o = json_object();
	json_t *kinds = json_object();

	if (!o || !kinds) {
		json_decref(o);
		json_decref(kinds);
		return json_null();
	}
	for (unsigned k = 0; k < REPL_KIND_COUNT; k++)
		json_object_set_new(kinds, repl_page_kind_name((uint8_t)k),
				    json_integer((json_int_t)p->pl.kinds[k]));
	json_object_set_new(o, "pages_by_kind", kinds);
	json_object_set_new(o, "raw_dirty_bytes_total", json_integer((json_int_t)p->pl.raw_bytes_total));
	json_object_set_new(o, "page_bytes_sent_total", json_integer((json_int_t)p->pl.page_bytes_total));
	json_object_set_new(o, "raw_dirty_bytes_last", json_integer((json_int_t)p->pl.raw_bytes_last));
	json_object_set_new(o, "page_bytes_sent_last", json_integer((json_int_t)p->pl.page_bytes_last));
	json_object_set_new(o, "raw_dirty_bytes_per_epoch_mean",
			    json_real(sample_ring_mean(&p->pl.raw_bytes)));
	json_object_set_new(o, "page_bytes_sent_per_epoch_mean",
			    json_real(sample_ring_mean(&p->pl.page_bytes)));
	json_object_set_new(o, "compression_ratio", p->pl.raw_bytes_total ?
			    json_real((double)p->pl.page_bytes_total / (double)p->pl.raw_bytes_total) :
			    json_null());
	json_object_set_new(o, "encode_ms_p50", json_real(sample_ring_percentile(&p->pl.encode_ms, 50)));
	json_object_set_new(o, "encode_ms_p99", json_real(sample_ring_percentile(&p->pl.encode_ms, 99)));
	json_object_set_new(o, "epochs_encoding",
			    json_integer(p->pipeline ? checkpoint_pipeline_encoding(p->pipeline) : 0));
	json_object_set_new(o, "held_for_order_bytes",
			    json_integer((json_int_t)(p->seq ? checkpoint_sequencer_held(p->seq) : 0)));
	json_object_set_new(o, "device_blob_bytes_per_epoch_mean",
			    json_real(sample_ring_mean(&p->pl.device_raw)));
	json_object_set_new(o, "device_bytes_sent_per_epoch_mean",
			    json_real(sample_ring_mean(&p->pl.device_sent)));
	json_object_set_new(o, "device_blob_bytes_total",
			    json_integer((json_int_t)p->pl.device_raw_total));
	json_object_set_new(o, "device_bytes_sent_total",
			    json_integer((json_int_t)p->pl.device_sent_total));
	json_object_set_new(o, "page_requests", json_integer((json_int_t)p->pl.page_requests));
	json_object_set_new(o, "page_resends", json_integer((json_int_t)p->pl.page_resends));
	if (p->encoder && p->encoder->status)
		p->encoder->status(p->encoder->ctx, o);
	return o;
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

json_t *protection_status_json(const struct protection *p)
{
	struct output_queue_stats q = { 0 };
	int64_t now = monotonic_us();

	if (p->oc)
		output_commit_get_stats(p->oc, &q);
	json_t *o = json_pack("{s:s, s:s, s:s, s:I, s:I, s:I, s:f, s:f, s:f, s:I, s:I,"
			      " s:I, s:I, s:I, s:i, s:I, s:b, s:{s:b, s:I, s:I}, s:s,"
			      " s:I, s:I}",
			      "role", "primary", "state", protection_state_names[p->state],
			      "peer", p->backup,
			      "epoch", (json_int_t)p->last_epoch,
			      "acked_epoch", (json_int_t)p->acked_epoch,
			      "in_flight", (json_int_t)((p->checkpointed_epoch > p->last_epoch ?
						     p->checkpointed_epoch : p->last_epoch) -
						    p->acked_epoch),
			      "pause_ms_p50", sample_ring_percentile(&p->pause_ms, 50),
			      "pause_ms_p99", sample_ring_percentile(&p->pause_ms, 99),
			      "bytes_per_epoch_mean", sample_ring_mean(&p->epoch_bytes),
			      "dirty_pages_last", (json_int_t)p->dirty_pages_last,
			      "epochs", (json_int_t)p->epochs,
			      "backpressure_events", (json_int_t)p->backpressure_events,
			      "held_frames", (json_int_t)q.frames_held,
			      "held_bytes", (json_int_t)q.bytes_held,
			      "interval_ms", (int)p->interval_ms,
			      "generation", (json_int_t)p->ownership.generation,
			      "output_commit", p->output_commit,
			      "disk_sync", "done", p->disk && disk_copy_done(p->disk),
			      "bytes", (json_int_t)(p->disk ? disk_copy_bytes(p->disk) : 0),
			      "total", (json_int_t)(p->disk ? disk_copy_size(p->disk) : 0),
			      "checkpoint_source",
			      p->source ? checkpoint_source_state(p->source) : "none",
			      "bytes_sent", (json_int_t)(p->conn ? repl_conn_bytes_sent(p->conn) : 0),
			      "frames_released", (json_int_t)q.frames_released);
	if (!o)
		return NULL;
	json_object_set_new(o, "disk_copy", protection_disk_copy_json(p));
	json_object_set_new(o, "unsafe_release_early",
			    json_boolean(p->oc && output_commit_unsafe(p->oc)));
	json_object_set_new(o, "last_ack_age_ms", p->any_ack ?
			    json_integer((now - p->last_ack_us) / 1000) : json_null());
	json_object_set_new(o, "error", p->error[0] ? json_string(p->error) : json_null());
	json_object_set_new(o, "checkpoint_hold", protection_hold_json(p));
	json_object_set_new(o, "commit_protection", commit_protection_json(p));
	json_t *hb = p->hb ? heartbeat_link_status_json(p->hb) : NULL;
	json_object_set_new(o, "max_peer_silence_ms", hb ? json_incref(json_object_get(hb,
			    "max_silence_ms")) : json_null());
	json_object_set_new(o, "heartbeat", hb ? hb : json_null());
	json_object_set_new(o, "stream_max_silence_ms", json_integer(p->stream_max_silence_ms));
	json_object_set_new(o, "dirty_pages_per_epoch_mean",
			    json_real(sample_ring_mean(&p->dirty_pages)));
	json_object_set_new(o, "dirty_pages_per_epoch_p50",
			    json_real(sample_ring_percentile(&p->dirty_pages, 50)));
	json_object_set_new(o, "dirty_pages_per_epoch_p99",
			    json_real(sample_ring_percentile(&p->dirty_pages, 99)));
	json_object_set_new(o, "dirty_census", dirty_census_json(&p->census));
	json_object_set_new(o, "epochs_since_reset",
			    json_integer((json_int_t)(p->epochs - p->epochs_at_reset)));
	json_object_set_new(o, "peer_timeout_ms", json_integer(p->settings->peer_timeout_ms));
	json_object_set_new(o, "pipeline", pipeline_json(p));
	json_object_set_new(o, "pause_histogram", pause_histogram_json(&p->pause_hist));
	return o;
}
