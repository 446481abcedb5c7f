/*
 * Taking over a VM on the backup host, in the order the design gives:
 * win the VM in etcd (compare-and-swap from the generation we were told
 * to the next), run the optional fencing command, serve the disk replica
 * and the NIC here (vm_add, as for any VM), start the same QEMU command
 * line with -incoming, feed it the committed image as a migration stream
 * (eager_restore.c, or lazy_restore.c while it runs), and once it runs,
 * announce the guest's MAC so the LAN's switches learn where it moved.
 * Every step is timed for status and the drill.  The QEMU command line
 * is failover_qemu.c's.
 */
#include "backup/failover.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backup/failover_qemu.h"
#include "backup/fence.h"
#include "backup/replica.h"
#include "backup/replication_internal.h"
#include "base/fs_util.h"
#include "base/log.h"
#include "base/unix_socket.h"
#include "qemu/hmp_network.h"
#include "qemu/qmp.h"
#include "relay/net_relay.h"

#define WITNESS_RETRY_MS 1000
#define INCOMING_RETRY_MS 5
#define INCOMING_MAX_ATTEMPTS 4000 /* 20 s: QEMU under TCG starts slowly */
#define NIC_POLL_MS 2
#define NIC_WAIT_MAX_MS 2000
#define RESUME_POLL_MS 10
#define RESUME_MAX_POLLS 3000

