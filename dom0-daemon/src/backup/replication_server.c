/*
 * The backup side: the replication listener, each primary's session
 * (handshake, heartbeat liveness, loss, BYE) and the list of replicas in
 * status (replica.c keeps them, replica_status.c describes each).  A
 * configured session's other frames go to replica_stream.c.
 */
#include "backup/replication_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/accept_policy.h"
#include "base/fs_util.h"
#include "base/host_memory.h"
#include "base/log.h"
#include "codec/page_coding.h"
#include "wire/repl_auth.h"
#include "wire/repl_conn.h"
#include "wire/heartbeat.h"
#include "wire/repl_handshake.h"
#include "backup/replica.h"
#include "backup/replica_status.h"

/* How long a refused primary may take to read our ERROR and close (session_free). */
#define REFUSAL_LINGER_MS 2000

#include "backup/replication_internal.h"

/* ---- sessions --------------------------------------------------------- */

/*
 * After our ERROR the primary may still be sending: closing on its unread
 * bytes would reset the connection, and a reset can reach it before it
 * reads the ERROR.  So a refusal lingers: FIN after the ERROR, its bytes
 * drained until it closes (or REFUSAL_LINGER_MS).  The server keeps the
 * lingering connections, so that its destruction ends them.
 */
struct lingering_refusal {
	struct replication_server *server;
	struct repl_conn *conn;
	struct lingering_refusal *next;
};

static void lingering_freed(void *opaque)
{
	struct lingering_refusal *l = opaque;

	for (struct lingering_refusal **p = &l->server->lingering; *p; p = &(*p)->next)
		if (*p == l) {
			*p = l->next;
			break;
		}
	free(l);
}

static void linger_after_refusal(struct replication_server *s, struct repl_conn *conn)
{
	struct lingering_refusal *l = calloc(1, sizeof(*l));

	if (!l) {
		repl_conn_destroy(conn); /* out of memory: the plain close it was before */
		return;
	}
	l->server = s;
	l->conn = conn;
	l->next = s->lingering;
	s->lingering = l;
	repl_conn_on_freed(conn, lingering_freed, l);
	repl_conn_finish(conn, REFUSAL_LINGER_MS);
}

void session_free(struct session *ss)
{
	struct replication_server *s = ss->server;

	for (struct session **l = &s->sessions; *l; l = &(*l)->next)
		if (*l == ss) {
			*l = ss->next;
			break;
		}
	if (ss->timer)
		event_loop_del_timer(s->loop, ss->timer);
	if (ss->hb) {
		struct heartbeat_link_stats st;
		heartbeat_link_get_stats(ss->hb, &st);
		if (ss->replica) {
			/* What status shows of this link once it is gone. */
			ss->replica->last_heard_us = heartbeat_link_last_heard_us(ss->hb);
			if (st.max_silence_ms > ss->replica->max_silence_ms)
				ss->replica->max_silence_ms = st.max_silence_ms;
		}
		heartbeat_link_remove(ss->hb);
	}
	if (ss->replica && ss->replica->session == ss) {
		ss->replica->session = NULL;
		coded_pages_drop_pending(ss->replica);
	}
	if (ss->refused)
		linger_after_refusal(s, ss->conn);
	else
		repl_conn_destroy(ss->conn);
	free(ss);
}

/*
 * The primary is gone or broke the protocol.  A replica that can take
 * over arbitrates; one that cannot says why and stays passive.
 */
void session_lost(struct session *ss, const char *why, bool primary_dead)
{
	struct replica *r = ss->replica;

	if (r && r->session == ss) {
		r->session = NULL;
		if (primary_dead && r->state == REPLICA_READY) {
			session_free(ss);
			failover_primary_lost(r, why);
			return;
		}
		if (r->state == REPLICA_RECEIVING || r->state == REPLICA_READY) {
			char reason[sizeof(r->error)];
			/* A protocol error already said what went wrong: keep it. */
			snprintf(reason, sizeof(reason), "%s", ss->refused && r->error[0] ?
				 r->error : why);
			snprintf(r->error, sizeof(r->error), "%.400s%s", reason,
				 r->state == REPLICA_RECEIVING ? " (before the replica was "
				 "complete: nothing to take over)" : "");
			log_error("vm %s: primary lost: %s", r->name, r->error);
			/* A goodbye leaves a whole copy: a later protection may resync it. */
			if (!primary_dead && !ss->refused)
				replica_seal_disk_after_goodbye(r);
			replica_drop_image(r);
			/* Dead or refused by us: failed.  A goodbye: passive. */
			replica_set_state(r, primary_dead || ss->refused ? REPLICA_FAILED
								   : REPLICA_PASSIVE);
		}
	} else {
		log_info("replication: %s: %s", ss->peer, why);
	}
	session_free(ss);
}

