/*
 * The backup's side of one replication stream, once the primary is
 * authenticated: VM_CONFIG creates the replica (replica.c), then RAM
 * layout, pages, device state and disk frames are staged, and each
 * EPOCH_END is checked against its digest, committed in one call and
 * acknowledged.  replication_server.c owns the connection and hands every
 * frame of a configured session here.
 *
 * Coded pages (PAGES_CODED) and the pages asked for again go to
 * coded_pages.c; an epoch that waits for them is committed here when
 * they are in, and the frames kept behind it are handled then, in order.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "codec/device_delta.h"
#include "base/fs_util.h"
#include "base/log.h"
#include "backup/failover_qemu.h"
#include "backup/replica_memory.h"
#include "backup/replication_internal.h"

/* base_path: a disk already here (absorbed from a stopped VM), or "" for the default file. */
static struct replica *create_for_session(struct session *ss, struct vm_config *config,
					  const char *base_path, char *err, size_t errlen)
{
	struct replication_server *s = ss->server;

	return replica_create(s->loop, s->settings, s->vms, s->decoder, ss->peer, config,
			      base_path, err, errlen);
}

int replica_stream_init(struct replica *r)
{
	return repl_digest_init(&r->stream.digest);
}

void replica_stream_free(struct replica *r)
{
	repl_digest_free(&r->stream.digest);
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
	struct replica *old = replica_set_find(&ss->server->replicas, name);
	struct vm *here = vm_find(ss->server->vms, name);
	char base_path[PATH_MAX] = "";
	const char *busy = NULL;
	if (old && old->session)
		busy = "is already being replicated here";
	else if (old && (old->state == REPLICA_ARBITRATING ||
			 old->state == REPLICA_FAILING_OVER))
		busy = "is being taken over by this host";
	else if (here && !vm_qemu_gone_now(here))
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
		replica_set_remove(&ss->server->replicas, old);
		replica_free(old);
	}
	struct replica *r = create_for_session(ss, &config, base_path, err, sizeof(err));
	if (!r) {
		session_send_error(ss, REPL_ERR_INTERNAL, err);
		return -1;
	}
	r->session = ss;
	ss->replica = r;
	ss->state = SESSION_CONFIGURED;
	replica_set_add(&ss->server->replicas, r);
	log_info("vm %s: replicating from %s (%s); disk replica %s, %.1f MiB",
		 r->name, ss->handshake.peer_name, ss->peer, r->disk_path,
		 (double)r->disk_size / (1 << 20));
	return 0;
}

/* ---- memory admission ---------------------------------------------------- */

/*
 * Before the image is made: a replica this backup cannot hold beside the
 * others is refused now, in one line, rather than found by the OOM killer
 * mid-takeover.  Refused, not a protocol error: the primary does not
 * retry it by itself (primary/reprotect_policy.c).
 */
