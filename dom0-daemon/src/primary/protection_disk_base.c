/*
 * The primary's half of a failback's resync: what its disk is (DISK_BASE
 * after VM_CONFIG), what the backup answered (DISK_PLAN: a full copy or
 * only the changed extents), and keeping the disk's change log
 * (disk_changes.h) in step with the backup's acknowledgements.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "image/disk_changes.h"
#include "base/file_flush.h"
#include "base/log.h"
#include "primary/protection_internal.h"

_Static_assert(DISK_CHANGES_EXTENT_SHIFT == REPL_DISK_EXTENT_SHIFT &&
	       DISK_COPY_EXTENT_SHIFT == REPL_DISK_EXTENT_SHIFT,
	       "the log, the wire and the copy count the same extents");

/* Acknowledged marks are cleared (and the disk flushed) at most this often. */
#define FORGET_ACKED_EVERY_US 5000000

static uint64_t changes_epoch(void *opaque)
{
	struct protection *p = opaque;

	return output_commit_open_epoch(p->oc);
}

int protection_disk_base_start(struct protection *p, const struct protect_request *req,
			       char *err, size_t errlen)
{
	if (vm_track_changes(p->vm, err, errlen) < 0)
		return -1;
	do {
		if (getrandom(&p->disk_base.generation, sizeof(p->disk_base.generation), 0) !=
		    (ssize_t)sizeof(p->disk_base.generation)) {
			snprintf(err, errlen, "no randomness for the disk generation: %s",
				 strerror(errno));
			return -1;
		}
	} while (p->disk_base.generation == DISK_CHANGES_NO_GENERATION);
	p->disk_base.image_flush = file_flush_create(p->loop, err, errlen);
	if (!p->disk_base.image_flush)
		return -1;
	p->disk_base.full_copy_asked = req->full_copy;
	p->disk_base.debug_omit_extent = req->debug_resync_omit_extent;
	disk_changes_new_session(vm_changes(p->vm));
	vm_set_changes_epoch(p->vm, changes_epoch, p);
	return 0;
}

void protection_disk_base_end(struct protection *p)
{
	/* Joins a running flush: its callback must not outlive p. */
	file_flush_destroy(p->disk_base.image_flush);
	p->disk_base.image_flush = NULL;
	if (p->vm)
		vm_set_changes_epoch(p->vm, NULL, p);
}

int protection_send_disk_base(struct protection *p, struct buffer *out)
{
	struct disk_changes *dc = vm_changes(p->vm);
	struct repl_disk_base base = {
		.generation = p->disk_base.generation,
		.base_generation = p->disk_base.full_copy_asked ? DISK_CHANGES_NO_GENERATION
						      : disk_changes_generation(dc),
		.flags = p->disk_base.full_copy_asked ? REPL_DISK_BASE_FULL_ASKED : 0,
		.extent_count = disk_changes_extent_count(dc),
		.bits = disk_changes_bitmap(dc),
	};

	if (!p->disk_base.full_copy_asked && disk_changes_trouble(dc))
		log_info("vm %s: the disk's change log cannot vouch for it (%s): the backup "
			 "will get a full copy", p->name, disk_changes_trouble(dc));
	return repl_put_disk_base(out, &base);
}

/*
 * A negative control: one changed extent left out, for the disk check to
 * catch.  The one the guest wrote last: surely new since the other side's
 * copy (a mark kept only to be safe may name an extent that is equal on
 * both sides, and leaving that one out would prove nothing).
 */
static void omit_one_extent(struct protection *p, uint8_t *bits, uint64_t count)
{
	uint64_t pick = disk_changes_last_written(vm_changes(p->vm));

	if (pick >= count || !extent_bit(bits, pick))
		for (pick = count; pick-- > 0 && !extent_bit(bits, pick);)
			;
	if (pick >= count)
		return;
	extent_bit_set(bits, pick, false);
	log_warn("vm %s: DEBUG NEGATIVE CONTROL: extent %llu left out of the resync: the "
		 "backup's disk will differ there", p->name, (unsigned long long)pick);
}

