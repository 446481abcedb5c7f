/*
 * The primary side of Remus for one VM: `protect` turns a running VM into
 * a protected one.  It claims the VM in etcd, connects and authenticates
 * to the backup's remusdbd, ships the VM's configuration, copies the disk
 * while the VM runs, captures QEMU's checkpoints (checkpoint_source.h),
 * ships them as epochs, holds the guest's outgoing frames until their
 * epoch is acknowledged, and mirrors disk writes tagged with their epoch.
 *
 * The parts: protection.c (lifecycle, etcd claim, the connection),
 * protection_epochs.c (the stream of epochs and their acks),
 * protection_arbiter.c (losing the backup), protection_status.c, with
 * vm_config.c, repl_handshake.c, disk_copy.c and output_commit.c.
 *
 * When the backup goes away it arbitrates through etcd: it wins and runs
 * on unprotected (loudly), or it loses and fences itself (VM paused, held
 * output dropped).  Reaching neither the backup nor etcd also pauses the
 * VM: it cannot know that it has not been replaced.
 */
#ifndef REMUSDB_PROTECTION_H
#define REMUSDB_PROTECTION_H

#include <jansson.h>
#include <limits.h>
#include <stdbool.h>

#include "base/event_loop.h"
#include "wire/repl_settings.h"
#include "vm/vm_config.h"
#include "vm/vm.h"

#define PROTECTION_MIN_INTERVAL_MS VM_CONFIG_MIN_INTERVAL_MS
#define PROTECTION_MAX_INTERVAL_MS VM_CONFIG_MAX_INTERVAL_MS
#define PROTECTION_DEFAULT_INTERVAL_MS 50
#define PROTECTION_DEFAULT_CP_DSCP 47 /* guest-kmod/remusdb_cp.c's default */

struct protect_request {
	char backup[64];          /* "ADDR:PORT" of the backup's remusdbd */
	unsigned interval_ms;     /* epoch length */
	bool output_commit;       /* false: DEBUG negative control, frames leave at once */
	bool unsafe_release_early; /* DEBUG negative control: output leaves one epoch early */
	bool compress;            /* ASC: XOR+RLE/LZ4 page compression (docs/protocol.md) */
	bool read_tracking;       /* RT: pages equal to blocks the guest read go as disk references */
	bool commit_protection;   /* CP: only frames the guest marked wait (output_commit.h) */
	unsigned cp_dscp;         /* the guest module's mark (remusdb_cp's dscp parameter) */
	char trace_pages[PATH_MAX]; /* "" or a page trace to record (benchmarks, asc_encoder.h) */
	json_t *qemu_argv;        /* borrowed: the VM's QEMU command line */
	char run_dir[PATH_MAX];   /* the VM's run dir on this host, as in qemu_argv */
	bool full_copy;           /* copy the whole disk even if a resync could do */
	bool debug_resync_omit_extent; /* DEBUG negative control: a resync misses one extent */
};

struct protection;

/* Validates and starts; NULL with a message in err. */
struct protection *protection_start(event_loop *loop, const struct repl_settings *settings,
				    struct vm *vm, const struct protect_request *req,
				    char *err, size_t errlen);
/*
 * After remusdbd restarted with a protection marker for vm: pauses the VM,
 * holds its output, and arbitrates in etcd as if the backup were lost
 * (protection_marker.h says why).  restored: the settings `protect` was
 * given, kept on disk (protect_settings.h), or NULL.  With them, a VM that
 * etcd leaves here is protected again by automatic re-protection, as
 * after a lost backup; without them it runs on unprotected.  NULL only
 * when out of memory.
 */
struct protection_marker;
struct protection *protection_recover(event_loop *loop, const struct repl_settings *settings,
				      struct vm *vm, const struct protection_marker *m,
				      const struct protect_request *restored);
/*
 * After remusdbd restarted with kept settings but no marker for vm: the
 * VM ran unprotected (its backup was lost, nothing holds a replica), so
 * there is nothing to arbitrate: it goes on running, and re-protection
 * tries the backup as after a loss.  NULL only when out of memory.
 */
struct protection *protection_restore(event_loop *loop, const struct repl_settings *settings,
				      struct vm *vm, const struct protect_request *restored);
/*
 * `unprotect`: tells the backup (BYE), releases held output, leaves COLO.
 * On a protection that ended already, it stops the tries of a lost
 * backup (automatic re-protection) and nothing else.
 */
void protection_stop(struct protection *p);
void protection_destroy(struct protection *p);
/* True once it has ended (unprotected, fenced or failed): a new protect may replace it. */
bool protection_finished(const struct protection *p);
/*
 * True while QEMU checkpoints into it (syncing or protected, its
 * checkpoint source alive): QEMU's STOP and RESUME are then its pauses.
 */
bool protection_checkpointing(const struct protection *p);
json_t *protection_status_json(const struct protection *p);
/*
 * The VM's protection (protection_attach.c): the VM owns it, so one
 * attached in its place, or NULL, destroys it, and so does the VM's stop.
 */
struct protection *protection_of(const struct vm *vm);
void protection_attach(struct vm *vm, struct protection *p);
/*
 * `reset-stats`: pause and size percentiles, backpressure and peer
 * silence start again from zero (like Redis's CONFIG RESETSTAT), so that
 * a benchmark reads them over its own measurement window only.
 */
void protection_reset_stats(struct protection *p);
/*
 * `dirty-census`: where the checkpoints' pages came from since the last
 * reset-stats, with the hot and most shipped pages (dirty_census.h): a
 * scan of every guest page, so asked for apart from `status`.
 */
json_t *protection_dirty_census_json(const struct protection *p);
/*
 * hold-checkpoint: the VM stays paused at the end of its next checkpoint
 * and its memory (dump_bytes from guest physical 0) is written to
 * dump_path with QMP pmemsave, so that a test can compare it with the
 * backup's image of that epoch (docs/architecture.md, "Checking the
 * backup's image").  The VM resumes on protection_release_checkpoint(),
 * or by itself after HOLD_MAX_MS.  0, or -1 with err set.
 */
int protection_hold_checkpoint(struct protection *p, const char *dump_path,
			       uint64_t dump_bytes, char *err, size_t errlen);
void protection_release_checkpoint(struct protection *p);
/*
 * Why `protect` of vm on host is refused while etcd names another host
 * (owner, at generation) as its owner, with the command that retires an
 * owner that outlived its VM: operators act on this line, so it is built
 * here, where a unit test can read it.  Truncated to outlen.
 */
void protection_foreign_owner_reason(char *out, size_t outlen, const char *vm,
				     const char *owner, unsigned long long generation,
				     const char *host);

/*
 * `switchover` (primary/switchover.h): the VM stops at its next checkpoint
 * and stays paused once the backup acknowledged it, for the backup to take
 * over (its `failover`); QEMU quits here when etcd names the backup.  If
 * nobody takes over within timeout_ms, or on protection_switchover_cancel()
 * while the link is up, the VM resumes here, still protected.
 * unsafe_release_early is the drill's negative control: that checkpoint is
 * not shipped and its output leaves at once.  0, or -1 with err set.
 */
int protection_switchover(struct protection *p, unsigned timeout_ms, bool unsafe_release_early,
			  char *err, size_t errlen);
int protection_switchover_cancel(struct protection *p, char *err, size_t errlen);

#endif
