/*
 * The VM registry: every protected VM remusdbd serves, its definition
 * persisted under <state-dir>/vms/<name>.json, and its runtime parts:
 * an NBD export for the disk, a network relay for the NIC and a QMP
 * client watching QEMU.  A daemon restarted after a crash reloads every
 * definition and serves the same sockets again, so QEMU can reconnect.
 *
 * Implemented by vm_registry.c, vm_runtime.c, vm_tracking.c, vm_status.c
 * and clone_quarantine.c, which share struct vm (vm_internal.h).
 */
#ifndef REMUSDB_VM_H
#define REMUSDB_VM_H

#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/event_loop.h"

#define VM_NAME_MAX 32
#define VM_SOCKET_PATH_MAX 108 /* sun_path, NUL included */
#define VM_IFNAME_MAX 16       /* IFNAMSIZ, NUL included */

/*
 * As given to vm-add and stored on disk.  Empty strings are "not set".
 * Required: name, disk, nbd_socket.  The NIC (net_socket + tap, optional
 * bridge, mac) and qmp_socket are optional.
 */
struct vm_definition {
	char name[VM_NAME_MAX + 1];
	char disk[PATH_MAX];
	char nbd_socket[VM_SOCKET_PATH_MAX];
	char net_socket[VM_SOCKET_PATH_MAX];
	char qmp_socket[VM_SOCKET_PATH_MAX];
	char tap[VM_IFNAME_MAX];
	char bridge[VM_IFNAME_MAX];
	char mac[18];
	/* A fork's clone: the fork's id.  Its disk is optional (QEMU opens its
	 * own overlay), its NIC starts quarantined and its postcopy resume is
	 * watched (clone_watch.h). */
	char clone_of[128];
	/* "off": no watch (a negative control of the fork tests only: a clone
	 * whose page source dies then hangs for good). */
	char clone_watch[4];
	/* "1" once the clone was let onto the LAN (vm-release): a restarted
	 * daemon must not quarantine it again. */
	char clone_released[2];
};

struct vm;
struct vm_registry;

/*
 * Fills def from a JSON object of string members named like the struct
 * fields.  Unknown members, non-strings and over-long values are errors.
 */
int vm_definition_from_json(const json_t *obj, struct vm_definition *def,
			    char *err, size_t errlen);
json_t *vm_definition_to_json(const struct vm_definition *def);
/* Checks names, paths and the NIC fields; does not touch the system. */
int vm_definition_validate(const struct vm_definition *def, char *err,
			   size_t errlen);

/* Creates <state_dir>/vms if needed.  NULL with a message in err. */
struct vm_registry *vm_registry_create(event_loop *loop, const char *state_dir,
				       char *err, size_t errlen);
/*
 * Loads and starts every persisted VM.  A definition that cannot start
 * (say its disk is missing) stays registered with an error in its status.
 * Returns the number of VMs registered.
 */
int vm_registry_load(struct vm_registry *registry);
/* Stops every VM; the persisted definitions stay. */
void vm_registry_destroy(struct vm_registry *registry);

/* Validates, starts and persists a new VM.  0, or -1 with a message in err. */
int vm_add(struct vm_registry *registry, const struct vm_definition *def,
	   char *err, size_t errlen);
/* Stops the VM and deletes its definition.  0, or -1 with a message in err. */
int vm_remove(struct vm_registry *registry, const char *name, char *err,
	      size_t errlen);
struct vm *vm_find(const struct vm_registry *registry, const char *name);
unsigned vm_registry_count(const struct vm_registry *registry);

/* The VM's runtime parts (NULL when it has none). */
struct qmp_client;
struct net_relay;
struct nbd_export;
const struct vm_definition *vm_def(const struct vm *vm);
struct qmp_client *vm_qmp(struct vm *vm);
struct net_relay *vm_nic(struct vm *vm);
struct nbd_export *vm_export(struct vm *vm);
/*
 * Keeps the disk's change log (disk_changes.h) from now on: every write
 * marks its extents first, in the epoch the callback names.  A VM whose
 * disk has a log is tracked from vm_add on.  0, or -1 with err.
 */
