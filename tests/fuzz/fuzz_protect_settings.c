/*
 * libFuzzer harness for the protect settings parser: a restarted primary
 * reads <state-dir>/protect-settings/VM.json (primary/protect_settings.c)
 * and protects the VM again from what it says, so no byte string may be
 * misread, and whatever it accepts must write back to a file that reads
 * back the same (a settings file is rewritten at every re-protection).
 * Built by `make fuzz` (dom0-daemon/Makefile).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "primary/protect_settings.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct protect_request req, again;
	char vm[VM_NAME_MAX + 1], vm2[VM_NAME_MAX + 1], err[256];

	if (protect_settings_parse((const char *)data, size, vm, &req, err, sizeof(err)) < 0) {
		if (req.qemu_argv || !err[0] || memchr(err, '\n', strlen(err)))
			__builtin_trap(); /* a refusal leaves nothing and says why in one line */
		return 0;
	}
	char *text = protect_settings_format(vm, &req);
	if (!text)
		__builtin_trap();
	if (protect_settings_parse(text, strlen(text), vm2, &again, err, sizeof(err)) < 0 ||
	    strcmp(vm, vm2) != 0 || strcmp(req.backup, again.backup) != 0 ||
	    strcmp(req.run_dir, again.run_dir) != 0 || req.interval_ms != again.interval_ms ||
	    req.cp_dscp != again.cp_dscp || req.compress != again.compress ||
	    !(req.qemu_argv ? json_equal(req.qemu_argv, again.qemu_argv) : !again.qemu_argv))
		__builtin_trap(); /* what it accepted does not survive a rewrite */
	json_decref(req.qemu_argv);
	json_decref(again.qemu_argv);
	free(text);
	return 0;
}
