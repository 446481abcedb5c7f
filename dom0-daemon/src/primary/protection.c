/*
 * The primary side's lifecycle (protection.h): `protect` validates the
 * request, builds the VM_CONFIG to ship and starts the parts, then claims
 * the VM in etcd (protection_arbiter.c), whose answer connects to the
 * backup (protection_link.c); a restart recovers a protection from its
 * marker; `unprotect` and the VM's end stop and free it.
 */
#include "primary/protection.h"

#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "relay/net_relay.h"
#include "primary/protection_internal.h"
#include "primary/protection_marker.h"
#include "primary/protect_settings.h"
#include "qemu/qmp.h"

_Static_assert(sizeof(((struct protection_marker *)0)->backup) >=
	       sizeof(((struct protect_request *)0)->backup) &&
	       sizeof(((struct protection *)0)->backup) >=
	       sizeof(((struct protect_request *)0)->backup),
	       "the backup's address is kept whole in the protection and its marker");

const char *const protection_state_names[] = {
	[ST_CLAIMING] = "connecting", [ST_CONNECTING] = "connecting",
	[ST_AUTHENTICATING] = "connecting", [ST_SYNCING] = "syncing",
	[ST_PROTECTED] = "protected", [ST_ARBITRATING] = "arbitrating",
	[ST_UNPROTECTED] = "unprotected", [ST_FENCED] = "fenced",
	[ST_FAILED] = "failed",
};

void protection_set_state(struct protection *p, enum state s)
{
	bool now_protected = s == ST_PROTECTED && p->state != s;

	if (p->state != s)
		log_info("vm %s: protection %s -> %s", p->name, protection_state_names[p->state],
			 protection_state_names[s]);
	p->state = s;
	if (now_protected)
		protection_reprotect_protected(p);
	if (s == ST_UNPROTECTED || s == ST_FAILED)
		protection_switchover_ended(p, p->error[0] ? p->error : protection_state_names[s]);
}

void protection_stop_io(struct protection *p)
{
	protection_link_stop_timers(p);
	if (p->disk)
		disk_copy_stop(p->disk);
}

static int release_sink(void *opaque, const uint8_t *frame, size_t len)
{
	struct net_relay *nic = opaque;

	if (nic)
		net_relay_send_to_lan(nic, frame, len);
	return 0;
}

static void qmp_logged(struct qmp_client *qmp, json_t *reply, void *data)
{
	char *name = data;
	json_t *error = json_object_get(reply, "error");

	if (!reply)
		log_warn("vm %s: QMP connection lost before the reply", name);
	else if (error)
		log_error("vm %s: QMP: %s", name,
			  json_string_value(json_object_get(error, "desc")));
	free(name);
}

void protection_qmp(struct protection *p, const char *cmd)
{
	struct qmp_client *qmp = vm_qmp(p->vm);
	char *name = strdup(p->name);

	if (!qmp || !name || qmp_execute_owning(qmp, cmd, NULL, qmp_logged, name, free) < 0) {
		log_error("vm %s: cannot send QMP %s", p->name, cmd);
		free(name);
	}
}

/* ---- lifecycle -------------------------------------------------------- */

/* The VM_CONFIG to ship, checked now so that `protect` reports a mistake. */
static int build_vm_config(struct protection *p, const struct protect_request *req,
			   char *err, size_t errlen)
{
	const struct vm_definition *def = vm_def(p->vm);
	struct vm_config *c = &p->config;

	snprintf(c->vm, sizeof(c->vm), "%s", def->name);
	snprintf(c->primary_host, sizeof(c->primary_host), "%s", p->settings->host);
	snprintf(c->run_dir, sizeof(c->run_dir), "%s", req->run_dir);
	snprintf(c->mac, sizeof(c->mac), "%s", def->mac);
	snprintf(c->tap, sizeof(c->tap), "%s", def->tap);
	snprintf(c->bridge, sizeof(c->bridge), "%s", def->bridge);
	c->disk_size = disk_copy_size(p->disk);
	c->interval_ms = p->interval_ms;
	c->heartbeat_ms = p->settings->heartbeat_ms;
	c->peer_timeout_ms = p->settings->peer_timeout_ms;
	if (vm_config_set_argv(c, req->qemu_argv, err, errlen) < 0)
		return -1;
	return vm_config_check(c, err, errlen);
}

