/* A protected VM's QEMU gets the CPU first while it pauses (pause_boost.h). */
#include "primary/pause_boost.h"

#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "base/sched_group.h"

/* The kernel's range of nice values. */
#define NICE_HIGHEST (-20)

void pause_boost_init(struct pause_boost *b, unsigned levels)
{
	memset(b, 0, sizeof(*b));
	b->levels = levels;
}

/* A group at `base` raised by `levels`, within the kernel's range. */
static int boosted_value(int base, unsigned levels)
{
	int nice = base - (int)levels;

	return nice < NICE_HIGHEST ? NICE_HIGHEST : nice;
}

/* The first pause with QEMU known: may its group be raised, and from what? */
static bool checked(struct pause_boost *b, pid_t qemu_pid, const char *vm_name)
{
	char why[160];

	if (b->pid)
		return true;
	if (sched_group_check_own(qemu_pid, &b->base_nice, why, sizeof(why)) < 0) {
		b->unusable = true;
		snprintf(b->why, sizeof(b->why), "%s", why);
		log_warn("vm %s: its checkpoint pauses get no CPU boost: %s", vm_name, why);
		return false;
	}
	if (b->base_nice == boosted_value(0, b->levels)) {
		/*
		 * A boost left by a daemon that stopped mid-pause (it is killed
		 * between our reply and the checkpoint's end): a group at exactly
		 * the boosted value is taken for one, or it would stay raised.
		 */
		log_warn("vm %s: its QEMU's scheduling group is at nice %d, a pause boost left "
			 "behind by a daemon that stopped mid-pause: taken as 0", vm_name,
			 b->base_nice);
		b->base_nice = 0;
	}
	b->pid = qemu_pid;
	return true;
}

void pause_boost_begin(struct pause_boost *b, pid_t qemu_pid, const char *vm_name)
{
	char why[160];

	if (!b->levels || b->unusable || b->boosted || qemu_pid <= 0)
		return;
	if (!checked(b, qemu_pid, vm_name))
		return;
	int nice = boosted_value(b->base_nice, b->levels);
	if (sched_group_set(b->pid, nice, why, sizeof(why)) < 0) {
		b->unusable = true;
		snprintf(b->why, sizeof(b->why), "%s", why);
		log_warn("vm %s: its checkpoint pauses get no CPU boost any more: %s", vm_name,
			 why);
		return;
	}
	b->boosted = true;
	b->boosts++;
}

void pause_boost_end(struct pause_boost *b, const char *vm_name)
{
	char why[160];

	if (!b->boosted)
		return;
	b->boosted = false;
	if (sched_group_set(b->pid, b->base_nice, why, sizeof(why)) < 0) {
		/* QEMU gone (the usual case, then harmless) or the write refused. */
		b->unusable = true;
		snprintf(b->why, sizeof(b->why), "%s", why);
		log_warn("vm %s: could not end its pause's CPU boost: %s", vm_name, why);
	}
}

json_t *pause_boost_json(const struct pause_boost *b)
{
	const char *state = !b->levels ? "off" : b->unusable ? "unavailable"
				       : b->pid ? "ready" : "waiting for QEMU";

	return json_pack("{s:I, s:s, s:s?, s:I}", "levels", (json_int_t)b->levels, "state", state,
			 "why", b->unusable ? b->why : NULL, "boosts", (json_int_t)b->boosts);
}
