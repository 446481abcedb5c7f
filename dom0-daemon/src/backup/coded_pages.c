/*
 * Coded pages on the backup (coded_pages.h): decoded as they
 * arrive against the committed image (epoch N-1 is committed before any
 * frame of N is processed, so it is the base the primary's encoder
 * refers to), disk references resolved at EPOCH_END against the replica
 * with the epoch's writes laid over it, and every page checked against
 * its XXH3-64.  A page that fails is asked for again; its epoch is
 * committed only when every such page came back, and frames that arrive
 * meanwhile wait, in order, until then (replica_stream.c commits it).
 */
#include "backup/coded_pages.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/be.h"
#include "base/log.h"
#include "codec/page_coding.h"
#include "backup/replication_internal.h"

void coded_pages_init(struct replica_coded_pages *c, const struct page_decoder *decoder)
{
	c->decoder = decoder;
	buffer_init(&c->deferred);
}

void coded_pages_free(struct replica_coded_pages *c)
{
	free(c->fixups);
	buffer_free(&c->deferred);
}

/* A staged page of the open epoch whose content is still to come. */
struct page_fixup {
	uint8_t *slot;         /* epoch_stage_reserve_page() */
	uint64_t index;
	uint32_t block;
	uint64_t checksum;     /* this record's: what its own content must hash to */
	uint64_t want;         /* the page's last record in the epoch: what a resend must hash to */
	bool disk_ref;         /* to resolve at EPOCH_END */
	bool requested;        /* PAGE_REQUEST sent, PAGE_RESEND awaited */
	uint64_t disk_offset;
	uint8_t hash128[16];   /* XXH3-128, canonical (big-endian) */
};

void coded_pages_forget(struct replica *r)
{
	r->coded.fixup_count = 0;
	r->coded.requests_outstanding = 0;
}

void coded_pages_drop_pending(struct replica *r)
{
	coded_pages_forget(r);
	r->coded.epoch_waiting = false;
	buffer_free(&r->coded.deferred);
}

static bool page_requested(const struct replica *r, unsigned block, uint64_t index)
{
	for (size_t i = 0; i < r->coded.fixup_count; i++)
		if (r->coded.fixups[i].requested && r->coded.fixups[i].block == block &&
		    r->coded.fixups[i].index == index)
			return true;
	return false;
}

/*
 * A later record of a page decides what the epoch leaves behind, so it
 * decides what a resend of that page must hash to.
 */
static void note_last_record(struct replica *r, unsigned block, uint64_t index, uint64_t sum)
{
	for (size_t i = 0; i < r->coded.fixup_count; i++)
		if (r->coded.fixups[i].block == block && r->coded.fixups[i].index == index)
			r->coded.fixups[i].want = sum;
}

static struct page_fixup *add_fixup(struct replica *r, unsigned block, uint64_t index,
				    uint64_t checksum)
{
	if (r->coded.fixup_count == r->coded.fixup_cap) {
		size_t cap = r->coded.fixup_cap ? r->coded.fixup_cap * 2 : 16;
		struct page_fixup *grown = realloc(r->coded.fixups, cap * sizeof(*grown));
		if (!grown)
			return NULL;
		r->coded.fixups = grown;
		r->coded.fixup_cap = cap;
	}
	uint8_t *slot = epoch_stage_reserve_page(r->stage, block, index);
	if (!slot)
		return NULL;
	struct page_fixup *fx = &r->coded.fixups[r->coded.fixup_count++];
	memset(fx, 0, sizeof(*fx));
	fx->slot = slot;
	fx->block = block;
	fx->index = index;
	fx->checksum = checksum;
	fx->want = checksum;
	return fx;
}

/* Asks the primary for the page again (once per page and epoch). */
static int request_page(struct session *ss, struct replica *r, struct page_fixup *fx,
			uint8_t reason)
{
	struct repl_page_request rq = {
		.epoch = epoch_stage_epoch(r->stage), .block = (uint16_t)fx->block,
		.index = fx->index, .reason = reason,
	};
	bool asked = page_requested(r, fx->block, fx->index);

	fx->requested = true;
	if (asked)
		return 0;
	r->coded.requests_outstanding++;
	r->coded.counts.page_requests++;
	if (repl_put_page_request(repl_conn_out(ss->conn), &rq) < 0)
		return session_protocol_error(ss, "cannot queue a PAGE_REQUEST (out of memory)");
	repl_conn_flush(ss->conn);
	return 0;
}

