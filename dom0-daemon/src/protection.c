/* The primary side of Remus for one VM (see protection.h). */
#include "protection.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint_source.h"
#include "epoch_queue.h"
#include "log.h"
#include "nbd_server.h"
#include "net_relay.h"
#include "protection_marker.h"
#include "qmp.h"
#include "repl_conn.h"
#include "repl_proto.h"
#include "sample_ring.h"
#include "witness_async.h"

/* Held guest output beyond this is dropped like a full NIC queue. */
#define HELD_OUTPUT_MAX (64u << 20)
/* The disk copy adds a chunk only while less than this is queued. */
#define DISK_SYNC_CHUNK (1u << 20)
#define DISK_SYNC_BACKLOG (4u << 20)
#define DISK_SYNC_TICK_MS 2
/* During the bulk RAM copy QEMU is throttled above this backlog. */
#define BULK_HIGH_WATER (64u << 20)
#define BULK_LOW_WATER (16u << 20)
#define CONNECT_TIMEOUT_MS 5000
#define WITNESS_RETRY_MS 1000
/* NBD writes are split so a frame stays far below REPL_MAX_PAYLOAD. */
#define DISK_WRITE_PIECE (4u << 20)

enum state {
	ST_CLAIMING,    /* etcd: is this VM ours? */
	ST_CONNECTING,
	ST_AUTHENTICATING,
	ST_SYNCING,     /* disk copy and/or first epochs not yet acknowledged */
	ST_PROTECTED,
	ST_ARBITRATING, /* lost the backup: asking etcd */
	ST_UNPROTECTED, /* won, or unprotected by the operator: runs alone */
	ST_FENCED,      /* lost (or could not ask): VM paused */
	ST_FAILED,
};

static const char *const state_names[] = {
	[ST_CLAIMING] = "connecting", [ST_CONNECTING] = "connecting",
	[ST_AUTHENTICATING] = "connecting", [ST_SYNCING] = "syncing",
	[ST_PROTECTED] = "protected", [ST_ARBITRATING] = "arbitrating",
	[ST_UNPROTECTED] = "unprotected", [ST_FENCED] = "fenced",
	[ST_FAILED] = "failed",
};

struct protection {
	event_loop *loop;
	const struct repl_settings *settings;
	struct vm *vm;
	char name[VM_NAME_MAX + 1];
	char backup[64];
	unsigned interval_ms;
	bool output_commit;
	char *vm_config_json;     /* shipped to the backup */
	enum state state;
	char error[1024];
	bool unprotect_requested;
	bool stale_colo;          /* recovered after our restart: QEMU may sit in COLO */

	struct witness_async *witness;
	struct witness_ownership ownership; /* what etcd holds, as we know it */
	long long witness_retry_timer;
	bool paused_for_witness; /* we stopped the VM and may resume it */

	struct repl_conn *conn;
	long long connect_timer;
	long long heartbeat_timer;
	uint8_t nonce[REPL_NONCE_SIZE];
	uint8_t peer_nonce[REPL_NONCE_SIZE];
	char peer_name[65];

	struct checkpoint_source *source;
	struct repl_digest digest;   /* of the epoch being sent */
	uint64_t open_epoch;         /* tag of guest output and disk writes now */
	uint64_t last_epoch;         /* last EPOCH_END sent (0 = bulk) */
	bool bulk_sent;
	uint64_t acked_epoch;
	bool any_ack;
	int64_t last_ack_us;
	uint64_t epoch_pages;
	uint64_t dirty_pages_last;
	uint64_t epochs;             /* checkpoints shipped */
	uint64_t backpressure_events;
	int64_t max_silence_ms;      /* longest the backup was quiet: sizes the timeout */
	bool request_held;
	struct sample_ring pause_ms;
	struct sample_ring epoch_bytes;
	struct sample_ring dirty_pages;
	uint64_t epochs_at_reset;    /* `epochs` when reset-stats last ran */

	struct epoch_queue *held;
	bool dropping_output;        /* fenced: guest output goes nowhere */

	int disk_fd;                 /* read side of the disk copy */
	uint64_t disk_size;
	uint64_t sync_pos;
	uint64_t sync_bytes;
	bool sync_done;
	uint64_t sync_done_epoch;    /* protected once this epoch is acked */
	long long sync_timer;
	uint8_t *sync_buf;
};

static void set_state(struct protection *p, enum state s)
{
	if (p->state != s)
		log_info("vm %s: protection %s -> %s", p->name, state_names[p->state],
			 state_names[s]);
	p->state = s;
}

static struct buffer *out(struct protection *p)
{
	return repl_conn_out(p->conn);
}

/* Adds the frames appended since `before` to the epoch checksum. */
static void digest_tail(struct protection *p, size_t before)
{
	repl_digest_add_buffered(&p->digest, out(p), before);
}

static void stop_timers(struct protection *p)
{
	if (p->connect_timer)
		event_loop_del_timer(p->loop, p->connect_timer);
	if (p->heartbeat_timer)
		event_loop_del_timer(p->loop, p->heartbeat_timer);
	if (p->sync_timer)
		event_loop_del_timer(p->loop, p->sync_timer);
	p->connect_timer = p->heartbeat_timer = p->sync_timer = 0;
}

