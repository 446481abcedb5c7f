/*
 * The backup's side of one replication stream, once the primary is
 * authenticated: VM_CONFIG creates the replica (its disk file, its staged
 * epoch), then RAM layout, pages, device state and disk frames are staged,
 * and each EPOCH_END is checked against its digest, committed in one call
 * and acknowledged.  replication_server.c owns the connection and hands
 * every frame of a configured session here.
 *
 * Coded pages (PAGES_CODED) are decoded as they arrive against the
 * committed image (epoch N-1 is committed before any frame of N is
 * processed, so it is the base the primary's encoder refers to), disk
 * references are resolved at EPOCH_END against the replica with the
 * epoch's writes laid over it, and every page is checked against its
 * XXH3-64.  A page that fails is asked for again; its epoch is committed
 * only when every such page came back, and frames that arrive meanwhile
 * wait, in order, until then.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/be.h"
#include "codec/device_delta.h"
#include "base/fs_util.h"
#include "base/log.h"
#include "backup/replication_internal.h"

/* base_path: a disk already here (absorbed from a stopped VM), or "" for the default file. */
static struct replica *replica_create(struct session *ss, struct vm_config *config,
				      const char *base_path, char *err, size_t errlen)
{
	struct replication_server *s = ss->server;
	struct replica *r = calloc(1, sizeof(*r));

	if (!r) {
		snprintf(err, errlen, "out of memory");
		vm_config_clear(config);
		return NULL;
	}
	r->server = s;
	r->loop = s->loop;
	r->settings = s->settings;
	r->vms = s->vms;
	r->config = *config; /* takes its qemu_argv */
	memset(config, 0, sizeof(*config));
	r->disk_fd = -1;
	replica_checksums_init(&r->checksums);
	r->incoming_fd = -1;
	buffer_init(&r->restore_out);
	snprintf(r->peer, sizeof(r->peer), "%s", ss->peer);
	snprintf(r->name, sizeof(r->name), "%s", r->config.vm);
	snprintf(r->ownership.raw, sizeof(r->ownership.raw), "%s", r->config.ownership);
	r->ownership.exists = true;
	r->ownership.generation = r->config.generation;
	snprintf(r->ownership.owner, sizeof(r->ownership.owner), "%s",
		 r->config.primary_host);
	r->disk_size = r->config.disk_size;
	r->decoder = s->decoder;
	buffer_init(&r->deferred);
	r->stage = epoch_stage_create();
	r->flows = replica_flows_create();
	if (!r->stage || !r->flows || repl_digest_init(&r->digest) < 0) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	epoch_stage_begin(r->stage, 1);
	/* Opened at DISK_BASE, which decides between a full copy and a resync. */
	if (base_path[0])
		snprintf(r->disk_path, sizeof(r->disk_path), "%s", base_path);
	else if (replica_default_disk_path(r, r->disk_path, sizeof(r->disk_path), err,
					   errlen) < 0)
		goto fail;
	r->last_heard_us = monotonic_us();
	r->state = REPLICA_RECEIVING;
	return r;
fail:
	replica_free(r);
	return NULL;
}

