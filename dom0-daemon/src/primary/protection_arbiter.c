/*
 * The primary and etcd, the witness: `protect` claims the VM there before
 * connecting to the backup.  And the primary's ends: losing the backup
 * sends the question to etcd (arbitrate); winning runs the VM on
 * unprotected, losing fences it, and reaching neither pauses it until
 * etcd answers (protection.h says why).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "relay/net_relay.h"
#include "primary/protection_internal.h"
#include "primary/protection_marker.h"

int protection_arbiter_open(struct protection *p, const struct witness_ownership *ownership,
			    char *err, size_t errlen)
{
	if (ownership)
		p->arbiter.ownership = *ownership;
	p->arbiter.witness = witness_async_create(p->loop, &p->settings->witness, err, errlen);
	return p->arbiter.witness ? 0 : -1;
}

void protection_foreign_owner_reason(char *out, size_t outlen, const char *vm,
				     const char *owner, unsigned long long generation,
				     const char *host)
{
	/*
	 * An ownership key outlives its VM (no TTL, docs/witness.md): a new
	 * VM of the same name on another host meets the old owner here.
	 * The command checks that the owner no longer runs it before it
	 * deletes the key; --host keeps this host's copy out of that check.
	 */
	snprintf(out, outlen, "etcd says VM %s is owned by host %s (generation %llu), not by "
		 "%s: refusing to protect; if %s no longer runs %s, `remusdb owner retire %s "
		 "--host %s` clears the stale owner", vm, owner, generation, host, owner, vm,
		 vm, host);
}

static long claim_retry_due(event_loop *loop, long long id, void *data)
{
	struct protection *p = data;

	(void)loop;
	(void)id;
	p->arbiter.retry_timer = 0;
	if (protection_claim(p) < 0)
		protection_fail(p, "cannot ask etcd again (out of memory)");
	return TIMER_DONE;
}

/*
 * Whether the claim is asked again: etcd that did not answer is given
 * until claim_deadline_us, and the operator's status shows each miss.
 */
static bool claim_again_later(struct protection *p, const char *why)
{
	int64_t left_us = p->arbiter.claim_deadline_us - monotonic_us();

	if (left_us < (int64_t)WITNESS_CLAIM_RETRY_MS * 1000)
		return false;
	log_warn("vm %s: etcd did not answer the claim (try %u: %s): asking again in %d ms, "
		 "for %lld ms more", p->name, p->arbiter.claim_tries, why, WITNESS_CLAIM_RETRY_MS,
		 (long long)(left_us / 1000));
	snprintf(p->error, sizeof(p->error), "etcd did not answer the claim (try %u: %s); "
		 "asking again", p->arbiter.claim_tries, why);
	p->arbiter.retry_timer = event_loop_add_timer(p->loop, WITNESS_CLAIM_RETRY_MS,
						      claim_retry_due, p);
	if (p->arbiter.retry_timer < 0) {
		p->arbiter.retry_timer = 0;
		return false;
	}
	return true;
}

static void on_claimed(void *opaque, enum witness_result r,
		       const struct witness_ownership *now, const char *err)
{
	struct protection *p = opaque;
	struct protection_marker m;
	char err2[256], refusal[640];

	if (p->unprotect_requested)
		return;
	switch (r) {
	case WITNESS_OK:
		p->error[0] = '\0'; /* a missed try said so here */
		p->arbiter.ownership = *now;
		log_info("vm %s: etcd: owned by %s, generation %llu", p->name, now->owner,
			 (unsigned long long)now->generation);
		snprintf(p->config.ownership, sizeof(p->config.ownership), "%s", now->raw);
		p->config.generation = now->generation;
		memset(&m, 0, sizeof(m));
		snprintf(m.vm, sizeof(m.vm), "%s", p->name);
		snprintf(m.backup, sizeof(m.backup), "%s", p->backup);
		m.ownership = p->arbiter.ownership;
		if (protection_marker_save(p->settings->state_dir, &m, err2, sizeof(err2)) < 0) {
			protection_fail(p, "%s", err2);
			return;
		}
		protection_link_connect(p);
		return;
	case WITNESS_LOST:
		protection_foreign_owner_reason(refusal, sizeof(refusal), p->name, now->owner,
						(unsigned long long)now->generation,
						p->settings->host);
		protection_fail(p, "%s", refusal);
		return;
	default:
		if (claim_again_later(p, err ? err : witness_result_name(r)))
			return;
		protection_reprotect_note_unreachable(p); /* a re-protection asks again later */
		protection_fail(p, "cannot reach etcd at %s: %s; still failing after %d ms "
				"and %u tries (protection needs the witness to arbitrate failovers)",
				p->settings->witness.endpoints, err ? err : witness_result_name(r),
				WITNESS_CLAIM_PATIENCE_MS, p->arbiter.claim_tries);
		return;
	}
}

int protection_claim(struct protection *p)
{
	if (!p->arbiter.claim_deadline_us)
		p->arbiter.claim_deadline_us = monotonic_us() +
					       (int64_t)WITNESS_CLAIM_PATIENCE_MS * 1000;
	p->arbiter.claim_tries++;
	return witness_async_claim(p->arbiter.witness, p->name, p->settings->host, on_claimed, p);
}

