/*
 * One client connection of an NBD export, shared by the NBD server's
 * files: its state, its lifetime and socket I/O (nbd_conn.c), and the
 * helpers the two protocol phases use.  nbd_handshake.c and
 * nbd_transmission.c only parse what is buffered in c->in and queue
 * replies in c->out; nbd_server.c accepts the socket and hands it the
 * phases' step function.
 */
#ifndef REMUSDB_NBD_CONN_INTERNAL_H
#define REMUSDB_NBD_CONN_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "base/buffer.h"
#include "base/log.h"
#include "base/loop_worker.h"
#include "nbd/nbd_export_internal.h"
#include "nbd/nbd_proto.h"

enum phase {
	PHASE_CLIENT_FLAGS,
	PHASE_OPTIONS,
	PHASE_TRANSMISSION,
	PHASE_CLOSING, /* flush what is queued, then close */
};

struct nbd_conn;
/*
 * One step of the protocol: consumes at most one message from c->in and
 * queues its reply.  Returns 1 after a step, 0 when more bytes are
 * needed, -1 when c must be closed (already logged).
 */
typedef int (*nbd_conn_step_fn)(struct nbd_conn *c);

struct nbd_conn {
	struct nbd_export *export;
	nbd_conn_step_fn step;
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
	/*
	 * The connection's disk I/O runs on a worker thread of its own
	 * (loop_worker.h), started at its first request: a batch of reads
	 * and writes (nbd_io_batch.c), or the fdatasync of a FLUSH or a FUA
	 * change (nbd_conn_flush_then_reply).  While a job runs the
	 * connection reads and serves no new request, and c->in is left
	 * alone (a batch's writes point into it); the loop serves every
	 * other VM meanwhile.
	 */
	struct loop_worker *worker;
	bool io_pending;
	bool no_worker;               /* none could be had: I/O runs on the loop */
	bool closing;                 /* in nbd_conn_close: a job's end serves nothing more */
	struct nbd_request flush_req; /* the request a flush answers (header only) */
	struct nbd_io_batch *batch;   /* allocated at the first batch */
	struct buffer in;
	struct buffer out;
	struct nbd_conn *next;
};

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
void nbd_conn_log(struct nbd_conn *c, enum log_level level, const char *fmt, ...);
/* Logs a protocol violation (counted as an error); returns -1: close c. */
int nbd_conn_protocol_error(struct nbd_conn *c, const char *what);
/* Appends to c->out.  Returns 0, or -1 (logged) when out of memory. */
int nbd_conn_queue(struct nbd_conn *c, const void *data, size_t len);
/*
 * Makes the export's image durable and only then replies to req
 * (nbd_transmission_flushed queues the reply).  The
 * fdatasync runs on a worker thread unless none can be had; then it runs
 * here.  Returns what the step returns: 0, or -1 when c must be closed.
 */
int nbd_conn_flush_then_reply(struct nbd_conn *c, const struct nbd_request *req);
/* The reply to a request whose flush ended (err: 0 or -errno); -1: close c. */
int nbd_transmission_flushed(struct nbd_conn *c, const struct nbd_request *req, int err);
/*
 * c's worker, started at the first call; NULL (logged once) when none
 * can be had, and the caller does its I/O on the loop.
 */
struct loop_worker *nbd_conn_worker(struct nbd_conn *c);
/* Serves what is buffered, then sends and re-arms; c may be closed after. */
void nbd_conn_serve_buffered(struct nbd_conn *c);

/* Replies shared by the synchronous path and the batches (nbd_transmission.c). */
int nbd_transmission_simple_reply(struct nbd_conn *c, uint32_t error, uint64_t handle);
/* The error reply to req whose I/O failed (err: -errno), logged and counted. */
int nbd_transmission_io_failed(struct nbd_conn *c, const struct nbd_request *req, int err);
/* Queues the successful reply to READ req carrying its len bytes of data. */
int nbd_transmission_read_reply(struct nbd_conn *c, const struct nbd_request *req,
				const uint8_t *data);

/* The id of base:allocation on every connection (ids are per connection). */
#define NBD_CONTEXT_ID_ALLOCATION 1U
/* What c negotiated, as NBD_NEGOTIATED_* bits (nbd_proto.h). */
unsigned nbd_conn_negotiated(const struct nbd_conn *c);
/* The export's transmission flags as this connection sees them. */
uint16_t nbd_conn_transmission_flags(const struct nbd_conn *c);
/*
 * Serves fd (accepted by the export's listener; from says where from in
 * the log line) until the client or the export goes: greets the client,
 * then runs step whenever input is buffered.  Takes fd, closing it on
 * failure (logged).
 */
void nbd_conn_start(struct nbd_export *export, int fd, const char *from,
		    nbd_conn_step_fn step);
/* Unlinks c from its export, closes its socket and frees it. */
void nbd_conn_close(struct nbd_conn *c);

/*
 * The phases' steps (nbd_conn_step_fn), by phase; nbd_server.c runs the
 * one of c's phase.
 */
int nbd_handshake_step(struct nbd_conn *c);    /* CLIENT_FLAGS, OPTIONS */
int nbd_transmission_step(struct nbd_conn *c); /* TRANSMISSION */

#endif
