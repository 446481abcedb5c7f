/* The rules of the primary's half of a planned switchover (switchover.h); no I/O. */
#include "primary/switchover.h"

#include <stdio.h>
#include <string.h>

const char *switchover_state_name(enum switchover_state s)
{
	switch (s) {
	case SWITCHOVER_IDLE:
		return "idle";
	case SWITCHOVER_STOPPING:
		return "stopping";
	case SWITCHOVER_STOPPED:
		return "stopped";
	case SWITCHOVER_READY:
		return "ready";
	case SWITCHOVER_HANDED_OVER:
		return "handed-over";
	case SWITCHOVER_CANCELLED:
		return "cancelled";
	case SWITCHOVER_FAILED:
		return "failed";
	}
	return "unknown";
}

bool switchover_active(const struct switchover *s)
{
	return s->state == SWITCHOVER_STOPPING || s->state == SWITCHOVER_STOPPED ||
	       s->state == SWITCHOVER_READY;
}

int switchover_begin(struct switchover *s, bool protected, bool hold_possible,
		     unsigned timeout_ms, bool unsafe_release_early, int64_t now_us,
		     char *err, size_t errlen)
{
	if (switchover_active(s)) {
		snprintf(err, errlen, "a switchover is %s already", switchover_state_name(s->state));
		return -1;
	}
	if (s->state == SWITCHOVER_HANDED_OVER) {
		snprintf(err, errlen, "the VM was handed over to %s already", s->owner);
		return -1;
	}
	if (!protected) {
		snprintf(err, errlen, "the VM is not protected: a switchover needs a backup that "
			 "holds every acknowledged checkpoint");
		return -1;
	}
	if (timeout_ms < SWITCHOVER_MIN_TIMEOUT_MS || timeout_ms > SWITCHOVER_MAX_TIMEOUT_MS) {
		snprintf(err, errlen, "timeout %u ms is out of range: use %d..%d ms", timeout_ms,
			 SWITCHOVER_MIN_TIMEOUT_MS, SWITCHOVER_MAX_TIMEOUT_MS);
		return -1;
	}
	if (!hold_possible) {
		snprintf(err, errlen, "the checkpoint source cannot hold a checkpoint now (a "
			 "hold-checkpoint is in progress?)");
		return -1;
	}
	memset(s, 0, sizeof(*s));
	s->state = SWITCHOVER_STOPPING;
	s->unsafe_release_early = unsafe_release_early;
	s->requested_us = now_us;
	s->deadline_us = now_us + (int64_t)timeout_ms * 1000;
	return 0;
}

enum switchover_action switchover_checkpoint_held(struct switchover *s, uint64_t epoch,
						  uint64_t acked, int64_t now_us)
{
	if (s->state != SWITCHOVER_STOPPING)
		return SWITCHOVER_NOTHING;
	s->state = SWITCHOVER_STOPPED;
	s->held_epoch = epoch;
	s->stopped_us = now_us;
	/* The bug the control stands for: the backup is handed the epoch before. */
	s->epoch = s->unsafe_release_early && epoch > 0 ? epoch - 1 : epoch;
	switchover_acked(s, acked, now_us);
	return s->unsafe_release_early ? SWITCHOVER_WITHHOLD_AND_RELEASE : SWITCHOVER_NOTHING;
}

void switchover_acked(struct switchover *s, uint64_t epoch, int64_t now_us)
{
	if (s->state != SWITCHOVER_STOPPED || epoch < s->epoch)
		return;
	s->state = SWITCHOVER_READY;
	s->acked_us = now_us;
}

static void finish(struct switchover *s, enum switchover_state state, int64_t now_us)
{
	s->state = state;
	s->ended_us = now_us;
}

enum switchover_action switchover_cancel(struct switchover *s, bool link_up, const char *why,
					 int64_t now_us, char *err, size_t errlen)
{
	if (!switchover_active(s)) {
		snprintf(err, errlen, "no switchover in progress (it is %s)",
			 switchover_state_name(s->state));
		return SWITCHOVER_NOTHING;
	}
	if (!link_up) {
		snprintf(err, errlen, "the link to the backup is down: etcd decides now whether "
			 "the VM runs here or on the backup, not a cancel");
		return SWITCHOVER_NOTHING;
	}
	if (why)
		snprintf(s->error, sizeof(s->error), "cancelled: %s; the VM resumed here, still "
			 "protected", why);
	else
		snprintf(s->error, sizeof(s->error), "nobody took the VM over within %.0f s "
			 "(%s): the VM resumed here, still protected",
			 (s->deadline_us - s->requested_us) / 1e6, switchover_state_name(s->state));
	finish(s, SWITCHOVER_CANCELLED, now_us);
	return SWITCHOVER_RESUME;
}

bool switchover_overdue(const struct switchover *s, int64_t now_us)
{
	return switchover_active(s) && now_us >= s->deadline_us;
}

enum switchover_action switchover_owner_moved(struct switchover *s, const char *owner,
					      uint64_t generation, int64_t now_us)
{
	if (!switchover_active(s))
		return SWITCHOVER_NOTHING;
	snprintf(s->owner, sizeof(s->owner), "%s", owner);
	s->generation = generation;
	if (s->state != SWITCHOVER_READY) {
		/* Before our consent: a failover raced the switchover; it ends as any failover. */
		snprintf(s->error, sizeof(s->error), "%s took the VM over (generation %llu) before "
			 "checkpoint %llu was acknowledged: a failover, not this switchover",
			 owner, (unsigned long long)generation, (unsigned long long)s->held_epoch);
		finish(s, SWITCHOVER_FAILED, now_us);
		return SWITCHOVER_NOTHING;
	}
	finish(s, SWITCHOVER_HANDED_OVER, now_us);
	return SWITCHOVER_STOP_QEMU;
}

void switchover_protection_ended(struct switchover *s, const char *why, int64_t now_us)
{
	if (!switchover_active(s))
		return;
	snprintf(s->error, sizeof(s->error), "the protection ended: %s", why);
	finish(s, SWITCHOVER_FAILED, now_us);
}
