/*
 * The primary side's lifecycle (protection.h): `protect` validates and
 * claims the VM in etcd, connects and authenticates to the backup,
 * ships VM_CONFIG and hands over to protection_epochs.c; it sends
 * heartbeats, watches the backup's silence and routes the backup's frames.
 */
#include "primary/protection.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "codec/asc_encoder.h"
#include "base/log.h"
#include "nbd/nbd_server.h"
#include "relay/net_relay.h"
#include "primary/protection_internal.h"
#include "primary/protection_marker.h"
#include "qemu/qmp.h"

#define CONNECT_TIMEOUT_MS 5000

_Static_assert(sizeof(((struct protection_marker *)0)->backup) >=
	       sizeof(((struct protect_request *)0)->backup) &&
	       sizeof(((struct protection *)0)->backup) >=
	       sizeof(((struct protect_request *)0)->backup),
	       "the backup's address is kept whole in the protection and its marker");

const char *const protection_state_names[] = {
	[ST_CLAIMING] = "connecting", [ST_CONNECTING] = "connecting",
	[ST_AUTHENTICATING] = "connecting", [ST_SYNCING] = "syncing",
	[ST_PROTECTED] = "protected", [ST_ARBITRATING] = "arbitrating",
	[ST_UNPROTECTED] = "unprotected", [ST_FENCED] = "fenced",
	[ST_FAILED] = "failed",
};

void protection_set_state(struct protection *p, enum state s)
{
	if (p->state != s)
		log_info("vm %s: protection %s -> %s", p->name, protection_state_names[p->state],
			 protection_state_names[s]);
	p->state = s;
}

static struct buffer *out(struct protection *p)
{
	return repl_conn_out(p->conn);
}

void protection_stop_io(struct protection *p)
{
	if (p->connect_timer)
		event_loop_del_timer(p->loop, p->connect_timer);
	if (p->heartbeat_timer)
		event_loop_del_timer(p->loop, p->heartbeat_timer);
	p->connect_timer = p->heartbeat_timer = 0;
	if (p->disk)
		disk_copy_stop(p->disk);
}

void protection_close_conn(struct protection *p)
{
	if (p->disk)
		disk_copy_stop(p->disk); /* it borrows the connection */
	protection_stop_pipeline(p);  /* so do the sequencer and the coded epochs */
	heartbeat_link_remove(p->hb);
	p->hb = NULL;
	repl_conn_destroy(p->conn);
	p->conn = NULL;
}

/*
 * Our last frame (a BYE) is queued: the connection is handed to
 * repl_conn_finish, which gets it to the backup before the FIN, then
 * goes by itself.  Long enough for a backup busy committing an epoch.
 */
#define GOODBYE_LINGER_MS 3000

static void ignore_silence(void *opaque, int64_t silent_ms)
{
	(void)opaque;
	(void)silent_ms;
}

/*
 * The BYE may wait behind megabytes of epoch data.  Were the heartbeats
 * to stop when it is queued, the backup would hear silence first, take
 * the primary for dead and, winning etcd, start a second copy of the VM
 * (seen in test_unprotect.py under rdb-dirty at 25 ms).  So the link goes
 * on beating until the goodbye connection is gone, as a link of its own
 * whose silence concerns nobody here any more.  NULL when there is none:
 * the old link then ends with the protection, as before.
 */
static struct heartbeat_link *goodbye_heartbeats(struct protection *p)
{
	struct heartbeat_link_config c = {
		.we_are_primary = true,
		.timeout_ms = repl_peer_timeout_ms(p->settings, true),
		.on_silence = ignore_silence,
	};
	struct sockaddr_in backup;
	char err[256];

	if (!p->hb || repl_parse_address(p->backup, &backup, err, sizeof(err)) < 0 ||
	    repl_handshake_link_secret(&p->handshake, &c.id, c.key) < 0)
		return NULL;
	c.peer = &backup;
	heartbeat_link_remove(p->hb);
	p->hb = NULL;
	return heartbeat_link_add(p->settings->heartbeats, &c);
}

static void end_goodbye_heartbeats(void *link)
{
	heartbeat_link_remove(link);
}

/* Hands conn to repl_conn_finish with the heartbeats going on until it is gone. */
static void say_goodbye(struct repl_conn *conn, struct heartbeat_link *hb)
{
	if (hb)
		repl_conn_on_freed(conn, end_goodbye_heartbeats, hb);
	repl_conn_finish(conn, GOODBYE_LINGER_MS);
}

