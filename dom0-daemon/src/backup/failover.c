/*
 * Taking over a VM on the backup host, in the order the design gives:
 * win the VM in etcd (compare-and-swap from the generation we were told
 * to the next), run the optional fencing command, serve the disk replica
 * and the NIC here (vm_add, as for any VM), start the same QEMU command
 * line with -incoming, feed it the committed image as a migration stream
 * (restore_stream.h), and once it runs, announce the guest's MAC so the
 * LAN's switches learn where it moved.  Every step is timed for status
 * and the drill.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "backup/fence.h"
#include "base/fs_util.h"
#include "base/log.h"
#include "nbd/nbd_server.h"
#include "relay/net_relay.h"
#include "qemu/qmp.h"
#include "backup/replica.h"
#include "base/unix_socket.h"

extern char **environ;

#define WITNESS_RETRY_MS 1000
#define INCOMING_RETRY_MS 5
#define INCOMING_MAX_ATTEMPTS 4000 /* 20 s: QEMU under TCG starts slowly */
#define RESTORE_CHUNK (4u << 20)
#define RESUME_POLL_MS 10
#define RESUME_MAX_POLLS 3000

static double now_unix(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void takeover_failed(struct replica *r, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void takeover_failed(struct replica *r, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(r->error, sizeof(r->error), fmt, ap);
	va_end(ap);
	log_error("vm %s: TAKEOVER FAILED: %s", r->name, r->error);
	replica_failover_cleanup(r);
	replica_flows_takeover_end(r);
	r->state = REPLICA_FAILED;
}

/* Every takeover step waits on r->timer; one that cannot be armed ends the takeover. */
static void arm_timer(struct replica *r, long ms, timer_handler fn, const char *step)
{
	r->timer = event_loop_add_timer(r->loop, ms, fn, r);
	if (r->timer < 0) {
		r->timer = 0;
		takeover_failed(r, "cannot arm the timer of %s (out of memory)", step);
	}
}

static void del_timer(struct replica *r)
{
	if (r->timer)
		event_loop_del_timer(r->loop, r->timer);
	r->timer = 0;
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
		r->resumed_us = monotonic_us();
		r->resumed_at_unix = now_unix();
		json_t *args = json_pack("{s:i, s:i, s:i, s:i}", "initial", 50, "max", 550,
					 "rounds", 5, "step", 100);
		qmp_execute(qmp, "announce-self", args, on_announced, r);
		r->state = REPLICA_ACTIVE;
		r->error[0] = '\0';
		log_info("vm %s: TOOK OVER: the VM runs here from epoch %llu; primary "
			 "silent %lld ms, takeover %.1f ms (QEMU start %.1f ms, restore "
			 "%.1f ms, resume %.1f ms)", r->name,
			 (unsigned long long)r->committed_epoch, (long long)r->detected_after_ms,
			 (r->resumed_us - r->takeover_started_us) / 1000.0,
			 (r->qemu_spawned_us - r->takeover_started_us) / 1000.0,
			 (r->restore_done_us - r->qemu_spawned_us) / 1000.0,
			 (r->resumed_us - r->restore_done_us) / 1000.0);
		replica_failover_cleanup(r);
		if (!r->lazy) { /* a lazy restore frees it when every page is out */
			ram_image_destroy(r->image);
			r->image = NULL;
		}
		replica_flows_guest_running(r);
		return;
	}
	/* Loaded but not started (e.g. -S on the command line): start it. */
	if (status && (!strcmp(status, "paused") || !strcmp(status, "postmigrate")) &&
	    r->incoming_fd < 0)
		qmp_execute(qmp, "cont", NULL, NULL, NULL);
}

static long poll_resumed(event_loop *loop, long long id, void *data)
{
	struct replica *r = data;
	struct vm *vm = vm_find(r->vms, r->name);
	struct qmp_client *qmp = vm ? vm_qmp(vm) : NULL;

	if (++r->connect_attempts > RESUME_MAX_POLLS) {
		r->timer = 0;
		takeover_failed(r, "QEMU did not start running within %d s after the "
				"restore (see %s/qemu.log)", RESUME_MAX_POLLS * RESUME_POLL_MS / 1000,
				r->run_dir);
		return TIMER_DONE;
	}
	if (qmp && qmp_client_ready(qmp))
		qmp_execute(qmp, "query-status", NULL, on_query_status, r);
	return RESUME_POLL_MS;
}

/* ---- restore stream ------------------------------------------------------ */

static void restore_finished(struct replica *r)
{
	event_loop_unwatch(r->loop, r->incoming_fd);
	close(r->incoming_fd);
	r->incoming_fd = -1;
	r->restore_done_us = monotonic_us();
	log_info("vm %s: restore stream written (%.1f MiB in %.1f ms)", r->name,
		 (double)restore_stream_bytes(r->restore) / (1 << 20),
		 (r->restore_done_us - r->qemu_spawned_us) / 1000.0);
	restore_stream_destroy(r->restore);
	r->restore = NULL;
	buffer_free(&r->restore_out);
	r->connect_attempts = 0;
	arm_timer(r, RESUME_POLL_MS, poll_resumed, "waiting for the VM to run");
}

static void on_incoming_writable(event_loop *loop, int fd, void *data, int ready)
{
	struct replica *r = data;

	for (;;) {
		if (buffer_len(&r->restore_out) == 0) {
			if (r->restore_produced) {
				restore_finished(r);
				return;
			}
			int more = restore_stream_produce(r->restore, &r->restore_out,
							  RESTORE_CHUNK);
			if (more < 0) {
				takeover_failed(r, "out of memory producing the restore stream");
				return;
			}
			r->restore_produced = more == 0;
			continue;
		}
		if (buffer_write_fd(&r->restore_out, fd) < 0) {
			takeover_failed(r, "QEMU stopped reading the restore stream: %s "
					"(see %s/qemu.log)", strerror(errno), r->run_dir);
			return;
		}
		if (buffer_len(&r->restore_out) > 0)
			return; /* EAGAIN: wait for writability */
	}
}

/* ---- lazy restore (--restore lazy) --------------------------------------- */

/*
 * Why: the eager restore writes every page of the image into QEMU before
 * the VM may run, so takeover grows with guest RAM.  Lazy, the backup's
 * QEMU gets the device state and runs at once; the image is served by
 * the fork's postcopy source (postcopy_source.h): pages the guest touches
 * first, the rest pushed behind.  The image must live until every page is
 * out; then it goes.
 */
static long end_lazy_restore(event_loop *loop, long long id, void *data)
{
	struct replica *r = data;

	r->lazy_end_timer = 0;
	postcopy_session_destroy(r->lazy);
	r->lazy = NULL;
	postcopy_fork_destroy(r->lazy_fork);
	r->lazy_fork = NULL;
	if (r->state == REPLICA_ACTIVE) {
		ram_image_destroy(r->image);
		r->image = NULL;
	}
	return TIMER_DONE;
}

void replica_lazy_restore_stop(struct replica *r)
{
	if (r->lazy_end_timer)
		event_loop_del_timer(r->loop, r->lazy_end_timer);
	r->lazy_end_timer = 0;
	postcopy_session_destroy(r->lazy);
	r->lazy = NULL;
	postcopy_fork_destroy(r->lazy_fork);
	r->lazy_fork = NULL;
}

static int spawn_qemu(struct replica *r, char *err, size_t errlen);
static long try_incoming(event_loop *loop, long long id, void *data);

/*
 * The backup's QEMU can die while loading the device state of a lazy
 * restore (seen once in CI: a segfault in object_get_class 70 ms after
 * it started, before the guest ran).  The committed image is still
 * whole then, so the takeover goes on with a new QEMU and the eager
 * restore, if and only if nothing of the failed attempt can have
 * escaped: no write reached the disk replica and no frame left the
 * guest's NIC.  Otherwise the restart would resume the guest from the
 * checkpoint behind output clients already saw, and the takeover fails.
 */
static bool lazy_fall_back_to_eager(struct replica *r, const char *reason)
{
	struct vm *vm = vm_find(r->vms, r->name);
	struct nbd_export_stats disk = { 0 };
	struct net_relay_stats nic = { 0 };
	char err[256];

	if (r->lazy_fell_back || !vm || r->resumed_us)
		return false;
	if (vm_export(vm))
		nbd_export_get_stats(vm_export(vm), &disk);
	if (vm_nic(vm))
		net_relay_get_stats(vm_nic(vm), &nic);
	if (disk.writes || disk.write_zeroes || disk.trims || nic.frames_from_guest) {
		log_error("vm %s: the failed lazy restore's guest already wrote %llu times to "
			  "its disk and sent %llu frames: no second attempt", r->name,
			  (unsigned long long)(disk.writes + disk.write_zeroes + disk.trims),
			  (unsigned long long)nic.frames_from_guest);
		return false;
	}
	r->lazy_fell_back = true;
	if (r->qemu_pid > 0)
		kill(r->qemu_pid, SIGKILL); /* the daemon's reaper collects it */
	log_error("vm %s: LAZY RESTORE FAILED before the guest wrote or sent anything (%s): "
		  "taking over again with a new QEMU and the eager restore", r->name, reason);
	if (spawn_qemu(r, err, sizeof(err)) < 0) {
		takeover_failed(r, "after the failed lazy restore: %s", err);
		return true;
	}
	r->connect_attempts = 0;
	arm_timer(r, INCOMING_RETRY_MS, try_incoming, "connecting to QEMU's -incoming");
	return true;
}

static void on_lazy_done(void *opaque, struct postcopy_session *s, bool ok,
			 const char *reason)
{
	struct replica *r = opaque;

	postcopy_session_get_stats(s, &r->lazy_stats);
	r->lazy_done_us = monotonic_us();
	r->lazy_ok = ok;
	if (ok)
		log_info("vm %s: lazy restore complete: %llu pages, %llu asked for by the guest "
			 "(fault p50/p99 %u/%u us), %.1f ms after QEMU started", r->name,
			 (unsigned long long)r->lazy_stats.pages_total,
			 (unsigned long long)r->lazy_stats.pages_requested,
			 r->lazy_stats.latency_p50_us, r->lazy_stats.latency_p99_us,
			 (r->lazy_done_us - r->qemu_spawned_us) / 1000.0);
	else
		log_error("vm %s: LAZY RESTORE FAILED: %s; the guest cannot get the pages it "
			  "has not touched yet", r->name, reason);
	/* Not from inside the session's own callback. */
	r->lazy_end_timer = event_loop_add_timer(r->loop, 0, end_lazy_restore, r);
	if (r->lazy_end_timer < 0)
		r->lazy_end_timer = 0;
	if (!ok && r->state == REPLICA_FAILING_OVER && !lazy_fall_back_to_eager(r, reason))
		takeover_failed(r, "lazy restore: %s", reason);
}

static void start_lazy_restore(struct replica *r, int fd)
{
	char err[256];

	r->lazy_fork = postcopy_fork_create(r->image, NULL, 0);
	if (!r->lazy_fork) {
		close(fd);
		takeover_failed(r, "out of memory starting the lazy restore");
		return;
	}
	r->lazy = postcopy_session_start(r->loop, r->lazy_fork, fd, on_lazy_done, r, err,
					 sizeof(err));
	if (!r->lazy) {
		close(fd);
		takeover_failed(r, "cannot restore the image lazily: %s", err);
		return;
	}
	/* The device state goes first; the guest runs as soon as QEMU has it. */
	r->restore_done_us = monotonic_us();
	r->connect_attempts = 0;
	arm_timer(r, RESUME_POLL_MS, poll_resumed, "waiting for the VM to run");
}

static long try_incoming(event_loop *loop, long long id, void *data)
{
	struct replica *r = data;
	char path[PATH_MAX];
	char err[256];

	snprintf(path, sizeof(path), "%s/incoming.sock", r->run_dir);
	int fd = unix_connect(path);
	if (fd < 0) {
		if (++r->connect_attempts < INCOMING_MAX_ATTEMPTS)
			return INCOMING_RETRY_MS;
		r->timer = 0;
		takeover_failed(r, "QEMU never listened on %s (see %s/qemu.log)", path,
				r->run_dir);
		return TIMER_DONE;
	}
	r->timer = 0;
	if (r->settings->restore_lazy && !r->lazy_fell_back) {
		start_lazy_restore(r, fd);
		return TIMER_DONE;
	}
	r->incoming_fd = fd;
	r->restore = restore_stream_create(r->image, err, sizeof(err));
	if (!r->restore) {
		takeover_failed(r, "cannot restore the image: %s", err);
		return TIMER_DONE;
	}
	buffer_init(&r->restore_out);
	r->restore_produced = false;
	if (event_loop_watch(loop, fd, EV_WRITABLE, on_incoming_writable, r) < 0)
		takeover_failed(r, "epoll: %s", strerror(errno));
	return TIMER_DONE;
}

/* ---- QEMU ------------------------------------------------------------- */

static char *replace_all(const char *s, const char *from, const char *to)
{
	size_t from_len = strlen(from), to_len = strlen(to), n = 0;

	for (const char *p = s; from_len && (p = strstr(p, from)); p += from_len)
		n++;
	char *outp = malloc(strlen(s) + n * (to_len + 1) + 1);
	char *o = outp;
	if (!outp)
		return NULL;
	while (from_len && *s) {
		const char *hit = strstr(s, from);
		if (!hit)
			break;
		memcpy(o, s, (size_t)(hit - s));
		o += hit - s;
		memcpy(o, to, to_len);
		o += to_len;
		s = hit + from_len;
	}
	strcpy(o, s);
	return outp;
}

/*
 * The primary's command line with its run dir replaced by ours, without
 * -daemonize (we reap QEMU ourselves), plus -incoming.
 */
/* The primary's arguments a QEMU here does without: it runs as our child, restoring. */
static bool kept_arg(const char *arg)
{
	return strcmp(arg, "-daemonize") && strcmp(arg, "-incoming");
}

static char **build_argv(struct replica *r, char *err, size_t errlen)
{
	const char *primary_dir = r->config.run_dir;
	size_t n = r->config.qemu_argc;
	char **out = calloc(n + 5, sizeof(char *));
	size_t k = 0;

	if (!out) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	for (size_t i = 0; i < n; i++) {
		const char *arg = r->config.qemu_argv[i];
		if (!kept_arg(arg))
			continue;
		out[k] = replace_all(arg, primary_dir, r->run_dir);
		if (!out[k++]) {
			snprintf(err, errlen, "out of memory");
			goto fail;
		}
	}
	if (r->settings->restore_lazy) {
		/* The capability must be on before -incoming starts listening. */
		out[k++] = strdup("-global");
		out[k++] = strdup("migration.x-postcopy-ram=on");
	}
	out[k++] = strdup("-incoming");
	char incoming[PATH_MAX + 16];
	snprintf(incoming, sizeof(incoming), "unix:%s/incoming.sock", r->run_dir);
	out[k++] = strdup(incoming);
	return out;
fail:
	for (size_t i = 0; i < k; i++)
		free(out[i]);
	free(out);
	return NULL;
}

static void free_argv(char **argv)
{
	for (size_t i = 0; argv && argv[i]; i++)
		free(argv[i]);
	free(argv);
}

static int spawn_qemu(struct replica *r, char *err, size_t errlen)
{
	char **argv = build_argv(r, err, errlen);
	char log_path[PATH_MAX + 16];
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t attr;
	pid_t pid;

	if (!argv)
		return -1;
	snprintf(log_path, sizeof(log_path), "%s/qemu.log", r->run_dir);
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
	posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log_path,
					 O_WRONLY | O_CREAT | O_APPEND, 0644);
	posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
	posix_spawnattr_init(&attr);
	/* Its own session: the daemon's signals and death must not reach it. */
	posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
	int rc = posix_spawnp(&pid, argv[0], &fa, &attr, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&attr);
	if (rc != 0) {
		snprintf(err, errlen, "cannot start %s: %s", argv[0], strerror(rc));
	} else {
		r->qemu_pid = pid;
		log_info("vm %s: started QEMU (pid %d) with -incoming", r->name, (int)pid);
	}
	free_argv(argv);
	return rc ? -1 : 0;
}

