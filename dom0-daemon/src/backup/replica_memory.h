/*
 * What a replica costs the backup in memory, and whether one more fits
 * (admission).  Pure arithmetic: the limit and the replicas already
 * admitted come from the caller (replica_stream.c at RAM_LAYOUT), so the
 * rule is unit-tested apart from any host.
 *
 * Counted per replica:
 *   image     every RAM block the primary declares (the committed copy);
 *   staging   the epoch being received, before it commits: no bound holds
 *             it (an epoch may dirty every page), so an allowance of an
 *             eighth of guest RAM, at least 64 MiB, is counted;
 *   deferred  frames held while the backup asks for pages it lacks
 *             (coded_pages.c): at most REPLICA_DEFER_MAX;
 *   takeover  what a takeover adds beside the image: nothing when the new
 *             QEMU maps the image (--restore shared), a second copy of the
 *             guest's RAM when it is written into QEMU (eager, lazy, or
 *             shared falling back for a launcher's command line).
 * Not counted: a fork's frozen copy (replica_fork.c), which the fork's
 * own request must fit.
 */
#ifndef REMUSDB_BACKUP_REPLICA_MEMORY_H
#define REMUSDB_BACKUP_REPLICA_MEMORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define REPLICA_STAGING_MIN (64ULL << 20)

struct replica_memory {
	uint64_t image, staging, deferred, takeover;
};

/* The need of a replica whose RAM blocks total ram_bytes. */
void replica_memory_need(uint64_t ram_bytes, bool takeover_maps_image,
			 struct replica_memory *need);
uint64_t replica_memory_total(const struct replica_memory *m);
/* a + b, or UINT64_MAX where it would wrap. */
uint64_t replica_memory_add(uint64_t a, uint64_t b);

/*
 * 0 when need fits beside in_use (the sum of the admitted replicas'
 * totals, `others` of them) under limit; -1 with the refusal, one line
 * with the numbers and the fix, in why.  limit 0 admits everything: the
 * daemon always sets one (--memory-limit, or the host's memory), and a
 * zeroed repl_settings in the unit tests and fuzzers means none.
 */
int replica_memory_admit(const char *vm, const struct replica_memory *need, uint64_t limit,
			 uint64_t in_use, unsigned others, char *why, size_t whylen);

#endif