static void finish_conn(struct protection *p)
{
	struct repl_conn *conn = p->conn;

	p->conn = NULL;
	struct heartbeat_link *hb = goodbye_heartbeats(p);
	protection_close_conn(p); /* the borrowers let go; the connection is ours */
	say_goodbye(conn, hb);
}

static int release_sink(void *opaque, const uint8_t *frame, size_t len)
{
	struct net_relay *nic = opaque;

	if (nic)
		net_relay_send_to_lan(nic, frame, len);
	return 0;
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

void protection_qmp(struct protection *p, const char *cmd)
{
	struct qmp_client *qmp = vm_qmp(p->vm);
	char *name = strdup(p->name);

	if (!qmp || !name || qmp_execute(qmp, cmd, NULL, qmp_logged, name) < 0) {
		log_error("vm %s: cannot send QMP %s", p->name, cmd);
		free(name);
	}
}

/* ---- the connection to the backup ------------------------------------ */

static void on_backup_silent(void *opaque, int64_t silent_ms)
{
	struct protection *p = opaque;
	char why[160];

	if (p->state != ST_SYNCING && p->state != ST_PROTECTED)
		return; /* arbitrating already, or done */
	snprintf(why, sizeof(why), "no heartbeat from the backup for %lld ms (timeout %u ms)",
		 (long long)silent_ms, repl_peer_timeout_ms(p->settings, p->state == ST_PROTECTED));
	protection_backup_lost(p, why);
}

/* The backup's heartbeats, from the moment both sides know the link's key. */
static int open_heartbeat_link(struct protection *p)
{
	struct heartbeat_link_config c = {
		.we_are_primary = true,
		.timeout_ms = repl_peer_timeout_ms(p->settings, false),
		.on_silence = on_backup_silent,
		.opaque = p,
	};
	struct sockaddr_in backup;
	char err[256];

	if (repl_parse_address(p->backup, &backup, err, sizeof(err)) < 0 ||
	    repl_handshake_link_secret(&p->handshake, &c.id, c.key) < 0)
		return -1;
	c.peer = &backup;
	p->hb = heartbeat_link_add(p->settings->heartbeats, &c);
	return p->hb ? 0 : -1;
}

static int on_handshake(struct protection *p, const struct repl_frame *f)
{
	char err[256];

	switch (repl_handshake_on_frame(&p->handshake, f, out(p))) {
	case REPL_HANDSHAKE_FAILED:
		protection_fail(p, "replication handshake with %s: %s", p->backup,
				p->handshake.error);
		return -1;
	case REPL_HANDSHAKE_MORE:
		repl_conn_flush(p->conn);
		protection_set_state(p, ST_AUTHENTICATING);
		return 0;
	case REPL_HANDSHAKE_DONE:
		break;
	}
	if (p->connect_timer)
		event_loop_del_timer(p->loop, p->connect_timer);
	p->connect_timer = 0;
	log_info("vm %s: authenticated backup %s (%s)", p->name, p->handshake.peer_name,
		 p->backup);
	if (open_heartbeat_link(p) < 0) {
		protection_fail(p, "cannot start heartbeats to %s (out of memory, or a "
				"heartbeat link with the same id exists)", p->backup);
		return -1;
	}
	char *json = vm_config_encode(&p->config, err, sizeof(err));
	if (!json || repl_put_vm_config(out(p), json, strlen(json)) < 0) {
		protection_fail(p, "cannot send VM_CONFIG: %s", json ? "out of memory" : err);
		free(json);
		return -1;
	}
	free(json);
	if (protection_send_disk_base(p, out(p)) < 0) {
		protection_fail(p, "cannot send DISK_BASE (out of memory)");
		return -1;
	}
	repl_conn_flush(p->conn);
	protection_start_replication(p);
	return 0;
}

/* A refusal or a broken rule of the backup ends the protection. */
static int backup_failed(struct protection *p, const char *why)
{
	if (p->state < ST_SYNCING)
		protection_fail(p, "%s", why);
	else
		protection_backup_lost(p, why);
	return -1;
}

static int on_frame(void *opaque, const struct repl_frame *f)
{
	struct protection *p = opaque;
	const char *err;
	char why[400];

	if (p->state == ST_ARBITRATING)
		return 0; /* etcd decides now; acks change nothing */

	switch (f->type) {
	case REPL_HELLO:
	case REPL_AUTH_OK:
		if (p->state != ST_CONNECTING && p->state != ST_AUTHENTICATING)
			break;
		return on_handshake(p, f);
	case REPL_ERROR: {
		struct repl_error e;
		if (repl_decode_error(f, &e, &err) < 0)
			return backup_failed(p, "the backup sent a malformed ERROR");
		snprintf(why, sizeof(why), "the backup %s refused: %.*s", p->backup,
			 (int)e.reason_len, e.reason);
		return backup_failed(p, why);
	}
	case REPL_EPOCH_ACK: {
		uint64_t epoch;
		if (p->state != ST_SYNCING && p->state != ST_PROTECTED)
			return 0;
		if (repl_decode_epoch_ack(f, &epoch, &err) < 0) {
			protection_backup_lost(p, err);
			return -1;
		}
		protection_on_ack(p, epoch);
		return 0;
	}
	case REPL_PAGE_REQUEST:
		if (p->state != ST_SYNCING && p->state != ST_PROTECTED)
			return 0;
		return protection_on_page_request(p, f);
	case REPL_DISK_PLAN:
		if (p->state != ST_SYNCING)
			break;
		if (protection_on_disk_plan(p, f, why, sizeof(why)) < 0)
			return backup_failed(p, why);
		return 0;
	case REPL_HEARTBEAT:
		return 0;
	case REPL_BYE:
		protection_backup_lost(p, "the backup said goodbye");
		return -1;
	default:
		break;
	}
	snprintf(why, sizeof(why), "unexpected %s from the backup in state %s",
		 repl_type_name(f->type), protection_state_names[p->state]);
	return backup_failed(p, why);
}

static void on_closed(void *opaque, const char *why)
{
	struct protection *p = opaque;

	if (p->state == ST_CONNECTING || p->state == ST_AUTHENTICATING) {
		protection_fail(p, "cannot set up replication to %s: %s (is remusdbd running "
				"there with --listen %s, and do both hosts use the same "
				"--psk-file?)", p->backup, why, p->backup);
		return;
	}
	if (p->state == ST_FAILED || p->state == ST_UNPROTECTED ||
	    p->state == ST_ARBITRATING || p->state == ST_FENCED) {
		protection_close_conn(p);
		return;
	}
	protection_backup_lost(p, why);
}

static void on_drained(void *opaque)
{
	struct protection *p = opaque;

	if (p->state == ST_FAILED || p->state == ST_UNPROTECTED) {
		finish_conn(p); /* our BYE is in the kernel: see it delivered */
		return;
	}
	protection_resume_bulk(p);
	if (p->state == ST_SYNCING && p->disk)
		disk_copy_pump(p->disk);
}

static long on_heartbeat(event_loop *loop, long long id, void *data)
{
	struct protection *p = data;
	int64_t now = monotonic_us();

	if (!p->conn)
		return (long)p->settings->heartbeat_ms;
	protection_resume_bulk(p);
	/* The heartbeat thread decides liveness; the copy's allowance ends once protected. */
	if (p->hb)
		heartbeat_link_set_timeout(p->hb, repl_peer_timeout_ms(p->settings,
								p->state == ST_PROTECTED));
	int64_t stream_silent_ms = (now - repl_conn_last_heard_us(p->conn)) / 1000;
	bool replicating = p->state == ST_SYNCING || p->state == ST_PROTECTED;
	if (replicating && stream_silent_ms > p->stream_max_silence_ms)
		p->stream_max_silence_ms = stream_silent_ms;
	if (stream_silent_ms > REPL_STREAM_SILENCE_MS && replicating) {
		char why[160];
		snprintf(why, sizeof(why), "nothing arrived on the replication stream for "
			 "%lld ms (heartbeats may flow, but the stream is stuck)",
			 (long long)stream_silent_ms);
		protection_backup_lost(p, why);
		return (long)p->settings->heartbeat_ms;
	}
	/* The backup takes HEARTBEAT frames only after VM_CONFIG: none during the handshake. */
	if (p->state < ST_SYNCING)
		return (long)p->settings->heartbeat_ms;
	if (repl_put_heartbeat(out(p), (uint64_t)now, p->last_epoch) < 0) {
		/* Without heartbeats the backup would declare us dead. */
		backup_failed(p, "cannot queue a heartbeat (out of memory)");
		return (long)p->settings->heartbeat_ms;
	}
	repl_conn_flush(p->conn);
	return (long)p->settings->heartbeat_ms;
}

static long on_connect_timeout(event_loop *loop, long long id, void *data)
{
	struct protection *p = data;

	p->connect_timer = 0;
	protection_fail(p, "no answer from the backup at %s within %d ms (is remusdbd "
			"running there with --listen %s?)", p->backup, CONNECT_TIMEOUT_MS,
			p->backup);
	return TIMER_DONE;
}

static void connect_backup(struct protection *p)
{
	struct sockaddr_in addr;
	char err[256];
	int one = 1;

	if (repl_parse_address(p->backup, &addr, err, sizeof(err)) < 0) {
		protection_fail(p, "%s", err);
		return;
	}
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		protection_fail(p, "socket: %s", strerror(errno));
		return;
	}
	/* Acks and heartbeats are tiny and latency-critical. */
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 && errno != EINPROGRESS) {
		int e = errno;
		close(fd);
		protection_fail(p, "cannot connect to the backup at %s: %s (is remusdbd "
				"running there with --listen %s?)", p->backup, strerror(e),
				p->backup);
		return;
	}
	struct repl_conn_events ev = {
		.opaque = p, .on_frame = on_frame, .on_closed = on_closed,
		.on_drained = on_drained,
	};
	p->conn = repl_conn_create(p->loop, fd, p->backup, &ev);
	if (!p->conn) {
		protection_fail(p, "out of memory");
		return;
	}
	protection_set_state(p, ST_CONNECTING);
	p->connect_timer = event_loop_add_timer(p->loop, CONNECT_TIMEOUT_MS,
						on_connect_timeout, p);
	p->heartbeat_timer = event_loop_add_timer(p->loop, (long)p->settings->heartbeat_ms,
						  on_heartbeat, p);
	if (p->connect_timer < 0 || p->heartbeat_timer < 0) {
		p->connect_timer = p->connect_timer < 0 ? 0 : p->connect_timer;
		p->heartbeat_timer = p->heartbeat_timer < 0 ? 0 : p->heartbeat_timer;
		protection_fail(p, "cannot add the connection's timers (out of memory)");
	}
}

