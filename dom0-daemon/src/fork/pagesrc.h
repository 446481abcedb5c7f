/*
 * A fork's page source: the clones' side, shared by the two ways a
 * snapshot comes to exist.
 *
 *  - remusdbd-pagesrc (pagesrc_main.c): an exec'd child of remusdbd that
 *    captures an unprotected parent's migration (snapshot_capture.h).
 *  - A fork() of the backup's remusdbd (vm_fork.c): the committed image
 *    of a protected VM is already in memory, and fork() freezes it at
 *    page granularity for free, the way Redis's BGSAVE freezes its
 *    dataset: the backup keeps committing epochs, the kernel copies each
 *    page it overwrites, and the copies are released with this process.
 *
 * Either way the snapshot is then served the same way: stdin carries
 * `serve ID unix:PATH` or `serve ID tcp:ADDR:PORT` lines from remusdbd;
 * stdout carries one JSON object per line (event "captured", "progress",
 * "clone", "failed", "done").  The process exits, status 0, when every
 * clone announced has every page, which releases the snapshot's memory.
 */
#ifndef REMUSDB_PAGESRC_H
#define REMUSDB_PAGESRC_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/event_loop.h"
#include "image/ram_image.h"
#include "fork/snapshot_capture.h"

#define PAGESRC_MAX_CLONES 16

/* expected: clones announced (1..PAGESRC_MAX_CLONES); push_rate in bytes/s (0: no cap). */
void pagesrc_init(event_loop *loop, unsigned expected, uint64_t push_rate);
/* One JSON object on stdout, as a line; takes the reference. */
void pagesrc_emit(json_t *obj);
/*
 * The snapshot is complete: img (borrowed until pagesrc_run returns) is
 * served from now on, dirtied pages pushed first.  details are merged
 * into the "captured" event (taken).  -1 (and the run ends) when out of
 * memory.
 */
int pagesrc_snapshot_ready(const struct ram_image *img, const struct page_ref *dirtied,
			   size_t ndirtied, json_t *details);
/* Ends the run with a "failed" event. */
void pagesrc_fail(const char *why);
/* Serves stdin's commands and the clones until done; the exit status to use. */
int pagesrc_run(void);

#endif
