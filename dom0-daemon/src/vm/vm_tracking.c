/*
 * What a VM's disk keeps track of: its change log (disk_changes.h), which
 * every write marks before the image changes, so that a failback copies
 * only what changed; and its read index (read_index.h), which the
 * protection code uses to send blocks the backup already holds by hash.
 */
#include <stdio.h>

#include "base/log.h"
#include "image/disk_changes.h"
#include "nbd/nbd_server.h"
#include "nbd/read_index.h"
#include "vm/vm_internal.h"

static int mark_changes(void *opaque, uint64_t offset, uint64_t len)
{
	struct vm *vm = opaque;
	uint64_t epoch = vm->changes_epoch ? vm->changes_epoch(vm->changes_epoch_opaque)
					   : DISK_CHANGES_NO_EPOCH;

	/* A log that cannot be written costs a failback its shortcut, never the guest a write. */
	disk_changes_mark(vm->changes, offset, len, epoch);
	return 0;
}

int vm_track_changes(struct vm *vm, char *err, size_t errlen)
{
	if (vm->changes)
		return 0;
	if (!vm->disk) {
		snprintf(err, errlen, "VM %s serves no disk", vm->def.name);
		return -1;
	}
	vm->changes = disk_changes_open(vm->def.disk, nbd_export_size(vm->disk), err, errlen);
	if (!vm->changes)
		return -1;
	if (nbd_export_add_before_write(vm->disk, mark_changes, NULL, vm) < 0) {
		disk_changes_close(vm->changes);
		vm->changes = NULL;
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	return 0;
}

struct disk_changes *vm_changes(struct vm *vm)
{
	return vm->changes;
}

void vm_set_changes_epoch(struct vm *vm, uint64_t (*epoch)(void *opaque), void *opaque)
{
	if (!epoch && vm->changes_epoch_opaque != opaque)
		return; /* a newer protection already took over the numbering */
	vm->changes_epoch = epoch;
	vm->changes_epoch_opaque = epoch ? opaque : NULL;
}

void vm_changes_stop(struct vm *vm)
{
	if (vm->disk && vm->changes)
		nbd_export_remove_before_write(vm->disk, vm);
	disk_changes_close(vm->changes);
	vm->changes = NULL;
}

int vm_read_tracking_start(struct vm *vm, size_t budget_bytes, char *err,
			   size_t errlen)
{
	if (!vm->disk) {
		snprintf(err, errlen, "vm %s serves no disk to track reads on",
			 vm->def.name);
		return -1;
	}
	struct read_index *idx = read_index_create(budget_bytes);
	if (!idx) {
		snprintf(err, errlen, "cannot allocate a %zu-byte read index for "
			 "vm %s", budget_bytes, vm->def.name);
		return -1;
	}
	nbd_export_set_read_index(vm->disk, idx);
	struct read_index_stats s;
	read_index_get_stats(idx, &s);
	log_info("vm %s: disk read tracking on (%llu entries in %llu bytes)",
		 vm->def.name, (unsigned long long)s.capacity,
		 (unsigned long long)s.bytes);
	return 0;
}

void vm_read_tracking_stop(struct vm *vm)
{
	if (vm->disk && nbd_export_read_index(vm->disk)) {
		nbd_export_set_read_index(vm->disk, NULL);
		log_info("vm %s: disk read tracking off", vm->def.name);
	}
}

struct read_index *vm_read_index(struct vm *vm)
{
	return vm->disk ? nbd_export_read_index(vm->disk) : NULL;
}
