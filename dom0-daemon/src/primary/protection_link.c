/*
 * The primary's connection to the backup (protection.h): connecting,
 * the handshake and VM_CONFIG, heartbeats both ways (the heartbeat
 * thread's link and HEARTBEAT frames on the stream), the backup's frames
 * routed to the parts that handle them, and the goodbye that gets our
 * last frame delivered before the connection closes.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"
#include "primary/protection_internal.h"

#define CONNECT_TIMEOUT_MS 5000

static struct buffer *out(struct protection *p)
{
	return repl_conn_out(p->link.conn);
}

int protection_link_init(struct protection *p)
{
	const struct repl_settings *s = p->settings;

	if (repl_handshake_init(&p->link.handshake, REPL_ROLE_PRIMARY, s->psk, s->psk_len,
				s->host, NULL) < 0)
		return -1;
	p->link.handshake.backup_range = p->link.backup_versions;
	return 0;
}

uint16_t protection_link_version(const struct protection *p)
{
	return p->link.handshake.done ? p->link.handshake.version : 0;
}

struct repl_conn *protection_conn(const struct protection *p)
{
	return p->link.conn;
}

void protection_link_stop_timers(struct protection *p)
{
	if (p->link.connect_timer)
		event_loop_del_timer(p->loop, p->link.connect_timer);
	if (p->link.heartbeat_timer)
		event_loop_del_timer(p->loop, p->link.heartbeat_timer);
	p->link.connect_timer = p->link.heartbeat_timer = 0;
}

void protection_close_conn(struct protection *p)
{
	if (p->disk)
		disk_copy_stop(p->disk); /* it borrows the connection */
	protection_stop_pipeline(p);  /* so do the sequencer and the coded epochs */
	heartbeat_link_remove(p->link.hb);
	p->link.hb = NULL;
	repl_conn_destroy(p->link.conn);
	p->link.conn = NULL;
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

	if (!p->link.hb || repl_parse_address(p->backup, &backup, err, sizeof(err)) < 0 ||
	    repl_handshake_link_secret(&p->link.handshake, &c.id, c.key) < 0)
		return NULL;
	c.peer = &backup;
	/* Same link id as the one it replaces: it must go on numbering, or
	 * the backup drops every goodbye heartbeat as a replay. */
	c.first_seq = heartbeat_link_retire(p->link.hb);
	p->link.hb = NULL;
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
	struct repl_conn *conn = p->link.conn;

	p->link.conn = NULL;
	struct heartbeat_link *hb = goodbye_heartbeats(p);
	protection_close_conn(p); /* the borrowers let go; the connection is ours */
	say_goodbye(conn, hb);
}

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
	    repl_handshake_link_secret(&p->link.handshake, &c.id, c.key) < 0)
		return -1;
	c.peer = &backup;
	p->link.hb = heartbeat_link_add(p->settings->heartbeats, &c);
	return p->link.hb ? 0 : -1;
}

static int on_handshake(struct protection *p, const struct repl_frame *f)
{
	char err[256];

	switch (repl_handshake_on_frame(&p->link.handshake, f, out(p))) {
	case REPL_HANDSHAKE_FAILED:
		protection_reprotect_note_refused(p, 0);
		protection_fail(p, "replication handshake with %s: %s", p->backup,
				p->link.handshake.error);
		return -1;
	case REPL_HANDSHAKE_MORE:
		repl_conn_flush(p->link.conn);
		protection_set_state(p, ST_AUTHENTICATING);
		return 0;
	case REPL_HANDSHAKE_DONE:
		break;
	}
	if (p->link.connect_timer)
		event_loop_del_timer(p->loop, p->link.connect_timer);
	p->link.connect_timer = 0;
	log_info("vm %s: authenticated backup %s (%s), replication protocol %u", p->name,
		 p->link.handshake.peer_name, p->backup, p->link.handshake.version);
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
	repl_conn_flush(p->link.conn);
	protection_start_replication(p);
	return 0;
}

/*
 * The backup does not speak the version we offered (ERROR(1) during the
 * handshake).  Once, we connect again offering the highest version both
 * speak; when there is none, or the backup refused that one too, the
 * protection fails with the line that names both ranges.
 */
