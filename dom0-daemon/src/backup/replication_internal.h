/*
 * Internals of the backup side shared by its files: replication_server.c
 * (the listener, sessions, handshake and liveness) and the files that
 * handle a configured session's frames (replica_stream.c and the
 * features it hands frames to), which answer and end the session.
 */
#ifndef REMUSDB_REPLICATION_INTERNAL_H
#define REMUSDB_REPLICATION_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "base/accept_policy.h"
#include "wire/heartbeat.h"
#include "wire/repl_conn.h"
#include "wire/repl_handshake.h"
#include "backup/replica.h"
#include "backup/replication_server.h"

/* A primary that has not authenticated within this is dropped (the default
 * of repl_settings.handshake_timeout_ms). */
#define HANDSHAKE_TIMEOUT_MS 5000

enum session_state { SESSION_HELLO_SENT, SESSION_AUTHENTICATED, SESSION_CONFIGURED };

struct session {
	struct replication_server *server;
	struct repl_conn *conn;
	enum session_state state;
	struct repl_handshake handshake; /* from the accept on: our HELLO opens it */
	char peer[64];
	struct replica *replica;
	struct heartbeat_link *hb; /* the primary's liveness, from authentication on */
	long long timer;
	int64_t started_us;
	bool refused;      /* we sent ERROR: the primary is alive, not dead */
	struct session *next;
};

struct replication_server {
	event_loop *loop;
	const struct repl_settings *settings;
	struct vm_registry *vms;
	int listen_fd;
	struct accept_policy accept;
	int64_t refusal_logged_us;  /* refusals are logged at most once a second */
	unsigned refused_unlogged;
	char listen_addr[64];
	struct session *sessions;
	struct replica_set replicas;
	const struct page_decoder *decoder; /* given to each new replica */
	long long retire_timer;             /* replica_retire.c */
	struct lingering_refusal *lingering; /* refused connections saying goodbye */
};

/* replication_server.c: sessions */
void session_free(struct session *ss);
/*
 * What the replicas holding an image were admitted with (replica_memory.h),
 * summed saturating, but for `except` (NULL: none): admission's "in use"
 * and status's host memory, counted one way.
 */
struct admitted_memory {
	uint64_t total;          /* their admitted needs */
	uint64_t protected_ram;  /* their images: the guests' RAM */
	unsigned replicas;
};
struct admitted_memory replication_server_admitted(const struct replication_server *s,
						   const struct replica *except);
/* The primary is gone or broke the protocol: arbitrate, or say why and stay passive. */
void session_lost(struct session *ss, const char *why, bool primary_dead);
/* Drops the replica's connection to its primary, if any (a takeover won or lost). */
void replica_detach_session(struct replica *r, const char *why);

/* session_error.c */
/* Tells the primary why (ERROR) before the connection closes. */
void session_send_error(struct session *ss, uint16_t code, const char *reason);
/* An ERROR(protocol) that also becomes the replica's error; returns -1. */
int session_protocol_error(struct session *ss, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

#endif
