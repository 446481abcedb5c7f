/*
 * A VM's runtime: starting and stopping its parts (the NBD export of its
 * disk, the relay of its NIC, the QMP client watching QEMU and, for a
 * clone, the watch on its postcopy resume), QEMU's run state polled for
 * `status`, QEMU's events handed to what is attached to the VM, and the
 * attachments themselves.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/log.h"
#include "image/disk_changes.h"
#include "nbd/nbd_server.h"
#include "qemu/qmp.h"
#include "relay/net_relay.h"
#include "vm/clone_watch.h"
#include "vm/vm_internal.h"

/* How often QEMU's run state is refreshed for `status`. */
#define STATUS_POLL_MS 1000

/* QEMU 7.2's state for a VM inside a COLO checkpoint (RUN_STATE_COLO). */
static bool a_checkpoint(const char *from, const char *to)
{
	return (!strcmp(from, "running") && !strcmp(to, "colo")) ||
	       (!strcmp(from, "colo") && !strcmp(to, "running"));
}

static void set_run_state(struct vm *vm, const char *state)
{
	if (strcmp(vm->run_state, state) == 0)
		return;
	log_msg(a_checkpoint(vm->run_state, state) ? LOG_DEBUG : LOG_INFO,
		"vm %s: QEMU run state %s -> %s", vm->def.name, vm->run_state, state);
	snprintf(vm->run_state, sizeof(vm->run_state), "%s", state);
}

static void on_query_status(struct qmp_client *qmp, json_t *reply, void *data)
{
	struct vm *vm = data;
	json_t *status = json_object_get(json_object_get(reply, "return"), "status");

	vm->status_pending = 0;
	if (!reply) {
		set_run_state(vm, "unknown"); /* QMP connection lost */
		return;
	}
	if (!json_is_string(status)) {
		log_warn("vm %s: unexpected query-status reply", vm->def.name);
		return;
	}
	set_run_state(vm, json_string_value(status));
}

static void poll_status(struct vm *vm)
{
	if (!vm->qmp || vm->status_pending)
		return;
	if (!qmp_client_ready(vm->qmp)) {
		/* Never "running" on the strength of an old answer: no QEMU, no VM. */
		set_run_state(vm, qmp_client_nobody_listens(vm->qmp) ? "no-qemu" : "unknown");
		return;
	}
	if (qmp_execute(vm->qmp, "query-status", NULL, on_query_status, vm) == 0)
		vm->status_pending = 1;
}

static long on_poll_timer(event_loop *loop, long long timer_id, void *data)
{
	poll_status(data);
	return STATUS_POLL_MS;
}

/* A STOP or RESUME that an attachment (a protection's checkpoint) caused. */
static bool routine_pause(const struct vm *vm, const char *event)
{
	if (strcmp(event, "STOP") != 0 && strcmp(event, "RESUME") != 0)
		return false;
	for (int slot = 0; slot < VM_ATTACH_SLOTS; slot++)
		if (vm->attachments[slot] && vm->attachment_ops[slot]->pauses_are_its_own &&
		    vm->attachment_ops[slot]->pauses_are_its_own(vm->attachments[slot]))
			return true;
	return false;
}

static void on_qmp_event(struct qmp_client *qmp, const char *event, json_t *data,
			 int64_t qemu_time_us, void *user)
{
	struct vm *vm = user;
	bool routine = routine_pause(vm, event);

	if (routine) {
		/* Ten a second per protected VM: the log and QEMU's monitor are spared. */
		log_debug("vm %s: QEMU event %s (a checkpoint)", vm->def.name, event);
	} else {
		char *details = data ? json_dumps(data, JSON_COMPACT) : NULL;
		log_info("vm %s: QEMU event %s%s%s", vm->def.name, event,
			 details ? " " : "", details ? details : "");
		free(details);
	}
	for (int slot = 0; slot < VM_ATTACH_SLOTS; slot++)
		if (vm->attachments[slot] && vm->attachment_ops[slot]->on_qmp_event)
			vm->attachment_ops[slot]->on_qmp_event(vm->attachments[slot], event, data,
								qemu_time_us);
	/*
	 * Run-state changes show in `status` at once rather than within 1 s,
	 * except a checkpoint's: its query-status would reach QEMU's monitor
	 * while the checkpoint holds QEMU's big lock.
	 */
	if (!routine && (!strcmp(event, "STOP") || !strcmp(event, "RESUME") ||
			 !strcmp(event, "SHUTDOWN") || !strcmp(event, "RESET")))
		poll_status(vm);
}

