/*
 * One replication connection between a primary and a backup remusdbd:
 * a non-blocking TCP socket on the event loop that cuts the byte stream
 * into protocol frames (repl_proto.h) and queues outgoing ones.
 *
 * Both roles use it; the protocol logic (handshake, epochs, heartbeats)
 * stays with the owner, which hears of every frame and of the end of the
 * connection through callbacks.  The outgoing queue is unbounded on
 * purpose: it is the primary's staging area for checkpoints, which must
 * be taken whole while the VM is paused; the owner bounds it by holding
 * back checkpoints (repl_conn_backlog).
 */
#ifndef REMUSDB_REPL_CONN_H
#define REMUSDB_REPL_CONN_H

#include <stddef.h>
#include <stdint.h>

#include "buffer.h"
#include "event_loop.h"
#include "repl_proto.h"

struct repl_conn;

struct repl_conn_events {
	void *opaque;
	/* A whole frame.  Nonzero return: protocol error, the owner closes. */
	int (*on_frame)(void *opaque, const struct repl_frame *frame);
	/*
	 * The connection ended (peer closed, I/O error, malformed frame).
	 * why says which.  The owner must destroy the connection (it may do
	 * so from inside this callback).
	 */
	void (*on_closed)(void *opaque, const char *why);
	/* The outgoing queue drained (optional): a place to add more. */
	void (*on_drained)(void *opaque);
};

/* Takes ownership of a connected (or connecting) non-blocking socket. */
struct repl_conn *repl_conn_create(event_loop *loop, int fd, const char *peer,
				   const struct repl_conn_events *events);
void repl_conn_destroy(struct repl_conn *conn);

/* The outgoing queue: append whole frames, then call repl_conn_flush. */
struct buffer *repl_conn_out(struct repl_conn *conn);
void repl_conn_flush(struct repl_conn *conn);
size_t repl_conn_backlog(const struct repl_conn *conn);
/* When a byte last arrived from the peer (monotonic us). */
int64_t repl_conn_last_heard_us(const struct repl_conn *conn);
uint64_t repl_conn_bytes_sent(const struct repl_conn *conn);

/*
 * "ADDR:PORT" (IPv4) to a sockaddr; -1 with a message in err when it is
 * not one.  Port 0 and missing ports are errors.
 */
struct sockaddr_in;
int repl_parse_address(const char *text, struct sockaddr_in *out, char *err,
		       size_t errlen);

#endif
