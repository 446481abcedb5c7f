/*
 * How long the event loop is held: a histogram of its turns.
 *
 * A turn is one pass of event_loop_run_once after epoll_wait returns: the
 * handlers of the ready descriptors, then the due timers.  Every VM of the
 * host shares the loop, so whatever one VM's handlers do in a turn, every
 * other VM's event that became ready meanwhile waits for: a quiet VM's
 * "QEMU has stopped" message (VMSTATE_SEND) sits in its socket until the
 * turn that is reading a busy VM's checkpoint ends.  The histogram says
 * how long turns are and what share of the time the loop is busy; it is
 * cumulative since the daemon started, so a reader compares two readings
 * for a window of its own (as Prometheus does with rate()).
 *
 * Counters only: observing a turn costs no allocation and O(buckets).
 */
#ifndef REMUSDB_LOOP_TURNS_H
#define REMUSDB_LOOP_TURNS_H

#include <stdint.h>

#include <jansson.h>

#define LOOP_TURN_BUCKETS 11

/* Upper bounds of the buckets, in milliseconds (Prometheus' `le`). */
extern const double loop_turn_bounds_ms[LOOP_TURN_BUCKETS];

struct loop_turns {
	uint64_t le[LOOP_TURN_BUCKETS]; /* per bucket, not cumulative */
	uint64_t count;                 /* every turn, those past the last bound too */
	uint64_t busy_us;               /* the turns' durations, summed */
	uint64_t max_us;
	int64_t since_us;               /* monotonic_us() when counting began */
};

void loop_turns_init(struct loop_turns *t, int64_t now_us);
void loop_turns_observe(struct loop_turns *t, uint64_t turn_us);

/*
 * {"bounds_ms": [...], "cumulative": [...], "count", "busy_ms", "max_ms",
 * "counted_for_ms"}: cumulative counts per bound, as a Prometheus
 * histogram has them.
 */
json_t *loop_turns_json(const struct loop_turns *t, int64_t now_us);

#endif
