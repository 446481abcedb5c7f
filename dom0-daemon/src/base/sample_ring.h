/*
 * The last N samples of a per-epoch measurement (pause time, bytes), for
 * percentiles in `status`.  A fixed ring: protection runs for days and
 * must not grow, and recent behaviour is what an operator asks about.
 */
#ifndef REMUSDB_SAMPLE_RING_H
#define REMUSDB_SAMPLE_RING_H

#include <stddef.h>
#include <stdint.h>

#define SAMPLE_RING_SIZE 4096

struct sample_ring {
	double values[SAMPLE_RING_SIZE];
	size_t next;
	size_t count;  /* valid values, at most SAMPLE_RING_SIZE */
	uint64_t total_count;
	double total_sum; /* over every sample ever added */
};

void sample_ring_add(struct sample_ring *r, double v);
/* p in [0, 100], nearest-rank over the ring; 0 when empty. */
double sample_ring_percentile(const struct sample_ring *r, double p);
/* Mean over every sample ever added; 0 when none. */
double sample_ring_mean(const struct sample_ring *r);

#endif
