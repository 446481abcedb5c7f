/*
 * The primary's measures of its checkpoints: pauses, sizes, dirty pages
 * and where they come from (dirty_census.h), and the pipeline's coding,
 * kept for `status` and /metrics; `reset-stats` starts most of them again.
 */
#include <string.h>

#include "base/log.h"
#include "primary/protection_internal.h"

void protection_stats_backpressure(struct protection *p)
{
	p->stats.backpressure_events++;
}

void protection_stats_epoch_sent(struct protection *p, uint64_t bytes)
{
	sample_ring_add(&p->stats.epoch_bytes, (double)bytes);
}

void protection_stats_layout(struct protection *p, const char *const *names,
			     const uint64_t *lengths, size_t count)
{
	if (dirty_census_layout(&p->stats.census, names, lengths, count) < 0)
		log_warn("vm %s: no memory for the dirty page census", p->name);
}

void protection_stats_page(struct protection *p, unsigned block, uint64_t page_index, bool zero)
{
	dirty_census_page(&p->stats.census, block, page_index, zero);
}

void protection_stats_checkpoint(struct protection *p, const struct checkpoint_stats *st)
{
	p->stats.dirty_pages_last = st->pages + st->zero_pages;
	p->stats.shipped++;
	sample_ring_add(&p->stats.dirty_pages, (double)p->stats.dirty_pages_last);
	dirty_census_epoch_end(&p->stats.census);
	sample_ring_add(&p->stats.pause_ms, (double)st->pause_us / 1000.0);
	pause_histogram_observe(&p->stats.pause_hist, (double)st->pause_us / 1000.0);
	sample_ring_add(&p->stats.stop_ms, (double)st->stop_us / 1000.0);
	sample_ring_add(&p->stats.sync_ms, (double)st->sync_us / 1000.0);
	sample_ring_add(&p->stats.request_wait_ms, (double)st->request_wait_us / 1000.0);
}

void protection_stats_resume(struct protection *p, int64_t resume_us, int64_t guest_pause_us)
{
	sample_ring_add(&p->stats.resume_ms, (double)resume_us / 1000.0);
	sample_ring_add(&p->stats.guest_pause_ms, (double)guest_pause_us / 1000.0);
	pause_histogram_observe(&p->stats.guest_pause_hist, (double)guest_pause_us / 1000.0);
}

void protection_stats_encoded(struct protection *p, const struct checkpoint_job_stats *st)
{
	sample_ring_add(&p->stats.pl.encode_ms, (double)st->encode_us / 1000.0);
	sample_ring_add(&p->stats.pl.raw_bytes, (double)st->raw_bytes);
	sample_ring_add(&p->stats.pl.page_bytes, (double)st->page_bytes);
	p->stats.pl.raw_bytes_last = st->raw_bytes;
	p->stats.pl.page_bytes_last = st->page_bytes;
	p->stats.pl.raw_bytes_total += st->raw_bytes;
	p->stats.pl.page_bytes_total += st->page_bytes;
	for (unsigned k = 0; k < REPL_KIND_COUNT; k++)
		p->stats.pl.kinds[k] += st->kinds[k];
	if (st->device_raw_bytes) {
		sample_ring_add(&p->stats.pl.device_raw, (double)st->device_raw_bytes);
		sample_ring_add(&p->stats.pl.device_sent, (double)st->device_bytes);
		p->stats.pl.device_raw_total += st->device_raw_bytes;
		p->stats.pl.device_sent_total += st->device_bytes;
	}
}

void protection_stats_page_request(struct protection *p)
{
	p->stats.pl.page_requests++;
}

void protection_stats_page_resent(struct protection *p)
{
	p->stats.pl.page_resends++;
}

void protection_stats_reset(struct protection *p)
{
	memset(&p->stats.pause_ms, 0, sizeof(p->stats.pause_ms));
	memset(&p->stats.stop_ms, 0, sizeof(p->stats.stop_ms));
	memset(&p->stats.sync_ms, 0, sizeof(p->stats.sync_ms));
	memset(&p->stats.request_wait_ms, 0, sizeof(p->stats.request_wait_ms));
	memset(&p->stats.resume_ms, 0, sizeof(p->stats.resume_ms));
	memset(&p->stats.guest_pause_ms, 0, sizeof(p->stats.guest_pause_ms));
	memset(&p->stats.epoch_bytes, 0, sizeof(p->stats.epoch_bytes));
	memset(&p->stats.dirty_pages, 0, sizeof(p->stats.dirty_pages));
	p->stats.backpressure_events = 0;
	memset(&p->stats.pl, 0, sizeof(p->stats.pl));
	p->stats.epochs_at_reset = p->stats.shipped;
	dirty_census_reset(&p->stats.census);
}

void protection_stats_end(struct protection *p)
{
	dirty_census_free(&p->stats.census);
}

struct protection_stats_summary protection_stats_summary(const struct protection *p)
{
	struct protection_stats_summary s = {
		.pause_ms_p50 = sample_ring_percentile(&p->stats.pause_ms, 50),
		.pause_ms_p99 = sample_ring_percentile(&p->stats.pause_ms, 99),
		.bytes_per_epoch_mean = sample_ring_mean(&p->stats.epoch_bytes),
		.dirty_pages_last = p->stats.dirty_pages_last,
		.epochs = p->stats.shipped,
		.backpressure_events = p->stats.backpressure_events,
	};

	return s;
}

json_t *protection_dirty_census_json(const struct protection *p)
{
	return dirty_census_json(&p->stats.census);
}

