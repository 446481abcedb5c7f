/*
 * The backup's half of a failback's resync: which file the replica is
 * written to, whether that file already holds the generation the
 * primary's disk belongs to (then only the extents either side marked are
 * copied, DISK_PLAN), and sealing it as a generation again once it is a
 * whole, flushed copy (a takeover or an orderly goodbye).
 *
 * Why the replica's own change log reads "no generation" while it
 * receives: its file lags the primary by the epochs not yet committed
 * and by what the page cache has not yet written back.  Only a flushed
 * file at a commit boundary is a generation; claiming one earlier could
 * make a later resync skip blocks a power cut took.  The one exception
 * is bound to the page cache itself: once READY, the file claims the
 * generation for as long as this kernel runs (its boot id), because a
 * daemon that dies without the host leaves every write it made in the
 * page cache, and every extent written since the primary's last
 * acknowledged and flushed epoch is still marked on the primary.  That
 * is what lets a primary re-protect to a restarted backup daemon by
 * changed extents (primary/protection_reprotect.c).
 */
#include "backup/replica_disk_base.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "image/disk_changes.h"
#include "base/fs_util.h"
#include "base/log.h"
#include "backup/replication_internal.h"

int replica_default_disk_path(const struct replica *r, char *path, size_t len, char *err,
			      size_t errlen)
{
	char dir[PATH_MAX];

	snprintf(dir, sizeof(dir), "%s/replicas", r->settings->state_dir);
	if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
		snprintf(err, errlen, "cannot create %.150s: %s", dir, strerror(errno));
		return -1;
	}
	if (snprintf(path, len, "%s/%s.img", dir, r->name) >= (int)len) {
		snprintf(err, errlen, "the state directory's path is too long");
		return -1;
	}
	return 0;
}

int replica_absorb_stopped_vm(struct vm_registry *vms, struct vm *vm, char *path, size_t len,
			      char *err, size_t errlen)
{
	char name[VM_NAME_MAX + 1];

	snprintf(name, sizeof(name), "%s", vm_def(vm)->name);
	if (snprintf(path, len, "%s", vm_def(vm)->disk) >= (int)len) {
		snprintf(err, errlen, "the VM's disk path is too long");
		return -1;
	}
	/* Its definition goes: a later takeover here registers the VM anew. */
	if (vm_remove(vms, name, err, errlen) < 0)
		return -1;
	log_warn("vm %s: its QEMU is gone here and another host now runs it: its disk %s "
		 "becomes the replica (resynced if it is of the same generation)", name, path);
	return 0;
}

/* NULL when the file here holds the primary's base generation: a resync can do. */
static const char *full_copy_reason(struct replica *r, const struct repl_disk_base *b,
				    char *why, size_t whylen)
{
	struct stat st;

	if (b->flags & REPL_DISK_BASE_FULL_ASKED)
		return "the primary asked for a full copy";
	if (b->base_generation == DISK_CHANGES_NO_GENERATION)
		return "the primary's disk has no proven generation (its first protection, or "
		       "its change log was lost)";
	if (stat(r->disk_path, &st) < 0)
		return "this host holds no copy of the disk";
	if ((uint64_t)st.st_size != r->disk_size) {
		snprintf(why, whylen, "the copy here (%.150s) is %lld bytes, the disk %" PRIu64,
			 r->disk_path, (long long)st.st_size, r->disk_size);
		return why;
	}
	if (disk_changes_trouble(r->disk_base.changes)) {
		snprintf(why, whylen, "the copy here (%.150s) cannot be vouched for: %s",
			 r->disk_path, disk_changes_trouble(r->disk_base.changes));
		return why;
	}
	if (disk_changes_generation(r->disk_base.changes) != b->base_generation) {
		snprintf(why, whylen, "the copy here (%.150s) is of generation %016" PRIx64
			 ", the primary's disk of %016" PRIx64, r->disk_path,
			 disk_changes_generation(r->disk_base.changes), b->base_generation);
		return why;
	}
	return NULL;
}

/* Both sides' marks; the extents are emptied here first, as a fresh file would be. */
static int prepare_resync(struct replica *r, const struct repl_disk_base *b, uint8_t *plan,
			  uint64_t *planned, char *err, size_t errlen)
{
	const uint8_t *ours = disk_changes_bitmap(r->disk_base.changes);
	size_t nb = disk_changes_bitmap_bytes(b->extent_count);

	*planned = 0;
	for (size_t i = 0; i < nb; i++)
		plan[i] = b->bits[i] | ours[i];
	for (uint64_t i = 0; i < b->extent_count; i++) {
		if (!extent_bit(plan, i))
			continue;
		uint64_t off = i << REPL_DISK_EXTENT_SHIFT, n = 1u << REPL_DISK_EXTENT_SHIFT;
		if (off + n > r->disk_size)
			n = r->disk_size - off;
		if (punch_or_zero(r->disk_fd, off, n) < 0) {
			snprintf(err, errlen, "cannot clear extent %" PRIu64 " of %.150s: %s", i,
				 r->disk_path, strerror(errno));
			return -1;
		}
		(*planned)++;
	}
	return 0;
}