static void on_claimed(void *opaque, enum witness_result r,
		       const struct witness_ownership *now, const char *err)
{
	struct protection *p = opaque;
	struct protection_marker m;
	char err2[256];

	if (p->unprotect_requested)
		return;
	switch (r) {
	case WITNESS_OK:
		p->ownership = *now;
		log_info("vm %s: etcd: owned by %s, generation %llu", p->name, now->owner,
			 (unsigned long long)now->generation);
		snprintf(p->config.ownership, sizeof(p->config.ownership), "%s", now->raw);
		p->config.generation = now->generation;
		memset(&m, 0, sizeof(m));
		snprintf(m.vm, sizeof(m.vm), "%s", p->name);
		snprintf(m.backup, sizeof(m.backup), "%s", p->backup);
		m.ownership = p->ownership;
		if (protection_marker_save(p->settings->state_dir, &m, err2, sizeof(err2)) < 0) {
			protection_fail(p, "%s", err2);
			return;
		}
		connect_backup(p);
		return;
	case WITNESS_LOST:
		protection_fail(p, "etcd says VM %s is owned by host %s (generation %llu), not "
				"by %s: refusing to protect a VM this host must not run", p->name,
				now->owner, (unsigned long long)now->generation,
				p->settings->host);
		return;
	default:
		protection_fail(p, "cannot reach etcd at %s: %s (protection needs the witness "
				"to arbitrate failovers)", p->settings->witness.endpoints,
				err ? err : witness_result_name(r));
		return;
	}
}