static int check_request(struct vm *vm, const struct repl_settings *s,
			 const struct protect_request *req, char *err, size_t errlen)
{
	const struct vm_definition *def = vm_def(vm);
	struct sockaddr_in addr;

	if (req->interval_ms < PROTECTION_MIN_INTERVAL_MS ||
	    req->interval_ms > PROTECTION_MAX_INTERVAL_MS) {
		snprintf(err, errlen, "interval %u ms is out of range: use %d..%d ms",
			 req->interval_ms, PROTECTION_MIN_INTERVAL_MS,
			 PROTECTION_MAX_INTERVAL_MS);
		return -1;
	}
	if (repl_parse_address(req->backup, &addr, err, errlen) < 0)
		return -1;
	if (req->commit_protection && (!req->output_commit || req->unsafe_release_early)) {
		snprintf(err, errlen, "commit protection is a form of output commit: it cannot "
			 "run with output commit off or released early");
		return -1;
	}
	if (req->commit_protection && (req->cp_dscp < 1 || req->cp_dscp > 63)) {
		snprintf(err, errlen, "cp_dscp %u: use the guest module's code point, 1..63",
			 req->cp_dscp);
		return -1;
	}
	if (!s->psk_len) {
		snprintf(err, errlen, "no pre-shared key: %s", s->psk_error[0] ? s->psk_error
			 : "start remusdbd with --psk-file FILE (the same key on both hosts)");
		return -1;
	}
	if (!s->witness.endpoints[0]) {
		snprintf(err, errlen, "no etcd configured: start remusdbd with --etcd URLS; "
			 "without a witness a failover could leave two live copies");
		return -1;
	}
	if (!s->heartbeats) {
		snprintf(err, errlen, "this remusdbd runs no heartbeat thread: it cannot "
			 "detect a dead backup");
		return -1;
	}
	if (!vm_qmp(vm) || !vm_export(vm) || !vm_nic(vm) || !def->qmp_socket[0]) {
		snprintf(err, errlen, "VM %s needs its disk, NIC and QMP socket served by "
			 "remusdbd to be protected (start it with tools/remusdb-vm)", def->name);
		return -1;
	}
	return 0;
}

/* The parts both a new and a recovered protection have. */
static struct protection *protection_new(event_loop *loop, const struct repl_settings *settings,
					 struct vm *vm, const char *backup,
					 bool unsafe_release_early)
{
	struct protection *p = calloc(1, sizeof(*p));

	if (!p)
		return NULL;
	p->loop = loop;
	p->settings = settings;
	p->vm = vm;
	snprintf(p->name, sizeof(p->name), "%s", vm_def(vm)->name);
	snprintf(p->backup, sizeof(p->backup), "%s", backup);
	pause_boost_init(&p->pause_boost, settings->pause_boost);
	p->oc = output_commit_create(HELD_OUTPUT_MAX, unsafe_release_early, release_sink,
				     vm_nic(vm));
	protection_coding_init(p);
	if (!p->oc) {
		protection_destroy(p);
		return NULL;
	}
	return p;
}


