/*
 * A checkpoint's end as the guest sees it: QEMU's RESUME event.
 *
 * Why: our pause (checkpoint_source.h, pause_us) ends when we send
 * VMSTATE_LOADED, but the guest runs again only once QEMU's migration
 * thread has read it, taken the big lock and restarted the vCPUs
 * (migration/colo.c, colo_do_checkpoint_transaction: vm_start after the
 * LOADED it waits for).  QEMU's own trace put that part at 1.1-1.7 ms at
 * p99 for a VM alone and 6.5-11.1 ms beside a busy neighbour
 * (docs/bench/README.md, "The neighbour, sixth part"): unseen by our
 * measure, and outside the pause's CPU boost, which ended with LOADED.
 * So the boost lasts until RESUME, and the part is measured with QEMU's
 * own timestamp on the event (vm_prepare_start stamps it as it restarts
 * the vCPUs), against our clock just before LOADED went: both
 * CLOCK_REALTIME on one host.
 *
 * Pure bookkeeping; protection_pause.c does the boost and the stats.
 */
#ifndef REMUSDB_CHECKPOINT_RESUME_H
#define REMUSDB_CHECKPOINT_RESUME_H

#include <stdbool.h>
#include <stdint.h>

/* A part longer than this is not the checkpoint's (a clock step, a stale event). */
#define CHECKPOINT_RESUME_MAX_US (10 * 1000 * 1000)

struct checkpoint_resume {
	bool expecting;          /* LOADED went; RESUME not seen yet */
	int64_t loaded_wall_us;  /* CLOCK_REALTIME just before LOADED went */
	int64_t pause_us;        /* that checkpoint's REPLY -> LOADED */
	uint64_t seen;           /* RESUMEs that ended a checkpoint, measured */
	uint64_t unmeasured;     /* ... whose time did not fit (no stamp, a clock step) */
	uint64_t missed;         /* checkpoints whose RESUME never came before the next */
};

/* LOADED went at loaded_wall_us (CLOCK_REALTIME), after a pause of pause_us. */
void checkpoint_resume_expect(struct checkpoint_resume *r, int64_t loaded_wall_us,
			      int64_t pause_us);
/*
 * QEMU's RESUME, stamped qemu_time_us (0: no stamp).  0: none was
 * expected (not a checkpoint's).  1: it ended the checkpoint, with
 * *resume_us (LOADED -> RESUME) and *guest_pause_us (REPLY -> RESUME).
 * -1: it ended the checkpoint, but its time does not fit.
 */
int checkpoint_resume_seen(struct checkpoint_resume *r, int64_t qemu_time_us,
			   int64_t *resume_us, int64_t *guest_pause_us);
/*
 * The next checkpoint begins (QEMU ran the guest for an interval to ask
 * for it): true when the last one's RESUME never came, counted.
 */
bool checkpoint_resume_missed(struct checkpoint_resume *r);
/* The checkpoints stop (the source is gone): nothing is expected any more. */
void checkpoint_resume_forget(struct checkpoint_resume *r);

#endif
