/* The parent-host half of a VM fork; see vm_fork.h. */
#include "fork/vm_fork.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fork/disk_snapshot.h"
#include "base/fs_util.h"
#include "base/log.h"
#include "nbd/nbd_server.h"
#include "fork/pagesrc.h"
#include "qemu/qmp.h"
#include "vm/vm.h"

extern char **environ;

#define MAX_LINE 65536
#define SNAPSHOT_PORT_ANY ":0"

enum fork_state {
	FORK_SPAWNING,   /* waiting for the page source to listen */
	FORK_MIGRATING,  /* the parent migrates into the page source */
	FORK_RESUMING,   /* disk frozen, `cont` sent */
	FORK_SERVING,    /* parent runs; clones get pages */
	FORK_SERVED,     /* the page source exited after the last clone */
	FORK_FAILED,
};

static const char *const state_names[] = { "spawning", "migrating", "resuming",
					   "serving", "served", "failed" };

struct vm_fork {
	event_loop *loop;
	struct fork_settings settings;
	struct vm *vm;       /* the running parent; NULL for a fork from a backup */
	char name[VM_NAME_MAX + 1];
	char id[64];
	char dir[1200];
	enum fork_state state;
	char error[512];
	unsigned clones;
	unsigned push_mbps;
	pid_t pid;
	int in_fd, out_fd; /* the page source's stdin and stdout */
	char line[MAX_LINE];
	size_t line_len;
	bool source_exited;
	bool source_done;  /* it printed "done" */
	int64_t started_us, completed_us, resumed_us, captured_us;
	json_int_t downtime_ms;
	json_t *capture;   /* the "captured" line */
	json_t *clone_stats; /* id -> latest stats */
	struct disk_snapshot *disk;
	struct nbd_export *disk_export;
	/* A fork from a backup: remusdbd's own view of the disk replica, which
	 * the replica's commits preserve through before they write it. */
	struct nbd_export *replica_disk;
	uint64_t committed_epoch;
	unsigned cont_attempts; /* refused `cont`s (on_cont) */
	long long cont_timer;
	double fork_call_ms; /* the backup's pause: fork() of remusdbd */
	char disk_socket[1300];
	char disk_export_name[128];
};

