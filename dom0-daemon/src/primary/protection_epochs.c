/*
 * The primary's replication stream once the backup is authenticated:
 * QEMU's checkpoints (checkpoint_source.h) become epochs, their pages
 * copied in the pause and coded after it (checkpoint_pipeline.h), put on the
 * wire in epoch order with the disk copy and write mirror (disk_copy.h)
 * by the sequencer (checkpoint_sequencer.h), and each epoch's acknowledgement
 * releases its held output (output_commit.h) and its kept raw pages.
 */
#include <stdio.h>
#include <string.h>

#include "codec/asc_encoder.h"
#include "base/log.h"
#include "relay/net_relay.h"
#include "primary/protection_internal.h"
#include "qemu/qmp.h"
#include "vm/vm.h"

static struct buffer *out(struct protection *p)
{
	return repl_conn_out(protection_conn(p));
}

/* Replicating with a live connection: the pipeline and sequencer exist. */
static bool streaming(const struct protection *p)
{
	return protection_conn(p) && p->epochs.seq && p->epochs.pipeline &&
	       (p->state == ST_SYNCING || p->state == ST_PROTECTED);
}

/*
 * Epochs checkpointed and not acknowledged: those still being coded count
 * as well as those on the wire, so that a slow encoder holds the next
 * checkpoint back exactly like a slow backup does.
 */
static uint64_t in_flight(const struct protection *p)
{
	const struct protection_epochs *e = &p->epochs;
	uint64_t newest = e->checkpointed_epoch > e->last_epoch ? e->checkpointed_epoch
							       : e->last_epoch;

	return newest - e->acked_epoch;
}

static bool may_checkpoint(void *opaque)
{
	struct protection *p = opaque;
	bool ok = (p->state == ST_SYNCING || p->state == ST_PROTECTED) &&
		  in_flight(p) < p->settings->max_inflight;

	if (!ok && !p->epochs.request_held) {
		protection_stats_backpressure(p);
		if (p->state == ST_SYNCING || p->state == ST_PROTECTED)
			log_warn("vm %s: backpressure: %llu epochs in flight to the "
				 "backup (%u still being coded); the next checkpoint waits",
				 p->name, (unsigned long long)in_flight(p),
				 p->epochs.pipeline ?
				 checkpoint_pipeline_encoding(p->epochs.pipeline) : 0);
	}
	p->epochs.request_held = !ok;
	if (ok) /* our reply stops the guest: the pause begins */
		protection_pause_begins(p);
	return ok;
}

/* ---- the sequencer's side: the connection --------------------------------- */

static struct buffer *seq_wire(void *opaque)
{
	return out(opaque);
}

static void seq_flush(void *opaque)
{
	struct protection *p = opaque;

	repl_conn_flush(protection_conn(p));
}

static void seq_epoch_end(void *opaque, const struct repl_epoch_end *e)
{
	struct protection *p = opaque;

	if (e->epoch > 0)
		protection_stats_epoch_sent(p, e->bytes);
	p->epochs.last_epoch = e->epoch;
}

/* Appends frames of `epoch` where the sequencer says; -1 after ending the link. */
#define SEQ_PUT(p, epoch, call, what)                                                \
	({                                                                           \
		struct buffer *b_ = checkpoint_sequencer_buffer((p)->epochs.seq, (epoch));       \
		size_t before_ = b_ ? buffer_len(b_) : 0;                            \
		int rc_ = !b_ || (call) < 0 ||                                       \
			  checkpoint_sequencer_appended((p)->epochs.seq, (epoch), before_) < 0   \
			  ? -1 : 0;                                                  \
		if (rc_ < 0)                                                         \
			protection_backup_lost((p), "cannot queue " what);           \
		rc_;                                                                 \
	})

/* ---- commit protection's flow positions (cp_flow_msg.h) -------------------- */

/* At the cut of `epoch`, before it closes: its FLOW_STATE is part of it. */
static int flow_state_to_backup(void *opaque, uint64_t epoch, const struct cp_flow_msg_record *r,
				uint32_t count)
{
	struct protection *p = opaque;

	if (!streaming(p))
		return 0;
	return SEQ_PUT(p, epoch, cp_flow_msg_put_state(b_, epoch, r, count), "FLOW_STATE");
}

/*
 * Straight onto the connection, ahead of epochs still in outboxes: the
 * backup acts on it at once.  It can still be queued behind bytes the
 * socket has not sent when the host dies; docs/architecture.md says what
 * covers that case.
 */
