/*
 * Forks of a protected VM taken from its backup (vm_fork.h): the replica's
 * half.  The committed image and the disk replica are frozen between two
 * commits, which is any moment the event loop runs anything else: a
 * commit (epoch_stage_commit) is applied in one call.
 */
#include "backup/replica_fork.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "backup/replica.h"
#include "backup/replication_internal.h"
#include "backup/replication_server.h"
#include "fork/vm_fork.h"

/* How long a generation of "recently committed" pages lasts (ram_image.h). */
#define RECENT_GENERATION_US (2 * 1000 * 1000)

/* 16384 pages (64 MiB) per loop turn: tens of ms of copying at most. */
#define CONVERGE_PAGES_PER_SLICE 16384u

static void stop_converging(struct replica *r)
{
	if (r->fork.converge_timer)
		event_loop_del_timer(r->loop, r->fork.converge_timer);
	r->fork.converge_timer = 0;
}

static long converge_slice(event_loop *loop, long long id, void *data)
{
	struct replica *r = data;
	uint64_t written = 0;
	char why[256];

	if (!r->image || r->fork.vm_fork) { /* gone, or a new fork reads the memfds */
		r->fork.converge_timer = 0;
		return TIMER_DONE;
	}
	int rc = ram_image_converge_some(r->image, CONVERGE_PAGES_PER_SLICE, &written, why,
					 sizeof(why));
	r->fork.converge_pages += written;
	if (rc == 1)
		return 0; /* the next slice at the next turn */
	r->fork.converge_timer = 0;
	if (rc < 0)
		log_warn("vm %s: the image stays apart from its memfds (%s): a takeover streams "
			 "every page instead of mapping them", r->name, why);
	else
		log_info("vm %s: the fork is gone: the %llu pages stored meanwhile are back in the "
			 "image's memfds (%.1f ms, a slice of at most %u pages per loop turn)",
			 r->name, (unsigned long long)r->fork.converge_pages,
			 (monotonic_us() - r->fork.converge_started_us) / 1000.0,
			 CONVERGE_PAGES_PER_SLICE);
	return TIMER_DONE;
}

/*
 * The fork is gone, its page source killed: nobody reads the memfds as
 * they were any more, so the pages stored since go back into them, a
 * slice per loop turn, and then a takeover may map the image again
 * (ram_image.h).
 */
static void converge_image(struct replica *r)
{
	if (!r->image || !ram_image_diverged(r->image) || r->fork.converge_timer)
		return;
	r->fork.converge_started_us = monotonic_us();
	r->fork.converge_pages = 0;
	r->fork.converge_timer = event_loop_add_timer(r->loop, 0, converge_slice, r);
	if (r->fork.converge_timer < 0) {
		r->fork.converge_timer = 0;
		log_warn("vm %s: no timer to write the image back into its memfds: a takeover "
			 "streams every page instead of mapping them", r->name);
	}
}

int replication_server_fork_start(struct replication_server *s, const char *vm,
				  const struct fork_settings *settings, unsigned clones,
				  unsigned push_mbps, char *err, size_t errlen)
{
	struct replica *r = replica_set_find(&s->replicas, vm);

	if (!r) {
		snprintf(err, errlen, "no VM named '%.40s' on this host, and no replica of one", vm);
		return -1;
	}
	if (r->fork.vm_fork) {
		snprintf(err, errlen, "the replica of %s already has a fork (fork-release it first)",
			 vm);
		return -1;
	}
	if (r->state != REPLICA_READY || !r->image) {
		snprintf(err, errlen, "the replica of %s is %s: only a READY replica has a "
			 "committed image to fork", vm, replica_state_name(r->state));
		return -1;
	}
	/* fork() freezes a private view only (ram_image.h). */
	char why[256];
	stop_converging(r);
	if (ram_image_diverge(r->image, why, sizeof(why)) < 0) {
		snprintf(err, errlen, "cannot freeze the image of %s for a fork: %s", vm, why);
		return -1;
	}
	/*
	 * An epoch waiting for resent pages is not committed: the image is
	 * still the previous epoch's, which is what the fork takes.
	 */
	r->fork.vm_fork = vm_fork_start_from_image(r->loop, settings, r->name, r->image,
					   r->committed_epoch,
					   r->disk_fd >= 0 ? r->disk_path : NULL, clones,
					   push_mbps, err, errlen);
	if (!r->fork.vm_fork)
		converge_image(r);
	return r->fork.vm_fork ? 0 : -1;
}

struct vm_fork *replication_server_fork(const struct replication_server *s, const char *vm)
{
	struct replica *r = replica_set_find(&s->replicas, vm);

	return r ? r->fork.vm_fork : NULL;
}

json_t *replication_server_fork_release(struct replication_server *s, const char *vm)
{
	struct replica *r = replica_set_find(&s->replicas, vm);

	if (!r || !r->fork.vm_fork)
		return NULL;
	json_t *last = vm_fork_status_json(r->fork.vm_fork);
	vm_fork_destroy(r->fork.vm_fork);
	r->fork.vm_fork = NULL;
	converge_image(r);
	return last;
}

void replica_fork_before_commit(struct replica *r)
{
	/* The fork ends itself, loudly, at the first range it cannot keep. */
	if (vm_fork_preserves_replica_disk(r->fork.vm_fork))
		epoch_stage_for_each_disk_range(r->stage, vm_fork_before_replica_write,
						r->fork.vm_fork);
}

void replica_fork_after_commit(struct replica *r)
{
	int64_t now = monotonic_us();

	if (now - r->fork.recent_rotated_us >= RECENT_GENERATION_US) {
		ram_image_rotate_recent(r->image);
		r->fork.recent_rotated_us = now;
	}
}

void replica_fork_taken_over(struct replica *r)
{
	struct vm *vm = vm_find(r->vms, r->name);

	vm_fork_disk_taken_over(r->fork.vm_fork, vm ? vm_export(vm) : NULL);
}

bool replica_fork_exists(const struct replica *r)
{
	return r->fork.vm_fork != NULL;
}

json_t *replica_fork_json(const struct replica *r)
{
	return r->fork.vm_fork ? vm_fork_status_json(r->fork.vm_fork) : NULL;
}

void replica_fork_end(struct replica *r)
{
	stop_converging(r);
	if (r->fork.vm_fork)
		log_info("vm %s: the replica goes: so does its fork", r->name);
	vm_fork_destroy(r->fork.vm_fork);
	r->fork.vm_fork = NULL;
}