static void detach_hooks(struct protection *p)
{
	struct nbd_export *disk = vm_export(p->vm);

	if (disk)
		nbd_export_set_write_hook(disk, NULL, NULL);
}

static int release_sink(void *opaque, const uint8_t *frame, size_t len)
{
	struct net_relay *nic = opaque;

	if (nic)
		net_relay_send_to_lan(nic, frame, len);
	return 0;
}

static void release_output(struct protection *p, uint64_t upto)
{
	if (p->held)
		epoch_queue_release(p->held, upto, release_sink, vm_nic(p->vm));
}

static void close_conn(struct protection *p)
{
	repl_conn_destroy(p->conn);
	p->conn = NULL;
}

static void qmp_logged(struct qmp_client *qmp, json_t *reply, void *data)
{
	char *name = data;
	json_t *error = json_object_get(reply, "error");

	if (!reply)
		log_warn("vm %s: QMP connection lost before the reply", name);
	else if (error)
		log_error("vm %s: QMP: %s", name,
			  json_string_value(json_object_get(error, "desc")));
	free(name);
}

static void qmp_command(struct protection *p, const char *cmd)
{
	struct qmp_client *qmp = vm_qmp(p->vm);
	char *name = strdup(p->name);

	if (!qmp || !name || qmp_execute(qmp, cmd, NULL, qmp_logged, name) < 0) {
		log_error("vm %s: cannot send QMP %s", p->name, cmd);
		free(name);
	}
}

/* The VM leaves COLO and runs on; its held output goes out. */
static void go_unprotected(struct protection *p, const char *why)
{
	stop_timers(p);
	detach_hooks(p);
	if (p->source) {
		checkpoint_source_abandon(p->source);
		checkpoint_source_destroy(p->source);
		p->source = NULL;
	}
	close_conn(p);
	release_output(p, UINT64_MAX);
	if (vm_nic(p->vm))
		net_relay_set_output_hook(vm_nic(p->vm), NULL, NULL);
	/* No backup holds a replica any more: a restart needs no arbitration. */
	protection_marker_delete(p->settings->state_dir, p->name);
	if (p->stale_colo) {
		qmp_command(p, "x-colo-lost-heartbeat");
		p->stale_colo = false;
	}
	if (p->paused_for_witness) {
		qmp_command(p, "cont");
		p->paused_for_witness = false;
	}
	snprintf(p->error, sizeof(p->error), "%s", why);
	set_state(p, ST_UNPROTECTED);
}

static void fail(struct protection *p, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Before the backup had anything: nothing to arbitrate, just stop. */
static void fail(struct protection *p, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(p->error, sizeof(p->error), fmt, ap);
	va_end(ap);
	log_error("vm %s: protection failed: %s", p->name, p->error);
	char why[sizeof(p->error)];
	snprintf(why, sizeof(why), "%s", p->error);
	go_unprotected(p, why);
	snprintf(p->error, sizeof(p->error), "%s", why);
	set_state(p, ST_FAILED);
}

/* ---- arbitration ---------------------------------------------------- */

static void fence(struct protection *p, const char *why)
{
	stop_timers(p);
	detach_hooks(p);
	if (p->source) {
		/* No x-colo-lost-heartbeat: that would let the VM run again. */
		checkpoint_source_destroy(p->source);
		p->source = NULL;
	}
	close_conn(p);
	if (!p->paused_for_witness)
		qmp_command(p, "stop");
	p->paused_for_witness = false;
	if (p->held)
		epoch_queue_drop_all(p->held);
	p->dropping_output = true;
	snprintf(p->error, sizeof(p->error), "%s", why);
	log_error("vm %s: FENCED: %s; the VM is paused and its unacknowledged "
		  "output was dropped", p->name, why);
	set_state(p, ST_FENCED);
}

static void arbitrate(struct protection *p);

static long retry_witness(event_loop *loop, long long id, void *data)
{
	struct protection *p = data;

	p->witness_retry_timer = 0;
	arbitrate(p);
	return TIMER_DONE;
}

static void on_cas_done(void *opaque, enum witness_result r,
			const struct witness_ownership *now, const char *err)
{
	struct protection *p = opaque;
	char why[1024];

	switch (r) {
	case WITNESS_OK:
		p->ownership = *now;
		snprintf(why, sizeof(why), "backup %s lost (%.400s); etcd generation "
			 "%llu is ours: RUNNING UNPROTECTED", p->backup, p->error,
			 (unsigned long long)now->generation);
		log_error("vm %s: %s", p->name, why);
		go_unprotected(p, why);
		return;
	case WITNESS_LOST:
		if (now && now->exists && now->owner[0])
			snprintf(why, sizeof(why), "the backup took over: etcd says %s "
				 "owns the VM (generation %llu)", now->owner,
				 (unsigned long long)now->generation);
		else
			snprintf(why, sizeof(why), "etcd no longer names this host as the "
				 "VM's owner (generation %llu moved on)",
				 (unsigned long long)p->ownership.generation);
		fence(p, why);
		return;
	case WITNESS_UNREACHABLE:
	case WITNESS_ERROR:
		/*
		 * We cannot know whether the backup has taken over: stop
		 * the VM until etcd answers, then resume or stay fenced.
		 */
		if (!p->paused_for_witness) {
			log_error("vm %s: neither the backup nor etcd is reachable "
				  "(%s): pausing the VM until etcd answers", p->name,
				  err ? err : witness_result_name(r));
			qmp_command(p, "stop");
			p->paused_for_witness = true;
		}
		snprintf(p->error, sizeof(p->error), "backup lost and etcd "
			 "unreachable (%s): VM paused, retrying etcd every %d ms",
			 err ? err : witness_result_name(r), WITNESS_RETRY_MS);
		set_state(p, ST_FENCED);
		p->witness_retry_timer = event_loop_add_timer(p->loop, WITNESS_RETRY_MS,
							      retry_witness, p);
		return;
	}
}

static void arbitrate(struct protection *p)
{
	if (witness_async_cas(p->witness, p->name, &p->ownership, p->settings->host,
			      on_cas_done, p) < 0)
		p->witness_retry_timer = event_loop_add_timer(p->loop, WITNESS_RETRY_MS,
							      retry_witness, p);
}

/* The backup is gone (closed, silent, or refused): ask etcd who runs the VM. */
static void backup_lost(struct protection *p, const char *why)
{
	if (p->state != ST_SYNCING && p->state != ST_PROTECTED)
		return;
	log_error("vm %s: lost the backup %s: %s; asking etcd", p->name, p->backup, why);
	snprintf(p->error, sizeof(p->error), "%s", why);
	if (p->sync_timer)
		event_loop_del_timer(p->loop, p->sync_timer);
	p->sync_timer = 0;
	detach_hooks(p);
	/*
	 * A connection that still works stays open (heartbeats go on) until
	 * etcd answers: closing it would tell a backup that is merely slow
	 * that we died, and it would race us for the VM.
	 */
	/* Checkpoints wait (the VM runs); output stays held until etcd answers. */
	set_state(p, ST_ARBITRATING);
	arbitrate(p);
}

/* ---- epochs ------------------------------------------------------- */

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
		backup_lost(p, "out of memory queueing an epoch");
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
	size_t before = buffer_len(out(p));
	if (repl_put_ram_layout(out(p), &l) < 0) {
		backup_lost(p, "cannot encode the RAM layout");
		return;
	}
	digest_tail(p, before);
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
			   data, data ? REPL_PAGE_SIZE : 0) < 0) {
		backup_lost(p, "out of memory queueing pages");
		return;
	}
	digest_tail(p, before);
	p->epoch_pages++;
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

