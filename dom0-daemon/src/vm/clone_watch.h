/*
 * The clone-host half of a VM fork: watches a clone QEMU that resumes by
 * postcopy from a fork's page source, so that a clone never hangs
 * forever when its page source dies.
 *
 * Why it is needed: a postcopy destination whose source goes away does
 * not fail; QEMU parks the migration in `postcopy-paused` for a recovery
 * that nobody will start, and every vCPU that touches a page not yet
 * received blocks for good.  The watch polls `query-migrate` and fails
 * the clone loudly (an error line, a failed state in `status`, QEMU told
 * to quit) when:
 *   - the migration is `postcopy-paused` or `failed` (the source process
 *     died or the connection broke: seen within one poll), or
 *   - it has not completed within the deadline (a source host that went
 *     silent without closing the connection).
 * The parent is never touched: it runs on another QEMU, often another
 * host.  Once the migration completed the clone has every page and the
 * watch ends.
 */
#ifndef REMUSDB_CLONE_WATCH_H
#define REMUSDB_CLONE_WATCH_H

#include <jansson.h>

#include "base/event_loop.h"

#define CLONE_WATCH_POLL_MS 250
#define CLONE_WATCH_DEFAULT_DEADLINE_MS (120 * 1000)

struct qmp_client;
struct clone_watch;

struct clone_watch *clone_watch_start(event_loop *loop, struct qmp_client *qmp,
				      const char *vm_name, long deadline_ms);
void clone_watch_destroy(struct clone_watch *w); /* NULL: no-op */
/* "waiting", "postcopy-active", "complete" or "failed", with the reason. */
json_t *clone_watch_status_json(const struct clone_watch *w);

#endif
