/* A VM's `status` object: its QEMU, disk, NIC, attachments and clone (control.h). */
#include "image/disk_changes.h"
#include "nbd/nbd_server.h"
#include "nbd/read_index.h"
#include "qemu/qmp.h"
#include "relay/net_relay.h"
#include "vm/clone_watch.h"
#include "vm/vm_internal.h"

static json_t *read_tracking_json(struct read_index *idx)
{
	struct read_index_stats s;

	read_index_get_stats(idx, &s);
	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I,"
			 " s:I, s:f}",
			 "entries", (json_int_t)s.entries,
			 "capacity", (json_int_t)s.capacity,
			 "bytes", (json_int_t)s.bytes,
			 "inserts", (json_int_t)s.inserts,
			 "refreshes", (json_int_t)s.refreshes,
			 "duplicates", (json_int_t)s.duplicates,
			 "invalidations", (json_int_t)s.invalidations,
			 "evictions", (json_int_t)s.evictions,
			 "zero_blocks", (json_int_t)s.zero_blocks,
			 "stale_reads", (json_int_t)s.stale_reads,
			 "lookups", (json_int_t)s.lookups, "hits", (json_int_t)s.hits,
			 "hit_rate", read_index_hit_rate(&s));
}

static json_t *disk_json(const struct vm *vm)
{
	struct nbd_export_stats s = { 0 };
	struct read_index *idx = vm->disk ? nbd_export_read_index(vm->disk) : NULL;
	uint64_t size = 0;
	json_t *disk;

	if (vm->disk) {
		nbd_export_get_stats(vm->disk, &s);
		size = nbd_export_size(vm->disk);
	}
	disk = json_pack("{s:s, s:s, s:I, s:s, s:b, s:I, s:I, s:I, s:I, s:I, s:I,"
			 " s:I, s:I, s:I, s:I, s:I}",
			 "export", vm->def.name, "path", vm->def.disk,
			 "size", (json_int_t)size, "socket", vm->def.nbd_socket,
			 "serving", vm->disk != NULL,
			 "connections", (json_int_t)s.connections_current,
			 "connections_total", (json_int_t)s.connections_total,
			 "reads", (json_int_t)s.reads, "writes", (json_int_t)s.writes,
			 "write_zeroes", (json_int_t)s.write_zeroes,
			 "bytes_read", (json_int_t)s.bytes_read,
			 "bytes_written", (json_int_t)s.bytes_written,
			 "flushes", (json_int_t)s.flushes, "trims", (json_int_t)s.trims,
			 "block_status", (json_int_t)s.block_status,
			 "errors", (json_int_t)s.errors);
	if (disk && vm->changes) {
		const char *trouble = disk_changes_trouble(vm->changes);
		json_object_set_new(disk, "change_log", json_pack("{s:I, s:I, s:s?}",
			"generation", (json_int_t)disk_changes_generation(vm->changes),
			"marked_extents", (json_int_t)disk_changes_marked(vm->changes),
			"trouble", trouble));
	}
	/* Present only while tracking is on. */
	if (disk && idx)
		json_object_set_new(disk, "read_tracking", read_tracking_json(idx));
	return disk;
}

static json_t *nic_json(const struct vm *vm)
{
	struct net_relay_stats s = { 0 };

	if (vm->nic)
		net_relay_get_stats(vm->nic, &s);
	return json_pack("{s:s, s:s, s:s, s:s, s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:I}",
			 "tap", vm->def.tap, "bridge", vm->def.bridge,
			 "mac", vm->def.mac, "socket", vm->def.net_socket,
			 "connected", s.connected,
			 "frames_to_guest", (json_int_t)s.frames_to_guest,
			 "bytes_to_guest", (json_int_t)s.bytes_to_guest,
			 "frames_from_guest", (json_int_t)s.frames_from_guest,
			 "bytes_from_guest", (json_int_t)s.bytes_from_guest,
			 "dropped", (json_int_t)s.frames_dropped,
			 "connects", (json_int_t)s.connects,
			 "quarantine", vm->nic ? net_relay_quarantine_mode(vm->nic) : "off",
			 "quarantine_dropped", (json_int_t)s.quarantine_dropped);
}

json_t *vm_status_json(const struct vm *vm)
{
	const char *version = vm->qmp ? qmp_client_qemu_version(vm->qmp) : "";
	json_t *nics = json_array();
	json_t *status;

	if (vm->def.tap[0])
		json_array_append_new(nics, nic_json(vm));
	status = json_pack("{s:s, s:s, s:s, s:b, s:s, s:[o], s:o}",
			   "name", vm->def.name, "run_state", vm->run_state,
			   "qemu_version", version,
			   "qmp_connected", vm->qmp && qmp_client_ready(vm->qmp),
			   "qmp_socket", vm->def.qmp_socket,
			   "disks", disk_json(vm), "nics", nics);
	if (status && vm->error[0])
		json_object_set_new(status, "error", json_string(vm->error));
	for (int slot = 0; status && slot < VM_ATTACH_SLOTS; slot++)
		if (vm->attachments[slot])
			json_object_set_new(status, vm->attachment_ops[slot]->status_key,
					    vm->attachment_ops[slot]->status_json(vm->attachments[slot]));
	if (status && vm->def.clone_of[0]) {
		json_t *clone = vm->clone_watch ? clone_watch_status_json(vm->clone_watch)
						: json_object();

		json_object_set_new(clone, "of", json_string(vm->def.clone_of));
		json_object_set_new(status, "clone", clone);
	}
	return status;
}

json_t *vm_registry_status_json(const struct vm_registry *registry)
{
	json_t *all = json_array();

	for (const struct vm *vm = registry->vms; vm && all; vm = vm->next)
		if (json_array_append_new(all, vm_status_json(vm)) < 0) {
			json_decref(all);
			return NULL;
		}
	return all;
}