static int hold_output(void *opaque, const uint8_t *frame, uint32_t len)
{
	struct protection *p = opaque;

	if (p->dropping_output)
		return 1;
	epoch_queue_push(p->held, p->open_epoch, frame, len);
	return 1;
}

static void on_checkpoint_begin(void *opaque, uint64_t epoch)
{
	struct protection *p = opaque;

	/* The cut: frames and writes from now on belong to the next epoch. */
	p->open_epoch = epoch + 1;
	if (epoch == 1 && p->output_commit && vm_nic(p->vm))
		net_relay_set_output_hook(vm_nic(p->vm), hold_output, p);
}

static void on_device_chunk(void *opaque, uint64_t epoch, uint64_t total, uint64_t offset,
			    const uint8_t *d, size_t n)
{
	struct protection *p = opaque;
	size_t before;

	if (!p->conn)
		return;
	before = buffer_len(out(p));
	if (repl_put_device(out(p), epoch, total, offset, d, n) < 0) {
		backup_lost(p, "out of memory queueing device state");
		return;
	}
	digest_tail(p, before);
}

static void on_checkpoint_end(void *opaque, const struct checkpoint_stats *st)
{
	struct protection *p = opaque;

	if (!p->conn)
		return;
	p->dirty_pages_last = st->pages + st->zero_pages;
	p->epochs++;
	sample_ring_add(&p->dirty_pages, (double)p->dirty_pages_last);
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
		repl_put_bye(out(p), REPL_BYE_TAKEOVER, why);
		repl_conn_flush(p->conn);
	}
	stop_timers(p);
	detach_hooks(p);
	if (p->source) {
		checkpoint_source_destroy(p->source);
		p->source = NULL;
	}
	snprintf(p->error, sizeof(p->error), "checkpoint stream failed: %s", why);
	p->dropping_output = true;
	if (p->held)
		epoch_queue_drop_all(p->held);
	set_state(p, ST_FAILED);
	/* The connection goes once the BYE is out (on_drained) or on close. */
}

/* ---- disk ---------------------------------------------------------- */

static void on_disk_write(void *opaque, enum nbd_write_kind kind, uint64_t offset,
			  const uint8_t *data, uint64_t len)
{
	struct protection *p = opaque;
	int rc = 0;

	if (!p->conn)
		return;
	while (len > 0 && rc == 0) {
		size_t n = len < DISK_WRITE_PIECE ? (size_t)len : DISK_WRITE_PIECE;
		size_t before = buffer_len(out(p));
		if (kind == NBD_WRITE_DATA)
			rc = repl_put_disk_write(out(p), p->open_epoch, offset, data, n);
		else
			rc = repl_put_disk_zero(out(p), p->open_epoch, offset, n);
		if (rc == 0)
			digest_tail(p, before);
		offset += n;
		len -= n;
		if (data)
			data += n;
	}
	if (rc < 0)
		backup_lost(p, "out of memory queueing a disk write");
	else
		repl_conn_flush(p->conn);
}

