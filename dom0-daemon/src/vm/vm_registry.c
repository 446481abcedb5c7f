/*
 * The VM registry: the VMs this daemon serves, in name order, each
 * definition persisted (vm_store.h) and checked against the others: no
 * two share a name, a socket or a tap.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "vm/vm_internal.h"
#include "vm/vm_store.h"

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
