/*
 * Failure detection: heartbeats sent and checked on a dedicated
 * real-time thread, over UDP beside the replication TCP link.
 *
 * Why a thread of its own, at SCHED_FIFO (as corosync does): on a busy
 * host the event loop and the guests' TCG threads compete for the CPU,
 * and a heartbeat that waits for either measures that competition, not
 * the peer's death.  On this project's 2-core lab, loop-driven heartbeats
 * on the TCP stream went quiet for 400-600 ms with nothing failed, which
 * forced a 1 s timeout.  The thread sends and checks no matter what the
 * loop or the guests do; it only tells the loop, through an eventfd,
 * that a peer has been silent for longer than its timeout.
 *
 * Why a guard on the loop: a daemon whose event loop is wedged must not
 * look alive because its heartbeat thread still runs.  The loop beats a
 * clock every HEARTBEAT_LOOP_BEAT_MS; when it has not for loop_stall_ms,
 * the thread stops sending and the peer declares us dead.
 *
 * One service per daemon, one socket: a backup receives on its
 * replication address (the same port, UDP) and learns each primary's
 * address from its first authenticated datagram; a primary sends to its
 * backup's replication address.  Each replication link is a "link" with
 * its own id, key (heartbeat_wire.h), timeout and statistics.
 */
#ifndef REMUSDB_HEARTBEAT_H
#define REMUSDB_HEARTBEAT_H

#include <jansson.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/event_loop.h"
#include "wire/heartbeat_wire.h"

#define HEARTBEAT_LOOP_BEAT_MS 100
#define HEARTBEAT_DEFAULT_LOOP_STALL_MS 5000
#define HEARTBEAT_DEFAULT_RT_PRIORITY 10
/* Silences are counted per millisecond up to this; longer ones in the last bucket. */
#define HEARTBEAT_SILENCE_BUCKETS 4096

struct heartbeat_service;
struct heartbeat_link;

struct heartbeat_service_config {
	const char *bind_addr;  /* "ADDR:PORT" (a backup's --listen), or NULL: any, ephemeral */
	unsigned interval_ms;   /* how often every link sends */
	int rt_priority;        /* SCHED_FIFO priority 1..99; 0: ordinary scheduling */
	unsigned loop_stall_ms; /* stop sending when the loop has not run for this long */
};

/* Binds the socket and starts the thread; NULL with a message in err. */
struct heartbeat_service *heartbeat_service_create(event_loop *loop,
						   const struct heartbeat_service_config *cfg,
						   char *err, size_t errlen);
/* Stops the thread; every link must have been removed. */
void heartbeat_service_destroy(struct heartbeat_service *s);
/* Whether the thread got its real-time priority, datagrams rejected, ... */
json_t *heartbeat_service_status_json(struct heartbeat_service *s);

/* Called on the loop thread, once, when the peer was silent for longer than the timeout. */
typedef void (*heartbeat_silence_fn)(void *opaque, int64_t silent_ms);

struct heartbeat_link_config {
	uint64_t id;
	uint8_t key[HEARTBEAT_KEY_SIZE];
	bool we_are_primary;
	const struct sockaddr_in *peer; /* NULL: learn it from its first valid datagram */
	unsigned timeout_ms;
	heartbeat_silence_fn on_silence;
	void *opaque;
	/*
	 * The last sequence number a link of the same id sent before this
	 * one replaced it (heartbeat_link_retire); 0 for a new link.  Why:
	 * the peer drops a datagram whose number is not above the last it
	 * accepted (replay protection), so a successor that started again
	 * at 1 would be silent to it.
	 */
	uint64_t first_seq;
};

/* NULL when out of memory, or when a link with this id exists. */
struct heartbeat_link *heartbeat_link_add(struct heartbeat_service *s,
					  const struct heartbeat_link_config *cfg);
/* After this the callback is never called; NULL is ignored. */
void heartbeat_link_remove(struct heartbeat_link *l);
/* heartbeat_link_remove, returning the last sequence number it sent (0 for NULL). */
uint64_t heartbeat_link_retire(struct heartbeat_link *l);
void heartbeat_link_set_timeout(struct heartbeat_link *l, unsigned timeout_ms);
/* When the last valid datagram arrived (monotonic_us), or when the link was added. */
int64_t heartbeat_link_last_heard_us(struct heartbeat_link *l);
/* The silence distribution and counters; reset-stats starts them again. */
json_t *heartbeat_link_status_json(struct heartbeat_link *l);
void heartbeat_link_reset_stats(struct heartbeat_link *l);

/* The silence distribution as numbers, for tests and status. */
struct heartbeat_link_stats {
	uint64_t sent, received, rejected;
	uint64_t silences;          /* gaps counted */
	int64_t max_silence_ms;
	unsigned p50_ms, p99_ms, p999_ms;
	int64_t last_heard_age_ms;
	unsigned timeout_ms;
	bool peer_known, expired;
};
void heartbeat_link_get_stats(struct heartbeat_link *l, struct heartbeat_link_stats *st);

#endif
