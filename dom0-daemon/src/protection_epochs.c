/*
 * The primary's replication stream once the backup is authenticated:
 * QEMU's checkpoints (checkpoint_source.h) become epochs on the wire, the
 * disk copy and write mirror (disk_copy.h) join them, and each epoch's
 * acknowledgement releases its held output (output_commit.h).
 */
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "net_relay.h"
#include "protection_internal.h"

static struct buffer *out(struct protection *p)
{
	return repl_conn_out(p->conn);
}

/* Adds the frames appended since `before` to the epoch checksum. */
static int digest_tail(struct protection *p, size_t before)
{
	return repl_digest_add_buffered(&p->digest, out(p), before);
}

static bool may_checkpoint(void *opaque)
{
	struct protection *p = opaque;
	bool ok = (p->state == ST_SYNCING || p->state == ST_PROTECTED) &&
		  p->last_epoch - p->acked_epoch < p->settings->max_inflight;

	if (!ok && !p->request_held) {
		p->backpressure_events++;
		if (p->state == ST_SYNCING || p->state == ST_PROTECTED)
			log_warn("vm %s: backpressure: %llu epochs in flight to the "
				 "backup; the next checkpoint waits", p->name,
				 (unsigned long long)(p->last_epoch - p->acked_epoch));
	}
	p->request_held = !ok;
	return ok;
}

static void queue_epoch_end(struct protection *p, uint64_t epoch)
{
	struct repl_epoch_end e = {
		.epoch = epoch,
		.pages = p->epoch_pages,
		.bytes = p->digest.bytes,
		.checksum = repl_digest_value(&p->digest),
		.timestamp_us = (uint64_t)monotonic_us(),
	};

	if (repl_put_epoch_end(out(p), &e) < 0) {
		protection_backup_lost(p, "cannot queue an EPOCH_END (out of memory)");
		return;
	}
	if (epoch > 0)
		sample_ring_add(&p->epoch_bytes, (double)p->digest.bytes);
	repl_digest_reset(&p->digest);
	p->epoch_pages = 0;
	p->last_epoch = epoch;
	repl_conn_flush(p->conn);
}

static void on_ram_layout(void *opaque, const char *machine_type, uint32_t section_id,
			  const struct colo_ram_block *blocks, size_t count)
{
	struct protection *p = opaque;
	struct repl_ram_layout l;

	if (!p->conn)
		return;
	memset(&l, 0, sizeof(l));
	l.ram_section_id = section_id;
	snprintf(l.machine_type, sizeof(l.machine_type), "%s", machine_type);
	l.block_count = (uint16_t)count;
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
	if (dirty_census_layout(&p->census, names, lengths,
				count < REPL_MAX_BLOCKS ? count : REPL_MAX_BLOCKS) < 0)
		log_warn("vm %s: no memory for the dirty page census", p->name);
	size_t before = buffer_len(out(p));
	if (repl_put_ram_layout(out(p), &l) < 0 || digest_tail(p, before) < 0) {
		protection_backup_lost(p, "cannot encode the RAM layout");
		return;
	}
	repl_conn_flush(p->conn);
}

static void on_page(void *opaque, uint64_t epoch, unsigned block, uint64_t page_index,
		    const uint8_t *data)
{
	struct protection *p = opaque;
	size_t before;

	if (!p->conn)
		return;
	before = buffer_len(out(p));
	if (repl_put_pages(out(p), epoch, (uint16_t)block,
			   data ? REPL_ENCODING_RAW : REPL_ENCODING_ZERO, 1, &page_index,
			   data, data ? REPL_PAGE_SIZE : 0) < 0 || digest_tail(p, before) < 0) {
		protection_backup_lost(p, "cannot queue pages (out of memory)");
		return;
	}
	p->epoch_pages++;
	if (epoch > 0)
		dirty_census_page(&p->census, block, page_index, !data);
	if (epoch == 0 && repl_conn_backlog(p->conn) > BULK_HIGH_WATER)
		checkpoint_source_set_bulk_paused(p->source, true);
}

static void on_bulk_done(void *opaque)
{
	struct protection *p = opaque;

	if (!p->conn)
		return;
	queue_epoch_end(p, 0);
	p->bulk_sent = true;
	log_info("vm %s: bulk RAM copy queued (%.1f MiB sent so far)", p->name,
		 (double)repl_conn_bytes_sent(p->conn) / (1 << 20));
}

