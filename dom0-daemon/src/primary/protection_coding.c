/*
 * How the primary codes its checkpoints' pages: the plain encoder, or
 * RemusDB's ASC (compression against a cache of pages sent before) and RT
 * (pages equal to disk blocks the guest read go as references), with the
 * VM's disk read index RT needs (asc_encoder.h, read_index.h).
 */
#include "codec/asc_encoder.h"
#include "base/log.h"
#include "primary/protection_internal.h"

void protection_coding_init(struct protection *p)
{
	p->coding.encoder = &page_encoder_default;
}

/* A recorded page trace stops here: 256 MiB of page pairs. */
#define TRACE_MAX_RECORDS 32768

/* The RemusDB optimizations the request asked for (both by default). */
int protection_coding_start(struct protection *p, const struct protect_request *req,
			    char *err, size_t errlen)
{
	struct asc_options opt = {
		.compress = req->compress,
		.cache_bytes = p->settings->compress_cache_bytes,
		.cache_percent = p->settings->compress_cache_percent,
		.disk_path = vm_def(p->vm)->disk,
		.trace_path = req->trace_pages[0] ? req->trace_pages : NULL,
		.trace_max_records = TRACE_MAX_RECORDS,
	};

	if (req->read_tracking) {
		if (vm_read_tracking_start(p->vm, p->settings->read_index_bytes, err, errlen) < 0)
			return -1;
		p->coding.read_tracking = true;
		p->coding.rt_index = opt.index = vm_read_index(p->vm);
	}
	p->coding.asc = asc_encoder_create(&opt, err, errlen);
	if (!p->coding.asc)
		return -1;
	p->coding.compress = req->compress;
	p->coding.encoder = p->coding.asc;
	log_info("vm %s: checkpoint compression %s, disk read tracking %s", p->name,
		 req->compress ? "on" : "OFF", req->read_tracking ? "on" : "OFF");
	return 0;
}

void protection_coding_end(struct protection *p)
{
	asc_encoder_destroy(p->coding.asc);
	p->coding.asc = NULL;
	/*
	 * Only our own index: a re-protect starts the new protection (and
	 * its index) before the old protection object is destroyed, and
	 * stopping that would free the index under the new encoder.
	 */
	if (p->coding.read_tracking && vm_read_index(p->vm) == p->coding.rt_index)
		vm_read_tracking_stop(p->vm);
}

const struct page_encoder *protection_coding_encoder(const struct protection *p)
{
	return p->coding.encoder;
}

bool protection_coding_compress(const struct protection *p)
{
	return p->coding.compress;
}

int protection_coding_set_guest_ram(struct protection *p, uint64_t guest_ram)
{
	return p->coding.asc ? asc_encoder_set_guest_ram(p->coding.asc, guest_ram) : 0;
}

void protection_coding_allow_disk_refs_from(struct protection *p, uint64_t epoch)
{
	if (p->coding.asc)
		asc_encoder_allow_disk_refs_from(p->coding.asc, epoch);
}

void protection_coding_reset_stats(struct protection *p)
{
	const struct page_encoder *enc = p->coding.encoder;

	if (enc && enc->reset_stats)
		enc->reset_stats(enc->ctx);
}

void protection_coding_status(const struct protection *p, json_t *o)
{
	const struct page_encoder *enc = p->coding.encoder;

	if (enc && enc->status)
		enc->status(enc->ctx, o);
}