/* ---- lifecycle -------------------------------------------------------- */

/* The VM_CONFIG to ship, checked now so that `protect` reports a mistake. */
static int build_vm_config(struct protection *p, const struct protect_request *req,
			   char *err, size_t errlen)
{
	const struct vm_definition *def = vm_def(p->vm);
	struct vm_config *c = &p->config;

	snprintf(c->vm, sizeof(c->vm), "%s", def->name);
	snprintf(c->primary_host, sizeof(c->primary_host), "%s", p->settings->host);
	snprintf(c->run_dir, sizeof(c->run_dir), "%s", req->run_dir);
	snprintf(c->mac, sizeof(c->mac), "%s", def->mac);
	snprintf(c->tap, sizeof(c->tap), "%s", def->tap);
	snprintf(c->bridge, sizeof(c->bridge), "%s", def->bridge);
	c->disk_size = disk_copy_size(p->disk);
	c->interval_ms = p->interval_ms;
	c->heartbeat_ms = p->settings->heartbeat_ms;
	c->peer_timeout_ms = p->settings->peer_timeout_ms;
	if (vm_config_set_argv(c, req->qemu_argv, err, errlen) < 0)
		return -1;
	return vm_config_check(c, err, errlen);
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
	if (req->commit_protection && (!req->output_commit || req->unsafe_release_early)) {
		snprintf(err, errlen, "commit protection is a form of output commit: it cannot "
			 "run with output commit off or released early");
		return -1;
	}
	if (req->commit_protection && (req->cp_dscp < 1 || req->cp_dscp > 63)) {
		snprintf(err, errlen, "cp_dscp %u: use the guest module's code point, 1..63",
			 req->cp_dscp);
		return -1;
	}
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
	if (!s->heartbeats) {
		snprintf(err, errlen, "this remusdbd runs no heartbeat thread: it cannot "
			 "detect a dead backup");
		return -1;
	}
	if (!vm_qmp(vm) || !vm_export(vm) || !vm_nic(vm) || !def->qmp_socket[0]) {
		snprintf(err, errlen, "VM %s needs its disk, NIC and QMP socket served by "
			 "remusdbd to be protected (start it with tools/remusdb-vm)", def->name);
		return -1;
	}
	return 0;
}