static void flow_ahead_to_backup(void *opaque, const struct cp_flow_msg_ahead *a)
{
	struct protection *p = opaque;

	if (!streaming(p))
		return;
	if (cp_flow_msg_put_ahead(out(p), a) < 0) {
		protection_backup_lost(p, "cannot queue FLOW_AHEAD (out of memory)");
		return;
	}
	repl_conn_flush(protection_conn(p));
}

/* ---- checkpoints ---------------------------------------------------------- */

static void on_ram_layout(void *opaque, const char *machine_type, uint32_t section_id,
			  const struct colo_ram_block *blocks, size_t count)
{
	struct protection *p = opaque;
	struct repl_ram_layout l;

	if (!streaming(p))
		return;
	memset(&l, 0, sizeof(l));
	l.ram_section_id = section_id;
	snprintf(l.machine_type, sizeof(l.machine_type), "%s", machine_type);
	l.block_count = (uint16_t)count;
	uint64_t guest_ram = 0;
	for (size_t i = 0; i < count; i++)
		guest_ram += blocks[i].length;
	if (protection_coding_set_guest_ram(p, guest_ram) < 0) {
		protection_fail(p, "no memory for the compression cache (a tenth of %.0f MiB; "
				"see --compress-cache-mb)", (double)guest_ram / (1 << 20));
		return;
	}
	for (size_t i = 0; i < count && i < REPL_MAX_BLOCKS; i++) {
		snprintf(l.blocks[i].name, sizeof(l.blocks[i].name), "%s", blocks[i].name);
		l.blocks[i].length = blocks[i].length;
	}
	const char *names[REPL_MAX_BLOCKS];
	uint64_t lengths[REPL_MAX_BLOCKS];
	for (size_t i = 0; i < count && i < REPL_MAX_BLOCKS; i++) {
		names[i] = blocks[i].name;
		lengths[i] = blocks[i].length;
	}
	protection_stats_layout(p, names, lengths,
				count < REPL_MAX_BLOCKS ? count : REPL_MAX_BLOCKS);
	SEQ_PUT(p, 0, repl_put_ram_layout(b_, &l), "the RAM layout");
}

/*
 * The bulk copy (epoch 0) is still sent as plain PAGES, straight from the
 * parser: it is streamed under flow control (the source pauses above
 * BULK_HIGH_WATER), which a job holding the whole of RAM before coding
 * could not be, and with nothing sent before there is nothing to code a
 * delta against.  Checkpoint pages are only copied here, inside the pause;
 * the worker codes them once the VM runs again.
 */
static void on_page(void *opaque, uint64_t epoch, unsigned block, uint64_t page_index,
		    const uint8_t *data)
{
	struct protection *p = opaque;

	if (!streaming(p))
		return;
	if (epoch > 0) {
		protection_stats_page(p, block, page_index, !data);
		if (checkpoint_pipeline_add_page(p->epochs.pipeline, block, page_index, data) < 0)
			protection_backup_lost(p, "cannot stage a checkpoint page (out of memory)");
		return;
	}
	if (SEQ_PUT(p, 0, repl_put_pages(b_, 0, (uint16_t)block,
					 data ? REPL_ENCODING_RAW : REPL_ENCODING_ZERO, 1,
					 &page_index, data, data ? REPL_PAGE_SIZE : 0),
		    "pages (out of memory)") < 0)
		return;
	p->epochs.epoch_pages++;
	if (repl_conn_backlog(protection_conn(p)) > BULK_HIGH_WATER)
		checkpoint_source_set_bulk_paused(p->source, true);
}

static void on_bulk_done(void *opaque)
{
	struct protection *p = opaque;

	if (!streaming(p))
		return;
	if (checkpoint_sequencer_end(p->epochs.seq, 0, NULL, 0, p->epochs.epoch_pages) < 0) {
		protection_backup_lost(p, "cannot queue the EPOCH_END of the bulk copy");
		return;
	}
	p->epochs.epoch_pages = 0;
	p->epochs.bulk_sent = true;
	log_info("vm %s: bulk RAM copy queued (%.1f MiB sent so far)", p->name,
		 (double)repl_conn_bytes_sent(protection_conn(p)) / (1 << 20));
}

