/*
 * Retiring replicas whose VM is gone, so that status does not show a VM
 * stopped long ago as ACTIVE (or a finished protection as PASSIVE)
 * forever.  A replica is idle when no primary is connected, no fork
 * reads from it, and either it ended (PASSIVE, FAILED) or it took over
 * and the taken-over VM is no longer defined here (stopped and removed).
 * An idle replica is retired after --retire-replicas-after seconds
 * (status shows when), or at once by `forget`.  Retiring frees its image
 * and closes its disk replica; the file stays, like any VM disk.
 */
#include "backup/replica_retire.h"

#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "backup/replica.h"
#include "backup/replication_internal.h"
#include "backup/replication_server.h"

#define RETIRE_CHECK_MS 1000

static bool replica_idle(const struct replica *r, const char **why)
{
	if (r->session) {
		*why = "its primary is connected";
		return false;
	}
	if (replica_fork_exists(r)) {
		*why = "a fork reads from it (fork-release it first)";
		return false;
	}
	switch (r->state) {
	case REPLICA_PASSIVE:
	case REPLICA_FAILED:
		return true;
	case REPLICA_ACTIVE:
		if (!vm_find(r->vms, r->name))
			return true;
		*why = "it took over and the VM is defined here (stop it first)";
		return false;
	case REPLICA_ARBITRATING:
	case REPLICA_FAILING_OVER:
		*why = "a takeover is under way";
		return false;
	default:
		*why = "it still holds a complete replica";
		return false;
	}
}

static void retire(struct replication_server *s, struct replica *r, const char *how)
{
	log_info("vm %s: replica (%s) retired: %s", r->name, replica_state_name(r->state), how);
	replica_set_remove(&s->replicas, r);
	replica_free(r);
}

long replica_retire_tick(event_loop *loop, long long id, void *data)
{
	struct replication_server *s = data;
	int64_t now = monotonic_us();
	int64_t after_us = (int64_t)s->settings->replica_retire_s * 1000000;
	struct replica *next;
	const char *why;

	for (struct replica *r = s->replicas.first; r; r = next) {
		next = r->next;
		if (!after_us || !replica_idle(r, &why)) { /* 0: never */
			r->retirement.idle_since_us = 0;
			continue;
		}
		if (!r->retirement.idle_since_us)
			r->retirement.idle_since_us = now;
		else if (now - r->retirement.idle_since_us >= after_us)
			retire(s, r, "idle for longer than --retire-replicas-after");
	}
	return RETIRE_CHECK_MS;
}

int replication_server_forget(struct replication_server *s, const char *vm, char *err,
			      size_t errlen)
{
	const char *why = NULL;
	int forgotten = 0, found = 0;
	struct replica *next;

	for (struct replica *r = s->replicas.first; r; r = next) {
		next = r->next;
		if (strcmp(r->name, vm))
			continue;
		found++;
		if (replica_idle(r, &why)) {
			retire(s, r, "forgotten by the operator");
			forgotten++;
		}
	}
	if (!found) {
		snprintf(err, errlen, "no replica of %s on this host", vm);
		return -1;
	}
	if (!forgotten) {
		snprintf(err, errlen, "the replica of %s is in use: %s", vm, why);
		return -1;
	}
	return forgotten;
}

json_t *replica_retire_json(const struct replica *r)
{
	if (!r->retirement.idle_since_us || !r->settings->replica_retire_s)
		return json_null();
	int64_t idle_s = (monotonic_us() - r->retirement.idle_since_us) / 1000000;
	int64_t left = (int64_t)r->settings->replica_retire_s - idle_s;
	return json_pack("{s:I, s:I}", "idle_s", (json_int_t)idle_s,
			 "retired_in_s", (json_int_t)(left > 0 ? left : 0));
}
