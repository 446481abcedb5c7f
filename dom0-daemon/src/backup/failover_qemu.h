/*
 * The takeover's QEMU (failover_qemu.c): the primary's command line made
 * to run here, and its start.
 */
#ifndef REMUSDB_FAILOVER_QEMU_H
#define REMUSDB_FAILOVER_QEMU_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "vm/vm_config.h"

/*
 * The RAM block a takeover's QEMU can map from the image instead of
 * loading it from the stream: x86's pc and q35 machines name their main
 * RAM "pc.ram" (QEMU's default_ram_id), as the primary's stream does.
 */
#define FAILOVER_SHARED_RAM_BLOCK "pc.ram"

/* The image's memfd of that block and its length; fd -1: none (the stream carries it). */
struct failover_shared_ram {
	int fd;
	uint64_t length;
};

/*
 * Whether the command line lets its QEMU map the image's main RAM: it
 * must run QEMU itself (a launcher, such as libvirt's, starts QEMU its own
 * way) and must not choose a memory backend of its own.  false with why.
 */
bool failover_qemu_can_share_ram(const struct vm_config *config, char *why, size_t whylen);
/*
 * Starts the primary's QEMU command line with its run dir replaced by
 * run_dir, restoring from -incoming (with postcopy when lazy), for VM
 * name; with ram->fd >= 0 its main RAM is that memfd, mapped shared
 * (memory-backend-file on the fd, which the child inherits).  Its pid,
 * or -1 with err.
 */
pid_t failover_qemu_spawn(const struct vm_config *config, const char *run_dir, bool lazy,
			  const struct failover_shared_ram *ram, const char *name,
			  char *err, size_t errlen);
/*
 * The VM's QEMU command as it runs here after the takeover, without the
 * restore's -incoming: what a protection from here to another host (a
 * failback) ships as the VM's command line.
 */
json_t *failover_qemu_command_json(const struct vm_config *config, const char *run_dir);

#endif
