/*
 * The disk replica's file and its generation (replica_disk_base.c): which
 * file, full copy or resync and why, sealing it as a generation at a
 * takeover or after an orderly goodbye.
 */
#ifndef REMUSDB_REPLICA_DISK_BASE_H
#define REMUSDB_REPLICA_DISK_BASE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/file_flush.h"
#include "wire/repl_proto.h"

struct replica;
struct session;
struct vm;
struct vm_registry;

struct replica_disk_base {
	struct disk_changes *changes; /* the file's change log, until sealed */
	uint64_t generation;       /* the generation the primary's copy starts */
	bool resync;               /* only changed extents are copied */
	char reason[400];
	uint8_t *discarded_bits;   /* extents a takeover's discarded epoch wrote */
	struct file_flush *seal_flush; /* the file's flush on a worker; the seal follows */
};

int replica_default_disk_path(const struct replica *r, char *path, size_t len, char *err,
			      size_t errlen);
/*
 * A VM defined here whose QEMU is gone, that the primary now protects
 * back to us: its definition is removed and its disk (path) becomes the
 * replica's file.  0, or -1 with err.
 */
int replica_absorb_stopped_vm(struct vm_registry *vms, struct vm *vm, char *path, size_t len,
			      char *err, size_t errlen);
/* DISK_BASE: chooses full copy or resync, opens the file, answers DISK_PLAN. */
int replica_on_disk_base(struct session *ss, struct replica *r, const struct repl_frame *f);
/* Records the staged disk ranges of the epoch a takeover is about to discard. */
void replica_note_discarded(struct replica *r);
/*
 * Starts flushing the replica file on a worker; done runs on the loop.
 * 0, or -1 with err.
 */
int replica_start_disk_flush(struct replica *r, file_flush_done done, char *err,
			     size_t errlen);
/*
 * A takeover, once that flush succeeded: the file becomes the generation
 * the copy started, with the discarded extents marked, and the log is
 * closed.  0, or -1 (logged; the file then vouches for nothing).
 */
int replica_seal_disk_at_takeover(struct replica *r);
/*
 * An orderly goodbye while READY leaves a whole copy: the file is flushed
 * on a worker and then sealed the same way, without the discarded marks.
 */
void replica_seal_disk_after_goodbye(struct replica *r);
/*
 * For replica_free: a goodbye's flush still running is waited for and
 * its seal made; an abandoned takeover's is waited for without one.
 */
void replica_seal_disk_finish(struct replica *r);
/*
 * The replica's state changed.  READY: the copy is whole and an epoch
 * committed on it, so the file claims the generation for as long as this
 * kernel's page cache holds it (disk_changes_claim_unflushed): a daemon
 * that dies and restarts here can then be resynced instead of copied
 * whole.  FAILED while that claim stands: it is withdrawn.
 */
void replica_disk_base_state_changed(struct replica *r);
/* For replica_free, later: the change log and the discarded marks go. */
void replica_disk_base_free(struct replica *r);
json_t *replica_disk_base_json(const struct replica *r);

#endif