/* The parts both a new and a recovered protection have. */
static struct protection *protection_new(event_loop *loop, const struct repl_settings *settings,
					 struct vm *vm, const char *backup,
					 bool unsafe_release_early)
{
	struct protection *p = calloc(1, sizeof(*p));

	if (!p)
		return NULL;
	p->loop = loop;
	p->settings = settings;
	p->vm = vm;
	snprintf(p->name, sizeof(p->name), "%s", vm_def(vm)->name);
	snprintf(p->backup, sizeof(p->backup), "%s", backup);
	p->oc = output_commit_create(HELD_OUTPUT_MAX, unsafe_release_early, release_sink,
				     vm_nic(vm));
	p->encoder = &page_encoder_default;
	if (!p->oc) {
		protection_destroy(p);
		return NULL;
	}
	return p;
}

/* A recorded page trace stops here: 256 MiB of page pairs. */
#define TRACE_MAX_RECORDS 32768

/* The RemusDB optimizations the request asked for (both by default). */
static int start_encoder(struct protection *p, const struct protect_request *req, char *err,
			 size_t errlen)
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
		p->read_tracking = true;
		p->rt_index = opt.index = vm_read_index(p->vm);
	}
	p->asc = asc_encoder_create(&opt, err, errlen);
	if (!p->asc)
		return -1;
	p->compress = req->compress;
	p->encoder = p->asc;
	log_info("vm %s: checkpoint compression %s, disk read tracking %s", p->name,
		 req->compress ? "on" : "OFF", req->read_tracking ? "on" : "OFF");
	return 0;
}

