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

#include "base/buffer.h"
#include "base/event_loop.h"
#include "wire/repl_proto.h"

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
/*
 * Ends the connection politely instead: what is queued (a BYE) goes out,
 * then a FIN (shutdown SHUT_WR), and whatever the peer still sends is read
 * and dropped until it closes too, or timeout_ms pass.  Why not close():
 * close() with unread bytes in the receive queue (the peer's acks) sends
 * RST, and an RST throws away what the kernel has not sent yet, so the
 * peer would see a dead primary instead of a BYE.  The same holds for an
 * ERROR after a frame the owner refused (its on_frame failed): the
 * connection then lingers too, since only the owner, not the peer, ended
 * it.  One the peer closed or reset is freed at once.  The owner's
 * callbacks are never called again and the connection frees itself:
 * forget it.
 */
void repl_conn_finish(struct repl_conn *conn, unsigned timeout_ms);
/*
 * fn(opaque) is called once, when the connection is freed (also after
 * repl_conn_finish): for what must last exactly as long as the goodbye,
 * such as the heartbeats that tell the peer we are alive meanwhile.
 */
void repl_conn_on_freed(struct repl_conn *conn, void (*fn)(void *opaque), void *opaque);

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