/* ---- liveness ---------------------------------------------------------- */

/*
 * The primary was silent past its timeout (what names the evidence).
 * Returns true when the session is gone.
 */
static bool primary_silent(struct session *ss, int64_t silent_ms, unsigned timeout_ms,
			   const char *what)
{
	struct replica *r = ss->replica;
	char why[160];

	if (ss->state != SESSION_CONFIGURED || (r && r->state == REPLICA_ARBITRATING))
		return false;
	snprintf(why, sizeof(why), "no %s from the primary for %lld ms (timeout %u ms)", what,
		 (long long)silent_ms, timeout_ms);
	if (r)
		failover_note_silence(r, silent_ms);
	if (r && r->state == REPLICA_READY) {
		/*
		 * The connection stays open while etcd decides: a primary
		 * that is only slow must not read our close as our death
		 * and race us.  Winning drops it.
		 */
		failover_primary_lost(r, why);
		return false;
	}
	session_lost(ss, why, true);
	return true;
}

static unsigned peer_timeout_ms(const struct session *ss)
{
	const struct replica *r = ss->replica;

	return repl_peer_timeout_ms(ss->server->settings, !r || r->state != REPLICA_RECEIVING);
}

static void on_primary_silence(void *opaque, int64_t silent_ms)
{
	struct session *ss = opaque;

	primary_silent(ss, silent_ms, peer_timeout_ms(ss), "heartbeat");
}

/* ---- handshake ---------------------------------------------------------- */

static int on_handshake(struct session *ss, const struct repl_frame *f)
{
	const struct repl_settings *s = ss->server->settings;
	struct repl_handshake *h = &ss->handshake;

	switch (repl_handshake_on_frame(h, f, repl_conn_out(ss->conn))) {
	case REPL_HANDSHAKE_FAILED:
		session_send_error(ss, h->error_code, h->error);
		return -1;
	case REPL_HANDSHAKE_MORE:
		return 0;
	case REPL_HANDSHAKE_DONE:
		break;
	}
	repl_conn_flush(ss->conn);
	ss->state = SESSION_AUTHENTICATED;
	log_info("replication: primary %s (%s) authenticated, replication protocol %u",
		 h->peer_name, ss->peer, h->version);
	/* Its heartbeats tell us its address; ours go back there. */
	struct heartbeat_link_config c = {
		.timeout_ms = repl_peer_timeout_ms(s, false),
		.on_silence = on_primary_silence, .opaque = ss,
	};
	if (repl_handshake_link_secret(h, &c.id, c.key) < 0 ||
	    !(ss->hb = heartbeat_link_add(s->heartbeats, &c))) {
		session_protocol_error(ss, "cannot start heartbeats (out of memory, or a heartbeat "
			       "link with the same id exists)");
		return -1;
	}
	return 0;
}

/*
 * The primary ends the session: it asks for a takeover (a READY replica
 * arbitrates), or protection ended (the replica stays, passive).
 */
static int on_bye(struct session *ss, const struct repl_frame *f)
{
	struct replica *r = ss->replica;
	struct repl_bye b;
	const char *err;

	if (repl_decode_bye(f, &b, &err) < 0)
		return session_protocol_error(ss, "%s", err);
	if (b.reason == REPL_BYE_TAKEOVER && r->state == REPLICA_READY) {
		char why[300];
		snprintf(why, sizeof(why), "the primary asks for a takeover: %.*s",
			 (int)b.text_len, b.text);
		session_lost(ss, why, true);
		return 0; /* ss is gone */
	}
	log_info("vm %s: the primary ended protection (%.*s): replica discarded",
		 r->name, (int)b.text_len, b.text);
	r->error[0] = '\0';
	session_lost(ss, "the primary ended protection", false);
	return 0;
}