static void fork_failed(struct vm_fork *f, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void stop_source(struct vm_fork *f)
{
	if (f->pid > 0 && !f->source_exited)
		kill(f->pid, SIGKILL); /* the daemon's reaper collects it */
	if (f->in_fd >= 0)
		close(f->in_fd);
	f->in_fd = -1;
	if (f->out_fd >= 0) {
		event_loop_unwatch(f->loop, f->out_fd);
		close(f->out_fd);
	}
	f->out_fd = -1;
}

static void fork_failed(struct vm_fork *f, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(f->error, sizeof(f->error), fmt, ap);
	va_end(ap);
	log_error("vm %s: FORK %s FAILED: %s", f->name, f->id, f->error);
	enum fork_state was = f->state;
	f->state = FORK_FAILED;
	stop_source(f);
	/* Never leave the parent stopped by our migration. */
	if (f->vm && (was == FORK_MIGRATING || was == FORK_RESUMING))
		qmp_execute(vm_qmp(f->vm), "cont", NULL, NULL, NULL);
}

/* ---- the page source's output ------------------------------------------- */

static void on_source_line(struct vm_fork *f, const char *text)
{
	json_error_t jerr;
	json_t *msg = json_loads(text, 0, &jerr);
	const char *event = json_string_value(json_object_get(msg, "event"));

	if (!event) {
		log_warn("vm %s: fork %s: page source said: %.200s", f->name,
			 f->id, text);
		json_decref(msg);
		return;
	}
	if (!strcmp(event, "listening") && f->state == FORK_SPAWNING) {
		char uri[4200];

		snprintf(uri, sizeof(uri), "unix:%s/capture.sock", f->dir);
		f->state = FORK_MIGRATING;
		qmp_execute(vm_qmp(f->vm), "migrate", json_pack("{s:s}", "uri", uri), NULL, NULL);
		log_info("vm %s: fork %s: migrating the parent into the page source",
			 f->name, f->id);
	} else if (!strcmp(event, "captured")) {
		f->captured_us = monotonic_us();
		json_decref(f->capture);
		f->capture = json_incref(msg);
	} else if (!strcmp(event, "progress")) {
		size_t i;
		json_t *c;

		json_array_foreach(json_object_get(msg, "clones"), i, c)
			json_object_set(f->clone_stats, json_string_value(json_object_get(c, "id")), c);
	} else if (!strcmp(event, "clone")) {
		const char *id = json_string_value(json_object_get(msg, "id"));

		json_object_del(msg, "event");
		json_object_set(f->clone_stats, id ? id : "?", msg);
		log_info("vm %s: fork %s: clone %s: %s", f->name, f->id,
			 id ? id : "?", json_string_value(json_object_get(msg, "error")));
	} else if (!strcmp(event, "done")) {
		f->source_done = true;
	} else if (!strcmp(event, "failed") || !strcmp(event, "error")) {
		const char *why = json_string_value(json_object_get(msg, "error"));

		log_error("vm %s: fork %s: page source: %s", f->name, f->id,
			  why ? why : "?");
		if (f->state == FORK_MIGRATING || f->state == FORK_SPAWNING)
			fork_failed(f, "the page source failed: %s", why ? why : "?");
	}
	json_decref(msg);
}

static void on_source_output(event_loop *loop, int fd, void *data, int ready)
{
	struct vm_fork *f = data;
	ssize_t n = read(fd, f->line + f->line_len, sizeof(f->line) - 1 - f->line_len);

	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (n <= 0) {
		/* It exited (or closed stdout, which it never does while alive). */
		f->source_exited = true;
		event_loop_unwatch(loop, fd);
		close(fd);
		f->out_fd = -1;
		if (f->state == FORK_FAILED)
			return;
		if (f->state == FORK_SERVING && f->source_done) {
			f->state = FORK_SERVED;
			log_info("vm %s: fork %s: every clone has every page; memory "
				 "snapshot released", f->name, f->id);
		} else {
			fork_failed(f, "the page source exited in state %s (see %s/pagesrc.log)",
				    state_names[f->state], f->dir);
		}
		return;
	}
	f->line_len += (size_t)n;
	char *start = f->line, *nl;
	while ((nl = memchr(start, '\n', f->line_len - (size_t)(start - f->line)))) {
		*nl = 0;
		on_source_line(f, start);
		if (f->out_fd < 0)
			return;
		start = nl + 1;
	}
	f->line_len -= (size_t)(start - f->line);
	memmove(f->line, start, f->line_len);
	if (f->line_len == sizeof(f->line) - 1)
		f->line_len = 0;
}

/* ---- the parent's migration ------------------------------------------------ */

/*
 * QMP callbacks get the VM, not the fork: a fork released while a reply
 * is outstanding must not be touched, and the VM outlives its QMP client.
 */
static void on_cont(struct qmp_client *qmp, json_t *reply, void *data);

/*
 * QEMU sends MIGRATION "completed" from its migration thread a moment
 * before the run state leaves finish-migrate for postmigrate, and a
 * `cont` in between is refused (seen here: 2 forks in 13).  So a refused
 * `cont` is sent again, every CONT_RETRY_MS, for up to CONT_ATTEMPTS.
 */
#define CONT_RETRY_MS 10
#define CONT_ATTEMPTS 200

static long retry_cont(event_loop *loop, long long id, void *data)
{
	struct vm_fork *f = vm_fork_of(data);

	if (!f)
		return TIMER_DONE;
	f->cont_timer = 0; /* this one: destroy must not delete it */
	if (f->state == FORK_RESUMING)
		qmp_execute(vm_qmp(f->vm), "cont", NULL, on_cont, f->vm);
	return TIMER_DONE;
}

static void on_cont(struct qmp_client *qmp, json_t *reply, void *data)
{
	struct vm_fork *f = vm_fork_of(data);

	if (!f || f->state != FORK_RESUMING)
		return;
	if (!reply) {
		fork_failed(f, "the parent did not resume: QMP connection lost before `cont` answered");
		return;
	}
	json_t *error = json_object_get(reply, "error");
	if (error) {
		const char *desc = json_string_value(json_object_get(error, "desc"));

		if (++f->cont_attempts < CONT_ATTEMPTS) {
			f->cont_timer = event_loop_add_timer(f->loop, CONT_RETRY_MS, retry_cont, f->vm);
			if (f->cont_timer > 0)
				return;
			f->cont_timer = 0;
		}
		fork_failed(f, "the parent did not resume: `cont` refused %u times: %s",
			    f->cont_attempts, desc ? desc : "?");
		return;
	}
	f->resumed_us = monotonic_us();
	f->state = FORK_SERVING;
	log_info("vm %s: fork %s: parent resumed; paused %lld ms (QEMU downtime) + "
		 "%.1f ms (disk freeze and cont%s)", f->name, f->id,
		 (long long)f->downtime_ms, (f->resumed_us - f->completed_us) / 1000.0,
		 f->cont_attempts ? ", `cont` retried until QEMU left finish-migrate" : "");
}

static void on_query_migrate(struct qmp_client *qmp, json_t *reply, void *data)
{
	struct vm_fork *f = vm_fork_of(data);
	json_t *dt = json_object_get(json_object_get(reply, "return"), "downtime");

	if (f && json_is_integer(dt))
		f->downtime_ms = json_integer_value(dt);
}

/* Freezes live's image now and serves the snapshot to the clones. */
static int freeze_export(struct vm_fork *f, struct nbd_export *live, char *err, size_t errlen)
{
	char tcp[80] = "";

	f->disk = disk_snapshot_create(live, f->settings.state_dir, err, errlen);
	if (!f->disk)
		return -1;
	snprintf(f->disk_socket, sizeof(f->disk_socket), "%s/disk.sock", f->dir);
	snprintf(f->disk_export_name, sizeof(f->disk_export_name), "%s", f->id);
	if (f->settings.lan_addr[0])
		snprintf(tcp, sizeof(tcp), "%s%s", f->settings.lan_addr, SNAPSHOT_PORT_ANY);
	f->disk_export = nbd_export_create_snapshot(f->loop, f->disk_export_name,
						    f->disk_socket, tcp[0] ? tcp : NULL,
						    f->disk);
	if (!f->disk_export) {
		snprintf(err, errlen, "cannot serve the disk snapshot (the daemon log says why)");
		return -1;
	}
	return 0;
}

static int freeze_disk(struct vm_fork *f, char *err, size_t errlen)
{
	if (!vm_export(f->vm))
		return 0; /* a VM whose disk QEMU opens itself: memory only */
	return freeze_export(f, vm_export(f->vm), err, errlen);
}

static void migration_completed(struct vm_fork *f)
{
	char err[256];

	f->completed_us = monotonic_us();
	/* QEMU stopped the parent and flushed and released its disk before
	 * reporting completion, so the image is the disk of this instant. */
	if (freeze_disk(f, err, sizeof(err)) < 0) {
		fork_failed(f, "disk snapshot: %s", err);
		return;
	}
	f->state = FORK_RESUMING;
	qmp_execute(vm_qmp(f->vm), "cont", NULL, on_cont, f->vm);
	qmp_execute(vm_qmp(f->vm), "query-migrate", NULL, on_query_migrate, f->vm);
}

void vm_fork_on_qmp_event(struct vm_fork *f, const char *event, json_t *data)
{
	if (!f || f->state != FORK_MIGRATING || strcmp(event, "MIGRATION"))
		return;
	const char *status = json_string_value(json_object_get(data, "status"));
	if (!status)
		return;
	if (!strcmp(status, "completed"))
		migration_completed(f);
	else if (!strcmp(status, "failed") || !strcmp(status, "cancelled"))
		fork_failed(f, "the parent's migration into the page source %s", status);
}

/* ---- start, serve, end ---------------------------------------------------- */

/* Either kind of page source, started: its pipes on the event loop. */
static int watch_source(struct vm_fork *f, char *err, size_t errlen)
{
	fcntl(f->out_fd, F_SETFL, O_NONBLOCK);
	fcntl(f->in_fd, F_SETFL, O_NONBLOCK);
	if (event_loop_watch(f->loop, f->out_fd, EV_READABLE, on_source_output, f) < 0) {
		snprintf(err, errlen, "cannot watch the page source");
		return -1;
	}
	return 0;
}

static int spawn_source(struct vm_fork *f, char *err, size_t errlen)
{
	int in_pipe[2], out_pipe[2];
	char capture[4200], logp[4200], clones[16], mbps[16];
	posix_spawn_file_actions_t fa;

	snprintf(capture, sizeof(capture), "%s/capture.sock", f->dir);
	snprintf(logp, sizeof(logp), "%s/pagesrc.log", f->dir);
	snprintf(clones, sizeof(clones), "%u", f->clones);
	snprintf(mbps, sizeof(mbps), "%u", f->push_mbps);
	char *argv[] = { f->settings.pagesrc, "--capture-socket", capture, "--clones",
			 clones, "--push-mbps", mbps, "--log", logp, NULL };
	if (pipe2(in_pipe, O_CLOEXEC) < 0)
		goto fail_errno;
	if (pipe2(out_pipe, O_CLOEXEC) < 0) {
		close(in_pipe[0]);
		close(in_pipe[1]);
		goto fail_errno;
	}
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, in_pipe[0], STDIN_FILENO);
	posix_spawn_file_actions_adddup2(&fa, out_pipe[1], STDOUT_FILENO);
	int rc = posix_spawn(&f->pid, argv[0], &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	close(in_pipe[0]);
	close(out_pipe[1]);
	f->in_fd = in_pipe[1];
	f->out_fd = out_pipe[0];
	if (rc) {
		snprintf(err, errlen, "cannot start %s: %s", argv[0], strerror(rc));
		return -1;
	}
	return watch_source(f, err, errlen);
fail_errno:
	snprintf(err, errlen, "pipe: %s", strerror(errno));
	return -1;
}

static void set_capabilities(struct vm_fork *f)
{
	/* Events tell us when the migration completed; neither COLO nor
	 * postcopy on the parent: this is a plain precopy into the page source. */
	json_t *caps = json_pack("[{s:s, s:b}, {s:s, s:b}, {s:s, s:b}]",
				 "capability", "events", "state", 1,
				 "capability", "x-colo", "state", 0,
				 "capability", "postcopy-ram", "state", 0);

	qmp_execute(vm_qmp(f->vm), "migrate-set-capabilities",
		    json_pack("{s:o}", "capabilities", caps), NULL, NULL);
}

static struct vm_fork *fork_alloc(event_loop *loop, const struct fork_settings *settings,
				  const char *name, unsigned clones, unsigned push_mbps,
				  char *err, size_t errlen)
{
	static unsigned counter;
	struct vm_fork *f;

	if (clones == 0 || clones > PAGESRC_MAX_CLONES) {
		snprintf(err, errlen, "clones must be 1 to %d", PAGESRC_MAX_CLONES);
		return NULL;
	}
	f = calloc(1, sizeof(*f));
	if (!f) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	f->loop = loop;
	f->settings = *settings;
	snprintf(f->name, sizeof(f->name), "%s", name);
	f->clones = clones;
	f->push_mbps = push_mbps;
	f->in_fd = f->out_fd = -1;
	f->clone_stats = json_object();
	f->started_us = monotonic_us();
	snprintf(f->id, sizeof(f->id), "%s@fork-%d-%u", name, (int)getpid(), ++counter);
	snprintf(f->dir, sizeof(f->dir), "%s/forks/%s", settings->run_dir, f->id);
	if (mkdir_p(f->dir) < 0) {
		snprintf(err, errlen, "cannot create %s: %s", f->dir, strerror(errno));
		vm_fork_destroy(f);
		return NULL;
	}
	return f;
}

struct vm_fork *vm_fork_start(event_loop *loop, const struct fork_settings *settings,
			      struct vm *vm, unsigned clones, unsigned push_mbps,
			      char *err, size_t errlen)
{
	struct vm_fork *f;

	if (!vm_qmp(vm) || !qmp_client_ready(vm_qmp(vm))) {
		snprintf(err, errlen, "QEMU's QMP socket is not connected");
		return NULL;
	}
	f = fork_alloc(loop, settings, vm_def(vm)->name, clones, push_mbps, err, errlen);
	if (!f)
		return NULL;
	f->vm = vm;
	if (spawn_source(f, err, errlen) < 0) {
		vm_fork_destroy(f);
		return NULL;
	}
	set_capabilities(f);
	log_info("vm %s: fork %s started for %u clone(s)", vm_def(vm)->name, f->id, clones);
	return f;
}

/* ---- a fork from a backup's committed image --------------------------------- */

/*
 * The child of fork(): it holds the image as it was at the fork, whatever
 * the daemon commits from now on, and serves it like remusdbd-pagesrc
 * (pagesrc.h).  Everything the daemon had open goes first: its sockets,
 * epoll and the replica's connection belong to the daemon alone, and
 * only this thread exists here (the daemon's others are not forked).
 */
static void __attribute__((noreturn))
serve_frozen_image(const struct vm_fork *f, const struct ram_image *img,
		   const struct page_ref *dirtied, size_t ndirtied, int in_fd, int out_fd)
{
	char logp[1300];
	sigset_t none;
	int in_high = fcntl(in_fd, F_DUPFD, 10), out_high = fcntl(out_fd, F_DUPFD, 10);

	if (in_high < 0 || out_high < 0 || dup2(in_high, STDIN_FILENO) < 0 ||
	    dup2(out_high, STDOUT_FILENO) < 0)
		_exit(127);
	close_range(STDERR_FILENO + 1, ~0U, 0);
	/* The daemon blocks SIGTERM and SIGINT for its signalfd. */
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	signal(SIGTERM, SIG_DFL);
	signal(SIGINT, SIG_DFL);
	signal(SIGCHLD, SIG_DFL);
	signal(SIGPIPE, SIG_IGN);
	snprintf(logp, sizeof(logp), "%s/pagesrc.log", f->dir);
	if (log_open(logp, LOG_INFO) < 0)
		_exit(127);
	log_info("fork %s: serving the committed image of epoch %llu to %u clone(s)",
		 f->id, (unsigned long long)f->committed_epoch, f->clones);
	event_loop *loop = event_loop_create();
	if (!loop)
		_exit(127);
	pagesrc_init(loop, f->clones, (uint64_t)f->push_mbps * 1000000 / 8);
	pagesrc_snapshot_ready(img, dirtied, ndirtied, json_pack(
		"{s:s, s:I, s:I}", "from", "backup", "epoch", (json_int_t)f->committed_epoch,
		"redirtied", (json_int_t)ndirtied));
	_exit(pagesrc_run());
}

static int fork_frozen_source(struct vm_fork *f, const struct ram_image *img,
			      char *err, size_t errlen)
{
	int in_pipe[2], out_pipe[2];
	size_t ndirtied;
	struct page_ref *dirtied = ram_image_recent_pages(img, &ndirtied);

	if (pipe2(in_pipe, O_CLOEXEC) < 0) {
		snprintf(err, errlen, "pipe: %s", strerror(errno));
		free(dirtied);
		return -1;
	}
	if (pipe2(out_pipe, O_CLOEXEC) < 0) {
		snprintf(err, errlen, "pipe: %s", strerror(errno));
		close(in_pipe[0]);
		close(in_pipe[1]);
		free(dirtied);
		return -1;
	}
	int64_t before = monotonic_us();
	f->pid = fork();
	if (f->pid == 0)
		serve_frozen_image(f, img, dirtied, ndirtied, in_pipe[0], out_pipe[1]);
	f->fork_call_ms = (monotonic_us() - before) / 1000.0;
	int fork_errno = errno;
	free(dirtied);
	close(in_pipe[0]);
	close(out_pipe[1]);
	f->in_fd = in_pipe[1];
	f->out_fd = out_pipe[0];
	if (f->pid < 0) {
		snprintf(err, errlen, "fork: %s", strerror(fork_errno));
		return -1;
	}
	return watch_source(f, err, errlen);
}

struct vm_fork *vm_fork_start_from_image(event_loop *loop, const struct fork_settings *settings,
					 const char *name, const struct ram_image *img,
					 uint64_t epoch, const char *disk_path,
					 unsigned clones, unsigned push_mbps,
					 char *err, size_t errlen)
{
	struct vm_fork *f = fork_alloc(loop, settings, name, clones, push_mbps, err, errlen);

	if (!f)
		return NULL;
	f->committed_epoch = epoch;
	/* Disk and memory at the same commit: nothing runs between these. */
	if (disk_path) {
		f->replica_disk = nbd_export_open_unserved(loop, f->id, disk_path);
		if (!f->replica_disk) {
			snprintf(err, errlen, "cannot open the disk replica %s", disk_path);
			goto fail;
		}
		if (freeze_export(f, f->replica_disk, err, errlen) < 0)
			goto fail;
	}
	if (fork_frozen_source(f, img, err, errlen) < 0)
		goto fail;
	f->completed_us = f->resumed_us = monotonic_us();
	f->state = FORK_SERVING;
	log_info("vm %s: fork %s of the committed image of epoch %llu for %u clone(s); "
		 "fork() took %.1f ms", name, f->id, (unsigned long long)epoch, clones,
		 f->fork_call_ms);
	return f;
fail:
	vm_fork_destroy(f);
	return NULL;
}

/* The disk snapshot cannot be kept: end the fork loudly, never the replica. */
static void lose_disk(struct vm_fork *f, const char *why)
{
	nbd_export_destroy(f->disk_export);
	f->disk_export = NULL;
	disk_snapshot_destroy(f->disk);
	f->disk = NULL;
	nbd_export_destroy(f->replica_disk);
	f->replica_disk = NULL;
	fork_failed(f, "its disk snapshot is gone: %s; its clones read a disk that no "
		    "longer exists (stop them)", why);
}

bool vm_fork_preserves_replica_disk(const struct vm_fork *f)
{
	return f && f->replica_disk && f->disk;
}

int vm_fork_before_replica_write(void *fork, uint64_t offset, uint64_t length)
{
	struct vm_fork *f = fork;
	int rc = nbd_export_before_write(f->replica_disk, offset, length);

	if (rc)
		lose_disk(f, rc == -ENOSPC ? "no room to preserve the blocks the backup "
			  "overwrites" : "preserving a block the backup overwrites failed");
	return rc;
}

void vm_fork_disk_taken_over(struct vm_fork *f, struct nbd_export *vm_disk)
{
	if (!f || !f->replica_disk || !f->disk)
		return;
	if (!vm_disk || disk_snapshot_rebind(f->disk, vm_disk) < 0) {
		lose_disk(f, "the taken-over VM's disk export cannot carry it");
		return;
	}
	nbd_export_destroy(f->replica_disk);
	f->replica_disk = NULL;
	log_info("vm %s: fork %s: the taken-over VM's writes now preserve the snapshot",
		 f->name, f->id);
}

int vm_fork_serve(struct vm_fork *f, const char *clone_id, const char *address,
		  char *err, size_t errlen)
{
	char cmd[512];

	if (f->state != FORK_SERVING) {
		snprintf(err, errlen, "fork %s is %s, not serving", f->id, state_names[f->state]);
		return -1;
	}
	if (strpbrk(clone_id, " \n") || strpbrk(address, " \n") || !clone_id[0]) {
		snprintf(err, errlen, "bad clone id or address");
		return -1;
	}
	int n = snprintf(cmd, sizeof(cmd), "serve %s %s\n", clone_id, address);
	if (n <= 0 || (size_t)n >= sizeof(cmd) || write(f->in_fd, cmd, (size_t)n) != n) {
		snprintf(err, errlen, "cannot reach the page source");
		return -1;
	}
	return 0;
}

void vm_fork_destroy(struct vm_fork *f)
{
	if (!f)
		return;
	stop_source(f);
	if (f->cont_timer > 0)
		event_loop_del_timer(f->loop, f->cont_timer);
	nbd_export_destroy(f->disk_export);
	disk_snapshot_destroy(f->disk);
	nbd_export_destroy(f->replica_disk);
	json_decref(f->capture);
	json_decref(f->clone_stats);
	free(f);
}

json_t *vm_fork_status_json(const struct vm_fork *f)
{
	json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:i, s:i, s:i, s:b}", "id", f->id,
			      "from", f->vm ? "parent" : "backup",
			      "state", state_names[f->state], "error", f->error,
			      "clones_expected", (int)f->clones, "push_mbps", (int)f->push_mbps,
			      "pagesrc_pid", (int)f->pid,
			      "pagesrc_running", !f->source_exited);

	if (!f->vm) {
		json_object_set_new(o, "epoch", json_integer((json_int_t)f->committed_epoch));
		json_object_set_new(o, "backup_fork_call_ms", json_real(f->fork_call_ms));
	} else if (f->resumed_us) {
		double freeze_ms = (f->resumed_us - f->completed_us) / 1000.0;

		json_object_set_new(o, "parent_pause_ms", json_real((double)f->downtime_ms + freeze_ms));
		json_object_set_new(o, "qemu_downtime_ms", json_integer(f->downtime_ms));
		json_object_set_new(o, "freeze_and_cont_ms", json_real(freeze_ms));
		json_object_set_new(o, "snapshot_ms",
				    json_real((f->resumed_us - f->started_us) / 1000.0));
	}
	if (f->capture)
		json_object_set(o, "capture", f->capture);
	json_object_set(o, "clones", f->clone_stats);
	if (f->disk_export) {
		struct nbd_export_stats st;
		struct disk_snapshot_stats ds;

		nbd_export_get_stats(f->disk_export, &st);
		disk_snapshot_get_stats(f->disk, &ds);
		json_object_set_new(o, "disk", json_pack(
			"{s:s, s:s, s:s, s:i, s:I, s:I, s:I, s:I}", "export", f->disk_export_name,
			"socket", f->disk_socket, "host", f->settings.lan_addr,
			"port", nbd_export_tcp_port(f->disk_export),
			"bytes_read", (json_int_t)st.bytes_read,
			"block_status", (json_int_t)st.block_status,
			"blocks_preserved", (json_int_t)ds.blocks_preserved,
			"size", (json_int_t)nbd_export_size(f->disk_export)));
	}
	return o;
}
