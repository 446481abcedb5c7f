/* The VM registry and each VM's runtime: NBD export, NIC relay, QMP watch. */
#include "vm/vm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "image/disk_changes.h"
#include "base/log.h"
#include "nbd/nbd_server.h"
#include "relay/net_relay.h"
#include "qemu/qmp.h"
#include "nbd/read_index.h"
#include "vm/clone_watch.h"
#include "vm/vm_store.h"

/* How often QEMU's run state is refreshed for `status`. */
#define STATUS_POLL_MS 1000

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

static void set_run_state(struct vm *vm, const char *state)
{
	if (strcmp(vm->run_state, state) == 0)
		return;
	log_info("vm %s: QEMU run state %s -> %s", vm->def.name, vm->run_state, state);
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

static void on_qmp_event(struct qmp_client *qmp, const char *event, json_t *data,
			 void *user)
{
	struct vm *vm = user;
	char *details = data ? json_dumps(data, JSON_COMPACT) : NULL;

	log_info("vm %s: QEMU event %s%s%s", vm->def.name, event,
		 details ? " " : "", details ? details : "");
	free(details);
	for (int slot = 0; slot < VM_ATTACH_SLOTS; slot++)
		if (vm->attachments[slot] && vm->attachment_ops[slot]->on_qmp_event)
			vm->attachment_ops[slot]->on_qmp_event(vm->attachments[slot], event, data);
	/* Run-state changes show in `status` at once rather than within 1 s. */
	if (!strcmp(event, "STOP") || !strcmp(event, "RESUME") ||
	    !strcmp(event, "SHUTDOWN") || !strcmp(event, "RESET"))
		poll_status(vm);
}

static void vm_stop(struct vm *vm)
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
	if (vm->disk && vm->changes)
		nbd_export_remove_before_write(vm->disk, vm);
	disk_changes_close(vm->changes);
	vm->changes = NULL;
	nbd_export_destroy(vm->disk);
	vm->disk = NULL;
}

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

bool vm_qemu_gone(const struct vm *vm)
{
	return vm->qmp && !qmp_client_ready(vm->qmp) && qmp_client_nobody_listens(vm->qmp);
}

/* Starts every part; on failure stops what started and explains in err. */
static int vm_start(struct vm *vm, char *err, size_t errlen)
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

static struct vm *vm_new(struct vm_registry *registry, const struct vm_definition *def)
{
	struct vm *vm = calloc(1, sizeof(*vm));

	if (!vm)
		return NULL;
	vm->registry = registry;
	vm->def = *def;
	strcpy(vm->run_state, "unknown");
	return vm;
}

static void insert_sorted(struct vm_registry *registry, struct vm *vm)
{
	struct vm **link = &registry->vms;

	while (*link && strcmp((*link)->def.name, vm->def.name) < 0)
		link = &(*link)->next;
	vm->next = *link;
	*link = vm;
}

/* Two VMs must not share a name, a socket or a tap. */
static int check_conflicts(const struct vm_registry *registry,
			   const struct vm_definition *def, char *err, size_t errlen)
{
	for (const struct vm *vm = registry->vms; vm; vm = vm->next) {
		const struct vm_definition *o = &vm->def;
		const char *clash = NULL;

		if (!strcmp(o->name, def->name)) {
			snprintf(err, errlen, "a VM named '%s' already exists "
				 "(vm-remove it first)", def->name);
			return -1;
		}
		/* A clone may serve no disk: an empty socket clashes with nothing. */
		if (def->nbd_socket[0] && !strcmp(o->nbd_socket, def->nbd_socket))
			clash = def->nbd_socket;
		else if (def->tap[0] && !strcmp(o->tap, def->tap))
			clash = def->tap;
		else if (def->net_socket[0] && !strcmp(o->net_socket, def->net_socket))
			clash = def->net_socket;
		else if (def->qmp_socket[0] && !strcmp(o->qmp_socket, def->qmp_socket))
			clash = def->qmp_socket;
		if (clash) {
			snprintf(err, errlen, "%s is already used by VM '%s'", clash,
				 o->name);
			return -1;
		}
	}
	return 0;
}

struct vm_registry *vm_registry_create(event_loop *loop, const char *state_dir,
				       char *err, size_t errlen)
{
	struct vm_registry *registry = calloc(1, sizeof(*registry));

	if (!registry) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	registry->loop = loop;
	registry->vms_dir = vm_store_open(state_dir, err, errlen);
	if (!registry->vms_dir) {
		free(registry);
		return NULL;
	}
	return registry;
}

static void load_visit(const struct vm_definition *def, void *data)
{
	struct vm_registry *registry = data;
	char err[256];

	if (check_conflicts(registry, def, err, sizeof(err)) < 0) {
		log_error("vm %s: not loaded: %s", def->name, err);
		return;
	}
	struct vm *vm = vm_new(registry, def);
	if (!vm) {
		log_error("vm %s: not loaded: out of memory", def->name);
		return;
	}
	/* Keep it registered even if it cannot start, so status shows why. */
	if (vm_start(vm, vm->error, sizeof(vm->error)) < 0)
		log_error("vm %s: loaded but not running: %s", def->name, vm->error);
	else
		log_info("vm %s: loaded from %s", def->name, registry->vms_dir);
	insert_sorted(registry, vm);
}

