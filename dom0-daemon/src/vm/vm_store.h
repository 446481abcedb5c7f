/*
 * Persistence of VM definitions: one JSON file per VM in <state>/vms.
 * Files are replaced by write-to-temp + fsync + rename, so a SIGKILL or
 * power cut leaves either the old or the new definition, never half.
 */
#ifndef REMUSDB_VM_STORE_H
#define REMUSDB_VM_STORE_H

#include <stddef.h>

#include "vm/vm.h"

/* Creates state_dir/vms (and parents).  Returns a malloc'ed path or NULL. */
char *vm_store_open(const char *state_dir, char *err, size_t errlen);
int vm_store_save(const char *vms_dir, const struct vm_definition *def, char *err,
		  size_t errlen);
int vm_store_delete(const char *vms_dir, const char *name, char *err,
		    size_t errlen);
/*
 * Calls visit for every valid definition, in name order.  Unreadable or
 * invalid files are logged and skipped; leftover temp files are removed.
 */
typedef void (*vm_store_visit)(const struct vm_definition *def, void *data);
void vm_store_load_all(const char *vms_dir, vm_store_visit visit, void *data);

#endif