static int on_session_frame(void *opaque, const struct repl_frame *f)
{
	struct session *ss = opaque;

	switch (ss->state) {
	case SESSION_HELLO_SENT:
		return on_handshake(ss, f);
	case SESSION_AUTHENTICATED:
		if (f->type == REPL_VM_CONFIG)
			return replica_on_vm_config(ss, f);
		if (f->type == REPL_HEARTBEAT)
			return 0;
		break;
	case SESSION_CONFIGURED:
		return f->type == REPL_BYE ? on_bye(ss, f) : replica_on_frame(ss, f);
	}
	char why[96];
	snprintf(why, sizeof(why), "unexpected %s during the handshake",
		 repl_type_name(f->type));
	session_send_error(ss, REPL_ERR_PROTOCOL, why);
	return -1;
}

static void on_session_closed(void *opaque, const char *why)
{
	struct session *ss = opaque;
	struct replica *r = ss->replica;

	/* A READY replica waits for the failure detector (failover_primary_closed says why). */
	if (!ss->refused && r && r->session == ss && r->state == REPLICA_READY) {
		unsigned timeout_ms = peer_timeout_ms(ss);
		r->session = NULL;
		session_free(ss); /* notes when the primary's last heartbeat came */
		failover_primary_closed(r, why, timeout_ms);
		return;
	}
	/* After our ERROR the primary lives on: nothing to take over. */
	session_lost(ss, why, !ss->refused);
}

static long on_session_timer(event_loop *loop, long long id, void *data)
{
	struct session *ss = data;
	const struct repl_settings *s = ss->server->settings;
	int64_t now = monotonic_us();

	unsigned handshake_ms = s->handshake_timeout_ms ? s->handshake_timeout_ms
							: HANDSHAKE_TIMEOUT_MS;
	if (ss->state != SESSION_CONFIGURED && now - ss->started_us > handshake_ms * 1000LL) {
		char why[64];

		snprintf(why, sizeof(why), "no handshake within %u ms", handshake_ms);
		ss->timer = 0;
		session_lost(ss, why, false);
		return TIMER_DONE;
	}
	/* The heartbeat thread decides liveness; the copy's allowance ends once ready. */
	if (ss->hb)
		heartbeat_link_set_timeout(ss->hb, peer_timeout_ms(ss));
	int64_t stream_silent_ms = (now - repl_conn_last_heard_us(ss->conn)) / 1000;
	if (ss->replica && ss->state == SESSION_CONFIGURED &&
	    stream_silent_ms > ss->replica->stream_max_silence_ms)
		ss->replica->stream_max_silence_ms = stream_silent_ms;
	if (stream_silent_ms > REPL_STREAM_SILENCE_MS) {
		long long timer = ss->timer;
		ss->timer = 0; /* we are inside it: session_free must not delete it */
		if (primary_silent(ss, stream_silent_ms, REPL_STREAM_SILENCE_MS,
				   "byte on the replication stream"))
			return TIMER_DONE;
		ss->timer = timer;
	}
	if (ss->state == SESSION_CONFIGURED) {
		if (repl_put_heartbeat(repl_conn_out(ss->conn), (uint64_t)now,
				       ss->replica ? ss->replica->committed_epoch : 0) < 0) {
			/* Silent, we would look dead to the primary: say so and stop. */
			ss->timer = 0;
			session_protocol_error(ss, "cannot queue a heartbeat (out of memory)");
			session_lost(ss, "cannot queue a heartbeat (out of memory)", false);
			return TIMER_DONE;
		}
		repl_conn_flush(ss->conn);
	}
	return (long)s->heartbeat_ms;
}

static unsigned unauthenticated_sessions(const struct replication_server *s)
{
	unsigned n = 0;

	for (const struct session *ss = s->sessions; ss; ss = ss->next)
		n += ss->state == SESSION_HELLO_SENT;
	return n;
}