/* Next chunk of allocated data at or after sync_pos; false at the end. */
static bool next_sync_extent(struct protection *p, uint64_t *offset, size_t *len)
{
	off_t data = lseek(p->disk_fd, (off_t)p->sync_pos, SEEK_DATA);

	if (data < 0)
		return false; /* ENXIO: no more data */
	off_t hole = lseek(p->disk_fd, data, SEEK_HOLE);
	if (hole < 0)
		hole = (off_t)p->disk_size;
	uint64_t n = (uint64_t)(hole - data);
	*offset = (uint64_t)data;
	*len = n < DISK_SYNC_CHUNK ? (size_t)n : DISK_SYNC_CHUNK;
	return *len > 0;
}

static void pump_disk_sync(struct protection *p)
{
	while (p->conn && !p->sync_done && repl_conn_backlog(p->conn) < DISK_SYNC_BACKLOG) {
		uint64_t offset;
		size_t len;

		if (!next_sync_extent(p, &offset, &len)) {
			size_t before = buffer_len(out(p));
			repl_put_disk_sync_done(out(p), p->disk_size);
			digest_tail(p, before);
			p->sync_done = true;
			p->sync_done_epoch = p->open_epoch;
			log_info("vm %s: disk copy queued (%.1f MiB of data); protected "
				 "once epoch %llu is acknowledged", p->name,
				 (double)p->sync_bytes / (1 << 20),
				 (unsigned long long)p->sync_done_epoch);
			break;
		}
		ssize_t n = pread(p->disk_fd, p->sync_buf, len, (off_t)offset);
		if (n <= 0) {
			fail(p, "reading the disk %s for the initial copy: %s",
			     vm_def(p->vm)->disk, n < 0 ? strerror(errno) : "unexpected end");
			return;
		}
		size_t before = buffer_len(out(p));
		if (repl_put_disk_sync(out(p), offset, p->sync_buf, (size_t)n) < 0) {
			backup_lost(p, "out of memory queueing the disk copy");
			return;
		}
		digest_tail(p, before);
		p->sync_pos = offset + (uint64_t)n;
		p->sync_bytes += (uint64_t)n;
	}
	if (p->conn)
		repl_conn_flush(p->conn);
}

static long on_sync_tick(event_loop *loop, long long id, void *data)
{
	struct protection *p = data;

	pump_disk_sync(p);
	if (p->sync_done || p->state != ST_SYNCING) {
		p->sync_timer = 0;
		return TIMER_DONE;
	}
	return DISK_SYNC_TICK_MS;
}

/* ---- connection ------------------------------------------------------ */

static void on_ack(struct protection *p, uint64_t epoch)
{
	if (epoch > p->last_epoch || (p->any_ack && epoch <= p->acked_epoch)) {
		backup_lost(p, "the backup acknowledged an epoch out of order");
		return;
	}
	p->acked_epoch = epoch;
	p->any_ack = true;
	p->last_ack_us = monotonic_us();
	release_output(p, epoch);
	if (p->state == ST_SYNCING && p->sync_done && epoch >= p->sync_done_epoch) {
		log_info("vm %s: PROTECTED by %s (epoch %llu acknowledged, %u ms epochs)",
			 p->name, p->backup, (unsigned long long)epoch, p->interval_ms);
		set_state(p, ST_PROTECTED);
	}
	if (p->request_held && p->source)
		checkpoint_source_kick(p->source);
}

static void start_replication(struct protection *p)
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
	set_state(p, ST_SYNCING);
	p->open_epoch = 1;
	nbd_export_set_write_hook(vm_export(p->vm), on_disk_write, p);
	p->source = checkpoint_source_open(p->loop, &cfg, &ev, err, sizeof(err));
	if (!p->source) {
		fail(p, "cannot start checkpointing: %s", err);
		return;
	}
	p->sync_timer = event_loop_add_timer(p->loop, DISK_SYNC_TICK_MS, on_sync_tick, p);
	pump_disk_sync(p);
}