void vm_stop(struct vm *vm)
{
	/* First: the protection holds hooks into the relay and the export. */
	for (int slot = 0; slot < VM_ATTACH_SLOTS; slot++)
		vm_attach(vm, slot, NULL, NULL);
	if (vm->poll_timer)
		event_loop_del_timer(vm->registry->loop, vm->poll_timer);
	vm->poll_timer = 0;
	/* Drops a pending query-status without calling back. */
	qmp_client_destroy(vm->qmp);
	vm->qmp = NULL;
	/* After its QMP client: that dropped the watch's pending reply. */
	clone_watch_destroy(vm->clone_watch);
	vm->clone_watch = NULL;
	vm->status_pending = 0;
	net_relay_destroy(vm->nic);
	vm->nic = NULL;
	vm_changes_stop(vm);
	nbd_export_destroy(vm->disk);
	vm->disk = NULL;
}

bool vm_qemu_gone(const struct vm *vm)
{
	return vm->qmp && !qmp_client_ready(vm->qmp) && qmp_client_nobody_listens(vm->qmp);
}

const char *vm_run_state(const struct vm *vm)
{
	return vm->run_state;
}

bool vm_qemu_gone_now(struct vm *vm)
{
	if (vm->qmp && !qmp_client_ready(vm->qmp))
		qmp_client_connect_now(vm->qmp); /* nothing happens while connected */
	return vm_qemu_gone(vm);
}

/* Starts every part; on failure stops what started and explains in err. */
int vm_start(struct vm *vm, char *err, size_t errlen)
{
	const struct vm_definition *def = &vm->def;
	event_loop *loop = vm->registry->loop;
	struct stat st;

	if (def->disk[0] && stat(def->disk, &st) < 0) {
		snprintf(err, errlen, "disk image %s: %s", def->disk, strerror(errno));
		return -1;
	}
	if (def->disk[0])
		vm->disk = nbd_export_create(loop, def->name, def->nbd_socket, def->disk);
	if (def->disk[0] && !vm->disk) {
		snprintf(err, errlen, "cannot serve disk %s on %s (the daemon log "
			 "says why)", def->disk, def->nbd_socket);
		goto fail;
	}
	/* A log kept before goes on: the disk must not change behind its back. */
	if (def->disk[0] && disk_changes_exist(def->disk) && vm_track_changes(vm, err, errlen) < 0)
		goto fail;
	if (def->tap[0]) {
		struct net_relay_config nic = {
			.vm_name = def->name,
			.stream_socket = def->net_socket,
			.tap_name = def->tap,
			.bridge = def->bridge,
		};
		vm->nic = net_relay_create(loop, &nic);
		if (!vm->nic) {
			snprintf(err, errlen, "cannot set up the NIC relay with tap %s "
				 "(the daemon log says why)", def->tap);
			goto fail;
		}
		if (def->clone_of[0] && !def->clone_released[0])
			net_relay_set_quarantine(vm->nic, true);
		if (def->clone_of[0] && !strcmp(def->clone_watch, "off"))
			log_warn("vm %s: UNSAFE: clone not watched: it hangs for good if its "
				 "page source dies", def->name);
	}
	if (def->qmp_socket[0]) {
		vm->qmp = qmp_client_create(loop, def->qmp_socket, on_qmp_event, vm);
		vm->poll_timer = event_loop_add_timer(loop, STATUS_POLL_MS,
						      on_poll_timer, vm);
		if (!vm->qmp || vm->poll_timer < 0) {
			vm->poll_timer = vm->poll_timer < 0 ? 0 : vm->poll_timer;
			snprintf(err, errlen, "cannot start the QMP client for %s",
				 def->qmp_socket);
			goto fail;
		}
		if (def->clone_of[0] && strcmp(def->clone_watch, "off")) {
			vm->clone_watch = clone_watch_start(loop, vm->qmp, def->name, 0);
			if (!vm->clone_watch) {
				snprintf(err, errlen, "cannot watch the clone (out of memory)");
				goto fail;
			}
		}
	}
	return 0;
fail:
	vm_stop(vm);
	return -1;
}

const struct vm_definition *vm_def(const struct vm *vm)
{
	return &vm->def;
}

struct qmp_client *vm_qmp(struct vm *vm)
{
	return vm->qmp;
}

struct net_relay *vm_nic(struct vm *vm)
{
	return vm->nic;
}

struct nbd_export *vm_export(struct vm *vm)
{
	return vm->disk;
}

void *vm_attachment(const struct vm *vm, enum vm_attachment_slot slot)
{
	return vm->attachments[slot];
}

void vm_attach(struct vm *vm, enum vm_attachment_slot slot,
	       const struct vm_attachment_ops *ops, void *attachment)
{
	void *old = vm->attachments[slot];

	if (old && old != attachment)
		vm->attachment_ops[slot]->destroy(old);
	vm->attachments[slot] = attachment;
	vm->attachment_ops[slot] = attachment ? ops : NULL;
}