static void on_checkpoint_begin(void *opaque, uint64_t epoch)
{
	struct protection *p = opaque;

	/* The cut: frames and writes from now on belong to the next epoch. */
	output_commit_cut(p->oc, epoch);
	if (epoch == 1 && p->output_commit && vm_nic(p->vm))
		net_relay_set_output_hook(vm_nic(p->vm), output_commit_hold, p->oc);
	if (!streaming(p))
		return;
	if (checkpoint_sequencer_cut(p->epochs.seq, epoch) < 0 ||
	    checkpoint_pipeline_open(p->epochs.pipeline, epoch) < 0)
		protection_backup_lost(p, "cannot open the checkpoint's epoch (out of memory)");
}

static void on_device_chunk(void *opaque, uint64_t epoch, uint64_t total, uint64_t offset,
			    const uint8_t *d, size_t n)
{
	struct protection *p = opaque;

	if (!streaming(p))
		return;
	if (checkpoint_pipeline_add_device(p->epochs.pipeline, total, offset, d, n) < 0)
		protection_backup_lost(p, "cannot stage device state (out of memory)");
}

static void on_checkpoint_end(void *opaque, const struct checkpoint_stats *st)
{
	struct protection *p = opaque;

	protection_pause_loaded(p, st);
	protection_hold_checkpoint_ended(p, st->epoch);
	if (!streaming(p))
		return;
	p->epochs.checkpointed_epoch = st->epoch;
	protection_stats_checkpoint(p, st);
	if (protection_switchover_checkpoint_ended(p, st->epoch))
		return; /* the switchover's negative control: this epoch never leaves */
	/* The VM runs again: only now does the coding start. */
	if (checkpoint_pipeline_submit(p->epochs.pipeline) < 0)
		protection_backup_lost(p, "a checkpoint ended without its epoch open");
}

/* On the loop, in epoch order: the worker coded an epoch. */
static void on_encoded(void *opaque, struct checkpoint_job *job)
{
	struct protection *p = opaque;
	const struct checkpoint_job_stats *st = checkpoint_job_stats(job);
	const char *err = checkpoint_job_error(job);
	char why[200];
	size_t len;
	const uint8_t *frames = checkpoint_job_frames(job, &len);

	if (!streaming(p))
		return;
	if (err) {
		snprintf(why, sizeof(why), "cannot code epoch %llu: %s",
			 (unsigned long long)checkpoint_job_epoch(job), err);
		protection_backup_lost(p, why);
		return;
	}
	if (checkpoint_sequencer_end(p->epochs.seq, checkpoint_job_epoch(job), frames, len,
				     st->pages) < 0) {
		protection_backup_lost(p, "cannot queue a coded epoch (out of memory)");
		return;
	}
	protection_stats_encoded(p, st);
}

static void on_source_failed(void *opaque, const char *why)
{
	struct protection *p = opaque;

	/*
	 * QEMU's stream broke: most likely QEMU itself died.  The backup
	 * must decide (BYE "takeover"), not us: arbitrating here could keep a
	 * dead VM "running unprotected" while a good replica waits.
	 */
	log_error("vm %s: checkpoint stream failed: %s", p->name, why);
	if (protection_conn(p) && (p->state == ST_SYNCING || p->state == ST_PROTECTED)) {
		if (repl_put_bye(out(p), REPL_BYE_TAKEOVER, why) < 0)
			log_error("vm %s: cannot queue BYE takeover (out of memory): the "
				  "backup learns of it from the closed connection", p->name);
		repl_conn_flush(protection_conn(p));
	}
	protection_stop_io(p);
	protection_hold_end(p, false); /* the stream is dead: nothing to release */
	if (p->source) {
		checkpoint_source_destroy(p->source);
		p->source = NULL;
		protection_pause_stop(p);
	}
	snprintf(p->error, sizeof(p->error), "checkpoint stream failed: %s", why);
	output_commit_drop_all(p->oc);
	protection_set_state(p, ST_FAILED);
	/* The connection goes once the BYE is out (on_drained) or on close. */
}

void protection_on_ack(struct protection *p, uint64_t epoch)
{
	if (epoch > p->epochs.last_epoch || (p->epochs.any_ack && epoch <= p->epochs.acked_epoch)) {
		protection_backup_lost(p, "the backup acknowledged an epoch out of order");
		return;
	}
	p->epochs.acked_epoch = epoch;
	p->epochs.any_ack = true;
	if (p->epochs.pipeline)
		/* no PAGE_REQUEST can come for it now */
		checkpoint_pipeline_acked(p->epochs.pipeline, epoch);
	p->epochs.last_ack_us = monotonic_us();
	output_commit_ack(p->oc, epoch);
	protection_switchover_acked(p, epoch);
	bool now_protected = p->state == ST_SYNCING && disk_copy_done(p->disk) &&
			     epoch >= p->epochs.sync_done_epoch;
	if (now_protected) {
		log_info("vm %s: PROTECTED by %s (epoch %llu acknowledged, %u ms epochs)",
			 p->name, p->backup, (unsigned long long)epoch, p->interval_ms);
		protection_set_state(p, ST_PROTECTED);
	}
	protection_disk_base_acked(p, epoch, now_protected);
	if (p->epochs.request_held && p->source)
		checkpoint_source_kick(p->source);
}