/* A page that failed: loud, counted, and asked for again. */
static int page_failed(struct session *ss, struct replica *r, unsigned block,
		       const struct repl_coded_page *cp, uint8_t reason, const char *what)
{
	if (reason == REPL_REQ_CHECKSUM)
		r->coded.counts.checksum_mismatches++;
	else if (reason == REPL_REQ_UNDECODABLE)
		r->coded.counts.undecodable++;
	else
		r->coded.counts.disk_ref_fallbacks++;
	log_error("vm %s: epoch %llu, block %u, page %llu: %s; asking the primary for it again",
		  r->name, (unsigned long long)epoch_stage_epoch(r->stage), block,
		  (unsigned long long)cp->index, what);
	struct page_fixup *fx = add_fixup(r, block, cp->index, cp->checksum);
	if (!fx)
		return session_protocol_error(ss, "out of memory staging a page");
	return request_page(ss, r, fx, reason);
}

int coded_pages_on_frame(struct session *ss, struct replica *r, const struct repl_frame *f)
{
	struct repl_pages_coded pc;
	struct repl_coded_iter it;
	struct repl_coded_page cp;
	const char *err;
	uint8_t page[REPL_PAGE_SIZE];
	char what[128];

	if (repl_decode_pages_coded(f, &pc, &err) < 0)
		return session_protocol_error(ss, "%s", err);
	if (!r->image)
		return session_protocol_error(ss, "PAGES_CODED before RAM_LAYOUT");
	if (pc.block >= ram_image_block_count(r->image))
		return session_protocol_error(ss, "PAGES_CODED for block %u of %zu", pc.block,
					      ram_image_block_count(r->image));
	/* The bulk copy goes straight into the image: it has no EPOCH_END to wait at. */
	if (pc.epoch == 0 || pc.epoch != epoch_stage_epoch(r->stage))
		return session_protocol_error(ss, "PAGES_CODED of epoch %llu while epoch %llu is "
					      "open", (unsigned long long)pc.epoch,
					      (unsigned long long)epoch_stage_epoch(r->stage));
	const struct ram_image_block *blk = ram_image_block(r->image, pc.block);
	uint64_t block_pages = blk->length / REPL_PAGE_SIZE;
	repl_coded_iter_init(&it, &pc);
	while (repl_coded_iter_next(&it, &cp)) {
		const uint8_t *data = NULL;

		if (cp.index >= block_pages)
			return session_protocol_error(ss, "PAGES_CODED: page %llu is outside block "
						      "%u (%llu pages)",
						      (unsigned long long)cp.index, pc.block,
						      (unsigned long long)block_pages);
		note_last_record(r, pc.block, cp.index, cp.checksum);
		switch (cp.kind) {
		case REPL_KIND_RAW:
			data = cp.data;
			break;
		case REPL_KIND_ZERO:
			break;
		case REPL_KIND_DISK_REF: {
			struct page_fixup *fx = add_fixup(r, pc.block, cp.index, cp.checksum);
			if (!fx)
				return session_protocol_error(ss, "out of memory staging a page");
			fx->disk_ref = true;
			fx->disk_offset = load_be64(cp.data);
			memcpy(fx->hash128, cp.data + 8, sizeof(fx->hash128));
			r->coded.counts.disk_refs++;
			continue;
		}
		default: {
			/* The committed page: the base the primary's encoder referred to. */
			const uint8_t *base = blk->mem + cp.index * REPL_PAGE_SIZE;
			const struct page_decoder *d = r->coded.decoder;
			if (d->decode_page(d->ctx, cp.kind, base, cp.data, cp.len, page) < 0) {
				snprintf(what, sizeof(what), "cannot decode its %s data",
					 repl_page_kind_name(cp.kind));
				if (page_failed(ss, r, pc.block, &cp, REPL_REQ_UNDECODABLE, what) < 0)
					return -1;
				continue;
			}
			data = page;
		}
		}
		uint64_t sum = page_checksum(data);
		if (sum != cp.checksum) {
			snprintf(what, sizeof(what), "CHECKSUM DIVERGENCE after decoding %s "
				 "(%016llx, the primary says %016llx)", repl_page_kind_name(cp.kind),
				 (unsigned long long)sum, (unsigned long long)cp.checksum);
			if (page_failed(ss, r, pc.block, &cp, REPL_REQ_CHECKSUM, what) < 0)
				return -1;
			continue;
		}
		if (epoch_stage_add_page(r->stage, pc.block, cp.index, data) < 0)
			return session_protocol_error(ss, "out of memory staging a page");
	}
	return 0;
}

