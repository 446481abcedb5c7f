/*
 * Internals shared by the NBD server's files: the export and connection
 * state, and the helpers the two protocol phases use.  nbd_server.c owns
 * sockets and lifetimes; nbd_handshake.c and nbd_transmission.c only
 * parse what is buffered in c->in and queue replies in c->out.
 */
#ifndef REMUSDB_NBD_CONN_H
#define REMUSDB_NBD_CONN_H

#include <stdbool.h>
#include <stddef.h>

#include "base/accept_policy.h"
#include "base/buffer.h"
#include "nbd/disk_file.h"
#include "base/event_loop.h"
#include "base/log.h"
#include "nbd/nbd_server.h"

enum phase {
	PHASE_CLIENT_FLAGS,
	PHASE_OPTIONS,
	PHASE_TRANSMISSION,
	PHASE_CLOSING, /* flush what is queued, then close */
};

struct nbd_conn {
	struct nbd_export *export;
	int fd;
	unsigned id; /* for log lines */
	enum phase phase;
	int no_zeroes;
	unsigned options_seen;
	/*
	 * NBD_OPT_STRUCTURED_REPLY acknowledged: READ answers with chunks
	 * and errors go as error chunks (with a message).
	 */
	bool structured;
	/* base:allocation selected by the last NBD_OPT_SET_META_CONTEXT. */
	bool meta_allocation;
	struct buffer in;
	struct buffer out;
	struct nbd_conn *next;
};

struct nbd_before_write {
	nbd_before_write_fn fn;
	nbd_detach_fn detach;
	void *opaque;
	struct nbd_before_write *next;
};

struct nbd_export {
	event_loop *loop;
	char *name;
	char *socket_path;
	/*
	 * disk.size and disk.path describe what is served.  A read-only
	 * export reads backend instead and has no image (disk.fd is -1).
	 */
	struct disk_file disk;
	bool read_only;
	struct nbd_read_backend backend;
	uint16_t transmission_flags;
	int listen_fd;
	struct accept_policy accept;
	int tcp_listen_fd; /* -1 without TCP */
	struct accept_policy tcp_accept;
	struct nbd_before_write *before_write; /* in registration order */
	unsigned next_conn_id;
	struct nbd_conn *conns;
	struct nbd_export_stats stats;
	nbd_write_hook write_hook;
	void *write_hook_opaque;
	struct read_index *read_index; /* owned; NULL = read tracking off */
};

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
void nbd_conn_log(struct nbd_conn *c, enum log_level level, const char *fmt, ...);
/* Logs a protocol violation (counted as an error); returns -1: close c. */
int nbd_conn_protocol_error(struct nbd_conn *c, const char *what);
/* Appends to c->out.  Returns 0, or -1 (logged) when out of memory. */
int nbd_conn_queue(struct nbd_conn *c, const void *data, size_t len);

/* The id of base:allocation on every connection (ids are per connection). */
#define NBD_CONTEXT_ID_ALLOCATION 1U
/* What c negotiated, as NBD_NEGOTIATED_* bits (nbd_proto.h). */
unsigned nbd_conn_negotiated(const struct nbd_conn *c);
/* The export's transmission flags as this connection sees them. */
uint16_t nbd_conn_transmission_flags(const struct nbd_conn *c);
/*
 * One step of a phase: consumes at most one message from c->in and queues
 * its reply.  Returns 1 after a step, 0 when more bytes are needed, -1
 * when c must be closed (already logged).
 */
int nbd_handshake_step(struct nbd_conn *c);    /* CLIENT_FLAGS, OPTIONS */
int nbd_transmission_step(struct nbd_conn *c); /* TRANSMISSION */

#endif
