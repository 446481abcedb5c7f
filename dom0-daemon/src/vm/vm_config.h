/*
 * The VM_CONFIG message: what a primary tells its backup about the VM it
 * protects, so that the backup can start an identical QEMU if it takes
 * over.  One typed struct, one encoder and one validating decoder
 * (docs/protocol.md, "VM_CONFIG").
 *
 * Why validate at arrival: a field that is wrong (a bad MAC, an empty
 * command line) would otherwise surface only at takeover, the one moment
 * it must not fail.  The decoder checks every field's type and range, and
 * the backup refuses a bad VM_CONFIG with an ERROR the primary reports.
 * The encoder refuses what the decoder would reject, so that `protect`
 * reports the mistake on the primary.
 */
#ifndef REMUSDB_VM_CONFIG_H
#define REMUSDB_VM_CONFIG_H

#include <jansson.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "vm/vm.h"
#include "witness/witness.h"

#define VM_CONFIG_MIN_INTERVAL_MS 25
#define VM_CONFIG_MAX_INTERVAL_MS 500
/* Heartbeat and peer timeout: anything longer than an hour is a typo. */
#define VM_CONFIG_MAX_TIMING_MS 3600000u
#define VM_CONFIG_MAX_ARGS 4096
#define VM_CONFIG_MAC_SIZE 18 /* "52:54:00:12:34:56" and its NUL */

struct vm_config {
	char vm[VM_NAME_MAX + 1];
	char primary_host[WITNESS_OWNER_MAX + 1];
	char **qemu_argv;               /* qemu_argc strings and a NULL; owned */
	size_t qemu_argc;
	char run_dir[PATH_MAX];         /* the primary's run dir, named in qemu_argv */
	uint64_t disk_size;
	char mac[VM_CONFIG_MAC_SIZE];   /* "" = QEMU picks one */
	char tap[VM_IFNAME_MAX];
	char bridge[VM_IFNAME_MAX];     /* "" = none */
	unsigned interval_ms;
	unsigned heartbeat_ms;
	unsigned peer_timeout_ms;
	char ownership[WITNESS_RAW_MAX + 1]; /* the etcd value the primary claimed */
	uint64_t generation;
};

/*
 * Copies a JSON array of strings (the `protect` request's qemu_argv) into
 * c.  0, or -1 with a message in err.
 */
int vm_config_set_argv(struct vm_config *c, const json_t *argv, char *err, size_t errlen);
/* Frees qemu_argv; c may then be filled again. */
void vm_config_clear(struct vm_config *c);
/*
 * Every field but ownership and generation (which the primary learns
 * from etcd later): 0, or -1 with a message in err naming the field.
 */
int vm_config_check(const struct vm_config *c, char *err, size_t errlen);
/* Compact JSON text (malloc'd) of a valid c; NULL with a message in err. */
char *vm_config_encode(const struct vm_config *c, char *err, size_t errlen);
/*
 * Parses and checks a VM_CONFIG payload into out (cleared first; free it
 * with vm_config_clear even on failure).  0, or -1 with err naming what
 * is wrong.
 */
int vm_config_decode(const char *json, size_t len, struct vm_config *out, char *err,
		     size_t errlen);
/*
 * The definition a takeover registers (vm_add): the VM's NIC from c, its
 * disk and sockets at disk_path and run_dir on this host.  -1 if a path
 * does not fit, with err filled.
 */
int vm_config_definition(const struct vm_config *c, const char *disk_path,
			 const char *run_dir, struct vm_definition *def, char *err,
			 size_t errlen);

#endif