/*
 * At EPOCH_END: every disk reference is read from the replica as this
 * epoch leaves it and must match its XXH3-128 and its page checksum; one
 * that does not costs a resend, never a wrong page.
 */
static int resolve_disk_refs(struct session *ss, struct replica *r)
{
	size_t n = r->coded.fixup_count; /* request_page may add none, but be exact */

	for (size_t i = 0; i < n; i++) {
		struct page_fixup *fx = &r->coded.fixups[i];
		XXH128_canonical_t canon;
		const char *what = NULL;

		if (!fx->disk_ref || fx->requested)
			continue;
		fx->disk_ref = false;
		if (fx->disk_offset > r->disk_size || r->disk_size - fx->disk_offset < REPL_PAGE_SIZE)
			what = "its disk reference points past the disk's end";
		else if (epoch_stage_read_disk(r->stage, r->disk_fd, fx->disk_offset, fx->slot,
					       REPL_PAGE_SIZE) < 0)
			what = "its disk block cannot be read";
		if (!what) {
			XXH128_canonicalFromHash(&canon, XXH3_128bits(fx->slot, REPL_PAGE_SIZE));
			if (memcmp(canon.digest, fx->hash128, sizeof(fx->hash128)) != 0)
				what = "DISK_REF verification failed (XXH3-128 of the disk block differs)";
			else if (page_checksum(fx->slot) != fx->checksum)
				what = "CHECKSUM DIVERGENCE of its disk block";
		}
		if (!what)
			continue;
		r->coded.counts.disk_ref_fallbacks++;
		log_error("vm %s: epoch %llu, block %u, page %llu at disk offset %llu: %s; asking "
			  "the primary for it again", r->name,
			  (unsigned long long)epoch_stage_epoch(r->stage), fx->block,
			  (unsigned long long)fx->index, (unsigned long long)fx->disk_offset, what);
		if (request_page(ss, r, fx, REPL_REQ_DISK_REF) < 0)
			return -1;
	}
	return 0;
}

int coded_pages_defer(struct session *ss, struct replica *r, const struct repl_frame *f)
{
	uint8_t header[REPL_HEADER_SIZE];

	if (buffer_len(&r->coded.deferred) + REPL_HEADER_SIZE + f->length > REPLICA_DEFER_MAX)
		return session_protocol_error(ss, "more than %u MiB of frames arrived while epoch "
					      "%llu waited for %zu resent page(s)",
					      REPLICA_DEFER_MAX >> 20,
					      (unsigned long long)r->coded.waiting_end.epoch,
					      r->coded.requests_outstanding);
	repl_encode_header(header, f->type, f->length);
	if (buffer_append(&r->coded.deferred, header, sizeof(header)) < 0 ||
	    buffer_append(&r->coded.deferred, f->payload, f->length) < 0)
		return session_protocol_error(ss, "out of memory keeping a frame for later");
	r->coded.counts.deferred_frames++;
	return 0;
}

