/*
 * A protected VM leaves a marker in <state-dir>/protected/<vm>.json while
 * a backup may hold a replica of it.  It matters when remusdbd itself
 * restarts on the primary: QEMU kept running in COLO, but the new daemon
 * has no memory of the protection.  Without the marker it would relay the
 * guest's output freely while the backup, having lost us, takes over:
 * two live copies.  With it, the VM is paused and etcd decides, exactly
 * as when the backup is lost (protection_recover).
 */
#ifndef REMUSDB_PROTECTION_MARKER_H
#define REMUSDB_PROTECTION_MARKER_H

#include <stddef.h>

#include "witness/witness.h"

struct protection_marker {
	char vm[33];
	char backup[64];
	struct witness_ownership ownership;
};

/* Written atomically (temp + rename).  0, or -1 with a message in err. */
int protection_marker_save(const char *state_dir, const struct protection_marker *m,
			   char *err, size_t errlen);
void protection_marker_delete(const char *state_dir, const char *vm);
/* Calls visit for each marker found (unreadable ones are logged and skipped). */
void protection_marker_load_all(const char *state_dir,
				void (*visit)(const struct protection_marker *m, void *data),
				void *data);

#endif
