/*
 * The fork as its parent VM's attachment (vm.h, vm_attach): the table of
 * hooks through which the VM, which knows nothing of forks, ends it,
 * shows it in `status` and forwards QEMU's events (the parent's migration
 * into the page source reports through them).
 */
#include "fork/vm_fork.h"
#include "vm/vm.h"

static void destroy_attached(void *attachment)
{
	vm_fork_destroy(attachment);
}

static json_t *attached_status_json(const void *attachment)
{
	return vm_fork_status_json(attachment);
}

static void attached_on_qmp_event(void *attachment, const char *event, json_t *data,
				  int64_t qemu_time_us)
{
	vm_fork_on_qmp_event(attachment, event, data);
}

static const struct vm_attachment_ops fork_attachment = {
	.status_key = "fork",
	.destroy = destroy_attached,
	.status_json = attached_status_json,
	.on_qmp_event = attached_on_qmp_event,
};

struct vm_fork *vm_fork_of(const struct vm *vm)
{
	return vm_attachment(vm, VM_ATTACH_FORK);
}

void vm_fork_attach(struct vm *vm, struct vm_fork *f)
{
	vm_attach(vm, VM_ATTACH_FORK, &fork_attachment, f);
}