static int on_version_refusal(struct protection *p, const struct repl_error *e)
{
	struct repl_handshake *h = &p->link.handshake;
	uint16_t offered = h->offered;
	uint16_t retry = repl_handshake_on_version_refusal(h, e, p->backup);

	if (retry && p->link.version_retries > 0)
		snprintf(h->error, sizeof(h->error), "backup %s refused replication protocol %u "
			 "on the second attempt too (it now says it speaks %u..%u): %.*s",
			 p->backup, offered, h->backup_range.lo, h->backup_range.hi,
			 (int)e->reason_len, e->reason);
	if (!retry || p->link.version_retries > 0) {
		protection_fail(p, "%s", h->error);
		return -1;
	}
	log_info("vm %s: backup %s speaks replication protocol %u..%u, not %u: connecting "
		 "again with version %u", p->name, p->backup, h->backup_range.lo,
		 h->backup_range.hi, offered, retry);
	p->link.backup_versions = h->backup_range;
	p->link.version_retries++;
	protection_link_stop_timers(p);
	/* Only the handshake used it: nothing else borrows it yet. */
	repl_conn_destroy(p->link.conn);
	p->link.conn = NULL;
	if (protection_link_init(p) < 0) {
		protection_fail(p, "no randomness for the handshake nonce");
		return -1;
	}
	protection_link_connect(p);
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
		if (e.code == REPL_ERR_VERSION &&
		    (p->state == ST_CONNECTING || p->state == ST_AUTHENTICATING))
			return on_version_refusal(p, &e);
		snprintf(why, sizeof(why), "the backup %s refused: %.*s", p->backup,
			 (int)e.reason_len, e.reason);
		protection_reprotect_note_refused(p, e.code);
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
		protection_reprotect_note_unreachable(p);
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

	if (!p->link.conn)
		return (long)p->settings->heartbeat_ms;
	protection_resume_bulk(p);
	/* The heartbeat thread decides liveness; the copy's allowance ends once protected. */
	if (p->link.hb)
		heartbeat_link_set_timeout(p->link.hb,
					   repl_peer_timeout_ms(p->settings,
								p->state == ST_PROTECTED));
	int64_t stream_silent_ms = (now - repl_conn_last_heard_us(p->link.conn)) / 1000;
	bool replicating = p->state == ST_SYNCING || p->state == ST_PROTECTED;
	if (replicating && stream_silent_ms > p->link.stream_max_silence_ms)
		p->link.stream_max_silence_ms = stream_silent_ms;
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
	if (repl_put_heartbeat(out(p), (uint64_t)now, protection_last_epoch(p)) < 0) {
		/* Without heartbeats the backup would declare us dead. */
		backup_failed(p, "cannot queue a heartbeat (out of memory)");
		return (long)p->settings->heartbeat_ms;
	}
	repl_conn_flush(p->link.conn);
	return (long)p->settings->heartbeat_ms;
}

static long on_connect_timeout(event_loop *loop, long long id, void *data)
{
	struct protection *p = data;

	p->link.connect_timer = 0;
	protection_reprotect_note_unreachable(p);
	protection_fail(p, "no answer from the backup at %s within %d ms (is remusdbd "
			"running there with --listen %s?)", p->backup, CONNECT_TIMEOUT_MS,
			p->backup);
	return TIMER_DONE;
}

void protection_link_connect(struct protection *p)
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
		protection_reprotect_note_unreachable(p);
		protection_fail(p, "cannot connect to the backup at %s: %s (is remusdbd "
				"running there with --listen %s?)", p->backup, strerror(e),
				p->backup);
		return;
	}
	struct repl_conn_events ev = {
		.opaque = p, .on_frame = on_frame, .on_closed = on_closed,
		.on_drained = on_drained,
	};
	p->link.conn = repl_conn_create(p->loop, fd, p->backup, &ev);
	if (!p->link.conn) {
		protection_fail(p, "out of memory");
		return;
	}
	protection_set_state(p, ST_CONNECTING);
	p->link.connect_timer = event_loop_add_timer(p->loop, CONNECT_TIMEOUT_MS,
						     on_connect_timeout, p);
	p->link.heartbeat_timer = event_loop_add_timer(p->loop, (long)p->settings->heartbeat_ms,
						       on_heartbeat, p);
	if (p->link.connect_timer < 0 || p->link.heartbeat_timer < 0) {
		p->link.connect_timer = p->link.connect_timer < 0 ? 0 : p->link.connect_timer;
		p->link.heartbeat_timer = p->link.heartbeat_timer < 0 ? 0 : p->link.heartbeat_timer;
		protection_fail(p, "cannot add the connection's timers (out of memory)");
	}
}

struct protection_goodbye protection_link_leave(struct protection *p)
{
	struct protection_goodbye bye = { 0 };

	if (p->link.conn) {
		if (repl_put_bye(out(p), REPL_BYE_UNPROTECT, "unprotect requested") < 0)
			log_warn("vm %s: cannot queue BYE (out of memory): the backup learns "
				 "of the unprotect from the closed connection", p->name);
		repl_conn_flush(p->link.conn);
	}
	bye.conn = p->link.conn;
	p->link.conn = NULL; /* go_unprotected must not close it before the BYE is out */
	bye.hb = bye.conn ? goodbye_heartbeats(p) : NULL;
	return bye;
}

void protection_link_goodbye(struct protection_goodbye *bye)
{
	/* A close could reach the backup as RST without the BYE: a takeover. */
	if (bye->conn)
		say_goodbye(bye->conn, bye->hb);
}

json_t *protection_link_heartbeat_json(const struct protection *p)
{
	return p->link.hb ? heartbeat_link_status_json(p->link.hb) : NULL;
}

int64_t protection_link_stream_max_silence_ms(const struct protection *p)
{
	return p->link.stream_max_silence_ms;
}

void protection_link_reset_stats(struct protection *p)
{
	if (p->link.hb)
		heartbeat_link_reset_stats(p->link.hb);
	p->link.stream_max_silence_ms = 0;
}