static int open_replica_file(struct replica *r, bool full, char *err, size_t errlen)
{
	r->disk_fd = open(r->disk_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	/* A full copy starts from holes: it sends only the primary's data. */
	if (r->disk_fd < 0 || (full && ftruncate(r->disk_fd, 0) < 0) ||
	    ftruncate(r->disk_fd, (off_t)r->disk_size) < 0) {
		snprintf(err, errlen, "cannot create the disk replica %.150s: %s", r->disk_path,
			 strerror(errno));
		return -1;
	}
	return 0;
}

int replica_on_disk_base(struct session *ss, struct replica *r, const struct repl_frame *f)
{
	struct repl_disk_base b;
	const char *perr;
	char why[400], err[300];
	uint64_t planned = 0;

	if (r->disk_fd >= 0 || r->disk_base.changes)
		return session_protocol_error(ss, "a second DISK_BASE");
	if (repl_decode_disk_base(f, &b, &perr) < 0)
		return session_protocol_error(ss, "%s", perr);
	uint64_t count = disk_changes_extents_of(r->disk_size);
	if (b.extent_count != count)
		return session_protocol_error(ss, "DISK_BASE counts %" PRIu64 " extents, a %"
					      PRIu64 "-byte disk has %" PRIu64, b.extent_count,
					      r->disk_size, count);
	r->disk_base.changes = disk_changes_open(r->disk_path, r->disk_size, err, sizeof(err));
	if (!r->disk_base.changes)
		return session_protocol_error(ss, "the disk replica's change log: %s", err);
	const char *reason = full_copy_reason(r, &b, why, sizeof(why));
	uint8_t *plan = reason ? NULL : malloc(disk_changes_bitmap_bytes(count));
	if (!reason && !plan)
		return session_protocol_error(ss, "out of memory");
	/* Before the first byte changes: a copy that dies half way vouches for nothing. */
	char unfinished[200];
	snprintf(unfinished, sizeof(unfinished), "a copy from %s to it did not finish", r->peer);
	err[0] = '\0';
	if (disk_changes_invalidate(r->disk_base.changes, unfinished) < 0)
		snprintf(err, sizeof(err), "%s", disk_changes_trouble(r->disk_base.changes));
	else if (open_replica_file(r, reason != NULL, err, sizeof(err)) == 0 && plan)
		prepare_resync(r, &b, plan, &planned, err, sizeof(err));
	if (err[0]) {
		free(plan);
		snprintf(r->error, sizeof(r->error), "%s", err);
		session_send_error(ss, REPL_ERR_INTERNAL, err);
		return -1;
	}
	if (!reason) {
		snprintf(why, sizeof(why), "the copy here and the primary's disk are both of "
			 "generation %016" PRIx64 ": %" PRIu64 " of %" PRIu64 " extents changed",
			 b.base_generation, planned, count);
		reason = why;
	}
	r->disk_base.generation = b.generation;
	r->disk_base.resync = plan != NULL;
	snprintf(r->disk_base.reason, sizeof(r->disk_base.reason), "%s", reason);
	log_info("vm %s: disk %s: %s (%s)", r->name, r->disk_path,
		 plan ? "RESYNC of changed extents" : "full copy", reason);
	struct repl_disk_plan answer = {
		.resync = plan != NULL, .extent_count = count, .reason = reason, .bits = plan,
	};
	int rc = repl_put_disk_plan(repl_conn_out(ss->conn), &answer);
	free(plan);
	if (rc < 0)
		return session_protocol_error(ss, "cannot queue DISK_PLAN (out of memory)");
	repl_conn_flush(ss->conn);
	return 0;
}

static int note_range(void *opaque, uint64_t offset, uint64_t length)
{
	struct replica *r = opaque;
	uint64_t last = offset + length - 1;

	if (length == 0 || offset >= r->disk_size)
		return 0;
	if (last >= r->disk_size)
		last = r->disk_size - 1;
	for (uint64_t i = offset >> REPL_DISK_EXTENT_SHIFT; i <= last >> REPL_DISK_EXTENT_SHIFT; i++)
		extent_bit_set(r->disk_base.discarded_bits, i, true);
	return 0;
}

void replica_note_discarded(struct replica *r)
{
	struct replica_disk_base *base = &r->disk_base;
	uint64_t count = disk_changes_extents_of(r->disk_size);

	free(base->discarded_bits);
	base->discarded_bits = calloc(1, disk_changes_bitmap_bytes(count) + 1);
	/* Without it the seal cannot name them: it then vouches for nothing. */
	if (!base->discarded_bits ||
	    epoch_stage_for_each_disk_range(r->stage, note_range, r) < 0) {
		free(base->discarded_bits);
		base->discarded_bits = NULL;
	}
}

/*
 * The flushed file is the generation's committed state.  A takeover's
 * discarded epoch never reached it, but the old primary's disk may hold
 * those writes: they stay marked for the failback.
 */
static int seal(struct replica *r, bool taking_over)
{
	struct replica_disk_base *base = &r->disk_base;
	uint64_t count = disk_changes_extents_of(r->disk_size);
	int rc = 0;

	if (taking_over && !base->discarded_bits)
		rc = disk_changes_invalidate(base->changes, "the extents of the epoch the takeover "
					     "discarded could not be recorded (out of memory)");
	else if (disk_changes_begin_generation(base->changes, base->generation,
					       DISK_CHANGES_NO_EPOCH) < 0 ||
		 (taking_over && disk_changes_mark_bitmap(base->changes, base->discarded_bits,
							  count) < 0))
		rc = -1;
	else
		log_info("vm %s: disk %s sealed as generation %016" PRIx64 " (%" PRIu64
			 " extents of the discarded epoch marked)", r->name, r->disk_path,
			 r->disk_base.generation, disk_changes_marked(r->disk_base.changes));
	disk_changes_close(r->disk_base.changes);
	r->disk_base.changes = NULL;
	return rc;
}

/* The file could not be flushed: the log, still "unfinished", vouches for nothing. */
static void seal_refused(struct replica *r, const char *why)
{
	log_error("vm %s: flushing the disk replica %s: %s: it vouches for nothing", r->name,
		  r->disk_path, why);
	disk_changes_close(r->disk_base.changes);
	r->disk_base.changes = NULL;
}

int replica_seal_disk_at_takeover(struct replica *r)
{
	if (!r->disk_base.changes || r->state != REPLICA_FAILING_OVER)
		return 0;
	return seal(r, true);
}

/*
 * Why on a worker: right after a copy the page cache can hold most of the
 * disk unwritten, and flushing it can take seconds that this loop owes
 * to every other VM's checkpoints and heartbeats.
 */
int replica_start_disk_flush(struct replica *r, file_flush_done done, char *err,
			     size_t errlen)
{
	if (r->disk_fd < 0) {
		snprintf(err, errlen, "no disk replica was opened");
		return -1;
	}
	if (!r->disk_base.seal_flush)
		r->disk_base.seal_flush = file_flush_create(r->loop, err, errlen);
	if (!r->disk_base.seal_flush)
		return -1;
	if (file_flush_start(r->disk_base.seal_flush, r->disk_path, done, r) < 0) {
		snprintf(err, errlen, "no worker thread could start");
		return -1;
	}
	return 0;
}

static void on_goodbye_flushed(void *opaque, int err)
{
	struct replica *r = opaque;

	if (!r->disk_base.changes)
		return;
	if (err)
		seal_refused(r, strerror(err));
	else
		seal(r, false);
}

void replica_seal_disk_after_goodbye(struct replica *r)
{
	char err[200];

	if (r->disk_base.changes && r->state == REPLICA_READY &&
	    replica_start_disk_flush(r, on_goodbye_flushed, err, sizeof(err)) < 0)
		seal_refused(r, err);
}

/*
 * Only a protection that comes back before the goodbye's flush ended
 * waits here: the new copy must find the file sealed to resync it.  A
 * takeover abandoned mid-flush (the daemon stops) must not go on.
 */
void replica_seal_disk_finish(struct replica *r)
{
	if (r->state != REPLICA_FAILING_OVER)
		file_flush_finish(r->disk_base.seal_flush);
	file_flush_destroy(r->disk_base.seal_flush);
	r->disk_base.seal_flush = NULL;
}

void replica_disk_base_state_changed(struct replica *r)
{
	struct disk_changes *dc = r->disk_base.changes;

	if (!dc)
		return;
	if (r->state == REPLICA_READY) {
		if (disk_changes_claim_unflushed(dc, r->disk_base.generation) == 0)
			log_info("vm %s: disk %s holds generation %016" PRIx64 " while this "
				 "kernel runs (unflushed: a restarted daemon here can be "
				 "resynced, a rebooted host is copied whole)", r->name,
				 r->disk_path, r->disk_base.generation);
		else
			log_warn("vm %s: disk %s cannot claim its generation (%s): a "
				 "protection after this daemon restarts copies it whole", r->name,
				 r->disk_path, disk_changes_trouble(dc) ? disk_changes_trouble(dc)
				 : "the change log cannot be written");
	} else if (r->state == REPLICA_FAILED && disk_changes_unflushed(dc)) {
		disk_changes_invalidate(dc, "the replica failed after its copy was whole: its "
				       "file vouches for nothing");
	}
}

void replica_disk_base_free(struct replica *r)
{
	disk_changes_close(r->disk_base.changes);
	free(r->disk_base.discarded_bits);
}

json_t *replica_disk_base_json(const struct replica *r)
{
	if (r->disk_fd < 0)
		return json_null();
	return json_pack("{s:s, s:s, s:s}", "mode", r->disk_base.resync ? "resync" : "full",
			 "reason", r->disk_base.reason, "path", r->disk_path);
}
