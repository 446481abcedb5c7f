/* A histogram of the event loop's turns (loop_turns.h). */
#include "base/loop_turns.h"

#include <string.h>

#include "base/metrics.h"

/* From a handler's usual tens of microseconds to a stall the heartbeat
 * guard would notice (it acts at 5 s). */
const double loop_turn_bounds_ms[LOOP_TURN_BUCKETS] = {
	0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 100, 1000,
};

void loop_turns_init(struct loop_turns *t, int64_t now_us)
{
	memset(t, 0, sizeof(*t));
	t->since_us = now_us;
}

void loop_turns_observe(struct loop_turns *t, uint64_t turn_us)
{
	t->count++;
	t->busy_us += turn_us;
	if (turn_us > t->max_us)
		t->max_us = turn_us;
	metrics_bucket_observe(loop_turn_bounds_ms, t->le, LOOP_TURN_BUCKETS,
			       (double)turn_us / 1000.0);
}

json_t *loop_turns_json(const struct loop_turns *t, int64_t now_us)
{
	json_t *bounds, *cum;

	metrics_bucket_arrays(loop_turn_bounds_ms, t->le, LOOP_TURN_BUCKETS, &bounds, &cum);
	return json_pack("{s:o, s:o, s:I, s:f, s:f, s:f}", "bounds_ms", bounds, "cumulative", cum,
			 "count", (json_int_t)t->count, "busy_ms", (double)t->busy_us / 1000.0,
			 "max_ms", (double)t->max_us / 1000.0, "counted_for_ms",
			 (double)(now_us - t->since_us) / 1000.0);
}