static int on_hello(struct protection *p, const struct repl_frame *f)
{
	struct repl_hello h, mine;
	const char *err;
	uint8_t mac[REPL_MAC_SIZE];

	if (repl_decode_hello(f, &h, &err) < 0) {
		fail(p, "backup %s sent a bad HELLO: %s", p->backup, err);
		return -1;
	}
	if (h.version != REPL_PROTOCOL_VERSION) {
		fail(p, "the backup at %s speaks replication protocol version %u, we speak "
		     "%u: run the same remusdbd version on both hosts", p->backup,
		     h.version, REPL_PROTOCOL_VERSION);
		return -1;
	}
	if (h.role != REPL_ROLE_BACKUP) {
		fail(p, "%s is not a backup remusdbd (it says role %u)", p->backup, h.role);
		return -1;
	}
	memcpy(p->peer_nonce, h.nonce, REPL_NONCE_SIZE);
	snprintf(p->peer_name, sizeof(p->peer_name), "%s", h.name);
	memset(&mine, 0, sizeof(mine));
	mine.version = REPL_PROTOCOL_VERSION;
	mine.role = REPL_ROLE_PRIMARY;
	memcpy(mine.nonce, p->nonce, REPL_NONCE_SIZE);
	snprintf(mine.name, sizeof(mine.name), "%s", p->settings->host);
	repl_auth_mac(p->settings->psk, p->settings->psk_len, REPL_AUTH_LABEL_PRIMARY,
		      p->peer_nonce, p->nonce, mac);
	if (repl_put_hello(out(p), &mine) < 0 || repl_put_auth(out(p), REPL_AUTH, mac) < 0) {
		fail(p, "out of memory");
		return -1;
	}
	repl_conn_flush(p->conn);
	set_state(p, ST_AUTHENTICATING);
	return 0;
}

static int on_auth_ok(struct protection *p, const struct repl_frame *f)
{
	uint8_t expected[REPL_MAC_SIZE];
	const uint8_t *mac;
	const char *err;

	if (repl_decode_auth(f, &mac, &err) < 0) {
		fail(p, "backup %s: bad AUTH_OK: %s", p->backup, err);
		return -1;
	}
	repl_auth_mac(p->settings->psk, p->settings->psk_len, REPL_AUTH_LABEL_BACKUP,
		      p->nonce, p->peer_nonce, expected);
	if (!repl_auth_check(expected, mac)) {
		fail(p, "the backup at %s does not know our pre-shared key: refusing to "
		     "replicate to it (check --psk-file on both hosts)", p->backup);
		return -1;
	}
	if (p->connect_timer)
		event_loop_del_timer(p->loop, p->connect_timer);
	p->connect_timer = 0;
	log_info("vm %s: authenticated backup %s (%s)", p->name, p->peer_name, p->backup);
	if (repl_put_vm_config(out(p), p->vm_config_json, strlen(p->vm_config_json)) < 0) {
		fail(p, "out of memory");
		return -1;
	}
	repl_conn_flush(p->conn);
	start_replication(p);
	return 0;
}

static int on_frame(void *opaque, const struct repl_frame *f)
{
	struct protection *p = opaque;
	const char *err;

	if (p->state == ST_ARBITRATING)
		return 0; /* etcd decides now; acks change nothing */

	switch (f->type) {
	case REPL_HELLO:
		if (p->state != ST_CONNECTING)
			break;
		return on_hello(p, f);
	case REPL_AUTH_OK:
		if (p->state != ST_AUTHENTICATING)
			break;
		return on_auth_ok(p, f);
	case REPL_ERROR: {
		struct repl_error e;
		if (repl_decode_error(f, &e, &err) < 0) {
			backup_lost(p, "the backup sent a malformed ERROR");
			return -1;
		}
		char why[400];
		snprintf(why, sizeof(why), "the backup %s refused: %.*s", p->backup,
			 (int)e.reason_len, e.reason);
		if (p->state < ST_SYNCING)
			fail(p, "%s", why);
		else
			backup_lost(p, why);
		return -1;
	}
	case REPL_EPOCH_ACK: {
		uint64_t epoch;
		if (p->state != ST_SYNCING && p->state != ST_PROTECTED)
			return 0;
		if (repl_decode_epoch_ack(f, &epoch, &err) < 0) {
			backup_lost(p, err);
			return -1;
		}
		on_ack(p, epoch);
		return 0;
	}
	case REPL_HEARTBEAT:
		return 0;
	case REPL_BYE:
		backup_lost(p, "the backup said goodbye");
		return -1;
	default:
		break;
	}
	char why[160];
	snprintf(why, sizeof(why), "unexpected %s from the backup in state %s",
		 repl_type_name(f->type), state_names[p->state]);
	if (p->state < ST_SYNCING)
		fail(p, "%s", why);
	else
		backup_lost(p, why);
	return -1;
}

static void on_closed(void *opaque, const char *why)
{
	struct protection *p = opaque;

	if (p->state == ST_CONNECTING || p->state == ST_AUTHENTICATING) {
		fail(p, "cannot set up replication to %s: %s (is remusdbd running there "
		     "with --listen %s, and do both hosts use the same --psk-file?)",
		     p->backup, why, p->backup);
		return;
	}
	if (p->state == ST_FAILED || p->state == ST_UNPROTECTED ||
	    p->state == ST_ARBITRATING || p->state == ST_FENCED) {
		close_conn(p);
		return;
	}
	backup_lost(p, why);
}

static void on_drained(void *opaque)
{
	struct protection *p = opaque;

	if (p->state == ST_FAILED || p->state == ST_UNPROTECTED) {
		close_conn(p); /* our BYE is out */
		return;
	}
	if (p->source && p->bulk_sent == false && repl_conn_backlog(p->conn) < BULK_LOW_WATER)
		checkpoint_source_set_bulk_paused(p->source, false);
	if (p->state == ST_SYNCING && !p->sync_done)
		pump_disk_sync(p);
}