static void serve_and_start_vm(struct replica *r);

/* The fence and the replica file's flush run side by side; the VM starts after both. */
static void start_vm_when_ready(struct replica *r)
{
	if (r->fence_done && r->takeover_flush_err >= 0)
		serve_and_start_vm(r);
}

static void on_takeover_flushed(void *opaque, int err)
{
	struct replica *r = opaque;

	r->takeover_flush_err = err;
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

	r->takeover_flush_err = -1;
	if (replica_start_disk_flush(r, on_takeover_flushed, err, sizeof(err)) < 0) {
		log_warn("vm %s: cannot flush the disk replica: %s", r->name, err);
		r->takeover_flush_err = ECANCELED;
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

	r->fence = NULL;
	if (!ok)
		log_error("vm %s: FENCING FAILED: '%s' %s (after %.1f ms); taking over anyway: "
			  "etcd made this host the owner", r->name, cmd, why, ms);
	else
		log_info("vm %s: fencing command '%s' succeeded after %.1f ms", r->name, cmd, ms);
	r->fence_done = true;
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
		r->fence_done = true;
		start_vm_when_ready(r);
		return;
	}
	r->fence = fence_start(r->loop, cmd, r->name, r->replaced_owner, FENCE_TIMEOUT_MS,
			       on_fenced, r, why, sizeof(why));
	if (!r->fence)
		on_fenced(r, false, 0, why);
}