void protection_resume_bulk(struct protection *p)
{
	if (p->source && !p->epochs.bulk_sent && protection_conn(p) &&
	    repl_conn_backlog(protection_conn(p)) < BULK_LOW_WATER)
		checkpoint_source_set_bulk_paused(p->source, false);
}

/*
 * The backup could not reproduce a page of an epoch it has not
 * acknowledged: send the raw page, kept since the pause.  Out of band (no
 * epoch digest covers it): the backup checks it against the checksum the
 * coded record carried.
 */
int protection_on_page_request(struct protection *p, const struct repl_frame *f)
{
	struct repl_page_request rq;
	const char *err;
	const uint8_t *page;
	static const uint8_t zeros[REPL_PAGE_SIZE];
	char why[300];

	if (repl_decode_page_request(f, &rq, &err) < 0) {
		protection_backup_lost(p, err);
		return -1;
	}
	if (!p->epochs.pipeline ||
	    checkpoint_pipeline_find_page(p->epochs.pipeline, rq.epoch, rq.block, rq.index,
					  &page) != 1) {
		snprintf(why, sizeof(why), "the backup asked again for page %llu of block %u of "
			 "epoch %llu, which is not held (acknowledged, never sent, or not in "
			 "that epoch): protocol error", (unsigned long long)rq.index, rq.block,
			 (unsigned long long)rq.epoch);
		protection_backup_lost(p, why);
		return -1;
	}
	protection_stats_page_request(p);
	log_warn("vm %s: the backup asks again for page %llu of block %u of epoch %llu "
		 "(reason %u)", p->name, (unsigned long long)rq.index, rq.block,
		 (unsigned long long)rq.epoch, rq.reason);
	if (repl_put_page_resend(out(p), rq.epoch, rq.block, rq.index, page ? page : zeros) < 0) {
		protection_backup_lost(p, "cannot queue a PAGE_RESEND (out of memory)");
		return -1;
	}
	protection_stats_page_resent(p);
	repl_conn_flush(protection_conn(p));
	return 0;
}

void protection_stop_pipeline(struct protection *p)
{
	checkpoint_pipeline_destroy(p->epochs.pipeline);
	p->epochs.pipeline = NULL;
	checkpoint_sequencer_destroy(p->epochs.seq);
	p->epochs.seq = NULL;
}

/* ---- the disk -------------------------------------------------------- */

static uint64_t open_epoch(void *opaque)
{
	struct protection *p = opaque;

	return output_commit_open_epoch(p->oc);
}

static void on_disk_copied(void *opaque)
{
	struct protection *p = opaque;

	p->epochs.sync_done_epoch = output_commit_open_epoch(p->oc);
	/* From that epoch on the backup's disk holds every block a reference can name. */
	protection_coding_allow_disk_refs_from(p, p->epochs.sync_done_epoch);
	log_info("vm %s: disk copy queued (%.1f MiB of data); protected once epoch %llu "
		 "is acknowledged", p->name, (double)disk_copy_bytes(p->disk) / (1 << 20),
		 (unsigned long long)p->epochs.sync_done_epoch);
}

static void on_disk_failed(void *opaque, enum disk_copy_fault fault, const char *why)
{
	struct protection *p = opaque;

	if (fault == DISK_COPY_READ_FAILED)
		protection_fail(p, "%s", why);
	else
		protection_backup_lost(p, why);
}

static struct buffer *sink_buffer(void *opaque, uint64_t epoch)
{
	struct protection *p = opaque;

	return p->epochs.seq && protection_conn(p) ?
	       checkpoint_sequencer_buffer(p->epochs.seq, epoch) : NULL;
}

static int sink_appended(void *opaque, uint64_t epoch, size_t before)
{
	struct protection *p = opaque;

	return p->epochs.seq ? checkpoint_sequencer_appended(p->epochs.seq, epoch, before) : -1;
}