static double now_unix(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

void failover_failed(struct replica *r, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(r->error, sizeof(r->error), fmt, ap);
	va_end(ap);
	log_error("vm %s: TAKEOVER FAILED: %s", r->name, r->error);
	failover_cleanup(r);
	cp_flow_takeover_end(r);
	r->state = REPLICA_FAILED;
}

/* Every takeover step waits on r->failover.timer; one that cannot be armed ends the takeover. */
static void arm_timer(struct replica *r, long ms, timer_handler fn, const char *step)
{
	r->failover.timer = event_loop_add_timer(r->loop, ms, fn, r);
	if (r->failover.timer < 0) {
		r->failover.timer = 0;
		failover_failed(r, "cannot arm the timer of %s (out of memory)", step);
	}
}

static void del_timer(struct replica *r)
{
	if (r->failover.timer)
		event_loop_del_timer(r->loop, r->failover.timer);
	r->failover.timer = 0;
}

/* ---- resume ------------------------------------------------------------ */

static void on_announced(struct qmp_client *qmp, json_t *reply, void *data)
{
	struct replica *r = data;
	json_t *error = json_object_get(reply, "error");

	if (error)
		log_warn("vm %s: announce-self: %s", r->name,
			 json_string_value(json_object_get(error, "desc")));
}

static long poll_resumed(event_loop *loop, long long id, void *data);

static void on_query_status(struct qmp_client *qmp, json_t *reply, void *data)
{
	struct replica *r = data;
	const char *status = json_string_value(json_object_get(
		json_object_get(reply, "return"), "status"));

	if (r->state != REPLICA_FAILING_OVER)
		return;
	if (status && !strcmp(status, "running")) {
		del_timer(r);
		r->failover.resumed_us = monotonic_us();
		r->failover.resumed_at_unix = now_unix();
		json_t *args = json_pack("{s:i, s:i, s:i, s:i}", "initial", 50, "max", 550,
					 "rounds", 5, "step", 100);
		qmp_execute(qmp, "announce-self", args, on_announced, r);
		r->state = REPLICA_ACTIVE;
		r->error[0] = '\0';
		const struct replica_failover *fo = &r->failover;
		log_info("vm %s: TOOK OVER: the VM runs here from epoch %llu; primary "
			 "silent %lld ms, takeover %.1f ms (QEMU start %.1f ms, restore "
			 "%.1f ms, resume %.1f ms)", r->name,
			 (unsigned long long)r->committed_epoch, (long long)fo->detected_after_ms,
			 (fo->resumed_us - fo->started_us) / 1000.0,
			 (fo->qemu_spawned_us - fo->started_us) / 1000.0,
			 (fo->restore_done_us - fo->qemu_spawned_us) / 1000.0,
			 (fo->resumed_us - fo->restore_done_us) / 1000.0);
		failover_cleanup(r);
		if (!lazy_restore_serving(r)) { /* a lazy restore frees it when every page is out */
			ram_image_destroy(r->image);
			r->image = NULL;
		}
		cp_flow_takeover_guest_running(r);
		return;
	}
	/* Loaded but not started (e.g. -S on the command line): start it. */
	if (status && (!strcmp(status, "paused") || !strcmp(status, "postmigrate")) &&
	    !eager_restore_streaming(r))
		qmp_execute(qmp, "cont", NULL, NULL, NULL);
}

static long poll_resumed(event_loop *loop, long long id, void *data)
{
	struct replica *r = data;
	struct vm *vm = vm_find(r->vms, r->name);
	struct qmp_client *qmp = vm ? vm_qmp(vm) : NULL;

	if (++r->failover.connect_attempts > RESUME_MAX_POLLS) {
		r->failover.timer = 0;
		failover_failed(r, "QEMU did not start running within %d s after the "
				"restore (see %s/qemu.log)", RESUME_MAX_POLLS * RESUME_POLL_MS / 1000,
				r->failover.run_dir);
		return TIMER_DONE;
	}
	if (qmp && qmp_client_ready(qmp))
		qmp_execute(qmp, "query-status", NULL, on_query_status, r);
	return RESUME_POLL_MS;
}

void failover_wait_for_resume(struct replica *r, int64_t restore_done_us)
{
	r->failover.restore_done_us = restore_done_us;
	r->failover.connect_attempts = 0;
	arm_timer(r, RESUME_POLL_MS, poll_resumed, "waiting for the VM to run");
}

/* ---- QEMU's -incoming ---------------------------------------------------- */

/*
 * --restore shared: the image's main RAM goes to QEMU as its memfd, where
 * the command line lets it (failover_qemu.h) and no fork holds the image
 * (ram_image.h); otherwise the stream carries every page, and status
 * says why.
 */
static void choose_shared_ram(struct replica *r, struct failover_shared_ram *ram)
{
	struct replica_failover *fo = &r->failover;

	ram->fd = -1;
	fo->ram_shared = false;
	fo->ram_not_shared[0] = '\0';
	if (!r->settings->restore_shared)
		return;
	if (!failover_qemu_can_share_ram(&r->config, fo->ram_not_shared,
					 sizeof(fo->ram_not_shared)))
		goto eager;
	if (ram_image_diverged(r->image)) {
		snprintf(fo->ram_not_shared, sizeof(fo->ram_not_shared), "a fork holds the "
			 "image (fork-release it for a takeover that copies no page)");
		goto eager;
	}
	ram->fd = ram_image_shared_fd(r->image, FAILOVER_SHARED_RAM_BLOCK, &ram->length);
	if (ram->fd < 0) {
		snprintf(fo->ram_not_shared, sizeof(fo->ram_not_shared), "the image has no RAM "
			 "block named %s", FAILOVER_SHARED_RAM_BLOCK);
		goto eager;
	}
	fo->ram_shared = true;
	return;
eager:
	log_warn("vm %s: the takeover streams every page of the image: %s", r->name,
		 fo->ram_not_shared);
}

static int spawn_qemu(struct replica *r, char *err, size_t errlen)
{
	struct failover_shared_ram ram = { .fd = -1 };

	if (!lazy_restore_wanted(r))
		choose_shared_ram(r, &ram);
	pid_t pid = failover_qemu_spawn(&r->config, r->failover.run_dir,
					lazy_restore_wanted(r), &ram, r->name, err, errlen);

	if (pid < 0)
		return -1;
	r->failover.qemu_pid = pid;
	return 0;
}

/*
 * QEMU opens its monitors and NIC sockets before -incoming listens, so
 * they are up now.  Left to their reconnect polls (armed by vm_add, before
 * QEMU was spawned) the monitor, which tells us the VM runs, and the NIC,
 * without which the running guest reaches nobody, would come up to a
 * poll interval (200 ms) later: most of a lazy takeover, and the floor
 * of an eager one.
 */
static void connect_to_qemu_now(struct replica *r)
{
	struct vm *vm = vm_find(r->vms, r->name);

	if (!vm)
		return;
	if (vm_qmp(vm))
		qmp_client_connect_now(vm_qmp(vm));
	if (vm_nic(vm))
		net_relay_connect_now(vm_nic(vm));
}

/* ---- the restore waits until QEMU took the NIC's stream ------------------ */

static void start_restore(struct replica *r)
{
	int fd = r->failover.incoming_fd;

	r->failover.incoming_held = false;
	r->failover.incoming_fd = -1;
	r->failover.nic_wait_us = monotonic_us() - r->failover.nic_wait_us;
	log_info("vm %s: restoring %s, %.1f ms after -incoming answered (QEMU's NIC "
		 "stream asked about %d time(s))", r->name,
		 lazy_restore_wanted(r) ? "lazily" : r->failover.ram_shared ?
		 "with its main RAM mapped from the image" : "eagerly",
		 r->failover.nic_wait_us / 1000.0, r->failover.nic_polls + 1);
	if (lazy_restore_wanted(r))
		lazy_restore_start(r, fd);
	else
		eager_restore_start(r, fd);
}

static void ask_nic_ready(struct replica *r);

static long retry_nic_ready(event_loop *loop, long long id, void *data)
{
	struct replica *r = data;

	r->failover.timer = 0;
	ask_nic_ready(r);
	return TIMER_DONE;
}

/*
 * QEMU 7.2 segfaults when it starts the VM before its stream netdev has
 * a client (qemu/hmp_network.h): a small restore (the shared one is a few
 * hundred KiB) loads before QEMU's main loop has got round to it.  So the
 * restore starts once `info network` shows the stream connected (the
 * relay connected just before), or when there is none, or after
 * NIC_WAIT_MAX_MS with a warning, as it always did.
 */
static void on_info_network(struct qmp_client *qmp, json_t *reply, void *data)
{
	struct replica *r = data;
	json_t *ret = reply ? json_object_get(reply, "return") : NULL;
	(void)qmp;

	if (r->state != REPLICA_FAILING_OVER || !r->failover.incoming_held)
		return;
	if (!json_is_string(ret)) {
		log_warn("vm %s: QEMU did not answer `info network` (%s): restoring without "
			 "knowing that it took the NIC's stream", r->name,
			 reply ? "an error" : "its monitor closed");
		start_restore(r);
		return;
	}
	enum hmp_streams st = hmp_network_streams(json_string_value(ret),
						  json_string_length(ret));
	if (st != HMP_STREAMS_WAITING) {
		start_restore(r);
		return;
	}
	if (++r->failover.nic_polls * NIC_POLL_MS >= NIC_WAIT_MAX_MS) {
		log_warn("vm %s: QEMU has not taken the NIC's stream after %d ms: restoring "
			 "anyway (QEMU 7.2 may crash starting the VM)", r->name, NIC_WAIT_MAX_MS);
		start_restore(r);
		return;
	}
	arm_timer(r, NIC_POLL_MS, retry_nic_ready, "waiting for QEMU to take the NIC's stream");
}

static void ask_nic_ready(struct replica *r)
{
	struct vm *vm = vm_find(r->vms, r->name);
	struct qmp_client *qmp = vm ? vm_qmp(vm) : NULL;
	json_t *args = json_pack("{s:s}", "command-line", "info network");

	if (!qmp || !args || !vm_nic(vm) ||
	    qmp_execute(qmp, "human-monitor-command", args, on_info_network, r) < 0)
		start_restore(r); /* no NIC to wait for, or no way to ask */
}

static long try_incoming(event_loop *loop, long long id, void *data)
{
	struct replica *r = data;
	char path[PATH_MAX];

	snprintf(path, sizeof(path), "%s/incoming.sock", r->failover.run_dir);
	int fd = unix_connect(path);
	if (fd < 0) {
		if (++r->failover.connect_attempts < INCOMING_MAX_ATTEMPTS)
			return INCOMING_RETRY_MS;
		r->failover.timer = 0;
		failover_failed(r, "QEMU never listened on %s (see %s/qemu.log)", path,
				r->failover.run_dir);
		return TIMER_DONE;
	}
	r->failover.timer = 0;
	/* Splits the takeover's "restore" into QEMU's start and the stream. */
	log_info("vm %s: QEMU's -incoming answered %.1f ms after QEMU started", r->name,
		 (monotonic_us() - r->failover.qemu_spawned_us) / 1000.0);
	connect_to_qemu_now(r);
	r->failover.incoming_fd = fd;
	r->failover.incoming_held = true;
	r->failover.nic_polls = 0;
	r->failover.nic_wait_us = monotonic_us();
	ask_nic_ready(r);
	return TIMER_DONE;
}

int failover_restart_qemu(struct replica *r, char *err, size_t errlen)
{
	if (spawn_qemu(r, err, errlen) < 0)
		return -1;
	r->failover.connect_attempts = 0;
	arm_timer(r, INCOMING_RETRY_MS, try_incoming, "connecting to QEMU's -incoming");
	return 0;
}

/* ---- the fence, the flush, the VM served here ----------------------------- */

static void serve_and_start_vm(struct replica *r);

/* The fence and the replica file's flush run side by side; the VM starts after both. */
static void start_vm_when_ready(struct replica *r)
{
	if (r->failover.fence_done && r->failover.flush_err >= 0)
		serve_and_start_vm(r);
}

static void on_takeover_flushed(void *opaque, int err)
{
	struct replica *r = opaque;

	r->failover.flush_err = err;
	start_vm_when_ready(r);
}

/*
 * The seal needs the file on disk, and the page cache may still hold much
 * of it: flushed on a worker (replica_start_disk_flush), so that this
 * loop goes on answering other VMs' heartbeats meanwhile.
 */
static void start_takeover_flush(struct replica *r)
{
	char err[200];

	r->failover.flush_err = -1;
	if (replica_start_disk_flush(r, on_takeover_flushed, err, sizeof(err)) < 0) {
		log_warn("vm %s: cannot flush the disk replica: %s", r->name, err);
		r->failover.flush_err = ECANCELED;
	}
}

/*
 * A failed or hung fence is logged loudly and the takeover goes on: etcd
 * already made this host the owner, and the old primary can neither
 * release output (no more acks reach it) nor keep the VM (its own
 * compare-and-swap fails), so the fence is the second line of defence.
 */
static void on_fenced(void *data, bool ok, double ms, const char *why)
{
	struct replica *r = data;
	const char *cmd = r->settings->fence_command;

	r->failover.fence = NULL;
	if (!ok)
		log_error("vm %s: FENCING FAILED: '%s' %s (after %.1f ms); taking over anyway: "
			  "etcd made this host the owner", r->name, cmd, why, ms);
	else
		log_info("vm %s: fencing command '%s' succeeded after %.1f ms", r->name, cmd, ms);
	r->failover.fence_done = true;
	start_vm_when_ready(r);
}

/*
 * The fence runs as a child watched by the event loop (fence.h): the
 * takeover goes on in on_fenced, and heartbeats to other primaries do
 * not stop meanwhile.
 */
static void run_fence_command(struct replica *r)
{
	const char *cmd = r->settings->fence_command;
	char why[256];

	if (!cmd || !cmd[0]) {
		r->failover.fence_done = true;
		start_vm_when_ready(r);
		return;
	}
	r->failover.fence = fence_start(r->loop, cmd, r->name, r->failover.replaced_owner,
					FENCE_TIMEOUT_MS, on_fenced, r, why, sizeof(why));
	if (!r->failover.fence)
		on_fenced(r, false, 0, why);
}

static void take_over(struct replica *r)
{
	r->state = REPLICA_FAILING_OVER;
	r->failover.started_us = monotonic_us();
	log_warn("vm %s: TAKING OVER from %s at committed epoch %llu", r->name,
		 r->failover.replaced_owner, (unsigned long long)r->committed_epoch);
	/* Whatever arrived of the next epoch was never acknowledged. */
	replica_note_discarded(r);
	epoch_stage_discard(r->stage);
	r->failover.fence_done = false;
	start_takeover_flush(r);
	run_fence_command(r);
}

static void serve_and_start_vm(struct replica *r)
{
	char *run_dir = r->failover.run_dir;
	struct vm_definition def;
	char err[512];

	if (snprintf(run_dir, sizeof(r->failover.run_dir), "%s/vms/%s", r->settings->run_dir,
		     r->name) >= (int)sizeof(r->failover.run_dir)) {
		failover_failed(r, "--run-dir %s is too long for unix socket paths",
				r->settings->run_dir);
		return;
	}
	if (mkdir_p(run_dir) < 0) {
		failover_failed(r, "cannot create %s: %s", run_dir, strerror(errno));
		return;
	}
	if (vm_config_definition(&r->config, r->disk_path, run_dir, &def, err,
				 sizeof(err)) < 0) {
		failover_failed(r, "%s", err);
		return;
	}
	bool flushed = r->failover.flush_err == 0;
	if (!flushed)
		log_warn("vm %s: the disk replica was not flushed: %s", r->name,
			 strerror(r->failover.flush_err));
	/* Before the guest writes: from here on its writes mark the log (vm_add). */
	if (!flushed || replica_seal_disk_at_takeover(r) < 0)
		log_error("vm %s: the disk's change log could not be sealed: a failback will "
			  "copy the whole disk", r->name);
	if (vm_add(r->vms, &def, err, sizeof(err)) < 0) {
		failover_failed(r, "cannot serve the VM's disk and NIC here: %s", err);
		return;
	}
	/* Before the guest writes: a fork's disk snapshot must see its writes. */
	replica_fork_taken_over(r);
	/* The clients first: they need no guest, and the sooner they hear, the better. */
	cp_flow_takeover_begin(r);
	if (spawn_qemu(r, err, sizeof(err)) < 0) {
		failover_failed(r, "%s", err);
		return;
	}
	r->failover.qemu_spawned_us = monotonic_us();
	r->failover.connect_attempts = 0;
	arm_timer(r, INCOMING_RETRY_MS, try_incoming, "connecting to QEMU's -incoming");
}

/* ---- arbitration ------------------------------------------------------- */

static void arbitrate(struct replica *r);

static long retry_arbitration(event_loop *loop, long long id, void *data)
{
	struct replica *r = data;

	r->failover.timer = 0;
	arbitrate(r);
	return TIMER_DONE;
}

static void on_cas_done(void *opaque, enum witness_result res,
			const struct witness_ownership *now, const char *err)
{
	struct replica *r = opaque;

	if (r->state != REPLICA_ARBITRATING)
		return;
	switch (res) {
	case WITNESS_OK:
		/* The fence and the log name the host we replace, not us. */
		snprintf(r->failover.replaced_owner, sizeof(r->failover.replaced_owner), "%s",
			 r->ownership.owner);
		r->ownership = *now;
		log_warn("vm %s: etcd: we own the VM now (generation %llu)", r->name,
			 (unsigned long long)now->generation);
		replica_detach_session(r, "taking over");
		take_over(r);
		return;
	case WITNESS_LOST:
		snprintf(r->error, sizeof(r->error), "not taking over: etcd says %s owns "
			 "the VM (generation %llu)", now->owner,
			 (unsigned long long)now->generation);
		log_warn("vm %s: %s", r->name, r->error);
		/*
		 * Only the primary moves the generation on without us, and it
		 * does so when it has given us up and runs unprotected: it will
		 * never ship another epoch on this connection.  Staying READY
		 * on a link that is merely silent (a partition drops packets,
		 * no FIN arrives) would re-arbitrate every heartbeat forever.
		 */
		replica_detach_session(r, "lost the arbitration");
		ram_image_destroy(r->image);
		r->image = NULL;
		epoch_stage_discard(r->stage);
		r->state = REPLICA_PASSIVE;
		return;
	default:
		snprintf(r->error, sizeof(r->error), "primary lost but etcd is unreachable "
			 "(%s): not taking over; retrying every %d ms",
			 err ? err : witness_result_name(res), WITNESS_RETRY_MS);
		log_error("vm %s: %s", r->name, r->error);
		arm_timer(r, WITNESS_RETRY_MS, retry_arbitration, "retrying etcd");
		return;
	}
}

static void arbitrate(struct replica *r)
{
	char err[256];

	if (!r->failover.witness) {
		r->failover.witness = witness_async_create(r->loop, &r->settings->witness, err,
						  sizeof(err));
		if (!r->failover.witness) {
			failover_failed(r, "cannot use etcd: %s", err);
			return;
		}
	}
	if (witness_async_cas(r->failover.witness, r->name, &r->ownership, r->settings->host,
			      on_cas_done, r) < 0)
		arm_timer(r, WITNESS_RETRY_MS, retry_arbitration, "retrying etcd");
}

void failover_primary_lost(struct replica *r, const char *why)
{
	if (r->state != REPLICA_READY)
		return;
	del_timer(r); /* a closed connection's wait (failover_primary_closed), if any */
	r->failover.lost_at_us = monotonic_us();
	r->failover.lost_at_unix = now_unix();
	snprintf(r->error, sizeof(r->error), "%s", why);
	log_error("vm %s: primary lost (%s) at committed epoch %llu: asking etcd",
		  r->name, why, (unsigned long long)r->committed_epoch);
	r->state = REPLICA_ARBITRATING;
	arbitrate(r);
}

static long on_closed_wait_over(event_loop *loop, long long id, void *data)
{
	struct replica *r = data;
	char why[sizeof(r->error)];

	r->failover.timer = 0;
	snprintf(why, sizeof(why), "%s", r->failover.closed_why);
	failover_note_silence(r, (monotonic_us() - r->last_heard_us) / 1000);
	failover_primary_lost(r, why);
	return TIMER_DONE;
}

void failover_primary_closed(struct replica *r, const char *why, unsigned timeout_ms)
{
	int64_t silent_ms = (monotonic_us() - r->last_heard_us) / 1000;

	if (r->state != REPLICA_READY)
		return;
	snprintf(r->failover.closed_why, sizeof(r->failover.closed_why), "%.200s, then no "
		 "heartbeat for %u ms", why, timeout_ms);
	if (silent_ms >= (int64_t)timeout_ms) {
		failover_note_silence(r, silent_ms);
		failover_primary_lost(r, r->failover.closed_why);
		return;
	}
	long wait_ms = (long)((int64_t)timeout_ms - silent_ms);
	snprintf(r->error, sizeof(r->error), "the primary's connection closed (%.200s): taking "
		 "over %ld ms from now unless it connects again and etcd keeps the VM there",
		 why, wait_ms);
	log_warn("vm %s: %s", r->name, r->error);
	arm_timer(r, wait_ms, on_closed_wait_over, "waiting for the primary's failure detector");
}

void failover_cleanup(struct replica *r)
{
	del_timer(r);
	if (r->failover.incoming_held) { /* the takeover ended before its restore began */
		close(r->failover.incoming_fd);
		r->failover.incoming_held = false;
	}
	fence_cancel(r->failover.fence);
	r->failover.fence = NULL;
	eager_restore_stop(r);
	witness_async_destroy(r->failover.witness);
	r->failover.witness = NULL;
}

/* ---- what the restores and status read ------------------------------------ */

pid_t failover_qemu_pid(const struct replica *r)
{
	return r->failover.qemu_pid;
}

int64_t failover_qemu_spawned_us(const struct replica *r)
{
	return r->failover.qemu_spawned_us;
}

bool failover_resumed(const struct replica *r)
{
	return r->failover.resumed_us != 0;
}

const char *failover_run_dir(const struct replica *r)
{
	return r->failover.run_dir;
}

void failover_note_silence(struct replica *r, int64_t silent_ms)
{
	r->failover.detected_after_ms = silent_ms;
}

/* A step's duration in ms, or null when it has not happened (to is 0). */
static json_t *step_ms(int64_t from_us, int64_t to_us)
{
	return to_us ? json_real((to_us - from_us) / 1000.0) : json_null();
}

json_t *failover_json(const struct replica *r)
{
	const struct replica_failover *fo = &r->failover;

	if (!fo->lost_at_us)
		return json_null();
	json_t *o = json_pack("{s:I, s:f}",
			      "detected_ms_after_last_heard", (json_int_t)fo->detected_after_ms,
			      "started_at_unix", fo->lost_at_unix);
	if (!o)
		return json_null();
	json_object_set_new(o, "arbitration_ms", step_ms(fo->lost_at_us, fo->started_us));
	json_object_set_new(o, "qemu_start_ms", step_ms(fo->started_us, fo->started_us ?
							fo->qemu_spawned_us : 0));
	json_object_set_new(o, "restore_ms", step_ms(fo->qemu_spawned_us, fo->restore_done_us));
	/* part of restore_ms: -incoming answered until QEMU had the NIC's client */
	json_object_set_new(o, "nic_wait_ms", fo->restore_done_us && !fo->incoming_held ?
			    json_real(fo->nic_wait_us / 1000.0) : json_null());
	json_object_set_new(o, "stream_bytes", fo->stream_bytes ?
			    json_integer((json_int_t)fo->stream_bytes) : json_null());
	if (r->state == REPLICA_ACTIVE)
		json_object_set_new(o, "command", failover_qemu_command_json(&r->config,
									     fo->run_dir));
	lazy_restore_status(r, o, fo->qemu_spawned_us);
	json_object_set_new(o, "resumed_at_unix", fo->resumed_us ?
			    json_real(fo->resumed_at_unix) : json_null());
	json_object_set_new(o, "total_ms", step_ms(fo->lost_at_us, fo->resumed_us));
	return o;
}
