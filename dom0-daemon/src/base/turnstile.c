/*
 * Turns handed on in arrival order (turnstile.h says what for).  All on
 * the event loop: no locking.  The queue and the holders are small arrays
 * (one entry per VM at most), so removal by moving the tail is enough.
 *
 * Invariant outside hand_on(): a free turn means an empty queue.
 */
#include "base/turnstile.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"

struct turn_holder {
	void *holder;
	int64_t since_us;
};

struct turn_waiter {
	void *holder;
	turnstile_wake_fn wake;
};

struct turnstile {
	event_loop *loop;
	unsigned slots;
	unsigned max_hold_ms;
	turnstile_name_fn name;
	struct turn_holder *holders; /* slots entries, `held` in use */
	unsigned held;
	struct turn_waiter *queue;
	unsigned waiting, queue_cap;
	void *offered;   /* the waiter being woken: it may take the free turn */
	bool handing_on; /* a give-back inside a wake leaves the handing to the outer loop */
	long long watch_timer;
	uint64_t granted, waited, taken_away;
};

struct turnstile *turnstile_create(event_loop *loop, unsigned slots, unsigned max_hold_ms,
				   turnstile_name_fn name)
{
	struct turnstile *t = calloc(1, sizeof(*t));

	if (!t)
		return NULL;
	t->loop = loop;
	t->slots = slots;
	t->max_hold_ms = max_hold_ms ? max_hold_ms : 1;
	t->name = name;
	if (slots && !(t->holders = calloc(slots, sizeof(*t->holders)))) {
		free(t);
		return NULL;
	}
	return t;
}

void turnstile_destroy(struct turnstile *t)
{
	if (!t)
		return;
	if (t->watch_timer)
		event_loop_del_timer(t->loop, t->watch_timer);
	free(t->holders);
	free(t->queue);
	free(t);
}

static int holder_index(const struct turnstile *t, const void *holder)
{
	for (unsigned i = 0; i < t->held; i++)
		if (t->holders[i].holder == holder)
			return (int)i;
	return -1;
}

static int waiter_index(const struct turnstile *t, const void *holder)
{
	for (unsigned i = 0; i < t->waiting; i++)
		if (t->queue[i].holder == holder)
			return (int)i;
	return -1;
}

static void remove_holder(struct turnstile *t, unsigned i)
{
	t->holders[i] = t->holders[--t->held];
}

/* In order: the queue is first come, first served. */
static void remove_waiter(struct turnstile *t, unsigned i)
{
	memmove(&t->queue[i], &t->queue[i + 1], (t->waiting - i - 1) * sizeof(*t->queue));
	t->waiting--;
}

static void hand_on(struct turnstile *t)
{
	if (t->handing_on)
		return;
	t->handing_on = true;
	while (t->held < t->slots && t->waiting > 0) {
		struct turn_waiter w = t->queue[0];

		remove_waiter(t, 0);
		t->offered = w.holder;
		w.wake(w.holder); /* takes the turn, or lets it go to the next */
		t->offered = NULL;
	}
	t->handing_on = false;
}

/* A turn is taken away at most a quarter of max_hold_ms late. */
static long watch_period_ms(const struct turnstile *t)
{
	return t->max_hold_ms >= 4 ? (long)(t->max_hold_ms / 4) : 1;
}

/* Takes the turns of holders past max_hold_ms away; runs while any is held. */
static long watch_holders(event_loop *loop, long long id, void *data)
{
	struct turnstile *t = data;
	int64_t now = monotonic_us();

	(void)loop;
	(void)id;
	for (unsigned i = 0; i < t->held;) {
		int64_t held_ms = (now - t->holders[i].since_us) / 1000;

		if (held_ms < (int64_t)t->max_hold_ms) {
			i++;
			continue;
		}
		log_warn("%s kept its checkpoint pause turn for %lld ms (at most %u): "
			 "the next VM's checkpoint goes on", t->name ?
			 t->name(t->holders[i].holder) : "a holder",
			 (long long)held_ms, t->max_hold_ms);
		t->taken_away++;
		remove_holder(t, i);
	}
	hand_on(t);
	if (t->held)
		return watch_period_ms(t);
	t->watch_timer = 0;
	return TIMER_DONE;
}

static void hold(struct turnstile *t, void *holder)
{
	t->holders[t->held].holder = holder;
	t->holders[t->held].since_us = monotonic_us();
	t->held++;
	t->granted++;
	if (!t->watch_timer) {
		long long id = event_loop_add_timer(t->loop, watch_period_ms(t),
						    watch_holders, t);
		t->watch_timer = id > 0 ? id : 0;
	}
}

bool turnstile_take(struct turnstile *t, void *holder, turnstile_wake_fn wake)
{
	if (!t->slots) {
		t->granted++;
		return true;
	}
	if (holder_index(t, holder) >= 0)
		return true;
	if (t->held < t->slots && (t->waiting == 0 || holder == t->offered)) {
		if (holder == t->offered)
			t->waited++;
		hold(t, holder);
		return true;
	}
	if (waiter_index(t, holder) >= 0)
		return false;
	if (t->waiting == t->queue_cap) {
		unsigned cap = t->queue_cap ? 2 * t->queue_cap : 8;
		struct turn_waiter *q = realloc(t->queue, cap * sizeof(*q));

		if (!q) {
			/* Cannot queue: better a shared pause than a checkpoint never asked for. */
			log_error("turnstile: out of memory; a checkpoint goes on without its turn");
			return true;
		}
		t->queue = q;
		t->queue_cap = cap;
	}
	t->queue[t->waiting].holder = holder;
	t->queue[t->waiting].wake = wake;
	t->waiting++;
	return false;
}

void turnstile_give_back(struct turnstile *t, void *holder)
{
	int i;

	if (!t || !t->slots)
		return;
	if ((i = holder_index(t, holder)) >= 0) {
		remove_holder(t, (unsigned)i);
		hand_on(t);
	} else if ((i = waiter_index(t, holder)) >= 0) {
		remove_waiter(t, (unsigned)i);
	}
	if (t->offered == holder)
		t->offered = NULL;
}

bool turnstile_holds(const struct turnstile *t, const void *holder)
{
	return t && t->slots && holder_index(t, holder) >= 0;
}

struct turnstile_stats turnstile_stats(const struct turnstile *t)
{
	struct turnstile_stats s = {
		.slots = t->slots, .held = t->held, .waiting = t->waiting,
		.granted = t->granted, .waited = t->waited, .taken_away = t->taken_away,
	};

	return s;
}