void protection_pause_for_witness(struct protection *p)
{
	if (!p->arbiter.paused_for_witness) {
		protection_qmp(p, "stop");
		p->arbiter.paused_for_witness = true;
	}
}

uint64_t protection_arbiter_generation(const struct protection *p)
{
	return p->arbiter.ownership.generation;
}

/*
 * After x-colo-lost-heartbeat QEMU restarts the guest itself once its
 * COLO thread is out (checkpoint_source_colo_entered()), so we only look
 * afterwards.  A `cont` sent at once can land while that thread is inside
 * a checkpoint's vm_stop, after it set the run state and before the
 * vCPUs stopped (softmmu/cpus.c): resume_all_vcpus() undoes the stop
 * that pause_all_vcpus() waits for, and the thread waits forever, holding
 * the migration and its yank instance, so the VM cannot be protected
 * again.  Seen in the soak of 2026-11-27 21:14: abandoned mid-checkpoint,
 * a RESUME with no STOP before it, no COLO_EXIT for 50 s, then every
 * migrate refused.  Normally COLO_EXIT comes 3-6 ms after the abandon.
 */
#define RESUME_LOOK_MS 500

static void resume_if_still_paused(struct protection *p)
{
	const char *state = vm_run_state(p->vm);

	if (strcmp(state, "paused") != 0 && strcmp(state, "colo") != 0)
		return;
	log_warn("vm %s: QEMU has not resumed the guest after leaving COLO (run state %s): "
		 "resuming it", p->name, state);
	protection_qmp(p, "cont");
}

static long look_at_resume(event_loop *loop, long long timer_id, void *data)
{
	struct protection *p = data;

	p->arbiter.resume_look_timer = 0;
	resume_if_still_paused(p);
	return TIMER_DONE;
}

/* We paused the guest for etcd; QEMU resumes it itself if it is leaving COLO. */
static void resume_after_witness(struct protection *p, bool qemu_resumes)
{
	if (!qemu_resumes) {
		protection_qmp(p, "cont");
		return;
	}
	if (p->arbiter.resume_look_timer)
		return;
	p->arbiter.resume_look_timer = event_loop_add_timer(p->loop, RESUME_LOOK_MS,
							    look_at_resume, p);
	if (p->arbiter.resume_look_timer <= 0) {
		p->arbiter.resume_look_timer = 0;
		resume_if_still_paused(p);
	}
}

void protection_arbiter_end(struct protection *p)
{
	if (p->arbiter.retry_timer)
		event_loop_del_timer(p->loop, p->arbiter.retry_timer);
	p->arbiter.retry_timer = 0;
	if (p->arbiter.resume_look_timer) {
		/* Going away before the look: look now rather than never. */
		event_loop_del_timer(p->loop, p->arbiter.resume_look_timer);
		p->arbiter.resume_look_timer = 0;
		resume_if_still_paused(p);
	}
	witness_async_destroy(p->arbiter.witness);
	p->arbiter.witness = NULL;
}

void protection_go_unprotected(struct protection *p, const char *why)
{
	bool qemu_resumes = p->stale_colo ||
			    (p->source && checkpoint_source_colo_entered(p->source));

	protection_stop_io(p);
	protection_hold_end(p, true); /* before COLO is left: the VM must not stay paused */
	if (p->source) {
		checkpoint_source_abandon(p->source);
		checkpoint_source_destroy(p->source);
		p->source = NULL;
		protection_pause_stop(p);
	}
	protection_close_conn(p);
	if (p->oc)
		output_commit_release_all(p->oc);
	if (vm_nic(p->vm))
		net_relay_set_output_hook(vm_nic(p->vm), NULL, NULL);
	/* No backup holds a replica any more: a restart needs no arbitration. */
	protection_marker_delete(p->settings->state_dir, p->name);
	if (p->stale_colo) {
		protection_qmp(p, "x-colo-lost-heartbeat");
		p->stale_colo = false;
	}
	if (p->arbiter.paused_for_witness) {
		resume_after_witness(p, qemu_resumes);
		p->arbiter.paused_for_witness = false;
	}
	snprintf(p->error, sizeof(p->error), "%s", why);
	protection_set_state(p, ST_UNPROTECTED);
}

void protection_fail(struct protection *p, const char *fmt, ...)
{
	char why[sizeof(p->error)];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	log_error("vm %s: protection failed: %s", p->name, why);
	protection_go_unprotected(p, why);
	protection_set_state(p, ST_FAILED);
	protection_reprotect_ended(p, END_FAILED);
}