/* A flood of connections must not become a flood of log lines. */
static void refuse_unauthenticated(struct replication_server *s, int cfd,
				   const char *peer)
{
	int64_t now = monotonic_us();

	close(cfd);
	s->refused_unlogged++;
	if (now - s->refusal_logged_us < 1000000)
		return;
	log_warn("replication: refusing the connection from %s: %d connections have "
		 "not authenticated yet (the limit); %u refused since the last such line, "
		 "this one included", peer, REPL_MAX_UNAUTHENTICATED_SESSIONS,
		 s->refused_unlogged);
	s->refusal_logged_us = now;
	s->refused_unlogged = 0;
}

static void on_accept(event_loop *loop, int fd, void *data, int ready)
{
	struct replication_server *s = data;

	for (;;) {
		struct sockaddr_in addr;
		socklen_t alen = sizeof(addr);
		int cfd = accept_policy_accept(&s->accept, (struct sockaddr *)&addr, &alen);
		int one = 1;

		if (cfd < 0)
			return;
		char ip[INET_ADDRSTRLEN] = "?", peer[64];
		inet_ntop(AF_INET, &addr.sin_addr, ip, sizeof(ip));
		snprintf(peer, sizeof(peer), "%s:%u", ip, ntohs(addr.sin_port));
		if (unauthenticated_sessions(s) >= REPL_MAX_UNAUTHENTICATED_SESSIONS) {
			refuse_unauthenticated(s, cfd, peer);
			continue;
		}
		setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		struct session *ss = calloc(1, sizeof(*ss));
		if (!ss) {
			log_error("replication: out of memory for the connection from %s", peer);
			close(cfd);
			continue;
		}
		snprintf(ss->peer, sizeof(ss->peer), "%s", peer);
		ss->server = s;
		ss->started_us = monotonic_us();
		struct repl_conn_events ev = {
			.opaque = ss, .on_frame = on_session_frame,
			.on_closed = on_session_closed,
		};
		/* repl_conn_create closes cfd when it fails. */
		ss->conn = repl_conn_create(loop, cfd, ss->peer, &ev);
		if (!ss->conn || repl_handshake_init(&ss->handshake, REPL_ROLE_BACKUP,
						     s->settings->psk, s->settings->psk_len,
						     s->settings->host, NULL) < 0) {
			log_error("replication: cannot take the connection from %s: %s",
				  peer, ss->conn ? "no random nonce" : "out of memory or epoll");
			repl_conn_destroy(ss->conn);
			free(ss);
			continue;
		}
		ss->next = s->sessions;
		s->sessions = ss;
		log_info("replication: connection from %s", ss->peer);
		if (!s->settings->psk_len) {
			session_send_error(ss, REPL_ERR_REFUSED, "this backup has no pre-shared key "
				   "(start remusdbd with --psk-file)");
			session_free(ss);
			continue;
		}
		ss->timer = event_loop_add_timer(loop, (long)s->settings->heartbeat_ms,
						 on_session_timer, ss);
		/* Without its timer the handshake timeout would never drop it. */
		if (ss->timer < 0 ||
		    repl_handshake_put_hello(&ss->handshake, repl_conn_out(ss->conn)) < 0) {
			log_error("replication: out of memory greeting %s; closing", ss->peer);
			if (ss->timer < 0)
				ss->timer = 0;
			session_free(ss);
			continue;
		}
		repl_conn_flush(ss->conn);
	}
}

