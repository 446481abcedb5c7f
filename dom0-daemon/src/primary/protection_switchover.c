/*
 * `switchover` on the primary (protection.h): the VM stops at a
 * checkpoint, that checkpoint is shipped and acknowledged, and the VM
 * stays paused so that the backup resumes exactly it.  The backup is
 * asked to take over by the operator's tool (`remusdb switchover`, over
 * the backup's control socket, as `remusdb failover` does); winning etcd
 * it drops the link, this host then loses its own compare-and-swap and
 * fences itself (protection_arbiter.c), and only then does QEMU quit
 * here.  The rules are switchover.c's; this file wires them to the
 * checkpoint source's hold, the acks, etcd's verdict and a deadline.
 */
#include <stdio.h>
#include <time.h>

#include "base/log.h"
#include "primary/protection_internal.h"

static double now_unix(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void stop_timer(struct protection *p)
{
	if (p->switchover.timer)
		event_loop_del_timer(p->loop, p->switchover.timer);
	p->switchover.timer = 0;
}

/* While the link is up; afterwards etcd decides (switchover.h). */
static bool link_up(const struct protection *p)
{
	return p->state == ST_PROTECTED && protection_conn(p);
}

static void act(struct protection *p, enum switchover_action a)
{
	struct switchover *s = &p->switchover.steps;

	switch (a) {
	case SWITCHOVER_NOTHING:
		return;
	case SWITCHOVER_RESUME:
		stop_timer(p);
		checkpoint_source_release(p->source);
		log_warn("vm %s: switchover %s", p->name, s->error);
		return;
	case SWITCHOVER_WITHHOLD_AND_RELEASE:
		output_commit_release_all(p->oc);
		log_warn("vm %s: UNSAFE SWITCHOVER (debug negative control): checkpoint %llu is "
			 "not shipped and its output left before any acknowledgement; the backup "
			 "is to resume epoch %llu", p->name, (unsigned long long)s->held_epoch,
			 (unsigned long long)s->epoch);
		return;
	case SWITCHOVER_STOP_QEMU:
		stop_timer(p);
		log_warn("vm %s: SWITCHED OVER: etcd names %s (generation %llu), which resumes "
			 "checkpoint %llu; QEMU quits here and the VM never runs here again",
			 p->name, s->owner, (unsigned long long)s->generation,
			 (unsigned long long)s->epoch);
		protection_qmp(p, "quit");
		return;
	}
}

static long on_deadline(event_loop *loop, long long id, void *data)
{
	struct protection *p = data;
	char err[256];

	p->switchover.timer = 0;
	enum switchover_action a = switchover_cancel(&p->switchover.steps, link_up(p), NULL,
						     monotonic_us(), err, sizeof(err));
	if (a == SWITCHOVER_NOTHING)
		log_warn("vm %s: the switchover's deadline passed: %s", p->name, err);
	act(p, a);
	return TIMER_DONE;
}

int protection_switchover(struct protection *p, unsigned timeout_ms, bool unsafe_release_early,
			  char *err, size_t errlen)
{
	struct protection_switchover *so = &p->switchover;
	bool hold_possible = p->source && p->hold.state != HOLD_ARMED &&
			     p->hold.state != HOLD_DUMPING && p->hold.state != HOLD_HELD;

	if (switchover_begin(&so->steps, link_up(p), hold_possible, timeout_ms,
			     unsafe_release_early, monotonic_us(), err, errlen) < 0)
		return -1;
	if (checkpoint_source_hold_next(p->source) < 0) {
		so->steps.state = SWITCHOVER_IDLE;
		snprintf(err, errlen, "the checkpoint source cannot hold a checkpoint now");
		return -1;
	}
	so->requested_at_unix = now_unix();
	stop_timer(p);
	so->timer = event_loop_add_timer(p->loop, (long)timeout_ms, on_deadline, p);
	if (so->timer < 0) {
		so->timer = 0;
		checkpoint_source_release(p->source);
		so->steps.state = SWITCHOVER_IDLE;
		snprintf(err, errlen, "cannot arm the switchover's deadline (out of memory)");
		return -1;
	}
	log_warn("vm %s: SWITCHOVER requested: the VM stops at its next checkpoint and waits "
		 "for %s to acknowledge it (at most %u ms)%s", p->name, p->backup, timeout_ms,
		 unsafe_release_early ? "; UNSAFE: its output leaves one epoch early" : "");
	return 0;
}

int protection_switchover_cancel(struct protection *p, char *err, size_t errlen)
{
	enum switchover_action a = switchover_cancel(&p->switchover.steps, link_up(p),
						     "by the operator", monotonic_us(), err,
						     errlen);

	if (a != SWITCHOVER_RESUME)
		return -1;
	act(p, a);
	return 0;
}

bool protection_switchover_checkpoint_ended(struct protection *p, uint64_t epoch)
{
	struct switchover *s = &p->switchover.steps;

	if (s->state != SWITCHOVER_STOPPING || checkpoint_source_held_epoch(p->source) != epoch)
		return false;
	enum switchover_action a = switchover_checkpoint_held(s, epoch, p->epochs.acked_epoch,
							      monotonic_us());
	log_info("vm %s: switchover: the VM is held paused at checkpoint %llu%s", p->name,
		 (unsigned long long)epoch, s->state == SWITCHOVER_READY ?
		 "" : "; waiting for the backup to acknowledge it");
	act(p, a);
	return a == SWITCHOVER_WITHHOLD_AND_RELEASE;
}

void protection_switchover_acked(struct protection *p, uint64_t epoch)
{
	struct switchover *s = &p->switchover.steps;
	enum switchover_state before = s->state;

	switchover_acked(s, epoch, monotonic_us());
	if (before != s->state)
		log_info("vm %s: switchover: checkpoint %llu acknowledged and its output released; "
			 "the VM stays paused for the backup to take over", p->name,
			 (unsigned long long)s->epoch);
}

void protection_switchover_owner_moved(struct protection *p, const struct witness_ownership *now)
{
	act(p, switchover_owner_moved(&p->switchover.steps, now->owner, now->generation,
				      monotonic_us()));
}

void protection_switchover_ended(struct protection *p, const char *why)
{
	if (!switchover_active(&p->switchover.steps))
		return;
	stop_timer(p);
	switchover_protection_ended(&p->switchover.steps, why, monotonic_us());
	log_warn("vm %s: switchover %s", p->name, p->switchover.steps.error);
}

void protection_switchover_end(struct protection *p)
{
	stop_timer(p);
}

/* ms from the request to `us`, or null when that step has not come. */
static json_t *since_request(const struct switchover *s, int64_t us)
{
	return us ? json_real((us - s->requested_us) / 1000.0) : json_null();
}

json_t *protection_switchover_json(const struct protection *p)
{
	const struct switchover *s = &p->switchover.steps;

	if (s->state == SWITCHOVER_IDLE)
		return json_null();
	json_t *o = json_pack("{s:s, s:I, s:I, s:b, s:f, s:f}",
			      "state", switchover_state_name(s->state),
			      "epoch", (json_int_t)s->epoch,
			      "held_epoch", (json_int_t)s->held_epoch,
			      "unsafe_release_early", s->unsafe_release_early,
			      "requested_at_unix", p->switchover.requested_at_unix,
			      "timeout_ms", (s->deadline_us - s->requested_us) / 1000.0);
	if (!o)
		return json_null();
	json_object_set_new(o, "stopped_ms", since_request(s, s->stopped_us));
	json_object_set_new(o, "acked_ms", since_request(s, s->acked_us));
	json_object_set_new(o, "ended_ms", since_request(s, s->ended_us));
	json_object_set_new(o, "owner", s->owner[0] ? json_string(s->owner) : json_null());
	json_object_set_new(o, "generation", s->owner[0] ?
			    json_integer((json_int_t)s->generation) : json_null());
	json_object_set_new(o, "error", s->error[0] ? json_string(s->error) : json_null());
	return o;
}