static void on_checkpoint_begin(void *opaque, uint64_t epoch)
{
	struct protection *p = opaque;

	/* The cut: frames and writes from now on belong to the next epoch. */
	output_commit_cut(p->oc, epoch);
	if (epoch == 1 && p->output_commit && vm_nic(p->vm))
		net_relay_set_output_hook(vm_nic(p->vm), output_commit_hold, p->oc);
}

static void on_device_chunk(void *opaque, uint64_t epoch, uint64_t total, uint64_t offset,
			    const uint8_t *d, size_t n)
{
	struct protection *p = opaque;
	size_t before;

	if (!p->conn)
		return;
	before = buffer_len(out(p));
	if (repl_put_device(out(p), epoch, total, offset, d, n) < 0 ||
	    digest_tail(p, before) < 0) {
		protection_backup_lost(p, "cannot queue device state (out of memory)");
		return;
	}
}

static void on_checkpoint_end(void *opaque, const struct checkpoint_stats *st)
{
	struct protection *p = opaque;

	if (!p->conn)
		return;
	p->dirty_pages_last = st->pages + st->zero_pages;
	p->epochs++;
	sample_ring_add(&p->dirty_pages, (double)p->dirty_pages_last);
	dirty_census_epoch_end(&p->census);
	sample_ring_add(&p->pause_ms, (double)st->pause_us / 1000.0);
	queue_epoch_end(p, st->epoch);
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
	if (p->conn && (p->state == ST_SYNCING || p->state == ST_PROTECTED)) {
		if (repl_put_bye(out(p), REPL_BYE_TAKEOVER, why) < 0)
			log_error("vm %s: cannot queue BYE takeover (out of memory): the "
				  "backup learns of it from the closed connection", p->name);
		repl_conn_flush(p->conn);
	}
	protection_stop_io(p);
	if (p->source) {
		checkpoint_source_destroy(p->source);
		p->source = NULL;
	}
	snprintf(p->error, sizeof(p->error), "checkpoint stream failed: %s", why);
	output_commit_drop_all(p->oc);
	protection_set_state(p, ST_FAILED);
	/* The connection goes once the BYE is out (on_drained) or on close. */
}

void protection_on_ack(struct protection *p, uint64_t epoch)
{
	if (epoch > p->last_epoch || (p->any_ack && epoch <= p->acked_epoch)) {
		protection_backup_lost(p, "the backup acknowledged an epoch out of order");
		return;
	}
	p->acked_epoch = epoch;
	p->any_ack = true;
	p->last_ack_us = monotonic_us();
	output_commit_ack(p->oc, epoch);
	if (p->state == ST_SYNCING && disk_copy_done(p->disk) &&
	    epoch >= p->sync_done_epoch) {
		log_info("vm %s: PROTECTED by %s (epoch %llu acknowledged, %u ms epochs)",
			 p->name, p->backup, (unsigned long long)epoch, p->interval_ms);
		protection_set_state(p, ST_PROTECTED);
	}
	if (p->request_held && p->source)
		checkpoint_source_kick(p->source);
}

void protection_resume_bulk(struct protection *p)
{
	if (p->source && !p->bulk_sent && p->conn &&
	    repl_conn_backlog(p->conn) < BULK_LOW_WATER)
		checkpoint_source_set_bulk_paused(p->source, false);
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

	p->sync_done_epoch = output_commit_open_epoch(p->oc);
	log_info("vm %s: disk copy queued (%.1f MiB of data); protected once epoch %llu "
		 "is acknowledged", p->name, (double)disk_copy_bytes(p->disk) / (1 << 20),
		 (unsigned long long)p->sync_done_epoch);
}

static void on_disk_failed(void *opaque, enum disk_copy_fault fault, const char *why)
{
	struct protection *p = opaque;

	if (fault == DISK_COPY_READ_FAILED)
		protection_fail(p, "%s", why);
	else
		protection_backup_lost(p, why);
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
	protection_set_state(p, ST_SYNCING);
	output_commit_cut(p->oc, 0); /* epoch 1 is open */
	p->source = checkpoint_source_open(p->loop, &cfg, &ev, err, sizeof(err));
	if (!p->source) {
		protection_fail(p, "cannot start checkpointing: %s", err);
		return;
	}
	/* A failure inside (the first chunks are read at once) is handled there. */
	if (disk_copy_start(p->disk, vm_export(p->vm), p->conn, &p->digest, err,
			    sizeof(err)) < 0)
		protection_fail(p, "cannot start the disk copy: %s", err);
}
