/*
 * Turns that a few holders at a time may have, handed on in the order they
 * were asked for.  remusdbd gives them to checkpoint pauses: one daemon
 * reads every VM's checkpoint on one event loop and the host's cores are
 * shared, so two VMs paused at once each wait for the other's stream.  A
 * VM that waits for a turn keeps running (its CHECKPOINT_REPLY is what
 * waits), so its pause stays its own (docs/architecture.md, "Pause turns").
 *
 * A holder that keeps a turn longer than max_hold_ms loses it (logged and
 * counted): a missed give-back must not stop every other VM's checkpoints.
 */
#ifndef REMUSDB_TURNSTILE_H
#define REMUSDB_TURNSTILE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/event_loop.h"

struct turnstile;

/* Called on the loop when a turn is free for a waiting holder: it asks again. */
typedef void (*turnstile_wake_fn)(void *holder);
/* The holder's name, for the log line of a turn taken away. */
typedef const char *(*turnstile_name_fn)(void *holder);

struct turnstile_stats {
	unsigned slots;        /* turns at once; 0: unlimited (nobody waits) */
	unsigned held;         /* turns held now */
	unsigned waiting;      /* holders in the queue now */
	uint64_t granted;      /* turns ever taken */
	uint64_t waited;       /* of those, turns that had to wait in the queue */
	uint64_t taken_away;   /* turns held past max_hold_ms */
};

/* slots 0: every take succeeds at once (the turnstile only counts). NULL: out of memory. */
struct turnstile *turnstile_create(event_loop *loop, unsigned slots, unsigned max_hold_ms,
				   turnstile_name_fn name);
void turnstile_destroy(struct turnstile *t);

/*
 * True when holder has a turn (just taken, or held already).  False: it
 * waits in the queue, and wake(holder) runs once a turn is free for it;
 * a holder that does not take the turn from inside wake leaves the queue.
 */
bool turnstile_take(struct turnstile *t, void *holder, turnstile_wake_fn wake);
/* Gives back holder's turn, or takes it out of the queue; no-op otherwise. */
void turnstile_give_back(struct turnstile *t, void *holder);
bool turnstile_holds(const struct turnstile *t, const void *holder);
struct turnstile_stats turnstile_stats(const struct turnstile *t);

#endif