static int admit_memory(struct session *ss, struct replica *r, uint64_t ram_bytes)
{
	const struct repl_settings *s = r->settings;
	char unused[200];
	bool maps = s->restore_shared && !s->restore_lazy &&
		    failover_qemu_can_share_ram(&r->config, unused, sizeof(unused));
	struct admitted_memory others = replication_server_admitted(ss->server, r);
	uint64_t left = s->memory_limit > others.total ? s->memory_limit - others.total : 0;

	replica_memory_need(ram_bytes, maps, &r->memory);
	if (replica_memory_admit(r->name, &r->memory, s->memory_limit, others.total,
				 others.replicas, r->error, sizeof(r->error)) == 0) {
		log_info("vm %s: replica admitted: %.2f GiB of memory (%.2f GiB of %.2f left "
			 "before it)", r->name,
			 (double)replica_memory_total(&r->memory) / (1ULL << 30),
			 (double)left / (1ULL << 30), (double)s->memory_limit / (1ULL << 30));
		return 0;
	}
	memset(&r->memory, 0, sizeof(r->memory));
	log_error("vm %s: %s", r->name, r->error);
	session_send_error(ss, REPL_ERR_REFUSED, r->error);
	return -1;
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
	if (pg.epoch == 0 && r->stream.bulk_done)
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

static int commit_epoch(struct session *ss, struct replica *r, const struct repl_epoch_end *e)
{
	char err[256];

	if (e->epoch == 0) {
		if (r->stream.bulk_done)
			return session_protocol_error(ss, "a second EPOCH_END 0");
		r->stream.bulk_done = true;
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
	if (cp_flow_positions_commit(r->flows, e->epoch) < 0)
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
	coded_pages_forget(r);
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
	uint64_t sum = repl_digest_value(&r->stream.digest);
	if (e.checksum != sum || e.bytes != r->stream.digest.bytes)
		return session_protocol_error(ss, "epoch %llu checksum mismatch (primary %016llx, "
				      "%llu bytes; received %016llx, %llu bytes): refusing it",
				      (unsigned long long)e.epoch,
				      (unsigned long long)e.checksum,
				      (unsigned long long)e.bytes, (unsigned long long)sum,
				      (unsigned long long)r->stream.digest.bytes);
	repl_digest_reset(&r->stream.digest);
	int wait = coded_pages_at_epoch_end(ss, r, &e);
	if (wait != 0)
		return wait < 0 ? -1 : 0;
	return commit_and_ack(ss, r, &e);
}

/*
 * The waiting epoch is complete: commit it, acknowledge it, then handle
 * the frames that came after it, in order, until one more epoch waits.
 */
static int finish_waiting_epoch(struct session *ss, struct replica *r)
{
	struct repl_epoch_end e = coded_pages_end_wait(r);
	struct repl_frame f;
	int rc;

	if ((rc = commit_and_ack(ss, r, &e)) != 0)
		return rc;
	while (!coded_pages_waiting(r) && (rc = coded_pages_next_deferred(ss, r, &f)) != 0) {
		if (rc < 0)
			return rc;
		if ((rc = replica_on_frame(ss, &f)) != 0)
			return rc;
	}
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
		coded_pages_count_device_delta(r);
	free(blob);
	return rc;
}

int replica_on_frame(struct session *ss, const struct repl_frame *f)
{
	struct replica *r = ss->replica;
	const char *err;

	if (coded_pages_defers(r, f->type))
		return coded_pages_defer(ss, r, f);
	if (repl_type_is_covered(f->type)) {
		uint8_t header[REPL_HEADER_SIZE];
		repl_encode_header(header, f->type, f->length);
		repl_digest_add(&r->stream.digest, header, f->payload, f->length);
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
		uint64_t ram_bytes = 0;
		for (unsigned i = 0; i < l.block_count; i++) {
			names[i] = l.blocks[i].name;
			lengths[i] = l.blocks[i].length;
			ram_bytes = replica_memory_add(ram_bytes, l.blocks[i].length);
		}
		if (admit_memory(ss, r, ram_bytes) < 0)
			return -1;
		r->image = ram_image_create(l.machine_type, l.ram_section_id, names, lengths,
					    l.block_count, e2, sizeof(e2));
		if (!r->image)
			return session_protocol_error(ss, "RAM_LAYOUT: %s", e2);
		return 0;
	}
	case REPL_PAGES:
		return on_pages(ss, r, f);
	case REPL_PAGES_CODED:
		return coded_pages_on_frame(ss, r, f);
	case REPL_PAGE_RESEND: {
		int complete = coded_pages_on_resend(ss, r, f);
		return complete > 0 ? finish_waiting_epoch(ss, r) : complete;
	}
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
		struct cp_flow_msg_state fs;
		if (cp_flow_msg_decode_state(f, &fs, &err) < 0)
			return session_protocol_error(ss, "%s", err);
		if (fs.epoch != epoch_stage_epoch(r->stage))
			return session_protocol_error(ss, "FLOW_STATE of epoch %llu while epoch "
						      "%llu is open", (unsigned long long)fs.epoch,
						      (unsigned long long)epoch_stage_epoch(r->stage));
		return cp_flow_positions_stage(r->flows, &fs) < 0 ?
		       session_protocol_error(ss, "FLOW_STATE: out of memory") : 0;
	}
	case REPL_FLOW_AHEAD: {
		struct cp_flow_msg_ahead a;
		if (cp_flow_msg_decode_ahead(f, &a, &err) < 0)
			return session_protocol_error(ss, "%s", err);
		return cp_flow_positions_ahead(r->flows, &a) < 0 ?
		       session_protocol_error(ss, "FLOW_AHEAD: out of memory") : 0;
	}
	case REPL_HEARTBEAT:
		return 0;
	/* BYE does not come here: it ends the session (replication_server.c). */
	default:
		return session_protocol_error(ss, "unexpected %s", repl_type_name(f->type));
	}
}