/* Refused at arrival: a bad field must not wait for the takeover to fail. */
int replica_on_vm_config(struct session *ss, const struct repl_frame *f)
{
	char err[256];
	const char *json, *perr;
	size_t len;
	struct vm_config config;

	if (repl_decode_vm_config(f, &json, &len, &perr) < 0) {
		session_send_error(ss, REPL_ERR_PROTOCOL, perr);
		return -1;
	}
	if (vm_config_decode(json, len, &config, err, sizeof(err)) < 0) {
		vm_config_clear(&config);
		session_send_error(ss, REPL_ERR_PROTOCOL, err);
		return -1;
	}
	const char *name = config.vm;
	struct replica *old = find_replica(ss->server, name);
	struct vm *here = vm_find(ss->server->vms, name);
	char base_path[PATH_MAX] = "";
	const char *busy = NULL;
	if (old && old->session)
		busy = "is already being replicated here";
	else if (old && (old->state == REPLICA_ARBITRATING ||
			 old->state == REPLICA_FAILING_OVER))
		busy = "is being taken over by this host";
	else if (here && !vm_qemu_gone(here))
		busy = "runs on this host (stop it here first)";
	if (busy) {
		char why[200];
		snprintf(why, sizeof(why), "VM %s %s", name, busy);
		vm_config_clear(&config);
		session_send_error(ss, REPL_ERR_BUSY, why);
		return -1;
	}
	/* A failback: the host that ran the VM before keeps its disk as the replica. */
	if (here && replica_absorb_stopped_vm(ss->server->vms, here, base_path,
					      sizeof(base_path), err, sizeof(err)) < 0) {
		vm_config_clear(&config);
		session_send_error(ss, REPL_ERR_INTERNAL, err);
		return -1;
	}
	if (old) {
		unlink_replica(ss->server, old);
		replica_free(old);
	}
	struct replica *r = replica_create(ss, &config, base_path, err, sizeof(err));
	if (!r) {
		session_send_error(ss, REPL_ERR_INTERNAL, err);
		return -1;
	}
	r->session = ss;
	ss->replica = r;
	ss->state = SESSION_CONFIGURED;
	r->next = ss->server->replicas;
	ss->server->replicas = r;
	log_info("vm %s: replicating from %s (%s); disk replica %s, %.1f MiB",
		 r->name, ss->handshake.peer_name, ss->peer, r->disk_path,
		 (double)r->disk_size / (1 << 20));
	return 0;
}

/* ---- epochs ------------------------------------------------------------ */

static int on_pages(struct session *ss, struct replica *r, const struct repl_frame *f)
{
	struct repl_pages pg;
	const char *err;
	uint8_t page[REPL_PAGE_SIZE];

	if (repl_decode_pages(f, &pg, &err) < 0)
		return session_protocol_error(ss, "%s", err);
	if (!r->image)
		return session_protocol_error(ss, "PAGES before RAM_LAYOUT");
	if (pg.block >= ram_image_block_count(r->image))
		return session_protocol_error(ss, "PAGES for block %u of %zu", pg.block,
				      ram_image_block_count(r->image));
	if (pg.epoch == 0 && r->bulk_done)
		return session_protocol_error(ss, "PAGES of the bulk copy after it ended");
	if (pg.epoch != 0 && pg.epoch != epoch_stage_epoch(r->stage))
		return session_protocol_error(ss, "PAGES of epoch %llu while epoch %llu is open",
				      (unsigned long long)pg.epoch,
				      (unsigned long long)epoch_stage_epoch(r->stage));
	uint64_t block_pages = ram_image_block(r->image, pg.block)->length / REPL_PAGE_SIZE;
	for (uint32_t i = 0; i < pg.count; i++) {
		uint64_t index = repl_pages_index(&pg, i);
		const uint8_t *data = NULL;
		int rc;

		if (index >= block_pages)
			return session_protocol_error(ss, "PAGES: page %llu is outside block %u (%llu "
					      "pages)", (unsigned long long)index, pg.block,
					      (unsigned long long)block_pages);

		if (pg.encoding != REPL_ENCODING_ZERO) {
			if (repl_pages_decode_page(&pg, i, page) < 0)
				return session_protocol_error(ss, "PAGES: page %u does not decode", i);
			data = page;
		}
		/* The bulk copy is not an epoch: nothing can fail over to it alone. */
		if (pg.epoch == 0)
			rc = ram_image_store_page(r->image, pg.block, index, data);
		else
			rc = epoch_stage_add_page(r->stage, pg.block, index, data);
		if (rc < 0)
			return session_protocol_error(ss, "PAGES: page %llu is outside block %u",
					      (unsigned long long)index, pg.block);
	}
	return 0;
}

/* ---- coded pages ----------------------------------------------------- */

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

static void forget_fixups(struct replica *r)
{
	r->fixup_count = 0;
	r->requests_outstanding = 0;
}

void replica_drop_pending(struct replica *r)
{
	forget_fixups(r);
	r->epoch_waiting = false;
	buffer_free(&r->deferred);
}