static long on_heartbeat(event_loop *loop, long long id, void *data)
{
	struct protection *p = data;
	int64_t now = monotonic_us();

	if (!p->conn)
		return (long)p->settings->heartbeat_ms;
	if (p->source && !p->bulk_sent && repl_conn_backlog(p->conn) < BULK_LOW_WATER)
		checkpoint_source_set_bulk_paused(p->source, false);
	int64_t silent_ms = (now - repl_conn_last_heard_us(p->conn)) / 1000;
	if (silent_ms > p->max_silence_ms && p->state >= ST_SYNCING &&
	    p->state != ST_ARBITRATING)
		p->max_silence_ms = silent_ms;
	unsigned timeout_ms = repl_peer_timeout_ms(p->settings, p->state == ST_PROTECTED);
	if (silent_ms > (int64_t)timeout_ms && p->state != ST_ARBITRATING) {
		char why[128];
		snprintf(why, sizeof(why), "no word from the backup for %lld ms "
			 "(timeout %u ms)", (long long)silent_ms, timeout_ms);
		backup_lost(p, why);
		return (long)p->settings->heartbeat_ms;
	}
	repl_put_heartbeat(out(p), (uint64_t)now, p->last_epoch);
	repl_conn_flush(p->conn);
	return (long)p->settings->heartbeat_ms;
}

static long on_connect_timeout(event_loop *loop, long long id, void *data)
{
	struct protection *p = data;

	p->connect_timer = 0;
	fail(p, "no answer from the backup at %s within %d ms (is remusdbd running "
	     "there with --listen %s?)", p->backup, CONNECT_TIMEOUT_MS, p->backup);
	return TIMER_DONE;
}

static void connect_backup(struct protection *p)
{
	struct sockaddr_in addr;
	char err[256];
	int one = 1;

	if (repl_parse_address(p->backup, &addr, err, sizeof(err)) < 0) {
		fail(p, "%s", err);
		return;
	}
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		fail(p, "socket: %s", strerror(errno));
		return;
	}
	/* Acks and heartbeats are tiny and latency-critical. */
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 && errno != EINPROGRESS) {
		int e = errno;
		close(fd);
		fail(p, "cannot connect to the backup at %s: %s (is remusdbd running "
		     "there with --listen %s?)", p->backup, strerror(e), p->backup);
		return;
	}
	struct repl_conn_events ev = {
		.opaque = p, .on_frame = on_frame, .on_closed = on_closed,
		.on_drained = on_drained,
	};
	p->conn = repl_conn_create(p->loop, fd, p->backup, &ev);
	if (!p->conn) {
		fail(p, "out of memory");
		return;
	}
	set_state(p, ST_CONNECTING);
	p->connect_timer = event_loop_add_timer(p->loop, CONNECT_TIMEOUT_MS,
						on_connect_timeout, p);
	p->heartbeat_timer = event_loop_add_timer(p->loop, (long)p->settings->heartbeat_ms,
						  on_heartbeat, p);
}

static void on_claimed(void *opaque, enum witness_result r,
		       const struct witness_ownership *now, const char *err)
{
	struct protection *p = opaque;

	if (p->unprotect_requested)
		return;
	switch (r) {
	case WITNESS_OK:
		p->ownership = *now;
		log_info("vm %s: etcd: owned by %s, generation %llu", p->name, now->owner,
			 (unsigned long long)now->generation);
		json_t *cfg = json_loads(p->vm_config_json, 0, NULL);
		if (cfg) {
			json_object_set_new(cfg, "ownership", json_string(now->raw));
			json_object_set_new(cfg, "generation", json_integer((json_int_t)now->generation));
			free(p->vm_config_json);
			p->vm_config_json = json_dumps(cfg, JSON_COMPACT);
			json_decref(cfg);
		}
		if (!p->vm_config_json) {
			fail(p, "out of memory");
			return;
		}
		struct protection_marker m;
		char err2[256];
		memset(&m, 0, sizeof(m));
		snprintf(m.vm, sizeof(m.vm), "%s", p->name);
		snprintf(m.backup, sizeof(m.backup), "%s", p->backup);
		m.ownership = p->ownership;
		if (protection_marker_save(p->settings->state_dir, &m, err2, sizeof(err2)) < 0) {
			fail(p, "%s", err2);
			return;
		}
		connect_backup(p);
		return;
	case WITNESS_LOST:
		fail(p, "etcd says VM %s is owned by host %s (generation %llu), not by "
		     "%s: refusing to protect a VM this host must not run", p->name,
		     now->owner, (unsigned long long)now->generation, p->settings->host);
		return;
	default:
		fail(p, "cannot reach etcd at %s: %s (protection needs the witness to "
		     "arbitrate failovers)", p->settings->witness.endpoints,
		     err ? err : witness_result_name(r));
		return;
	}
}

/* ---- lifecycle -------------------------------------------------------- */