int vm_registry_load(struct vm_registry *registry)
{
	vm_store_load_all(registry->vms_dir, load_visit, registry);
	return (int)vm_registry_count(registry);
}

static void vm_free(struct vm *vm)
{
	vm_stop(vm);
	free(vm);
}

void vm_registry_destroy(struct vm_registry *registry)
{
	if (!registry)
		return;
	while (registry->vms) {
		struct vm *vm = registry->vms;
		registry->vms = vm->next;
		vm_free(vm);
	}
	free(registry->vms_dir);
	free(registry);
}

int vm_add(struct vm_registry *registry, const struct vm_definition *def,
	   char *err, size_t errlen)
{
	if (vm_definition_validate(def, err, errlen) < 0 ||
	    check_conflicts(registry, def, err, errlen) < 0)
		return -1;
	struct vm *vm = vm_new(registry, def);
	if (!vm) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	if (vm_start(vm, err, errlen) < 0) {
		free(vm);
		return -1;
	}
	/* Persist only what runs, so a restart never meets a bad definition. */
	if (vm_store_save(registry->vms_dir, def, err, errlen) < 0) {
		vm_free(vm);
		return -1;
	}
	insert_sorted(registry, vm);
	log_info("vm %s: added (disk %s on %s%s%s)", def->name, def->disk,
		 def->nbd_socket, def->tap[0] ? ", tap " : "", def->tap);
	return 0;
}

int vm_remove(struct vm_registry *registry, const char *name, char *err,
	      size_t errlen)
{
	for (struct vm **link = &registry->vms; *link; link = &(*link)->next) {
		struct vm *vm = *link;
		if (strcmp(vm->def.name, name) != 0)
			continue;
		/* Delete first: a crash now must not bring the VM back. */
		if (vm_store_delete(registry->vms_dir, name, err, errlen) < 0)
			return -1;
		*link = vm->next;
		vm_free(vm);
		log_info("vm %s: removed", name);
		return 0;
	}
	snprintf(err, errlen, "no VM named '%.40s' (see the status command for "
		 "the list)", name);
	return -1;
}

struct vm *vm_find(const struct vm_registry *registry, const char *name)
{
	for (struct vm *vm = registry->vms; vm; vm = vm->next)
		if (strcmp(vm->def.name, name) == 0)
			return vm;
	return NULL;
}

unsigned vm_registry_count(const struct vm_registry *registry)
{
	unsigned n = 0;

	for (const struct vm *vm = registry->vms; vm; vm = vm->next)
		n++;
	return n;
}

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

int vm_admit_identity(struct vm *vm, const char *mac, const char *ipv4, char *err,
		      size_t errlen)
{
	unsigned m[6], a[4];
	uint8_t mb[6], ab[4];
	int end = 0;

	if (!vm->nic || !net_relay_quarantined(vm->nic)) {
		snprintf(err, errlen, "vm %s is not quarantined", vm->def.name);
		return -1;
	}
	if (sscanf(mac, "%2x:%2x:%2x:%2x:%2x:%2x%n", &m[0], &m[1], &m[2], &m[3], &m[4],
		   &m[5], &end) != 6 || mac[end] || (m[0] & 1)) {
		snprintf(err, errlen, "'%.40s' is not a unicast MAC address", mac);
		return -1;
	}
	end = 0;
	if (sscanf(ipv4, "%3u.%3u.%3u.%3u%n", &a[0], &a[1], &a[2], &a[3], &end) != 4 ||
	    ipv4[end] || a[0] > 255 || a[1] > 255 || a[2] > 255 || a[3] > 255) {
		snprintf(err, errlen, "'%.40s' is not an IPv4 address", ipv4);
		return -1;
	}
	for (int i = 0; i < 6; i++)
		mb[i] = (uint8_t)m[i];
	for (int i = 0; i < 4; i++)
		ab[i] = (uint8_t)a[i];
	net_relay_admit_identity(vm->nic, mb, ab);
	return 0;
}

int vm_release_quarantine(struct vm *vm, char *err, size_t errlen)
{
	if (!vm->nic || !net_relay_quarantined(vm->nic)) {
		snprintf(err, errlen, "vm %s is not quarantined", vm->def.name);
		return -1;
	}
	net_relay_set_quarantine(vm->nic, false);
	/* Remembered, so that a restarted daemon does not cut it off again. */
	snprintf(vm->def.clone_released, sizeof(vm->def.clone_released), "1");
	if (vm_store_save(vm->registry->vms_dir, &vm->def, err, errlen) < 0)
		log_warn("vm %s: released, but not persisted (%s): a restarted remusdbd "
			 "would quarantine it again", vm->def.name, err);
	return 0;
}