int vm_track_changes(struct vm *vm, char *err, size_t errlen);
struct disk_changes *vm_changes(struct vm *vm); /* NULL while untracked */
/*
 * epoch NULL: writes belong to no epoch (no protection) and stay marked;
 * it only takes effect if opaque is the one that set the callback.
 */
void vm_set_changes_epoch(struct vm *vm, uint64_t (*epoch)(void *opaque), void *opaque);
/* QEMU's QMP socket has nobody listening: the VM's QEMU is gone. */
bool vm_qemu_gone(const struct vm *vm);
/*
 * QEMU's run state as last seen on its monitor ("running", "paused",
 * "colo", ...), "unknown" without a monitor, "no-qemu" once it is gone.
 */
const char *vm_run_state(const struct vm *vm);
/*
 * The same, asked again now: a QEMU that died a moment ago shows as gone
 * only once a reconnect to its monitor was refused (up to the QMP
 * client's reconnect delay later), so while the monitor is disconnected
 * this tries it at once (a unix connect answers at once).  For a caller
 * about to refuse something because QEMU runs: a backup asked to protect
 * back a VM whose QEMU just died here.
 */
bool vm_qemu_gone_now(struct vm *vm);

/*
 * Disk read tracking (read_index.h) on the VM's NBD export, for the
 * protection code to start when a protected VM has it enabled: a fresh
 * index of budget_bytes replaces any previous one.  0, or -1 with a
 * message in err (no disk served, or not enough memory).  The index
 * lives as long as the export; stop drops it.
 */
struct read_index;
int vm_read_tracking_start(struct vm *vm, size_t budget_bytes, char *err,
			   size_t errlen);
void vm_read_tracking_stop(struct vm *vm);
/*
 * The index, for lookups and its statistics; NULL when tracking is off.
 * Valid until tracking stops or the VM stops: ask again, do not keep it.
 */
struct read_index *vm_read_index(struct vm *vm);

/*
 * A feature attached to the VM (its protection, its fork), as the VM sees
 * it: how to end it, its part of `status`, and QEMU's events.  Why hooks:
 * vm/ sits below primary/ and fork/ (docs/architecture.md, "The daemon's
 * folders"), so it names none of their types; each feature hands the VM
 * its table when it attaches (protection_attach, vm_fork_attach).
 */
struct vm_attachment_ops {
	const char *status_key; /* its object's key in the VM's status */
	void (*destroy)(void *attachment);
	json_t *(*status_json)(const void *attachment);
	/* QEMU's asynchronous events (qmp.h says what qemu_time_us is); NULL when not interested. */
	void (*on_qmp_event)(void *attachment, const char *event, json_t *data,
			     int64_t qemu_time_us);
	/*
	 * Whether QEMU's STOP and RESUME are the feature's own doing now (a
	 * protection's checkpoints, ten a second per VM): the VM then logs
	 * them at debug and leaves the run state to its 1 s poll instead of
	 * asking QEMU at each.  NULL: never.
	 */
	bool (*pauses_are_its_own)(const void *attachment);
};
/*
 * One slot per feature, in teardown order: the protection holds hooks
 * into the relay and the export, so it ends first.  Status lists them in
 * this order too.
 */
enum vm_attachment_slot {
	VM_ATTACH_PROTECTION,
	VM_ATTACH_FORK,
	VM_ATTACH_SLOTS
};
void *vm_attachment(const struct vm *vm, enum vm_attachment_slot slot);
/*
 * The VM owns what is attached to it: an attachment replaced by another
 * (or by NULL) is destroyed, and so is every attachment when the VM
 * stops.
 */
void vm_attach(struct vm *vm, enum vm_attachment_slot slot,
	       const struct vm_attachment_ops *ops, void *attachment);
/*
 * Lets a quarantined clone's new identity (MAC, IPv4 address) through and
 * nothing else (net_relay_admit_identity).  0, or -1 with a message in err.
 */
int vm_admit_identity(struct vm *vm, const char *mac, const char *ipv4, char *err,
		      size_t errlen);
/* Lets a clone onto the LAN.  0, or -1 with a message in err. */
int vm_release_quarantine(struct vm *vm, char *err, size_t errlen);

/* New references: one VM's status object / an array of all of them. */
json_t *vm_status_json(const struct vm *vm);
json_t *vm_registry_status_json(const struct vm_registry *registry);

#endif