static char *build_vm_config(struct protection *p, const struct protect_request *req,
			     char *err, size_t errlen)
{
	const struct vm_definition *def = vm_def(p->vm);
	json_t *cfg = json_pack("{s:s, s:s, s:O, s:s, s:I, s:s, s:s, s:s, s:i, s:i, s:i}",
				"vm", def->name, "primary_host", p->settings->host,
				"qemu_argv", req->qemu_argv, "run_dir", req->run_dir,
				"disk_size", (json_int_t)p->disk_size, "mac", def->mac,
				"tap", def->tap, "bridge", def->bridge,
				"interval_ms", (int)p->interval_ms,
				"heartbeat_ms", (int)p->settings->heartbeat_ms,
				"peer_timeout_ms", (int)p->settings->peer_timeout_ms);
	char *text = cfg ? json_dumps(cfg, JSON_COMPACT) : NULL;

	json_decref(cfg);
	if (!text)
		snprintf(err, errlen, "cannot encode the VM configuration");
	return text;
}

static int check_request(struct vm *vm, const struct repl_settings *s,
			 const struct protect_request *req, char *err, size_t errlen)
{
	const struct vm_definition *def = vm_def(vm);
	struct sockaddr_in addr;

	if (req->interval_ms < PROTECTION_MIN_INTERVAL_MS ||
	    req->interval_ms > PROTECTION_MAX_INTERVAL_MS) {
		snprintf(err, errlen, "interval %u ms is out of range: use %d..%d ms",
			 req->interval_ms, PROTECTION_MIN_INTERVAL_MS,
			 PROTECTION_MAX_INTERVAL_MS);
		return -1;
	}
	if (repl_parse_address(req->backup, &addr, err, errlen) < 0)
		return -1;
	if (!s->psk_len) {
		snprintf(err, errlen, "no pre-shared key: %s", s->psk_error[0] ? s->psk_error
			 : "start remusdbd with --psk-file FILE (the same key on both hosts)");
		return -1;
	}
	if (!s->witness.endpoints[0]) {
		snprintf(err, errlen, "no etcd configured: start remusdbd with --etcd URLS; "
			 "without a witness a failover could leave two live copies");
		return -1;
	}
	if (!vm_qmp(vm) || !vm_export(vm) || !vm_nic(vm) || !def->qmp_socket[0]) {
		snprintf(err, errlen, "VM %s needs its disk, NIC and QMP socket served by "
			 "remusdbd to be protected (start it with tools/remusdb-vm)", def->name);
		return -1;
	}
	if (!json_is_array(req->qemu_argv) || json_array_size(req->qemu_argv) == 0) {
		snprintf(err, errlen, "qemu_argv must be the VM's QEMU command line "
			 "(a non-empty array of strings)");
		return -1;
	}
	return 0;
}

struct protection *protection_start(event_loop *loop, const struct repl_settings *settings,
				    struct vm *vm, const struct protect_request *req,
				    char *err, size_t errlen)
{
	struct protection *p;
	struct stat st;

	if (check_request(vm, settings, req, err, errlen) < 0)
		return NULL;
	p = calloc(1, sizeof(*p));
	if (!p) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	p->loop = loop;
	p->settings = settings;
	p->vm = vm;
	p->disk_fd = -1;
	snprintf(p->name, sizeof(p->name), "%s", vm_def(vm)->name);
	snprintf(p->backup, sizeof(p->backup), "%s", req->backup);
	p->interval_ms = req->interval_ms;
	p->output_commit = req->output_commit;
	p->state = ST_CLAIMING;
	p->disk_fd = open(vm_def(vm)->disk, O_RDONLY | O_CLOEXEC);
	if (p->disk_fd < 0 || fstat(p->disk_fd, &st) < 0) {
		snprintf(err, errlen, "cannot open the disk %s: %s", vm_def(vm)->disk,
			 strerror(errno));
		goto fail;
	}
	p->disk_size = (uint64_t)st.st_size;
	p->sync_buf = malloc(DISK_SYNC_CHUNK);
	p->held = epoch_queue_create(HELD_OUTPUT_MAX);
	if (!p->sync_buf || !p->held || repl_digest_init(&p->digest) < 0 ||
	    repl_nonce_fill(p->nonce) < 0) {
		snprintf(err, errlen, "out of memory (or no randomness)");
		goto fail;
	}
	p->vm_config_json = build_vm_config(p, req, err, errlen);
	if (!p->vm_config_json)
		goto fail;
	p->witness = witness_async_create(loop, &settings->witness, err, errlen);
	if (!p->witness)
		goto fail;
	if (!p->output_commit)
		log_warn("vm %s: OUTPUT COMMIT DISABLED (debug negative control): "
			 "acknowledged commits can be lost at failover", p->name);
	log_info("vm %s: protecting to %s every %u ms", p->name, p->backup, p->interval_ms);
	if (witness_async_claim(p->witness, p->name, settings->host, on_claimed, p) < 0) {
		snprintf(err, errlen, "cannot ask etcd");
		goto fail;
	}
	return p;
fail:
	protection_destroy(p);
	return NULL;
}

struct protection *protection_recover(event_loop *loop, const struct repl_settings *settings,
				      struct vm *vm, const struct protection_marker *m)
{
	struct protection *p = calloc(1, sizeof(*p));