int coded_pages_on_resend(struct session *ss, struct replica *r, const struct repl_frame *f)
{
	struct repl_page_resend rs;
	const char *err;

	if (repl_decode_page_resend(f, &rs, &err) < 0)
		return session_protocol_error(ss, "%s", err);
	if (rs.epoch != epoch_stage_epoch(r->stage) ||
	    !page_requested(r, rs.block, rs.index))
		return session_protocol_error(ss, "PAGE_RESEND of page %llu of block %u of epoch "
					      "%llu, which was not asked for",
					      (unsigned long long)rs.index, rs.block,
					      (unsigned long long)rs.epoch);
	uint64_t sum = page_checksum(rs.data);
	for (size_t i = 0; i < r->coded.fixup_count; i++) {
		struct page_fixup *fx = &r->coded.fixups[i];
		if (!fx->requested || fx->block != rs.block || fx->index != rs.index)
			continue;
		if (sum != fx->want)
			return session_protocol_error(ss, "invalid PAGE_RESEND: page %llu of block %u "
						      "of epoch %llu hashes to %016llx, its coded "
						      "record said %016llx",
						      (unsigned long long)rs.index, rs.block,
						      (unsigned long long)rs.epoch,
						      (unsigned long long)sum,
						      (unsigned long long)fx->want);
		memcpy(fx->slot, rs.data, REPL_PAGE_SIZE);
		fx->requested = false;
	}
	r->coded.counts.page_resends++;
	r->coded.requests_outstanding--;
	log_info("vm %s: page %llu of block %u of epoch %llu resent and verified", r->name,
		 (unsigned long long)rs.index, rs.block, (unsigned long long)rs.epoch);
	return r->coded.epoch_waiting && r->coded.requests_outstanding == 0;
}


/*
 * While an epoch waits for resent pages, everything but the frames that
 * concern the link itself waits too, in order.
 */
bool coded_pages_defers(const struct replica *r, uint16_t type)
{
	return r->coded.epoch_waiting && type != REPL_HEARTBEAT && type != REPL_BYE &&
	       type != REPL_PAGE_RESEND && type != REPL_FLOW_AHEAD;
}

bool coded_pages_waiting(const struct replica *r)
{
	return r->coded.epoch_waiting;
}

int coded_pages_at_epoch_end(struct session *ss, struct replica *r,
			     const struct repl_epoch_end *e)
{
	if (e->epoch != 0 && resolve_disk_refs(ss, r) < 0)
		return -1;
	if (r->coded.requests_outstanding == 0)
		return 0;
	/* Not a page of it may be missing when it is committed: wait. */
	r->coded.epoch_waiting = true;
	r->coded.waiting_end = *e;
	r->coded.counts.epochs_waited++;
	log_warn("vm %s: epoch %llu waits for %zu page(s) asked for again", r->name,
		 (unsigned long long)e->epoch, r->coded.requests_outstanding);
	return 1;
}

struct repl_epoch_end coded_pages_end_wait(struct replica *r)
{
	r->coded.epoch_waiting = false;
	return r->coded.waiting_end;
}

int coded_pages_next_deferred(struct session *ss, struct replica *r, struct repl_frame *f)
{
	const char *err;

	if (buffer_len(&r->coded.deferred) == 0)
		return 0;
	ssize_t n = repl_frame_parse(buffer_head(&r->coded.deferred),
				     buffer_len(&r->coded.deferred), f, &err);
	if (n <= 0)
		return session_protocol_error(ss, "a kept frame does not parse");
	/* Consumed first; nothing is appended while it is handled (no epoch waits). */
	buffer_consume(&r->coded.deferred, (size_t)n);
	return 1;
}

void coded_pages_count_device_delta(struct replica *r)
{
	r->coded.counts.device_deltas++;
}

json_t *coded_pages_json(const struct replica *r)
{
	const struct replica_coded_pages *c = &r->coded;

	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:b, s:I, s:I}",
			 "checksum_mismatches", (json_int_t)c->counts.checksum_mismatches,
			 "undecodable", (json_int_t)c->counts.undecodable,
			 "disk_refs", (json_int_t)c->counts.disk_refs,
			 "disk_ref_fallbacks", (json_int_t)c->counts.disk_ref_fallbacks,
			 "page_requests", (json_int_t)c->counts.page_requests,
			 "page_resends", (json_int_t)c->counts.page_resends,
			 "deferred_frames", (json_int_t)c->counts.deferred_frames,
			 "epochs_waited", (json_int_t)c->counts.epochs_waited,
			 "waiting_for_resends", c->epoch_waiting,
			 "requests_outstanding", (json_int_t)c->requests_outstanding,
			 "device_deltas", (json_int_t)c->counts.device_deltas);
}
