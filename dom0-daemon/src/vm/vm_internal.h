/*
 * A VM's state, shared by the files of vm/: the registry (vm_registry.c)
 * keeps the list, the runtime (vm_runtime.c) starts and stops its parts
 * and watches QEMU, and the tracking (vm_tracking.c), status
 * (vm_status.c) and clone quarantine (clone_quarantine.c) files read and
 * extend them.  Everyone else goes through vm.h.
 */
#ifndef REMUSDB_VM_INTERNAL_H
#define REMUSDB_VM_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "vm/vm.h"

struct clone_watch;
struct disk_changes;

struct vm {
	struct vm_registry *registry;
	struct vm_definition def;
	struct nbd_export *disk;
	struct net_relay *nic;
	struct qmp_client *qmp;
	/* Its protection and its fork, as hooks (vm_attach). */
	void *attachments[VM_ATTACH_SLOTS];
	const struct vm_attachment_ops *attachment_ops[VM_ATTACH_SLOTS];
	struct clone_watch *clone_watch;
	/* The disk's change log (disk_changes.h), while one is kept. */
	struct disk_changes *changes;
	uint64_t (*changes_epoch)(void *opaque); /* the epoch writes belong to */
	void *changes_epoch_opaque;
	long long poll_timer;
	int status_pending;   /* a query-status is in flight */
	char run_state[32];   /* QEMU's "status", or "unknown" */
	char error[256];      /* why a loaded VM could not start; "" when fine */
	struct vm *next;      /* list kept in name order */
};

struct vm_registry {
	event_loop *loop;
	char *vms_dir;
	struct vm *vms;
};

/*
 * vm_runtime.c.  vm_start starts every part; on failure it stops what
 * started and explains in err.  vm_stop ends the attachments first, then
 * stops every part; the definition stays.
 */
int vm_start(struct vm *vm, char *err, size_t errlen);
void vm_stop(struct vm *vm);
/* vm_tracking.c: stops keeping the disk's change log (its file stays). */
void vm_changes_stop(struct vm *vm);

#endif
