/*
 * A replica's lifetime: created at VM_CONFIG with every feature's part
 * initialised, found by name in its server's set, moved through its
 * states, and freed with every feature's teardown, in the order that
 * lets each one still see what it needs (a flush finishes before the
 * fork and the failover go, the image before the stage and the file).
 */
#include "backup/replica.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fs_util.h"
#include "base/log.h"

static const char *const replica_state_names[] = {
	[REPLICA_RECEIVING] = "receiving", [REPLICA_READY] = "ready",
	[REPLICA_ARBITRATING] = "arbitrating", [REPLICA_FAILING_OVER] = "failing-over",
	[REPLICA_ACTIVE] = "active", [REPLICA_PASSIVE] = "passive",
	[REPLICA_FAILED] = "failed",
};

struct replica *replica_create(event_loop *loop, const struct repl_settings *settings,
			       struct vm_registry *vms, const struct page_decoder *decoder,
			       const char *peer, struct vm_config *config, const char *base_path,
			       char *err, size_t errlen)
{
	struct replica *r = calloc(1, sizeof(*r));

	if (!r) {
		snprintf(err, errlen, "out of memory");
		vm_config_clear(config);
		return NULL;
	}
	r->loop = loop;
	r->settings = settings;
	r->vms = vms;
	r->config = *config; /* takes its qemu_argv */
	memset(config, 0, sizeof(*config));
	r->disk_fd = -1;
	replica_checksums_init(&r->checksums);
	eager_restore_init(r);
	snprintf(r->peer, sizeof(r->peer), "%s", peer);
	snprintf(r->name, sizeof(r->name), "%s", r->config.vm);
	snprintf(r->ownership.raw, sizeof(r->ownership.raw), "%s", r->config.ownership);
	r->ownership.exists = true;
	r->ownership.generation = r->config.generation;
	snprintf(r->ownership.owner, sizeof(r->ownership.owner), "%s",
		 r->config.primary_host);
	r->disk_size = r->config.disk_size;
	coded_pages_init(&r->coded, decoder);
	r->stage = epoch_stage_create();
	r->flows = cp_flow_positions_create();
	if (!r->stage || !r->flows || replica_stream_init(r) < 0) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	epoch_stage_begin(r->stage, 1);
	/* Opened at DISK_BASE, which decides between a full copy and a resync. */
	if (base_path[0])
		snprintf(r->disk_path, sizeof(r->disk_path), "%s", base_path);
	else if (replica_default_disk_path(r, r->disk_path, sizeof(r->disk_path), err,
					   errlen) < 0)
		goto fail;
	r->last_heard_us = monotonic_us();
	r->state = REPLICA_RECEIVING;
	return r;
fail:
	replica_free(r);
	return NULL;
}

void replica_drop_image(struct replica *r)
{
	lazy_restore_stop(r); /* it reads the image */
	ram_image_destroy(r->image);
	r->image = NULL;
	if (r->stage)
		epoch_stage_discard(r->stage);
	if (r->flows)
		cp_flow_positions_discard(r->flows);
}

void replica_free(struct replica *r)
{
	replica_seal_disk_finish(r);
	replica_fork_end(r);
	replica_checksums_stop(r);
	failover_cleanup(r);
	cp_flow_takeover_end(r);
	replica_drop_image(r);
	cp_flow_positions_destroy(r->flows);
	epoch_stage_destroy(r->stage);
	replica_stream_free(r);
	coded_pages_free(&r->coded);
	replica_disk_base_free(r);
	if (r->disk_fd >= 0)
		close(r->disk_fd);
	vm_config_clear(&r->config);
	free(r);
}

const char *replica_state_name(enum replica_state st)
{
	return replica_state_names[st];
}

void replica_set_state(struct replica *r, enum replica_state st)
{
	bool changed = r->state != st;

	if (changed)
		log_info("vm %s: replica %s -> %s", r->name, replica_state_names[r->state],
			 replica_state_names[st]);
	r->state = st;
	if (changed)
		replica_disk_base_state_changed(r);
}

void replica_set_add(struct replica_set *set, struct replica *r)
{
	r->next = set->first;
	set->first = r;
}

void replica_set_remove(struct replica_set *set, struct replica *r)
{
	for (struct replica **l = &set->first; *l; l = &(*l)->next)
		if (*l == r) {
			*l = r->next;
			return;
		}
}

struct replica *replica_set_find(const struct replica_set *set, const char *name)
{
	for (struct replica *r = set->first; r; r = r->next)
		if (!strcmp(r->name, name))
			return r;
	return NULL;
}

void replica_set_free_all(struct replica_set *set)
{
	while (set->first) {
		struct replica *r = set->first;
		set->first = r->next;
		replica_free(r);
	}
}