void protection_stats_dirty_json(const struct protection *p, json_t *o)
{
	json_object_set_new(o, "dirty_pages_per_epoch_mean",
			    json_real(sample_ring_mean(&p->stats.dirty_pages)));
	json_object_set_new(o, "dirty_pages_per_epoch_p50",
			    json_real(sample_ring_percentile(&p->stats.dirty_pages, 50)));
	json_object_set_new(o, "dirty_pages_per_epoch_p99",
			    json_real(sample_ring_percentile(&p->stats.dirty_pages, 99)));
	/* The counts only: status is polled, and hot/top scan every page. */
	json_object_set_new(o, "dirty_census", dirty_census_summary_json(&p->stats.census));
	json_object_set_new(o, "epochs_since_reset",
			    json_integer((json_int_t)(p->stats.shipped -
						      p->stats.epochs_at_reset)));
}

/*
 * The checkpoint pipeline: what plain Remus would have sent (raw dirty
 * bytes) beside what the page coding sent, per epoch and in total, the
 * worker's time per epoch and the pages of each kind.  An encoder adds
 * its own members (page_encoder.status) to the same object.
 */
json_t *protection_stats_pipeline_json(const struct protection *p)
{
	const struct protection_pipeline_stats *pl = &p->stats.pl;
	struct protection_epoch_progress g = protection_epoch_progress(p);
	json_t *o = json_object();
	json_t *kinds = json_object();

	if (!o || !kinds) {
		json_decref(o);
		json_decref(kinds);
		return json_null();
	}
	for (unsigned k = 0; k < REPL_KIND_COUNT; k++)
		json_object_set_new(kinds, repl_page_kind_name((uint8_t)k),
				    json_integer((json_int_t)pl->kinds[k]));
	json_object_set_new(o, "pages_by_kind", kinds);
	json_object_set_new(o, "raw_dirty_bytes_total", json_integer((json_int_t)pl->raw_bytes_total));
	json_object_set_new(o, "page_bytes_sent_total", json_integer((json_int_t)pl->page_bytes_total));
	json_object_set_new(o, "raw_dirty_bytes_last", json_integer((json_int_t)pl->raw_bytes_last));
	json_object_set_new(o, "page_bytes_sent_last", json_integer((json_int_t)pl->page_bytes_last));
	json_object_set_new(o, "raw_dirty_bytes_per_epoch_mean",
			    json_real(sample_ring_mean(&pl->raw_bytes)));
	json_object_set_new(o, "page_bytes_sent_per_epoch_mean",
			    json_real(sample_ring_mean(&pl->page_bytes)));
	json_object_set_new(o, "compression_ratio", pl->raw_bytes_total ?
			    json_real((double)pl->page_bytes_total / (double)pl->raw_bytes_total) :
			    json_null());
	json_object_set_new(o, "encode_ms_p50", json_real(sample_ring_percentile(&pl->encode_ms, 50)));
	json_object_set_new(o, "encode_ms_p99", json_real(sample_ring_percentile(&pl->encode_ms, 99)));
	json_object_set_new(o, "epochs_encoding", json_integer(g.encoding));
	json_object_set_new(o, "held_for_order_bytes", json_integer((json_int_t)g.held_for_order));
	json_object_set_new(o, "device_blob_bytes_per_epoch_mean",
			    json_real(sample_ring_mean(&pl->device_raw)));
	json_object_set_new(o, "device_bytes_sent_per_epoch_mean",
			    json_real(sample_ring_mean(&pl->device_sent)));
	json_object_set_new(o, "device_blob_bytes_total",
			    json_integer((json_int_t)pl->device_raw_total));
	json_object_set_new(o, "device_bytes_sent_total",
			    json_integer((json_int_t)pl->device_sent_total));
	json_object_set_new(o, "page_requests", json_integer((json_int_t)pl->page_requests));
	json_object_set_new(o, "page_resends", json_integer((json_int_t)pl->page_resends));
	protection_coding_status(p, o);
	return o;
}

json_t *protection_stats_pause_parts_json(const struct protection *p)
{
	const struct checkpoint_resume *r = &p->resume;

	return json_pack("{s:f, s:f, s:f, s:f, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f}",
			 /* REPLY -> RESUME: the pause as the guest has it */
			 "guest_pause_ms_p50", sample_ring_percentile(&p->stats.guest_pause_ms, 50),
			 "guest_pause_ms_p99", sample_ring_percentile(&p->stats.guest_pause_ms, 99),
			 /* LOADED -> RESUME, by QEMU's stamp on the event */
			 "resume_ms_p50", sample_ring_percentile(&p->stats.resume_ms, 50),
			 "resume_ms_p99", sample_ring_percentile(&p->stats.resume_ms, 99),
			 "resumes_seen", (json_int_t)r->seen,
			 "resumes_unmeasured", (json_int_t)r->unmeasured,
			 "resumes_missed", (json_int_t)r->missed,
			 "stop_ms_p50", sample_ring_percentile(&p->stats.stop_ms, 50),
			 "stop_ms_p99", sample_ring_percentile(&p->stats.stop_ms, 99),
			 "bitmap_sync_ms_p50", sample_ring_percentile(&p->stats.sync_ms, 50),
			 "bitmap_sync_ms_p99", sample_ring_percentile(&p->stats.sync_ms, 99),
			 "request_wait_ms_p50", sample_ring_percentile(&p->stats.request_wait_ms, 50),
			 "request_wait_ms_p99", sample_ring_percentile(&p->stats.request_wait_ms, 99));
}

json_t *protection_stats_histogram_json(const struct protection *p)
{
	return pause_histogram_json(&p->stats.pause_hist);
}

json_t *protection_stats_guest_histogram_json(const struct protection *p)
{
	return pause_histogram_json(&p->stats.guest_pause_hist);
}
