/* A replica's memory need and the backup's admission rule (replica_memory.h). */
#include "backup/replica_memory.h"

#include <stdio.h>

#include "backup/coded_pages.h"

#define GIB(x) ((double)(x) / (1ULL << 30))

void replica_memory_need(uint64_t ram_bytes, bool takeover_maps_image,
			 struct replica_memory *need)
{
	uint64_t staging = ram_bytes / 8;

	need->image = ram_bytes;
	need->staging = staging < REPLICA_STAGING_MIN ? REPLICA_STAGING_MIN : staging;
	need->deferred = REPLICA_DEFER_MAX;
	need->takeover = takeover_maps_image ? 0 : ram_bytes;
}

/* A primary may declare any block lengths: the sums saturate, never wrap into a fit. */
uint64_t replica_memory_add(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

uint64_t replica_memory_total(const struct replica_memory *m)
{
	return replica_memory_add(replica_memory_add(m->image, m->staging),
				  replica_memory_add(m->deferred, m->takeover));
}

int replica_memory_admit(const char *vm, const struct replica_memory *need, uint64_t limit,
			 uint64_t in_use, unsigned others, char *why, size_t whylen)
{
	uint64_t total = replica_memory_total(need);
	uint64_t left = in_use < limit ? limit - in_use : 0;

	if (limit == 0 || total <= left)
		return 0;
	snprintf(why, whylen, "not enough memory for a replica of %s here: it needs %.2f GiB "
		 "(image %.2f, epoch staging %.2f, deferred frames %.2f, takeover copy %.2f) "
		 "and %.2f GiB of this backup's %.2f GiB --memory-limit are left (%u replica%s "
		 "hold %.2f GiB), %.1f MiB short; protect it to another backup, end a "
		 "protection here, or raise --memory-limit if the host has the memory",
		 vm, GIB(total), GIB(need->image), GIB(need->staging), GIB(need->deferred),
		 GIB(need->takeover), GIB(left), GIB(limit), others, others == 1 ? "" : "s",
		 GIB(in_use), (double)(total - left) / (1 << 20));
	return -1;
}
