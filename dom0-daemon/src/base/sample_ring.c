/* The last N per-epoch samples, for percentiles (sample_ring.h). */
#include "base/sample_ring.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void sample_ring_add(struct sample_ring *r, double v)
{
	r->values[r->next] = v;
	r->next = (r->next + 1) % SAMPLE_RING_SIZE;
	if (r->count < SAMPLE_RING_SIZE)
		r->count++;
	r->total_count++;
	r->total_sum += v;
}

static int compare_doubles(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

double sample_ring_percentile(const struct sample_ring *r, double p)
{
	double sorted[SAMPLE_RING_SIZE];

	if (r->count == 0)
		return 0;
	memcpy(sorted, r->values, r->count * sizeof(double));
	qsort(sorted, r->count, sizeof(double), compare_doubles);
	size_t rank = (size_t)ceil(p / 100.0 * (double)r->count);
	if (rank < 1)
		rank = 1;
	if (rank > r->count)
		rank = r->count;
	return sorted[rank - 1];
}

double sample_ring_mean(const struct sample_ring *r)
{
	return r->total_count ? r->total_sum / (double)r->total_count : 0;
}