struct protection *protection_start(event_loop *loop, const struct repl_settings *settings,
				    struct vm *vm, const struct protect_request *req,
				    char *err, size_t errlen)
{
	struct protection *p;

	if (check_request(vm, settings, req, err, errlen) < 0)
		return NULL;
	p = protection_new(loop, settings, vm, req->backup, req->unsafe_release_early);
	if (!p || protection_reprotect_keep(p, req) < 0) {
		protection_destroy(p);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	p->interval_ms = req->interval_ms;
	p->output_commit = req->output_commit;
	if (req->commit_protection && output_commit_enable_cp(p->oc, (uint8_t)req->cp_dscp) < 0) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	p->state = ST_CLAIMING;
	if (protection_coding_start(p, req, err, errlen) < 0)
		goto fail;
	struct disk_copy_events dev = protection_disk_events(p);
	p->disk = disk_copy_open(loop, vm_def(vm)->disk, &dev, err, errlen);
	if (!p->disk || protection_disk_base_start(p, req, err, errlen) < 0)
		goto fail;
	if (protection_link_init(p) < 0) {
		snprintf(err, errlen, "no randomness for the handshake nonce");
		goto fail;
	}
	if (build_vm_config(p, req, err, errlen) < 0)
		goto fail;
	if (protection_arbiter_open(p, NULL, err, errlen) < 0)
		goto fail;
	if (!p->output_commit)
		log_warn("vm %s: OUTPUT COMMIT DISABLED (debug negative control): "
			 "acknowledged commits can be lost at failover", p->name);
	if (req->unsafe_release_early)
		log_warn("vm %s: UNSAFE RELEASE EARLY (debug negative control): each "
			 "epoch's output leaves one epoch before its acknowledgement; "
			 "a failover can expose output the backup never produced", p->name);
	log_info("vm %s: protecting to %s every %u ms, %s", p->name, p->backup, p->interval_ms,
		 req->commit_protection ? "commit protection on (only marked output waits)"
					: "all output held until its epoch commits");
	if (protection_claim(p) < 0) {
		snprintf(err, errlen, "cannot ask etcd");
		goto fail;
	}
	/*
	 * Started: a restart from here on protects the VM again by itself.
	 * Every later ending that is never retried removes the file again
	 * (protection_reprotect_ended), so a failed start leaves none.
	 */
	if (protect_settings_save(settings->state_dir, p->name, req, err, errlen) < 0)
		goto fail;
	return p;
fail:
	protection_destroy(p);
	return NULL;
}

/*
 * The settings a restarted daemon found for the VM (restored, or NULL):
 * kept for re-protection as `protect` keeps its own, and the gap the
 * restart opened counts from now (the daemon cannot know when its
 * predecessor died).
 */
static int keep_restored(struct protection *p, const struct protect_request *restored)
{
	if (!restored)
		return 0;
	if (protection_reprotect_keep(p, restored) < 0)
		return -1;
	protection_reprotect_restored(p);
	return 0;
}

struct protection *protection_recover(event_loop *loop, const struct repl_settings *settings,
				      struct vm *vm, const struct protection_marker *m,
				      const struct protect_request *restored)
{
	struct protection *p = protection_new(loop, settings, vm, m->backup, false);
	char err[256];

	if (!p)
		return NULL;
	if (keep_restored(p, restored) < 0) {
		protection_destroy(p);
		return NULL;
	}
	p->interval_ms = restored ? restored->interval_ms : 0;
	p->output_commit = true;
	p->stale_colo = true;
	if (protection_arbiter_open(p, &m->ownership, err, sizeof(err)) < 0) {
		log_error("vm %s: cannot recover the protection state: %s", p->name, err);
		/* Still pause: we cannot tell whether the backup took over. */
		p->state = ST_FENCED;
	} else {
		p->state = ST_ARBITRATING;
	}
	/* Before the event loop runs: nothing the guest sends may leave yet. */
	if (vm_nic(vm))
		net_relay_set_output_hook(vm_nic(vm), output_commit_hold, p->oc);
	protection_pause_for_witness(p);
	snprintf(p->error, sizeof(p->error), "remusdbd restarted while the VM was protected "
		 "by %s: VM paused until etcd says whether the backup took over%s", p->backup,
		 restored ? "; protected again from the kept settings if it did not" : "");
	log_error("vm %s: %s", p->name, p->error);
	if (p->state == ST_ARBITRATING)
		protection_arbitrate(p);
	return p;
}

struct protection *protection_restore(event_loop *loop, const struct repl_settings *settings,
				      struct vm *vm, const struct protect_request *restored)
{
	struct protection *p = protection_new(loop, settings, vm, restored->backup, false);

	if (!p)
		return NULL;
	if (keep_restored(p, restored) < 0) {
		protection_destroy(p);
		return NULL;
	}
	p->interval_ms = restored->interval_ms;
	p->output_commit = restored->output_commit;
	p->state = ST_UNPROTECTED;
	snprintf(p->error, sizeof(p->error), "remusdbd restarted while the VM ran unprotected "
		 "(no backup held a replica of it)");
	log_warn("vm %s: %s: protecting it to %s again from the kept settings", p->name,
		 p->error, p->backup);
	protection_reprotect_ended(p, END_BACKUP_LOST);
	return p;
}

void protection_stop(struct protection *p)
{
	p->unprotect_requested = true;
	/* The operator's decision: a restart must not undo it. */
	protect_settings_delete(p->settings->state_dir, p->name);
	if (protection_finished(p)) {
		/* Ended already: only the tries of a lost backup stop (if any run). */
		protection_reprotect_ended(p, END_OPERATOR);
		return;
	}
	struct protection_goodbye bye = protection_link_leave(p);
	protection_go_unprotected(p, "unprotected by the operator");
	protection_link_goodbye(&bye);
	protection_reprotect_ended(p, END_OPERATOR);
	log_warn("vm %s: protection stopped by the operator: the VM runs unprotected", p->name);
}

void protection_destroy(struct protection *p)
{
	if (!p)
		return;
	protection_reprotect_end(p);
	protection_stop_io(p);
	if (vm_nic(p->vm))
		net_relay_set_output_hook(vm_nic(p->vm), NULL, NULL);
	protection_hold_end(p, p->state != ST_FENCED);
	protection_switchover_end(p);
	if (p->source)
		checkpoint_source_destroy(p->source);
	protection_pause_stop(p); /* a QEMU left boosted would stay so */
	protection_close_conn(p);
	protection_arbiter_end(p);
	if (p->oc) {
		/*
		 * Held output of unacknowledged epochs must never leave: the
		 * backup may resume from before it.  It is dropped, as a NIC
		 * queue is when the host dies (TCP retransmits what mattered).
		 */
		if (p->state == ST_UNPROTECTED)
			output_commit_release_all(p->oc);
		output_commit_destroy(p->oc);
	}
	protection_stats_end(p);
	protection_disk_base_end(p);
	disk_copy_destroy(p->disk);
	/* After protection_close_conn: the pipeline's worker, which uses both, is joined. */
	protection_coding_end(p);
	vm_config_clear(&p->config);
	free(p);
}