int protection_on_disk_plan(struct protection *p, const struct repl_frame *f, char *why,
			    size_t whylen)
{
	struct repl_disk_plan plan;
	const char *err;
	uint8_t *bits = NULL;

	if (p->disk_base.planned || !p->disk) {
		snprintf(why, whylen, "an unexpected DISK_PLAN from the backup");
		return -1;
	}
	if (repl_decode_disk_plan(f, &plan, &err) < 0) {
		snprintf(why, whylen, "the backup sent a malformed DISK_PLAN: %s", err);
		return -1;
	}
	if (plan.extent_count != disk_changes_extent_count(vm_changes(p->vm))) {
		snprintf(why, whylen, "the backup's DISK_PLAN counts %llu extents, the disk has "
			 "%llu", (unsigned long long)plan.extent_count,
			 (unsigned long long)disk_changes_extent_count(vm_changes(p->vm)));
		return -1;
	}
	if (plan.resync) {
		size_t nb = disk_changes_bitmap_bytes(plan.extent_count);
		bits = malloc(nb);
		if (!bits) {
			snprintf(why, whylen, "out of memory");
			return -1;
		}
		memcpy(bits, plan.bits, nb);
		if (p->disk_base.debug_omit_extent)
			omit_one_extent(p, bits, plan.extent_count);
	}
	int rc = disk_copy_set_plan(p->disk, bits, plan.extent_count);
	free(bits);
	if (rc < 0) {
		snprintf(why, whylen, "out of memory");
		return -1;
	}
	p->disk_base.planned = true;
	p->disk_base.resync = plan.resync;
	snprintf(p->disk_base.plan_reason, sizeof(p->disk_base.plan_reason), "%.*s",
		 (int)plan.reason_len, plan.reason);
	log_info("vm %s: disk copy to %s: %s, %llu extents of 1 MiB (%s)", p->name, p->backup,
		 plan.resync ? "RESYNC of changed extents only" : "full copy",
		 (unsigned long long)disk_copy_planned_extents(p->disk), p->disk_base.plan_reason);
	return 0;
}

void protection_disk_base_copy_starts(struct protection *p)
{
	p->disk_base.copy_started_us = monotonic_us();
}

/* The image is on disk up to the epoch the flush started at: marks may clear. */
static void on_image_flushed(void *opaque, int err)
{
	struct protection *p = opaque;
	struct disk_changes *dc = vm_changes(p->vm);

	if (err) {
		log_warn("vm %s: flushing the disk %s: %s; its change log keeps its marks", p->name,
			 vm_def(p->vm)->disk, strerror(err));
		return;
	}
	/* The backup was lost meanwhile: its acknowledgements vouch for nothing now. */
	if (p->state != ST_PROTECTED)
		return;
	if (!p->disk_base.generation_begun) {
		/* The backup's disk is the new generation: only later writes differ. */
		if (disk_changes_begin_generation(dc, p->disk_base.generation,
						  p->disk_base.flushed_epoch) == 0)
			log_info("vm %s: disk generation %016llx begins (%llu extents written "
				 "since, not yet acknowledged)", p->name,
				 (unsigned long long)p->disk_base.generation,
				 (unsigned long long)disk_changes_marked(dc));
		p->disk_base.generation_begun = true;
		return;
	}
	disk_changes_forget_acked(dc, p->disk_base.flushed_epoch);
}

/*
 * Marks clear only behind a flush of the image, and the flush runs on a
 * worker: the new generation once the copy is acknowledged, then the
 * acknowledged marks every few seconds.
 */
void protection_disk_base_acked(struct protection *p, uint64_t epoch, bool now_protected)
{
	int64_t now = monotonic_us();

	if (now_protected)
		p->disk_base.protected_us = now;
	/* The first flush at once (changes_forgotten_us is 0), then one per period. */
	if (!vm_changes(p->vm) || p->state != ST_PROTECTED ||
	    file_flush_busy(p->disk_base.image_flush) ||
	    now - p->disk_base.changes_forgotten_us < FORGET_ACKED_EVERY_US)
		return;
	p->disk_base.changes_forgotten_us = now;
	p->disk_base.flushed_epoch = epoch;
	if (file_flush_start(p->disk_base.image_flush, vm_def(p->vm)->disk, on_image_flushed,
			     p) < 0)
		log_warn("vm %s: cannot start a flush of its disk: the change log keeps its marks "
			 "for now", p->name);
}

json_t *protection_disk_copy_json(const struct protection *p)
{
	if (!p->disk)
		return json_null();
	return json_pack("{s:s, s:s, s:I, s:I, s:o}",
			 "mode", !p->disk_base.planned ? "waiting for the backup's plan"
			 : p->disk_base.resync ? "resync" : "full",
			 "reason", p->disk_base.plan_reason,
			 "bytes_sent", (json_int_t)disk_copy_bytes(p->disk),
			 "extents", (json_int_t)(p->disk_base.planned ?
						 disk_copy_planned_extents(p->disk) : 0),
			 "copy_seconds", p->disk_base.protected_us && p->disk_base.copy_started_us ?
			 json_real((double)(p->disk_base.protected_us -
					    p->disk_base.copy_started_us) / 1e6)
			 : json_null());
}
