/*
 * The primary's half of a planned switchover (`remusdb switchover`), as
 * pure rules: which step comes next and what the protection must do
 * about it.  protection_switchover.c wires them to the checkpoint source,
 * the acknowledgements, etcd's verdict and a deadline.
 *
 * The steps, in order:
 *   STOPPING   the next checkpoint will hold the VM paused at its end
 *   STOPPED    held at checkpoint N (shipped as usual): waits for its ack
 *   READY      N acknowledged, its output released by that ack; the VM
 *              stays paused so that the backup may resume exactly N
 *   HANDED_OVER etcd names another host (the backup took over): QEMU is
 *              stopped, never resumed
 * and the two other ends: CANCELLED (the VM resumed here, still
 * protected) and FAILED (the protection ended otherwise: the backup was
 * lost and this host runs the VM unprotected, or the stream broke).
 *
 * Why the VM may resume on a cancel only while the link to the backup is
 * up: once it is down, etcd decides who runs the VM (protection_arbiter.c)
 * and the backup may already own it; resuming then could run two copies.
 * While the link is up a resumed guest's output is held until the backup
 * acknowledges its epoch, so a backup taking over at that moment makes
 * this host fence itself with that output dropped: no client sees it.
 */
#ifndef REMUSDB_SWITCHOVER_H
#define REMUSDB_SWITCHOVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SWITCHOVER_DEFAULT_TIMEOUT_MS 30000
#define SWITCHOVER_MIN_TIMEOUT_MS 1000
#define SWITCHOVER_MAX_TIMEOUT_MS 600000

enum switchover_state {
	SWITCHOVER_IDLE,
	SWITCHOVER_STOPPING,
	SWITCHOVER_STOPPED,
	SWITCHOVER_READY,
	SWITCHOVER_HANDED_OVER,
	SWITCHOVER_CANCELLED,
	SWITCHOVER_FAILED,
};

/* What the protection does after a step. */
enum switchover_action {
	SWITCHOVER_NOTHING,
	SWITCHOVER_RESUME,           /* release the held checkpoint: the VM runs here again */
	/*
	 * The negative control (unsafe_release_early): the checkpoint is not
	 * shipped and every held frame leaves now, before any acknowledgement.
	 */
	SWITCHOVER_WITHHOLD_AND_RELEASE,
	SWITCHOVER_STOP_QEMU,        /* handed over: QEMU quits, the VM never runs here again */
};

struct switchover {
	enum switchover_state state;
	bool unsafe_release_early;
	uint64_t held_epoch;   /* the checkpoint the VM is paused at */
	uint64_t epoch;        /* the epoch the backup is to resume: held_epoch, one less if unsafe */
	int64_t requested_us, stopped_us, acked_us, ended_us, deadline_us;
	char owner[65];        /* HANDED_OVER: whom etcd names, and at which generation */
	uint64_t generation;
	char error[320];       /* CANCELLED, FAILED: why */
};

const char *switchover_state_name(enum switchover_state s);
/* Between its request and its end: the VM is (or is about to be) held. */
bool switchover_active(const struct switchover *s);

/*
 * A new switchover of a protection that is `protected` (and whose
 * checkpoint source can hold a checkpoint: hold_possible).  0, or -1
 * with why in err (s unchanged).
 */
int switchover_begin(struct switchover *s, bool protected, bool hold_possible,
		     unsigned timeout_ms, bool unsafe_release_early, int64_t now_us,
		     char *err, size_t errlen);
/*
 * The held checkpoint `epoch` ended (the VM is paused at it); acked: the
 * last epoch the backup acknowledged so far.
 */
enum switchover_action switchover_checkpoint_held(struct switchover *s, uint64_t epoch,
						  uint64_t acked, int64_t now_us);
/* The backup acknowledged `epoch`. */
void switchover_acked(struct switchover *s, uint64_t epoch, int64_t now_us);
/*
 * The operator's cancel (why), or the deadline (why NULL).  link_up: the
 * connection to the backup is still there (see above).  -1 with err when
 * there is nothing to cancel or the VM must not resume.
 */
enum switchover_action switchover_cancel(struct switchover *s, bool link_up, const char *why,
					 int64_t now_us, char *err, size_t errlen);
/* Is the deadline past? */
bool switchover_overdue(const struct switchover *s, int64_t now_us);
/* etcd says `owner` owns the VM at `generation`: this host lost it. */
enum switchover_action switchover_owner_moved(struct switchover *s, const char *owner,
					      uint64_t generation, int64_t now_us);
/* The protection ended some other way (why): unprotected, failed. */
void switchover_protection_ended(struct switchover *s, const char *why, int64_t now_us);

#endif
