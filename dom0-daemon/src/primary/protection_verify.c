/*
 * hold-checkpoint (protection.h): the primary half of checking that the
 * backup's image equals the guest's memory at a checkpoint.
 *
 * Why this shape: the guest's memory only equals a checkpoint while the
 * VM is paused inside it, and COLO restarts the VM at the end of every
 * checkpoint whatever its run state was (QMP stop does not stick).  So
 * the checkpoint source holds back QEMU's VMSTATE_LOADED, QEMU keeps the
 * VM stopped, and meanwhile QMP pmemsave writes the memory out (QEMU
 * waits for LOADED without its big lock, so QMP runs).  The epoch itself
 * is shipped and acknowledged as usual, and no later epoch can start, so
 * the backup's image stays at exactly that epoch until the release.
 */
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "primary/protection_internal.h"
#include "qemu/qmp.h"
#include "vm/vm.h"

/* A forgotten hold must not freeze the guest: it resumes by itself. */
#define HOLD_MAX_MS 60000

static const char *const hold_state_names[] = {
	[HOLD_IDLE] = "idle", [HOLD_ARMED] = "armed", [HOLD_DUMPING] = "dumping",
	[HOLD_HELD] = "held", [HOLD_RELEASED] = "released", [HOLD_FAILED] = "failed",
};

/* One pmemsave in flight; orphaned (p NULL) when the protection goes first. */
struct hold_call {
	struct protection *p;
};

static void stop_timer(struct protection *p)
{
	if (p->hold.timer) {
		event_loop_del_timer(p->loop, p->hold.timer);
		p->hold.timer = 0;
	}
}

static void orphan_call(struct protection *p)
{
	if (p->hold.call) {
		p->hold.call->p = NULL;
		p->hold.call = NULL;
	}
}

static void release(struct protection *p, enum hold_state final)
{
	stop_timer(p);
	orphan_call(p);
	checkpoint_source_release(p->source);
	p->hold.state = final;
}

static long on_hold_timeout(event_loop *loop, long long id, void *data)
{
	struct protection *p = data;

	p->hold.timer = 0;
	log_warn("vm %s: nobody released the checkpoint hold within %d s: the VM resumes",
		 p->name, HOLD_MAX_MS / 1000);
	snprintf(p->hold.error, sizeof(p->hold.error), "released after %d s by the timeout",
		 HOLD_MAX_MS / 1000);
	release(p, HOLD_RELEASED);
	return -1;
}

static void on_dumped(struct qmp_client *qmp, json_t *reply, void *data)
{
	struct hold_call *call = data;
	struct protection *p = call->p;

	free(call);
	if (!p)
		return;
	p->hold.call = NULL;
	json_t *error = reply ? json_object_get(reply, "error") : NULL;
	if (!reply || error) {
		const char *desc = error ? json_string_value(json_object_get(error, "desc")) : NULL;
		snprintf(p->hold.error, sizeof(p->hold.error), "pmemsave failed: %s",
			 desc ? desc : "QMP went away");
		log_error("vm %s: checkpoint %llu: %s", p->name,
			  (unsigned long long)p->hold.epoch, p->hold.error);
		release(p, HOLD_FAILED);
		return;
	}
	p->hold.state = HOLD_HELD;
	log_info("vm %s: checkpoint %llu: guest memory written to %s; the VM stays paused",
		 p->name, (unsigned long long)p->hold.epoch, p->hold.dump_path);
}

int protection_hold_checkpoint(struct protection *p, const char *dump_path,
			       uint64_t dump_bytes, char *err, size_t errlen)
{
	if (p->state != ST_PROTECTED || !p->source) {
		snprintf(err, errlen, "the VM is not protected (state %s)",
			 protection_state_names[p->state]);
		return -1;
	}
	if (p->hold.state == HOLD_ARMED || p->hold.state == HOLD_DUMPING ||
	    p->hold.state == HOLD_HELD) {
		snprintf(err, errlen, "a checkpoint hold is %s already",
			 hold_state_names[p->hold.state]);
		return -1;
	}
	if (strlen(dump_path) >= sizeof(p->hold.dump_path) || dump_path[0] != '/' ||
	    dump_bytes == 0) {
		snprintf(err, errlen, "dump must be an absolute path and size a positive length");
		return -1;
	}
	if (checkpoint_source_hold_next(p->source) < 0) {
		snprintf(err, errlen, "the checkpoint source cannot hold a checkpoint now");
		return -1;
	}
	memset(&p->hold, 0, sizeof(p->hold));
	snprintf(p->hold.dump_path, sizeof(p->hold.dump_path), "%s", dump_path);
	p->hold.dump_bytes = dump_bytes;
	p->hold.state = HOLD_ARMED;
	return 0;
}

void protection_hold_checkpoint_ended(struct protection *p, uint64_t epoch)
{
	if (p->hold.state != HOLD_ARMED || checkpoint_source_held_epoch(p->source) != epoch)
		return;
	p->hold.epoch = epoch;
	p->hold.state = HOLD_DUMPING;
	p->hold.timer = event_loop_add_timer(p->loop, HOLD_MAX_MS, on_hold_timeout, p);
	struct hold_call *call = calloc(1, sizeof(*call));
	json_t *args = json_pack("{s:I, s:I, s:s}", "val", (json_int_t)0,
				 "size", (json_int_t)p->hold.dump_bytes,
				 "filename", p->hold.dump_path);
	struct qmp_client *qmp = vm_qmp(p->vm);
	if (!call || !args || !qmp) {
		free(call);
		json_decref(args);
		snprintf(p->hold.error, sizeof(p->hold.error), "cannot ask QEMU for the memory");
		release(p, HOLD_FAILED);
		return;
	}
	call->p = p;
	p->hold.call = call;
	if (qmp_execute(qmp, "pmemsave", args, on_dumped, call) < 0) {
		p->hold.call = NULL;
		free(call);
		snprintf(p->hold.error, sizeof(p->hold.error), "cannot send QMP pmemsave");
		release(p, HOLD_FAILED);
	}
}

void protection_release_checkpoint(struct protection *p)
{
	if (p->hold.state == HOLD_ARMED || p->hold.state == HOLD_DUMPING ||
	    p->hold.state == HOLD_HELD)
		release(p, HOLD_RELEASED);
}

void protection_hold_end(struct protection *p, bool resume)
{
	stop_timer(p);
	orphan_call(p);
	if (resume)
		checkpoint_source_release(p->source);
	if (p->hold.state != HOLD_IDLE && p->hold.state != HOLD_FAILED)
		p->hold.state = HOLD_RELEASED;
}

json_t *protection_hold_json(const struct protection *p)
{
	return json_pack("{s:s, s:I, s:s, s:o}", "state", hold_state_names[p->hold.state],
			 "epoch", (json_int_t)p->hold.epoch, "dump", p->hold.dump_path,
			 "error", p->hold.error[0] ? json_string(p->hold.error) : json_null());
}