/* The connection's queue and the outboxes: both are bytes not yet sent. */
static size_t sink_backlog(void *opaque)
{
	struct protection *p = opaque;

	return (protection_conn(p) ? repl_conn_backlog(protection_conn(p)) : 0) +
	       (p->epochs.seq ? checkpoint_sequencer_held(p->epochs.seq) : 0);
}

struct disk_copy_events protection_disk_events(struct protection *p)
{
	struct disk_copy_events ev = {
		.opaque = p, .open_epoch = open_epoch, .on_copied = on_disk_copied,
		.on_failed = on_disk_failed,
	};

	return ev;
}

void protection_start_replication(struct protection *p)
{
	struct checkpoint_source_events ev = {
		.opaque = p,
		.on_ram_layout = on_ram_layout,
		.on_page = on_page,
		.on_bulk_done = on_bulk_done,
		.on_checkpoint_begin = on_checkpoint_begin,
		.on_device_chunk = on_device_chunk,
		.on_checkpoint_end = on_checkpoint_end,
		.on_failed = on_source_failed,
		.may_checkpoint = may_checkpoint,
	};
	char path[VM_SOCKET_PATH_MAX + 32];
	char err[256];
	const char *slash = strrchr(vm_def(p->vm)->qmp_socket, '/');

	/* The migration socket sits beside the VM's other sockets. */
	snprintf(path, sizeof(path), "%.*s/migrate.sock",
		 slash ? (int)(slash - vm_def(p->vm)->qmp_socket) : 1,
		 slash ? vm_def(p->vm)->qmp_socket : ".");
	struct checkpoint_source_config cfg = {
		.vm_name = p->name,
		.listen_path = path,
		.interval_ms = p->interval_ms,
		.qmp = vm_qmp(p->vm),
		.bulk_high_water = BULK_HIGH_WATER,
	};
	struct checkpoint_sequencer_io sio = {
		.opaque = p, .wire = seq_wire, .flush = seq_flush, .on_epoch_end = seq_epoch_end,
	};
	protection_stop_pipeline(p);
	p->epochs.seq = checkpoint_sequencer_create(&sio);
	p->epochs.pipeline = !p->epochs.seq ? NULL :
		checkpoint_pipeline_create(p->loop, protection_coding_encoder(p), on_encoded, p,
					   err, sizeof(err));
	if (!p->epochs.pipeline) {
		protection_fail(p, "cannot start the checkpoint pipeline: %s",
				p->epochs.seq ? err : "out of memory");
		return;
	}
	checkpoint_pipeline_name_thread(p->epochs.pipeline, p->name);
	/* Compression covers the device blob too: the unoptimized baseline sends it whole. */
	checkpoint_pipeline_delta_device(p->epochs.pipeline, protection_coding_compress(p));
	protection_set_state(p, ST_SYNCING);
	protection_disk_base_copy_starts(p);
	struct output_commit_flow_sink flows = {
		.opaque = p, .state = flow_state_to_backup, .ahead = flow_ahead_to_backup,
	};
	output_commit_set_flow_sink(p->oc, &flows);
	output_commit_cut(p->oc, 0); /* epoch 1 is open */
	p->source = checkpoint_source_open(p->loop, &cfg, &ev, err, sizeof(err));
	if (!p->source) {
		protection_fail(p, "cannot start checkpointing: %s", err);
		return;
	}
	/* A failure inside (the first chunks are read at once) is handled there. */
	struct disk_copy_sink sink = {
		.opaque = p, .buffer_for = sink_buffer, .appended = sink_appended,
		.backlog = sink_backlog,
	};
	if (disk_copy_start(p->disk, vm_export(p->vm), &sink, err, sizeof(err)) < 0)
		protection_fail(p, "cannot start the disk copy: %s", err);
}

uint64_t protection_last_epoch(const struct protection *p)
{
	return p->epochs.last_epoch;
}

struct protection_epoch_progress protection_epoch_progress(const struct protection *p)
{
	struct protection_epoch_progress g = {
		.sent = p->epochs.last_epoch,
		.acked = p->epochs.acked_epoch,
		.in_flight = in_flight(p),
		.any_ack = p->epochs.any_ack,
		.last_ack_us = p->epochs.last_ack_us,
		.encoding = p->epochs.pipeline ?
			    checkpoint_pipeline_encoding(p->epochs.pipeline) : 0,
		.held_for_order = p->epochs.seq ? checkpoint_sequencer_held(p->epochs.seq) : 0,
	};

	if (p->epochs.pipeline)
		g.pipeline_bytes = checkpoint_pipeline_memory(p->epochs.pipeline,
							      &g.pipeline_peak_bytes);
	return g;
}