struct replication_server *replication_server_create(event_loop *loop,
						     const struct repl_settings *settings,
						     const char *listen_addr,
						     struct vm_registry *vms,
						     char *err, size_t errlen)
{
	struct sockaddr_in addr;
	int one = 1;

	if (repl_parse_address(listen_addr, &addr, err, errlen) < 0)
		return NULL;
	if (!settings->heartbeats) {
		snprintf(err, errlen, "a backup needs the heartbeat thread to tell a dead "
			 "primary from a live one");
		return NULL;
	}
	struct replication_server *s = calloc(1, sizeof(*s));
	if (!s) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	s->loop = loop;
	s->settings = settings;
	s->vms = vms;
	s->decoder = &page_decoder_default;
	snprintf(s->listen_addr, sizeof(s->listen_addr), "%s", listen_addr);
	s->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (s->listen_fd < 0 ||
	    setsockopt(s->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(s->listen_fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 ||
	    listen(s->listen_fd, 16) < 0 ||
	    accept_policy_start(&s->accept, loop, s->listen_fd, "replication listener",
				on_accept, s) < 0) {
		snprintf(err, errlen, "cannot listen on %s: %s", listen_addr, strerror(errno));
		if (s->listen_fd >= 0)
			close(s->listen_fd);
		free(s);
		return NULL;
	}
	s->retire_timer = event_loop_add_timer(loop, 1000, replica_retire_tick, s);
	log_info("replication: listening on %s", listen_addr);
	return s;
}

void replication_server_set_page_decoder(struct replication_server *s,
					 const struct page_decoder *decoder)
{
	s->decoder = decoder ? decoder : &page_decoder_default;
}

void replication_server_destroy(struct replication_server *s)
{
	if (!s)
		return;
	while (s->sessions)
		session_free(s->sessions);
	while (s->lingering)
		repl_conn_destroy(s->lingering->conn); /* lingering_freed unlinks it */
	replica_set_free_all(&s->replicas);
	if (s->retire_timer > 0)
		event_loop_del_timer(s->loop, s->retire_timer);
	accept_policy_stop(&s->accept);
	close(s->listen_fd);
	free(s);
}

int replication_server_failover(struct replication_server *s, const char *vm,
				char *err, size_t errlen)
{
	struct replica *r = replica_set_find(&s->replicas, vm);

	if (!r) {
		snprintf(err, errlen, "this host holds no replica of VM '%.40s'", vm);
		return -1;
	}
	if (r->state != REPLICA_READY) {
		snprintf(err, errlen, "the replica of %s is %s, not ready: %s", vm,
			 replica_state_name(r->state),
			 r->state == REPLICA_RECEIVING ? "wait for the initial copy to "
			 "finish" : "nothing to take over");
		return -1;
	}
	failover_primary_lost(r, "manual failover");
	return 0;
}

int replication_server_image_checksums(struct replication_server *s, const char *vm,
				       const char *block, const char *path, char *err,
				       size_t errlen)
{
	struct replica *r = replica_set_find(&s->replicas, vm);

	if (!r) {
		snprintf(err, errlen, "this host holds no replica of VM '%.40s'", vm);
		return -1;
	}
	return replica_checksums_start(r, block, path, err, errlen);
}

void replica_detach_session(struct replica *r, const char *why)
{
	struct session *ss = r->session;

	if (!ss)
		return;
	r->session = NULL;
	ss->replica = NULL;
	log_info("vm %s: closing the connection from the primary: %s", r->name, why);
	session_free(ss);
}

struct admitted_memory replication_server_admitted(const struct replication_server *s,
						   const struct replica *except)
{
	struct admitted_memory m = { 0, 0, 0 };

	for (const struct replica *r = s->replicas.first; r; r = r->next) {
		if (r == except || !r->image)
			continue;
		m.total = replica_memory_add(m.total, replica_memory_total(&r->memory));
		m.protected_ram = replica_memory_add(m.protected_ram, r->memory.image);
		m.replicas++;
	}
	return m;
}

json_t *replication_server_memory_json(const struct replication_server *s)
{
	struct admitted_memory m = replication_server_admitted(s, NULL);
	uint64_t protected_bytes = m.protected_ram, rss = host_memory_self_rss();

	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:o}",
			 "limit_bytes", (json_int_t)s->settings->memory_limit,
			 "admitted_bytes", (json_int_t)m.total,
			 "replicas", (json_int_t)m.replicas,
			 "protected_ram_bytes", (json_int_t)protected_bytes,
			 "daemon_rss_bytes", (json_int_t)rss,
			 "daemon_rss_per_protected_gib", protected_bytes && rss ?
			 json_real((double)rss / ((double)protected_bytes / (1ULL << 30))) :
			 json_null());
}

json_t *replication_server_status_json(const struct replication_server *s)
{
	json_t *all = json_array();
	int64_t now = monotonic_us();

	for (const struct replica *r = s->replicas.first; r && all; r = r->next) {
		json_t *o = replica_status_json(r, r->session ? r->session->hb : NULL, now);
		if (o)
			json_array_append_new(all, o);
	}
	return all;
}
