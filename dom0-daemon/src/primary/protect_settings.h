/*
 * What `protect` was asked, kept on disk so that a restarted remusdbd can
 * protect the VM again by itself: <state-dir>/protect-settings/<vm>.json,
 * written (temp file, fsync, rename) when a protection starts and removed
 * when the operator unprotects it, when the VM leaves this host, or when
 * the protection ends in a way that is never retried (a fence, a
 * refusal, a local failure: reprotect_policy.h).
 *
 * Why a file of its own and not more members in the protection marker
 * (protection_marker.h): the marker says "a backup may hold a replica,
 * arbitrate before the guest's output leaves" and goes when the VM runs
 * unprotected; these settings must outlive that, since a daemon that
 * restarts during an unprotected gap still owes the VM its re-protection.
 *
 * The format (docs/operations.md, "A restart of the primary's remusdbd")
 * is one JSON object with exactly these members, all required:
 *   format "remusdb-protect-settings", version 1, vm, backup, interval_ms,
 *   output_commit, unsafe_release_early, compress, read_tracking,
 *   commit_protection, cp_dscp, debug_resync_omit_extent, run_dir,
 *   qemu_argv (an array of strings, or null).
 * The parser is strict: an unknown or missing member, a wrong type, a
 * value out of range, another version or a duplicate key is refused with
 * one line, never half read (tests/unit/test_protect_settings.c,
 * tests/fuzz/fuzz_protect_settings.c).  A re-protection never copies the
 * whole disk by request nor records a page trace, so full_copy and
 * trace_pages are not kept.
 */
#ifndef REMUSDB_PROTECT_SETTINGS_H
#define REMUSDB_PROTECT_SETTINGS_H

#include <stddef.h>

#include "primary/protection.h"

#define PROTECT_SETTINGS_FORMAT "remusdb-protect-settings"
#define PROTECT_SETTINGS_VERSION 1
/* Far above any QEMU command line; a longer file is refused unread. */
#define PROTECT_SETTINGS_MAX_BYTES (1u << 20)

/*
 * The file's text for vm's protection req: NULL when out of memory
 * (free() it).  full_copy and trace_pages are left out (see above).
 */
char *protect_settings_format(const char *vm, const struct protect_request *req);

/*
 * Parses len bytes of a settings file into req (zeroed first) and vm (its
 * name).  On success req->qemu_argv is a new reference (json_decref it)
 * or NULL.  0, or -1 with one line in err and nothing to free.
 */
int protect_settings_parse(const char *text, size_t len, char vm[VM_NAME_MAX + 1],
			   struct protect_request *req, char *err, size_t errlen);

/* Written atomically.  0, or -1 with a message in err. */
int protect_settings_save(const char *state_dir, const char *vm,
			  const struct protect_request *req, char *err, size_t errlen);

/*
 * vm's settings: 1 found (req as protect_settings_parse leaves it), 0 no
 * file, -1 unreadable or malformed (one line in err).  A file whose vm
 * member names another VM is malformed.
 */
int protect_settings_load(const char *state_dir, const char *vm, struct protect_request *req,
			  char *err, size_t errlen);

void protect_settings_delete(const char *state_dir, const char *vm);

/* Calls visit with the VM name of each settings file found (*.json). */
void protect_settings_each(const char *state_dir,
			   void (*visit)(const char *vm, void *data), void *data);

#endif
