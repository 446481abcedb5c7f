/*
 * The operator's fencing command (--fence-command): run by the backup
 * after it won the VM in etcd and before it starts the VM, to power off or
 * isolate the old primary (IPMI, a switch port, a cloud API).
 */
#ifndef REMUSDB_FENCE_H
#define REMUSDB_FENCE_H

#include <stddef.h>

#define FENCE_TIMEOUT_MS 10000

/*
 * Runs cmd with /bin/sh, REMUSDB_VM=vm and REMUSDB_PRIMARY=replaced_owner
 * in its environment, and waits for it for at most timeout_ms; on timeout
 * its whole process group is killed.  Returns 0 when it exited with 0,
 * -1 otherwise with the reason in err.  *elapsed_ms gets its run time.
 */
int fence_run(const char *cmd, const char *vm, const char *replaced_owner,
	      int timeout_ms, double *elapsed_ms, char *err, size_t errlen);

#endif