static bool page_requested(const struct replica *r, unsigned block, uint64_t index)
{
	for (size_t i = 0; i < r->fixup_count; i++)
		if (r->fixups[i].requested && r->fixups[i].block == block &&
		    r->fixups[i].index == index)
			return true;
	return false;
}

/*
 * A later record of a page decides what the epoch leaves behind, so it
 * decides what a resend of that page must hash to.
 */
static void note_last_record(struct replica *r, unsigned block, uint64_t index, uint64_t sum)
{
	for (size_t i = 0; i < r->fixup_count; i++)
		if (r->fixups[i].block == block && r->fixups[i].index == index)
			r->fixups[i].want = sum;
}

static struct page_fixup *add_fixup(struct replica *r, unsigned block, uint64_t index,
				    uint64_t checksum)
{
	if (r->fixup_count == r->fixup_cap) {
		size_t cap = r->fixup_cap ? r->fixup_cap * 2 : 16;
		struct page_fixup *grown = realloc(r->fixups, cap * sizeof(*grown));
		if (!grown)
			return NULL;
		r->fixups = grown;
		r->fixup_cap = cap;
	}
	uint8_t *slot = epoch_stage_reserve_page(r->stage, block, index);
	if (!slot)
		return NULL;
	struct page_fixup *fx = &r->fixups[r->fixup_count++];
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
	r->requests_outstanding++;
	r->coded.page_requests++;
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
		r->coded.checksum_mismatches++;
	else if (reason == REPL_REQ_UNDECODABLE)
		r->coded.undecodable++;
	else
		r->coded.disk_ref_fallbacks++;
	log_error("vm %s: epoch %llu, block %u, page %llu: %s; asking the primary for it again",
		  r->name, (unsigned long long)epoch_stage_epoch(r->stage), block,
		  (unsigned long long)cp->index, what);
	struct page_fixup *fx = add_fixup(r, block, cp->index, cp->checksum);
	if (!fx)
		return session_protocol_error(ss, "out of memory staging a page");
	return request_page(ss, r, fx, reason);
}

