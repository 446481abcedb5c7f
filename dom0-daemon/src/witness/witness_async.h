/*
 * The etcd witness (witness.h) for the daemon's event loop: each call
 * starts one operation on a worker thread and returns at once; the
 * result comes back as a callback on the loop thread.
 *
 * Why a thread and not curl's multi interface on the loop: the blocking
 * client with its endpoint failover and time budget stays one
 * straight-line function that is easy to test, and arbitration is rare
 * (once per protect, once per lost peer), so a short-lived thread per
 * operation costs nothing that matters.  The worker reports through a
 * pipe the loop watches, so the callback runs on the loop thread like
 * every other handler and needs no locks.
 *
 * At most one operation is in flight per handle (the callers arbitrate
 * one VM at a time; a second request while busy is refused).  The worker
 * only touches its own handle's client and job fields, and the loop
 * thread reads the answer only after joining it.
 */
#ifndef REMUSDB_WITNESS_ASYNC_H
#define REMUSDB_WITNESS_ASYNC_H

#include <stdbool.h>
#include <stddef.h>

#include "base/event_loop.h"
#include "witness/witness.h"

/*
 * now: the new or current ownership (see witness.h; zeroed when the
 * operation did not get that far).  err: why, or NULL when there is
 * nothing to say.  The handle is idle when this runs: the callback may
 * start the next operation or destroy the handle.
 */
typedef void (*witness_done_cb)(void *opaque, enum witness_result r,
				const struct witness_ownership *now, const char *err);

struct witness_async;

/* Checks cfg like witness_create(); NULL with a reason in err. */
struct witness_async *witness_async_create(event_loop *loop,
					   const struct witness_config *cfg,
					   char *err, size_t n);
/*
 * Cancels an operation in flight (its callback never runs), waits for
 * the worker to finish (milliseconds: see witness_cancel) and frees.
 */
void witness_async_destroy(struct witness_async *wa);
bool witness_async_busy(const struct witness_async *wa);

/*
 * Start witness_get/claim/cas (witness.h) on the worker.  The arguments
 * are copied.  Return 0, or -1 if an operation is already in flight or no
 * thread could be started (try again later).  Bad arguments are not
 * refused here: they come back through the callback as WITNESS_ERROR.
 */
int witness_async_get(struct witness_async *wa, const char *vm, witness_done_cb cb,
		      void *opaque);
int witness_async_claim(struct witness_async *wa, const char *vm, const char *owner,
			witness_done_cb cb, void *opaque);
int witness_async_cas(struct witness_async *wa, const char *vm,
		      const struct witness_ownership *expected, const char *new_owner,
		      witness_done_cb cb, void *opaque);

#endif
