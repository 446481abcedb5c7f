/*
 * The protection as its VM's attachment (vm.h, vm_attach): the table of
 * hooks through which the VM, which knows nothing of protection, ends it,
 * shows it in `status` and hands it QEMU's events.
 */
#include "primary/protection.h"

static void destroy_attached(void *attachment)
{
	protection_destroy(attachment);
}

static json_t *attached_status_json(const void *attachment)
{
	return protection_status_json(attachment);
}

/*
 * While the checkpoint source runs, QEMU stops and resumes the guest for
 * each checkpoint.  Once it is gone (unprotected, failed, leaving COLO),
 * a STOP is news again.
 */
static bool attached_pauses_are_checkpoints(const void *attachment)
{
	return protection_checkpointing(attachment);
}

static const struct vm_attachment_ops protection_attachment = {
	.status_key = "protection",
	.destroy = destroy_attached,
	.status_json = attached_status_json,
	.on_qmp_event = NULL,
	.pauses_are_its_own = attached_pauses_are_checkpoints,
};

struct protection *protection_of(const struct vm *vm)
{
	return vm_attachment(vm, VM_ATTACH_PROTECTION);
}

void protection_attach(struct vm *vm, struct protection *p)
{
	vm_attach(vm, VM_ATTACH_PROTECTION, &protection_attachment, p);
}