static int on_pages_coded(struct session *ss, struct replica *r, const struct repl_frame *f)
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
			r->coded.disk_refs++;
			continue;
		}
		default: {
			/* The committed page: the base the primary's encoder referred to. */
			const uint8_t *base = blk->mem + cp.index * REPL_PAGE_SIZE;
			if (r->decoder->decode_page(r->decoder->ctx, cp.kind, base, cp.data, cp.len,
						    page) < 0) {
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
	size_t n = r->fixup_count; /* request_page may add none, but be exact */

	for (size_t i = 0; i < n; i++) {
		struct page_fixup *fx = &r->fixups[i];
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
		r->coded.disk_ref_fallbacks++;
		log_error("vm %s: epoch %llu, block %u, page %llu at disk offset %llu: %s; asking "
			  "the primary for it again", r->name,
			  (unsigned long long)epoch_stage_epoch(r->stage), fx->block,
			  (unsigned long long)fx->index, (unsigned long long)fx->disk_offset, what);
		if (request_page(ss, r, fx, REPL_REQ_DISK_REF) < 0)
			return -1;
	}
	return 0;
}

static int commit_epoch(struct session *ss, struct replica *r, const struct repl_epoch_end *e)
{
	char err[256];

	if (e->epoch == 0) {
		if (r->bulk_done)
			return session_protocol_error(ss, "a second EPOCH_END 0");
		r->bulk_done = true;
		log_info("vm %s: bulk RAM copy received (%llu pages)", r->name,
			 (unsigned long long)e->pages);
		return 0;
	}
	if (e->epoch != epoch_stage_epoch(r->stage))
		return session_protocol_error(ss, "EPOCH_END %llu while epoch %llu is open",
				      (unsigned long long)e->epoch,
				      (unsigned long long)epoch_stage_epoch(r->stage));
	if (!epoch_stage_device_complete(r->stage))
		return session_protocol_error(ss, "epoch %llu ended with its device state incomplete",
				      (unsigned long long)e->epoch);
	replica_fork_before_commit(r);
	if (epoch_stage_commit(r->stage, r->image, r->disk_fd, err, sizeof(err)) < 0) {
		/* The replica can no longer be trusted: refuse, never take over. */
		snprintf(r->error, sizeof(r->error), "commit of epoch %llu failed: %s",
			 (unsigned long long)e->epoch, err);
		session_send_error(ss, REPL_ERR_INTERNAL, r->error);
		replica_drop_image(r);
		replica_set_state(r, REPLICA_FAILED);
		return -1;
	}
	if (replica_flows_commit(r->flows, e->epoch) < 0)
		log_error("vm %s: OUT OF MEMORY recording the flow positions of epoch %llu: a "
			  "takeover may leave some connections stalled instead of reset", r->name,
			  (unsigned long long)e->epoch);
	replica_fork_after_commit(r);
	r->committed_epoch = e->epoch;
	r->any_commit = true;
	r->epochs_committed++;
	epoch_stage_begin(r->stage, e->epoch + 1);
	if (r->state == REPLICA_RECEIVING && r->disk_synced &&
	    buffer_len(ram_image_device_blob(r->image)) > 0) {
		log_info("vm %s: replica READY at epoch %llu: a failover can resume it",
			 r->name, (unsigned long long)e->epoch);
		replica_set_state(r, REPLICA_READY);
	}
	return 0;
}

static int commit_and_ack(struct session *ss, struct replica *r, const struct repl_epoch_end *e)
{
	forget_fixups(r);
	if (commit_epoch(ss, r, e) < 0)
		return -1;
	/* Acknowledged only now: the whole epoch is committed in our memory. */
	if (repl_put_epoch_ack(repl_conn_out(ss->conn), e->epoch) < 0)
		return session_protocol_error(ss, "cannot queue EPOCH_ACK %llu (out of memory)",
				      (unsigned long long)e->epoch);
	repl_conn_flush(ss->conn);
	return 0;
}

static int on_epoch_end(struct session *ss, struct replica *r, const struct repl_frame *f)
{
	struct repl_epoch_end e;
	const char *err;

	if (repl_decode_epoch_end(f, &e, &err) < 0)
		return session_protocol_error(ss, "%s", err);
	uint64_t sum = repl_digest_value(&r->digest);
	if (e.checksum != sum || e.bytes != r->digest.bytes)
		return session_protocol_error(ss, "epoch %llu checksum mismatch (primary %016llx, "
				      "%llu bytes; received %016llx, %llu bytes): refusing it",
				      (unsigned long long)e.epoch,
				      (unsigned long long)e.checksum,
				      (unsigned long long)e.bytes, (unsigned long long)sum,
				      (unsigned long long)r->digest.bytes);
	repl_digest_reset(&r->digest);
	if (e.epoch != 0 && resolve_disk_refs(ss, r) < 0)
		return -1;
	if (r->requests_outstanding > 0) {
		/* Not a page of it may be missing when it is committed: wait. */
		r->epoch_waiting = true;
		r->waiting_end = e;
		r->coded.epochs_waited++;
		log_warn("vm %s: epoch %llu waits for %zu page(s) asked for again", r->name,
			 (unsigned long long)e.epoch, r->requests_outstanding);
		return 0;
	}
	return commit_and_ack(ss, r, &e);
}

static int defer_frame(struct session *ss, struct replica *r, const struct repl_frame *f)
{
	uint8_t header[REPL_HEADER_SIZE];

	if (buffer_len(&r->deferred) + REPL_HEADER_SIZE + f->length > REPLICA_DEFER_MAX)
		return session_protocol_error(ss, "more than %u MiB of frames arrived while epoch "
					      "%llu waited for %zu resent page(s)",
					      REPLICA_DEFER_MAX >> 20,
					      (unsigned long long)r->waiting_end.epoch,
					      r->requests_outstanding);
	repl_encode_header(header, f->type, f->length);
	if (buffer_append(&r->deferred, header, sizeof(header)) < 0 ||
	    buffer_append(&r->deferred, f->payload, f->length) < 0)
		return session_protocol_error(ss, "out of memory keeping a frame for later");
	r->coded.deferred_frames++;
	return 0;
}

/*
 * The waiting epoch is complete: commit it, acknowledge it, then handle
 * the frames that came after it, in order, until one more epoch waits.
 */
static int finish_waiting_epoch(struct session *ss, struct replica *r)
{
	struct repl_epoch_end e = r->waiting_end;
	int rc;

	r->epoch_waiting = false;
	if ((rc = commit_and_ack(ss, r, &e)) != 0)
		return rc;
	while (!r->epoch_waiting && buffer_len(&r->deferred) > 0) {
		struct repl_frame f;
		const char *err;
		ssize_t n = repl_frame_parse(buffer_head(&r->deferred), buffer_len(&r->deferred),
					     &f, &err);
		if (n <= 0)
			return session_protocol_error(ss, "a kept frame does not parse");
		/* Consumed first; nothing is appended while it is handled (no epoch waits). */
		buffer_consume(&r->deferred, (size_t)n);
		if ((rc = replica_on_frame(ss, &f)) != 0)
			return rc;
	}
	return 0;
}

static int on_page_resend(struct session *ss, struct replica *r, const struct repl_frame *f)
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
	for (size_t i = 0; i < r->fixup_count; i++) {
		struct page_fixup *fx = &r->fixups[i];
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
	r->coded.page_resends++;
	r->requests_outstanding--;
	log_info("vm %s: page %llu of block %u of epoch %llu resent and verified", r->name,
		 (unsigned long long)rs.index, rs.block, (unsigned long long)rs.epoch);
	if (r->epoch_waiting && r->requests_outstanding == 0)
		return finish_waiting_epoch(ss, r);
	return 0;
}

/*
 * A device blob coded against the one this replica committed last.  The
 * primary codes epochs in order and this replica commits epoch N before
 * it reads N+1's frames, so the bases agree by construction; the two
 * checksums turn any disagreement (a bug) into a loud protocol error
 * that ends the link, never into a wrong device state.
 */
static int on_device_delta(struct session *ss, struct replica *r, const struct repl_frame *f)
{
	struct repl_device_delta d;
	const char *err;

	if (repl_decode_device_delta(f, &d, &err) < 0)
		return session_protocol_error(ss, "%s", err);
	if (d.epoch != epoch_stage_epoch(r->stage))
		return session_protocol_error(ss, "DEVICE_DELTA of epoch %llu while %llu is open",
					      (unsigned long long)d.epoch,
					      (unsigned long long)epoch_stage_epoch(r->stage));
	if (!r->image)
		return session_protocol_error(ss, "DEVICE_DELTA before RAM_LAYOUT");
	if (d.total > DEVICE_DELTA_MAX_BLOB)
		return session_protocol_error(ss, "DEVICE_DELTA of a %llu-byte blob (at most %u)",
					      (unsigned long long)d.total, DEVICE_DELTA_MAX_BLOB);
	const struct buffer *base = ram_image_device_blob(r->image);
	if (d.base_len != buffer_len(base) ||
	    d.base_sum != XXH3_64bits(buffer_head(base), buffer_len(base)))
		return session_protocol_error(ss, "DEVICE_DELTA of epoch %llu is coded against a "
					      "device blob this replica does not have (%llu bytes, "
					      "it has %zu): DEVICE STATE DIVERGED",
					      (unsigned long long)d.epoch,
					      (unsigned long long)d.base_len, buffer_len(base));
	uint8_t *blob = malloc((size_t)d.total);
	if (!blob)
		return session_protocol_error(ss, "out of memory decoding device state");
	int rc = 0;
	if (device_delta_decode(d.records, d.records_len, buffer_head(base), buffer_len(base),
				blob, (size_t)d.total, &err) < 0)
		rc = session_protocol_error(ss, "DEVICE_DELTA of epoch %llu: %s",
					    (unsigned long long)d.epoch, err);
	else if (XXH3_64bits(blob, (size_t)d.total) != d.sum)
		rc = session_protocol_error(ss, "DEVICE_DELTA of epoch %llu decodes to a blob whose "
					    "checksum differs: DEVICE STATE DIVERGED",
					    (unsigned long long)d.epoch);
	else if (epoch_stage_add_device_chunk(r->stage, d.total, 0, blob, (size_t)d.total) < 0)
		rc = session_protocol_error(ss, "DEVICE_DELTA: %s", epoch_stage_error(r->stage));
	else
		r->coded.device_deltas++;
	free(blob);
	return rc;
}

int replica_on_frame(struct session *ss, const struct repl_frame *f)
{
	struct replica *r = ss->replica;
	const char *err;

	/*
	 * While an epoch waits for resent pages, everything but the frames
	 * that concern the link itself waits too, in order.
	 */
	if (r->epoch_waiting && f->type != REPL_HEARTBEAT && f->type != REPL_BYE &&
	    f->type != REPL_PAGE_RESEND && f->type != REPL_FLOW_AHEAD)
		return defer_frame(ss, r, f);
	if (repl_type_is_covered(f->type)) {
		uint8_t header[REPL_HEADER_SIZE];
		repl_encode_header(header, f->type, f->length);
		repl_digest_add(&r->digest, header, f->payload, f->length);
	}
	if (r->disk_fd < 0 && (f->type == REPL_DISK_WRITE || f->type == REPL_DISK_ZERO ||
			       f->type == REPL_DISK_SYNC || f->type == REPL_DISK_SYNC_DONE ||
			       f->type == REPL_EPOCH_END))
		return session_protocol_error(ss, "%s before DISK_BASE", repl_type_name(f->type));
	switch (f->type) {
	case REPL_RAM_LAYOUT: {
		struct repl_ram_layout l;
		const char *names[REPL_MAX_BLOCKS];
		uint64_t lengths[REPL_MAX_BLOCKS];
		char e2[256];

		if (repl_decode_ram_layout(f, &l, &err) < 0)
			return session_protocol_error(ss, "%s", err);
		if (r->image)
			return session_protocol_error(ss, "a second RAM_LAYOUT");
		for (unsigned i = 0; i < l.block_count; i++) {
			names[i] = l.blocks[i].name;
			lengths[i] = l.blocks[i].length;
		}
		r->image = ram_image_create(l.machine_type, l.ram_section_id, names, lengths,
					    l.block_count, e2, sizeof(e2));
		if (!r->image)
			return session_protocol_error(ss, "RAM_LAYOUT: %s", e2);
		return 0;
	}
	case REPL_PAGES:
		return on_pages(ss, r, f);
	case REPL_PAGES_CODED:
		return on_pages_coded(ss, r, f);
	case REPL_PAGE_RESEND:
		return on_page_resend(ss, r, f);
	case REPL_DEVICE: {
		struct repl_device d;
		if (repl_decode_device(f, &d, &err) < 0)
			return session_protocol_error(ss, "%s", err);
		if (d.epoch != epoch_stage_epoch(r->stage))
			return session_protocol_error(ss, "DEVICE of epoch %llu while %llu is open",
					      (unsigned long long)d.epoch,
					      (unsigned long long)epoch_stage_epoch(r->stage));
		if (epoch_stage_add_device_chunk(r->stage, d.total, d.offset, d.data, d.len) < 0)
			return session_protocol_error(ss, "DEVICE: %s", epoch_stage_error(r->stage));
		return 0;
	}
	case REPL_DEVICE_DELTA:
		return on_device_delta(ss, r, f);
	case REPL_DISK_BASE:
		return replica_on_disk_base(ss, r, f);
	case REPL_DISK_WRITE: {
		struct repl_disk_write w;
		if (repl_decode_disk_write(f, &w, &err) < 0)
			return session_protocol_error(ss, "%s", err);
		if (w.epoch != epoch_stage_epoch(r->stage) || w.offset + w.len > r->disk_size)
			return session_protocol_error(ss, "DISK_WRITE of epoch %llu at %llu (+%zu) does "
					      "not fit", (unsigned long long)w.epoch,
					      (unsigned long long)w.offset, w.len);
		return epoch_stage_add_disk_write(r->stage, w.offset, w.data, w.len) < 0 ?
		       session_protocol_error(ss, "out of memory staging a disk write") : 0;
	}
	case REPL_DISK_ZERO: {
		struct repl_disk_zero z;
		if (repl_decode_disk_zero(f, &z, &err) < 0)
			return session_protocol_error(ss, "%s", err);
		if (z.epoch != epoch_stage_epoch(r->stage) || z.offset + z.length > r->disk_size)
			return session_protocol_error(ss, "DISK_ZERO does not fit");
		return epoch_stage_add_disk_zero(r->stage, z.offset, z.length) < 0 ?
		       session_protocol_error(ss, "out of memory") : 0;
	}
	case REPL_DISK_SYNC: {
		struct repl_disk_sync d;
		if (repl_decode_disk_sync(f, &d, &err) < 0)
			return session_protocol_error(ss, "%s", err);
		if (d.offset + d.len > r->disk_size)
			return session_protocol_error(ss, "DISK_SYNC beyond the disk's end");
		/* The copy is applied at once: no failover before it is complete. */
		if (pwrite_all(r->disk_fd, d.data, d.len, d.offset) < 0)
			return session_protocol_error(ss, "writing the disk replica: %s", strerror(errno));
		/*
		 * Start writeback now, without waiting for it.  Otherwise the
		 * whole copy (hundreds of MiB) sits dirty in the page cache
		 * until the takeover's fdatasync, which then costs more than a
		 * second of downtime.  Advisory: an error here only means the
		 * kernel flushes later, so it is not a protocol error.
		 */
		(void)sync_file_range(r->disk_fd, (off_t)d.offset, (off_t)d.len,
				      SYNC_FILE_RANGE_WRITE);
		return 0;
	}
	case REPL_DISK_SYNC_DONE: {
		uint64_t size;
		if (repl_decode_disk_sync_done(f, &size, &err) < 0)
			return session_protocol_error(ss, "%s", err);
		if (size != r->disk_size)
			return session_protocol_error(ss, "disk size changed during the copy");
		r->disk_synced = true;
		log_info("vm %s: disk copy received", r->name);
		return 0;
	}
	case REPL_EPOCH_END:
		return on_epoch_end(ss, r, f);
	case REPL_FLOW_STATE: {
		struct repl_flow_state fs;
		if (repl_decode_flow_state(f, &fs, &err) < 0)
			return session_protocol_error(ss, "%s", err);
		if (fs.epoch != epoch_stage_epoch(r->stage))
			return session_protocol_error(ss, "FLOW_STATE of epoch %llu while epoch "
						      "%llu is open", (unsigned long long)fs.epoch,
						      (unsigned long long)epoch_stage_epoch(r->stage));
		return replica_flows_stage(r->flows, &fs) < 0 ?
		       session_protocol_error(ss, "FLOW_STATE: out of memory") : 0;
	}
	case REPL_FLOW_AHEAD: {
		struct repl_flow_ahead a;
		if (repl_decode_flow_ahead(f, &a, &err) < 0)
			return session_protocol_error(ss, "%s", err);
		return replica_flows_ahead(r->flows, &a) < 0 ?
		       session_protocol_error(ss, "FLOW_AHEAD: out of memory") : 0;
	}
	case REPL_HEARTBEAT:
		return 0;
	case REPL_BYE: {
		struct repl_bye b;
		if (repl_decode_bye(f, &b, &err) < 0)
			return session_protocol_error(ss, "%s", err);
		if (b.reason == REPL_BYE_TAKEOVER && r->state == REPLICA_READY) {
			char why[300];
			snprintf(why, sizeof(why), "the primary asks for a takeover: %.*s",
				 (int)b.text_len, b.text);
			session_lost(ss, why, true);
			return 1; /* ss is gone */
		}
		log_info("vm %s: the primary ended protection (%.*s): replica discarded",
			 r->name, (int)b.text_len, b.text);
		r->error[0] = '\0';
		session_lost(ss, "the primary ended protection", false);
		return 1;
	}
	default:
		return session_protocol_error(ss, "unexpected %s", repl_type_name(f->type));
	}
}