static void take_over(struct replica *r)
{
	r->state = REPLICA_FAILING_OVER;
	r->takeover_started_us = monotonic_us();
	log_warn("vm %s: TAKING OVER from %s at committed epoch %llu", r->name,
		 r->replaced_owner, (unsigned long long)r->committed_epoch);
	/* Whatever arrived of the next epoch was never acknowledged. */
	replica_note_discarded(r);
	epoch_stage_discard(r->stage);
	r->fence_done = false;
	start_takeover_flush(r);
	run_fence_command(r);
}

static void serve_and_start_vm(struct replica *r)
{
	struct vm_definition def;
	char err[512];

	if (snprintf(r->run_dir, sizeof(r->run_dir), "%s/vms/%s", r->settings->run_dir,
		     r->name) >= (int)sizeof(r->run_dir)) {
		takeover_failed(r, "--run-dir %s is too long for unix socket paths",
				r->settings->run_dir);
		return;
	}
	if (mkdir_p(r->run_dir) < 0) {
		takeover_failed(r, "cannot create %s: %s", r->run_dir, strerror(errno));
		return;
	}
	if (vm_config_definition(&r->config, r->disk_path, r->run_dir, &def, err,
				 sizeof(err)) < 0) {
		takeover_failed(r, "%s", err);
		return;
	}
	bool flushed = r->takeover_flush_err == 0;
	if (!flushed)
		log_warn("vm %s: the disk replica was not flushed: %s", r->name,
			 strerror(r->takeover_flush_err));
	/* Before the guest writes: from here on its writes mark the log (vm_add). */
	if (!flushed || replica_seal_disk_at_takeover(r) < 0)
		log_error("vm %s: the disk's change log could not be sealed: a failback will "
			  "copy the whole disk", r->name);
	if (vm_add(r->vms, &def, err, sizeof(err)) < 0) {
		takeover_failed(r, "cannot serve the VM's disk and NIC here: %s", err);
		return;
	}
	/* Before the guest writes: a fork's disk snapshot must see its writes. */
	replica_fork_taken_over(r);
	/* The clients first: they need no guest, and the sooner they hear, the better. */
	replica_flows_takeover_begin(r);
	if (spawn_qemu(r, err, sizeof(err)) < 0) {
		takeover_failed(r, "%s", err);
		return;
	}
	r->qemu_spawned_us = monotonic_us();
	r->connect_attempts = 0;
	arm_timer(r, INCOMING_RETRY_MS, try_incoming, "connecting to QEMU's -incoming");
}

