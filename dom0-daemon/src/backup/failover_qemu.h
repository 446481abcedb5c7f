/*
 * The takeover's QEMU (failover_qemu.c): the primary's command line made
 * to run here, and its start.
 */
#ifndef REMUSDB_FAILOVER_QEMU_H
#define REMUSDB_FAILOVER_QEMU_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "vm/vm_config.h"

/*
 * Starts the primary's QEMU command line with its run dir replaced by
 * run_dir, restoring from -incoming (with postcopy when lazy), for VM
 * name.  Its pid, or -1 with err.
 */
pid_t failover_qemu_spawn(const struct vm_config *config, const char *run_dir, bool lazy,
			  const char *name, char *err, size_t errlen);
/*
 * The VM's QEMU command as it runs here after the takeover, without the
 * restore's -incoming: what a protection from here to another host (a
 * failback) ships as the VM's command line.
 */
json_t *failover_qemu_command_json(const struct vm_config *config, const char *run_dir);

#endif
