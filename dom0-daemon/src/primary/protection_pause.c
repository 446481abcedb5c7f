/*
 * Each checkpoint's pause as the guest has it: from our CHECKPOINT_REPLY,
 * on which QEMU stops the guest, to QEMU's RESUME, when it runs again.
 * The pause's CPU boost (pause_boost.h) spans it, and its last part, our
 * LOADED to QEMU's restart, is measured (checkpoint_resume.h says why
 * the pause does not end at LOADED).
 */
#include <string.h>

#include "base/log.h"
#include "primary/protection_internal.h"
#include "qemu/qmp.h"

void protection_pause_begins(struct protection *p)
{
	/*
	 * QEMU asks for a checkpoint only after running the guest for an
	 * interval, so a RESUME still awaited was lost (QMP reconnecting, an
	 * event QEMU did not send): the boost it held ends here, once.
	 */
	if (checkpoint_resume_missed(&p->resume)) {
		pause_boost_end(&p->pause_boost, p->name);
		log_debug("vm %s: no RESUME came for the last checkpoint (%llu so far)", p->name,
			  (unsigned long long)p->resume.missed);
	}
	pause_boost_begin(&p->pause_boost, qmp_client_peer_pid(vm_qmp(p->vm)), p->name);
}

void protection_pause_loaded(struct protection *p, const struct checkpoint_stats *st)
{
	if (!st->loaded_wall_us) {
		/* LOADED held for a check: the guest stays paused, unboosted. */
		pause_boost_end(&p->pause_boost, p->name);
		return;
	}
	checkpoint_resume_expect(&p->resume, st->loaded_wall_us, st->pause_us);
}

void protection_pause_stop(struct protection *p)
{
	checkpoint_resume_forget(&p->resume);
	pause_boost_end(&p->pause_boost, p->name);
}

void protection_on_qmp_event(struct protection *p, const char *event, int64_t qemu_time_us)
{
	int64_t resume_us, guest_pause_us;

	/*
	 * Whatever the protection's state now (a backup lost mid-pause): a
	 * RESUME awaited is the checkpoint's, and one not awaited is not.
	 */
	if (strcmp(event, "RESUME") != 0)
		return;
	int r = checkpoint_resume_seen(&p->resume, qemu_time_us, &resume_us, &guest_pause_us);

	if (r == 0)
		return;
	pause_boost_end(&p->pause_boost, p->name);
	if (r > 0)
		protection_stats_resume(p, resume_us, guest_pause_us);
}