/* ---- arbitration ------------------------------------------------------- */

static void arbitrate(struct replica *r);

static long retry_arbitration(event_loop *loop, long long id, void *data)
{
	struct replica *r = data;

	r->timer = 0;
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
		snprintf(r->replaced_owner, sizeof(r->replaced_owner), "%s",
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

	if (!r->witness) {
		r->witness = witness_async_create(r->loop, &r->settings->witness, err,
						  sizeof(err));
		if (!r->witness) {
			takeover_failed(r, "cannot use etcd: %s", err);
			return;
		}
	}
	if (witness_async_cas(r->witness, r->name, &r->ownership, r->settings->host,
			      on_cas_done, r) < 0)
		arm_timer(r, WITNESS_RETRY_MS, retry_arbitration, "retrying etcd");
}

void replica_primary_lost(struct replica *r, const char *why)
{
	if (r->state != REPLICA_READY)
		return;
	r->lost_at_us = monotonic_us();
	r->lost_at_unix = now_unix();
	snprintf(r->error, sizeof(r->error), "%s", why);
	log_error("vm %s: primary lost (%s) at committed epoch %llu: asking etcd",
		  r->name, why, (unsigned long long)r->committed_epoch);
	r->state = REPLICA_ARBITRATING;
	arbitrate(r);
}

void replica_failover_cleanup(struct replica *r)
{
	del_timer(r);
	fence_cancel(r->fence);
	r->fence = NULL;
	if (r->incoming_fd >= 0) {
		event_loop_unwatch(r->loop, r->incoming_fd);
		close(r->incoming_fd);
		r->incoming_fd = -1;
	}
	restore_stream_destroy(r->restore);
	r->restore = NULL;
	buffer_free(&r->restore_out);
	witness_async_destroy(r->witness);
	r->witness = NULL;
}

/*
 * The VM's QEMU command as it runs here after the takeover, without the
 * restore's -incoming: what a protection from here to another host (a
 * failback) ships as the VM's command line.
 */
static json_t *takeover_command_json(const struct replica *r)
{
	json_t *argv = json_array();

	for (size_t i = 0; argv && i < r->config.qemu_argc; i++) {
		if (!kept_arg(r->config.qemu_argv[i]))
			continue;
		char *arg = replace_all(r->config.qemu_argv[i], r->config.run_dir, r->run_dir);
		if (!arg || json_array_append_new(argv, json_string(arg)) < 0) {
			free(arg);
			json_decref(argv);
			return json_null();
		}
		free(arg);
	}
	return argv ? argv : json_null();
}

json_t *replica_failover_json(const struct replica *r)
{
	if (!r->lost_at_us)
		return json_null();
	json_t *o = json_pack("{s:I, s:f}",
			      "detected_ms_after_last_heard", (json_int_t)r->detected_after_ms,
			      "started_at_unix", r->lost_at_unix);
	if (!o)
		return json_null();
	json_object_set_new(o, "arbitration_ms", r->takeover_started_us ?
			    json_real((r->takeover_started_us - r->lost_at_us) / 1000.0) : json_null());
	json_object_set_new(o, "qemu_start_ms", r->qemu_spawned_us && r->takeover_started_us ?
			    json_real((r->qemu_spawned_us - r->takeover_started_us) / 1000.0) : json_null());
	json_object_set_new(o, "restore_ms", r->restore_done_us ?
			    json_real((r->restore_done_us - r->qemu_spawned_us) / 1000.0) : json_null());
	if (r->state == REPLICA_ACTIVE)
		json_object_set_new(o, "command", takeover_command_json(r));
	json_object_set_new(o, "restore", json_string(!r->settings->restore_lazy ? "eager" :
						      r->lazy_fell_back ? "lazy, then eager" : "lazy"));
	if (r->settings->restore_lazy && r->lazy_done_us)
		json_object_set_new(o, "lazy", json_pack(
			"{s:b, s:f, s:I, s:I, s:i, s:i}", "complete", r->lazy_ok,
			"all_pages_ms", (r->lazy_done_us - r->qemu_spawned_us) / 1000.0,
			"pages_requested", (json_int_t)r->lazy_stats.pages_requested,
			"bytes_sent", (json_int_t)r->lazy_stats.bytes_sent,
			"fault_p50_us", (int)r->lazy_stats.latency_p50_us,
			"fault_p99_us", (int)r->lazy_stats.latency_p99_us));
	json_object_set_new(o, "resumed_at_unix", r->resumed_us ?
			    json_real(r->resumed_at_unix) : json_null());
	json_object_set_new(o, "total_ms", r->resumed_us ?
			    json_real((r->resumed_us - r->lost_at_us) / 1000.0) : json_null());
	return o;
}
