/*
 * The protection as its VM's attachment (vm.h, vm_attach): the table of
 * hooks through which the VM, which knows nothing of protection, ends it,
 * shows it in `status` and hands it QEMU's events.
 */
#include "primary/protection_internal.h"

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

/* QEMU's RESUME ends a checkpoint's pause (protection_pause.c). */
static void attached_on_qmp_event(void *attachment, const char *event, json_t *data,
				  int64_t qemu_time_us)
{
	protection_on_qmp_event(attachment, event, qemu_time_us);
}

static const struct vm_attachment_ops protection_attachment = {
	.status_key = "protection",
	.destroy = destroy_attached,
	.status_json = attached_status_json,
	.on_qmp_event = attached_on_qmp_event,
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
