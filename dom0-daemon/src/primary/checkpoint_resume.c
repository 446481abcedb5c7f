/*
 * A checkpoint's end as the guest sees it (checkpoint_resume.h): which
 * RESUME ends which checkpoint, and how long after our LOADED it came.
 */
#include "primary/checkpoint_resume.h"

void checkpoint_resume_expect(struct checkpoint_resume *r, int64_t loaded_wall_us,
			      int64_t pause_us)
{
	r->expecting = true;
	r->loaded_wall_us = loaded_wall_us;
	r->pause_us = pause_us;
}

int checkpoint_resume_seen(struct checkpoint_resume *r, int64_t qemu_time_us,
			   int64_t *resume_us, int64_t *guest_pause_us)
{
	if (!r->expecting)
		return 0;
	r->expecting = false;
	int64_t part = qemu_time_us - r->loaded_wall_us;

	/*
	 * Our time is read before LOADED is sent, and QEMU stamps RESUME only
	 * after reading it, on the same clock: a stamp before ours is a step
	 * of the clock.
	 */
	if (!qemu_time_us || part < 0 || part > CHECKPOINT_RESUME_MAX_US) {
		r->unmeasured++;
		return -1;
	}
	r->seen++;
	*resume_us = part;
	*guest_pause_us = r->pause_us + part;
	return 1;
}

bool checkpoint_resume_missed(struct checkpoint_resume *r)
{
	if (!r->expecting)
		return false;
	r->expecting = false;
	r->missed++;
	return true;
}

void checkpoint_resume_forget(struct checkpoint_resume *r)
{
	r->expecting = false;
}