	if (!p)
		return NULL;
	p->loop = loop;
	p->settings = settings;
	p->vm = vm;
	p->disk_fd = -1;
	snprintf(p->name, sizeof(p->name), "%s", vm_def(vm)->name);
	snprintf(p->backup, sizeof(p->backup), "%s", m->backup);
	p->output_commit = true;
	p->ownership = m->ownership;
	p->stale_colo = true;
	p->held = epoch_queue_create(HELD_OUTPUT_MAX);
	char err[256];
	p->witness = witness_async_create(loop, &settings->witness, err, sizeof(err));
	if (!p->held || !p->witness || repl_digest_init(&p->digest) < 0) {
		log_error("vm %s: cannot recover the protection state: %s", p->name,
			  p->witness ? "out of memory" : err);
		/* Still pause: we cannot tell whether the backup took over. */
		p->state = ST_FENCED;
	} else {
		p->state = ST_ARBITRATING;
	}
	/* Before the event loop runs: nothing the guest sends may leave yet. */
	if (vm_nic(vm))
		net_relay_set_output_hook(vm_nic(vm), hold_output, p);
	qmp_command(p, "stop");
	p->paused_for_witness = true;
	snprintf(p->error, sizeof(p->error), "remusdbd restarted while the VM was protected "
		 "by %s: VM paused until etcd says whether the backup took over", p->backup);
	log_error("vm %s: %s", p->name, p->error);
	if (p->state == ST_ARBITRATING)
		arbitrate(p);
	return p;
}

void protection_stop(struct protection *p)
{
	p->unprotect_requested = true;
	if (p->conn) {
		repl_put_bye(out(p), REPL_BYE_UNPROTECT, "unprotect requested");
		repl_conn_flush(p->conn);
	}
	struct repl_conn *conn = p->conn;
	p->conn = NULL; /* go_unprotected must not close it before the BYE is out */
	go_unprotected(p, "unprotected by the operator");
	p->conn = conn;
	if (p->conn && repl_conn_backlog(p->conn) == 0)
		close_conn(p);
	log_warn("vm %s: protection stopped by the operator: the VM runs unprotected", p->name);
}

void protection_destroy(struct protection *p)
{
	if (!p)
		return;
	stop_timers(p);
	if (p->witness_retry_timer)
		event_loop_del_timer(p->loop, p->witness_retry_timer);
	detach_hooks(p);
	if (vm_nic(p->vm))
		net_relay_set_output_hook(vm_nic(p->vm), NULL, NULL);
	if (p->source)
		checkpoint_source_destroy(p->source);
	close_conn(p);
	witness_async_destroy(p->witness);
	if (p->held) {
		/*
		 * Held output of unacknowledged epochs must never leave: the
		 * backup may resume from before it.  It is dropped, as a NIC
		 * queue is when the host dies (TCP retransmits what mattered).
		 */
		if (p->state == ST_UNPROTECTED)
			release_output(p, UINT64_MAX);
		epoch_queue_destroy(p->held);
	}
	repl_digest_free(&p->digest);
	if (p->disk_fd >= 0)
		close(p->disk_fd);
	free(p->sync_buf);
	free(p->vm_config_json);
	free(p);
}

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
	p->max_silence_ms = 0;
	p->epochs_at_reset = p->epochs;
}

json_t *protection_status_json(const struct protection *p)
{
	struct epoch_queue_stats q = { 0 };
	int64_t now = monotonic_us();

	if (p->held)
		epoch_queue_get_stats(p->held, &q);
	json_t *o = json_pack("{s:s, s:s, s:s, s:I, s:I, s:I, s:f, s:f, s:f, s:I, s:I,"
			      " s:I, s:I, s:I, s:i, s:I, s:b, s:{s:b, s:I, s:I}, s:s,"
			      " s:I, s:I}",
			      "role", "primary", "state", state_names[p->state],
			      "peer", p->backup,
			      "epoch", (json_int_t)p->last_epoch,
			      "acked_epoch", (json_int_t)p->acked_epoch,
			      "in_flight", (json_int_t)(p->last_epoch - p->acked_epoch),
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
			      "disk_sync", "done", p->sync_done,
			      "bytes", (json_int_t)p->sync_bytes,
			      "total", (json_int_t)p->disk_size,
			      "checkpoint_source",
			      p->source ? checkpoint_source_state(p->source) : "none",
			      "bytes_sent", (json_int_t)(p->conn ? repl_conn_bytes_sent(p->conn) : 0),
			      "frames_released", (json_int_t)q.frames_released);
	if (!o)
		return NULL;
	json_object_set_new(o, "last_ack_age_ms", p->any_ack ?
			    json_integer((now - p->last_ack_us) / 1000) : json_null());
	json_object_set_new(o, "error", p->error[0] ? json_string(p->error) : json_null());
	json_object_set_new(o, "max_peer_silence_ms", json_integer(p->max_silence_ms));
	json_object_set_new(o, "dirty_pages_per_epoch_mean",
			    json_real(sample_ring_mean(&p->dirty_pages)));
	json_object_set_new(o, "epochs_since_reset",
			    json_integer((json_int_t)(p->epochs - p->epochs_at_reset)));
	json_object_set_new(o, "peer_timeout_ms", json_integer(p->settings->peer_timeout_ms));
	return o;
}