static void fence(struct protection *p, const char *why)
{
	protection_stop_io(p);
	protection_hold_end(p, false); /* fenced: a held VM stays paused */
	if (p->source) {
		/* No x-colo-lost-heartbeat: that would let the VM run again. */
		checkpoint_source_destroy(p->source);
		p->source = NULL;
		protection_pause_stop(p);
	}
	protection_close_conn(p);
	/*
	 * Always, even if we paused it for the witness already: a COLO
	 * checkpoint that was in flight when we paused ends with QEMU's
	 * own vm_start() (migration/colo.c), which undoes our stop.
	 */
	protection_qmp(p, "stop");
	p->arbiter.paused_for_witness = false;
	if (p->oc)
		output_commit_drop_all(p->oc);
	snprintf(p->error, sizeof(p->error), "%s", why);
	log_error("vm %s: FENCED: %s; the VM is paused and its unacknowledged "
		  "output was dropped", p->name, why);
	protection_set_state(p, ST_FENCED);
	protection_reprotect_ended(p, END_FENCED);
}

static long retry_witness(event_loop *loop, long long id, void *data)
{
	struct protection *p = data;

	p->arbiter.retry_timer = 0;
	protection_arbitrate(p);
	return TIMER_DONE;
}

/*
 * etcd is asked again in WITNESS_RETRY_MS.  Without a timer nobody
 * would ever ask: the VM stays paused and fenced, which is safe.
 */
static void retry_later(struct protection *p)
{
	p->arbiter.retry_timer = event_loop_add_timer(p->loop, WITNESS_RETRY_MS,
						      retry_witness, p);
	if (p->arbiter.retry_timer < 0) {
		p->arbiter.retry_timer = 0;
		fence(p, "cannot schedule another question to etcd (out of memory): "
		      "fenced, as if the backup had taken over");
	}
}

static void on_cas_done(void *opaque, enum witness_result r,
			const struct witness_ownership *now, const char *err)
{
	struct protection *p = opaque;
	char why[1024];

	switch (r) {
	case WITNESS_OK:
		p->arbiter.ownership = *now;
		/* A restarted daemon may find the host's QEMU gone with its old self. */
		snprintf(why, sizeof(why), "backup %s lost (%.400s); etcd generation "
			 "%llu is ours: %s", p->backup, p->error,
			 (unsigned long long)now->generation,
			 vm_qemu_gone(p->vm) ? "UNPROTECTED, and no QEMU runs it here"
					     : "RUNNING UNPROTECTED");
		log_error("vm %s: %s", p->name, why);
		protection_go_unprotected(p, why);
		protection_reprotect_ended(p, END_BACKUP_LOST);
		return;
	case WITNESS_LOST:
		if (now && now->exists && now->owner[0])
			snprintf(why, sizeof(why), "the backup took over: etcd says %s "
				 "owns the VM (generation %llu)", now->owner,
				 (unsigned long long)now->generation);
		else
			snprintf(why, sizeof(why), "etcd no longer names this host as the "
				 "VM's owner (generation %llu moved on)",
				 (unsigned long long)p->arbiter.ownership.generation);
		fence(p, why);
		if (now && now->exists && now->owner[0])
			protection_switchover_owner_moved(p, now);
		else
			protection_switchover_ended(p, why);
		return;
	case WITNESS_UNREACHABLE:
	case WITNESS_ERROR:
		/*
		 * We cannot know whether the backup has taken over: stop
		 * the VM until etcd answers, then resume or stay fenced.
		 */
		if (!p->arbiter.paused_for_witness) {
			log_error("vm %s: neither the backup nor etcd is reachable "
				  "(%s): pausing the VM until etcd answers", p->name,
				  err ? err : witness_result_name(r));
			protection_qmp(p, "stop");
			p->arbiter.paused_for_witness = true;
		}
		snprintf(p->error, sizeof(p->error), "backup lost and etcd "
			 "unreachable (%s): VM paused, retrying etcd every %d ms",
			 err ? err : witness_result_name(r), WITNESS_RETRY_MS);
		protection_set_state(p, ST_FENCED);
		retry_later(p);
		return;
	}
}

void protection_arbitrate(struct protection *p)
{
	if (witness_async_cas(p->arbiter.witness, p->name, &p->arbiter.ownership, p->settings->host,
			      on_cas_done, p) < 0)
		retry_later(p);
}

void protection_backup_lost(struct protection *p, const char *why)
{
	if (p->state != ST_SYNCING && p->state != ST_PROTECTED)
		return;
	log_error("vm %s: lost the backup %s: %s; asking etcd", p->name, p->backup, why);
	snprintf(p->error, sizeof(p->error), "%s", why);
	if (p->disk)
		disk_copy_stop(p->disk);
	/*
	 * A connection that still works stays open (heartbeats go on) until
	 * etcd answers: closing it would tell a backup that is merely slow
	 * that we died, and it would race us for the VM.
	 */
	/*
	 * Checkpoints wait and output stays held until etcd answers, so the
	 * guest's work from now on can only be lost or discarded: pause it.
	 * On a host that lost its whole network (cut-link) that also frees
	 * the CPU a backup taking over on the same machine needs, and the
	 * answer can take a witness timeout.  Winning resumes it.
	 */
	protection_pause_for_witness(p);
	protection_set_state(p, ST_ARBITRATING);
	protection_arbitrate(p);
}