struct protection *protection_start(event_loop *loop, const struct repl_settings *settings,
				    struct vm *vm, const struct protect_request *req,
				    char *err, size_t errlen)
{
	struct protection *p;

	if (check_request(vm, settings, req, err, errlen) < 0)
		return NULL;
	p = protection_new(loop, settings, vm, req->backup, req->unsafe_release_early);
	if (!p) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	p->interval_ms = req->interval_ms;
	p->output_commit = req->output_commit;
	if (req->commit_protection && output_commit_enable_cp(p->oc, (uint8_t)req->cp_dscp) < 0) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	p->state = ST_CLAIMING;
	if (start_encoder(p, req, err, errlen) < 0)
		goto fail;
	struct disk_copy_events dev = protection_disk_events(p);
	p->disk = disk_copy_open(loop, vm_def(vm)->disk, &dev, err, errlen);
	if (!p->disk || protection_disk_base_start(p, req, err, errlen) < 0)
		goto fail;
	if (repl_handshake_init(&p->handshake, REPL_ROLE_PRIMARY, settings->psk,
				settings->psk_len, settings->host, NULL) < 0) {
		snprintf(err, errlen, "no randomness for the handshake nonce");
		goto fail;
	}
	if (build_vm_config(p, req, err, errlen) < 0)
		goto fail;
	p->witness = witness_async_create(loop, &settings->witness, err, errlen);
	if (!p->witness)
		goto fail;
	if (!p->output_commit)
		log_warn("vm %s: OUTPUT COMMIT DISABLED (debug negative control): "
			 "acknowledged commits can be lost at failover", p->name);
	if (req->unsafe_release_early)
		log_warn("vm %s: UNSAFE RELEASE EARLY (debug negative control): each "
			 "epoch's output leaves one epoch before its acknowledgement; "
			 "a failover can expose output the backup never produced", p->name);
	log_info("vm %s: protecting to %s every %u ms, %s", p->name, p->backup, p->interval_ms,
		 req->commit_protection ? "commit protection on (only marked output waits)"
					: "all output held until its epoch commits");
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
	struct protection *p = protection_new(loop, settings, vm, m->backup, false);
	char err[256];

	if (!p)
		return NULL;
	p->output_commit = true;
	p->ownership = m->ownership;
	p->stale_colo = true;
	p->witness = witness_async_create(loop, &settings->witness, err, sizeof(err));
	if (!p->witness) {
		log_error("vm %s: cannot recover the protection state: %s", p->name, err);
		/* Still pause: we cannot tell whether the backup took over. */
		p->state = ST_FENCED;
	} else {
		p->state = ST_ARBITRATING;
	}
	/* Before the event loop runs: nothing the guest sends may leave yet. */
	if (vm_nic(vm))
		net_relay_set_output_hook(vm_nic(vm), output_commit_hold, p->oc);
	protection_qmp(p, "stop");
	p->paused_for_witness = true;
	snprintf(p->error, sizeof(p->error), "remusdbd restarted while the VM was protected "
		 "by %s: VM paused until etcd says whether the backup took over", p->backup);
	log_error("vm %s: %s", p->name, p->error);
	if (p->state == ST_ARBITRATING)
		protection_arbitrate(p);
	return p;
}

void protection_stop(struct protection *p)
{
	p->unprotect_requested = true;
	if (p->conn) {
		if (repl_put_bye(out(p), REPL_BYE_UNPROTECT, "unprotect requested") < 0)
			log_warn("vm %s: cannot queue BYE (out of memory): the backup learns "
				 "of the unprotect from the closed connection", p->name);
		repl_conn_flush(p->conn);
	}
	struct repl_conn *conn = p->conn;
	p->conn = NULL; /* go_unprotected must not close it before the BYE is out */
	struct heartbeat_link *hb = conn ? goodbye_heartbeats(p) : NULL;
	protection_go_unprotected(p, "unprotected by the operator");
	/* A close could reach the backup as RST without the BYE: a takeover. */
	if (conn)
		say_goodbye(conn, hb);
	log_warn("vm %s: protection stopped by the operator: the VM runs unprotected", p->name);
}

void protection_destroy(struct protection *p)
{
	if (!p)
		return;
	protection_stop_io(p);
	if (p->witness_retry_timer)
		event_loop_del_timer(p->loop, p->witness_retry_timer);
	if (vm_nic(p->vm))
		net_relay_set_output_hook(vm_nic(p->vm), NULL, NULL);
	protection_hold_end(p, p->state != ST_FENCED);
	if (p->source)
		checkpoint_source_destroy(p->source);
	protection_close_conn(p);
	witness_async_destroy(p->witness);
	if (p->oc) {
		/*
		 * Held output of unacknowledged epochs must never leave: the
		 * backup may resume from before it.  It is dropped, as a NIC
		 * queue is when the host dies (TCP retransmits what mattered).
		 */
		if (p->state == ST_UNPROTECTED)
			output_commit_release_all(p->oc);
		output_commit_destroy(p->oc);
	}
	dirty_census_free(&p->census);
	protection_disk_base_end(p);
	disk_copy_destroy(p->disk);
	/* After protection_close_conn: the pipeline's worker, which uses both, is joined. */
	asc_encoder_destroy(p->asc);
	/*
	 * Only our own index: a re-protect starts the new protection (and
	 * its index) before the old protection object is destroyed, and
	 * stopping that would free the index under the new encoder.
	 */
	if (p->read_tracking && vm_read_index(p->vm) == p->rt_index)
		vm_read_tracking_stop(p->vm);
	vm_config_clear(&p->config);
	free(p);
}
