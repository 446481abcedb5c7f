/*
 * remusdbd: the dom0 daemon of RemusDB-KVM.  Serves each protected VM's
 * disk over NBD and its NIC through a network relay, and answers on a
 * control socket.  Runs in the foreground; whoever starts it backgrounds it.
 *
 * Exit codes: 0 after a clean shutdown (SIGTERM, SIGINT or the shutdown
 * command), 1 when startup or the event loop failed, 2 for a bad command
 * line or config file.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <sys/stat.h>
#include <sys/wait.h>

#include <systemd/sd-daemon.h>

#include "base/config.h"
#include "base/host_memory.h"
#include "base/sched_group.h"
#include "base/unmap_later.h"
#include "control/control.h"
#include "fork/vm_fork.h"
#include "primary/protection.h"
#include "primary/protection_marker.h"
#include "primary/protect_settings.h"
#include "wire/repl_auth.h"
#include "wire/repl_settings.h"
#include "backup/replication_server.h"
#include "base/event_loop.h"
#include "backup/fence.h"
#include "wire/heartbeat.h"
#include "control/http_endpoint.h"
#include "base/log.h"
#include "vm/vm.h"
#include "witness/witness.h"

enum { EXIT_CLEAN = 0, EXIT_FAILURE_RUNTIME = 1, EXIT_USAGE = 2 };

static void on_signal(event_loop *loop, int fd, void *data, int ready)
{
	struct signalfd_siginfo info;

	if (read(fd, &info, sizeof(info)) != sizeof(info))
		return;
	log_info("received %s, shutting down", strsignal((int)info.ssi_signo));
	sd_notifyf(0, "STOPPING=1\nSTATUS=shutting down (%s)", strsignal((int)info.ssi_signo));
	event_loop_stop(loop);
}

static void stop_loop(void *loop)
{
	sd_notify(0, "STOPPING=1\nSTATUS=shutting down (shutdown command)");
	event_loop_stop(loop);
}

/*
 * SIGTERM/SIGINT arrive through a signalfd, so shutdown runs as an
 * ordinary event; SIGPIPE is ignored because a peer closing its socket
 * must be an EPIPE error, not the death of every VM's data path.
 */
static int setup_signals(event_loop *loop)
{
	sigset_t mask;

	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	if (sigprocmask(SIG_BLOCK, &mask, NULL) < 0)
		return -1;
	int fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
	if (fd < 0)
		return -1;
	if (event_loop_watch(loop, fd, EV_READABLE, on_signal, NULL) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/*
 * remusdbd starts QEMU on a takeover and the fencing command; QEMU runs
 * in its own session and outlives us, but while we live we reap it.  A
 * running fence reaps its own child through its pidfd to read its exit
 * status, so its zombie is only looked at (WNOWAIT), never taken.
 */
static long reap_children(event_loop *loop, long long id, void *data)
{
	for (;;) {
		siginfo_t info;

		memset(&info, 0, sizeof(info));
		if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) < 0 ||
		    info.si_pid == 0 || fence_owns_child(info.si_pid) ||
		    waitpid(info.si_pid, NULL, WNOHANG) <= 0)
			break;
	}
	return 1000;
}

/*
 * Forks: sockets under the run dir, preserve files under the state dir,
 * the disk snapshot on the LAN address replication listens on, and the
 * page source: REMUSDBD_PAGESRC, else next to this binary (the build
 * tree), else in ../lib/remusdb/ beside the binary's directory (the
 * installed layout: PREFIX/sbin/remusdbd, PREFIX/lib/remusdb/remusdbd-pagesrc).
 */
static void fork_settings_from_config(struct fork_settings *f, const struct config *cfg)
{
	char self[900];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	const char *override = getenv("REMUSDBD_PAGESRC");

	memset(f, 0, sizeof(*f));
	snprintf(f->run_dir, sizeof(f->run_dir), "%.1000s", cfg->run_dir);
	snprintf(f->state_dir, sizeof(f->state_dir), "%.1000s", cfg->state_dir);
	snprintf(f->lan_addr, sizeof(f->lan_addr), "%s", cfg->listen);
	char *colon = strrchr(f->lan_addr, ':');
	if (colon)
		*colon = 0;
	self[n > 0 ? n : 0] = 0;
	char *slash = strrchr(self, '/');
	if (slash)
		slash[1] = 0;
	if (override && override[0]) {
		snprintf(f->pagesrc, sizeof(f->pagesrc), "%s", override);
		return;
	}
	snprintf(f->pagesrc, sizeof(f->pagesrc), "%sremusdbd-pagesrc", self);
	if (access(f->pagesrc, X_OK) == 0)
		return;
	char installed[sizeof(f->pagesrc)];
	snprintf(installed, sizeof(installed), "%s../lib/remusdb/remusdbd-pagesrc", self);
	if (access(installed, X_OK) == 0)
		snprintf(f->pagesrc, sizeof(f->pagesrc), "%s", installed);
}

/*
 * --memory-limit, or by default the host's memory less 1 GiB for the host
 * itself: admission (backup/replica_memory.h) refuses a replica beyond it.
 */
static uint64_t replica_memory_limit(const struct config *cfg)
{
	uint64_t total;

	if (cfg->memory_limit_mb)
		return cfg->memory_limit_mb << 20;
	total = host_memory_total();
	if (total == 0) {
		log_error("memory: /proc/meminfo gives no MemTotal: replicas are admitted without "
			  "a limit (set --memory-limit)");
		return 0;
	}
	if (total <= (2ULL << 30)) {
		log_warn("memory: the host reports %llu MiB in all: replicas may take half of it "
			 "(set --memory-limit)", (unsigned long long)(total >> 20));
		return total / 2;
	}
	return total - (1ULL << 30);
}

static void settings_from_config(struct repl_settings *s, const struct config *cfg)
{
	memset(s, 0, sizeof(*s));
	s->host = cfg->host;
	s->run_dir = cfg->run_dir;
	s->state_dir = cfg->state_dir;
	s->fence_command = cfg->fence_command;
	s->unsafe_no_flow_reset = cfg->unsafe_no_flow_reset;
	s->restore_lazy = !strcmp(cfg->restore, "lazy");
	s->restore_shared = !strcmp(cfg->restore, "shared");
	s->memory_limit = replica_memory_limit(cfg);
	s->replica_retire_s = cfg->retire_replicas_s;
	s->reprotect = !strcmp(cfg->reprotect, "on");
	s->reprotect_first_ms = cfg->reprotect_first_ms;
	s->reprotect_max_ms = cfg->reprotect_max_ms;
	s->heartbeat_ms = cfg->heartbeat_ms;
	s->peer_timeout_ms = cfg->peer_timeout_ms;
	s->max_inflight = cfg->max_inflight;
	s->pause_boost = cfg->pause_boost;
	s->read_index_bytes = (size_t)cfg->read_index_mb * 1024 * 1024;
	s->compress_cache_bytes = (uint64_t)cfg->compress_cache_mb * 1024 * 1024;
	s->compress_cache_percent = cfg->compress_cache_percent ? cfg->compress_cache_percent : 10;
	snprintf(s->witness.endpoints, sizeof(s->witness.endpoints), "%s", cfg->etcd);
	s->witness.timeout_ms = (long)cfg->etcd_timeout_ms;
	if (!cfg->psk_file[0]) {
		snprintf(s->psk_error, sizeof(s->psk_error), "start remusdbd with "
			 "--psk-file FILE (the same key on both hosts)");
		return;
	}
	if (repl_psk_load(cfg->psk_file, s->psk, &s->psk_len, s->psk_error,
			  sizeof(s->psk_error)) < 0) {
		s->psk_len = 0;
		log_error("pre-shared key: %s", s->psk_error);
	}
}

/* Says once at start whether failure detection got its real-time thread. */
static void log_heartbeat_scheduling(struct heartbeat_service *hb)
{
	json_t *st = heartbeat_service_status_json(hb);
	const char *how = json_string_value(json_object_get(st, "scheduling"));

	if (json_is_true(json_object_get(st, "realtime")))
		log_info("heartbeat thread: SCHED_FIFO, every %lld ms, UDP port %lld",
			 (long long)json_integer_value(json_object_get(st, "interval_ms")),
			 (long long)json_integer_value(json_object_get(st, "udp_port")));
	else
		log_warn("heartbeat thread runs WITHOUT real-time priority (%s): a busy host "
			 "can delay heartbeats and cause false failovers; raise "
			 "--peer-timeout-ms or run remusdbd with CAP_SYS_NICE",
			 how ? how : "status unavailable");
	json_decref(st);
}

/*
 * The daemon's nice value weighs against the guests only once its
 * session's group has it (base/sched_group.h); said once at start.
 */
static void log_session_group(void)
{
	char said[256];
	int rc = sched_group_follow_nice(said, sizeof(said));

	if (rc < 0)
		log_warn("scheduling: %s; under autogroup the daemon's nice value then orders "
			 "only its own threads, not it against the guests", said);
	else
		log_info("scheduling: %s", said);
}

struct recovery {
	event_loop *loop;
	const struct repl_settings *settings;
	struct vm_registry *vms;
};

/*
 * The VM's kept protect settings (protect_settings.h): 1 read into req, 0
 * none.  A file that cannot be read is reported and removed: a
 * protection half read is never started.
 */
static int restored_settings(const struct recovery *rc, const char *name,
			     struct protect_request *req)
{
	char err[512];
	int found = protect_settings_load(rc->settings->state_dir, name, req, err, sizeof(err));

	if (found < 0) {
		log_error("vm %s: kept protect settings unusable, removed (protect it again by "
			  "hand): %s", name, err);
		protect_settings_delete(rc->settings->state_dir, name);
		return 0;
	}
	return found;
}

static void recover_protection(const struct protection_marker *m, void *data)
{
	struct recovery *rc = data;
	struct vm *vm = vm_find(rc->vms, m->vm);
	struct protect_request req;

	if (!vm) {
		log_warn("vm %s: protection marker without a VM; removing it", m->vm);
		protection_marker_delete(rc->settings->state_dir, m->vm);
		protect_settings_delete(rc->settings->state_dir, m->vm);
		return;
	}
	int found = restored_settings(rc, m->vm, &req);
	struct protection *p = protection_recover(rc->loop, rc->settings, vm, m,
						  found ? &req : NULL);
	json_decref(req.qemu_argv);
	if (p)
		protection_attach(vm, p);
}

/* Kept settings without a marker: the VM ran unprotected, in a re-protection's gap. */
static void restore_protection(const char *name, void *data)
{
	struct recovery *rc = data;
	struct vm *vm = vm_find(rc->vms, name);
	struct protect_request req;

	if (!vm) {
		log_warn("vm %s: kept protect settings without a VM; removing them", name);
		protect_settings_delete(rc->settings->state_dir, name);
		return;
	}
	if (protection_of(vm) || !restored_settings(rc, name, &req))
		return; /* recovered from its marker, or nothing usable */
	struct protection *p = protection_restore(rc->loop, rc->settings, vm, &req);
	json_decref(req.qemu_argv);
	if (p)
		protection_attach(vm, p);
}

static int run(const struct config *cfg)
{
	static struct repl_settings repl;
	struct replication_server *replication = NULL;
	char err[512];
	int status = EXIT_FAILURE_RUNTIME;
	struct vm_registry *vms = NULL;
	struct control_server *control = NULL;
	struct http_endpoint *http = NULL;
	int signal_fd = -1;
	event_loop *loop = event_loop_create();

	if (!loop) {
		log_error("cannot create the event loop: %s", strerror(errno));
		return EXIT_FAILURE_RUNTIME;
	}
	signal_fd = setup_signals(loop);
	if (signal_fd < 0) {
		log_error("cannot set up signal handling: %s", strerror(errno));
		goto out;
	}
	vms = vm_registry_create(loop, cfg->state_dir, err, sizeof(err));
	if (!vms) {
		log_error("%s", err);
		goto out;
	}
	int loaded = vm_registry_load(vms);
	settings_from_config(&repl, cfg);
	if (repl.memory_limit)
		log_info("memory: replicas here may take %.2f GiB together (%s)",
			 (double)repl.memory_limit / (1ULL << 30),
			 cfg->memory_limit_mb ? "--memory-limit" : "the host's memory less 1 GiB");
	struct heartbeat_service_config hb = {
		.bind_addr = cfg->listen[0] ? cfg->listen : NULL,
		.interval_ms = cfg->heartbeat_ms,
		.rt_priority = (int)cfg->heartbeat_rt_priority,
		.loop_stall_ms = HEARTBEAT_DEFAULT_LOOP_STALL_MS,
	};
	repl.heartbeats = heartbeat_service_create(loop, &hb, err, sizeof(err));
	if (!repl.heartbeats) {
		log_error("%s", err);
		goto out;
	}
	log_heartbeat_scheduling(repl.heartbeats);
	log_session_group();
	struct recovery recovery = { .loop = loop, .settings = &repl, .vms = vms };
	protection_marker_load_all(cfg->state_dir, recover_protection, &recovery);
	protect_settings_each(cfg->state_dir, restore_protection, &recovery);
	if (cfg->listen[0]) {
		replication = replication_server_create(loop, &repl, cfg->listen, vms,
							err, sizeof(err));
		if (!replication) {
			log_error("%s", err);
			goto out;
		}
		/* Said now, not at the first takeover, which would fail on it. */
		if (!cfg->etcd[0])
			log_warn("no --etcd: this backup accepts replicas but cannot take "
				 "any over (a takeover needs etcd's ownership)");
	}
	if (event_loop_add_timer(loop, 1000, reap_children, NULL) < 0) {
		log_error("cannot start the reaper of child processes: out of memory");
		goto out;
	}
	static struct fork_settings forks;
	fork_settings_from_config(&forks, cfg);
	struct control_config control_cfg = {
		.forks = &forks,
		.socket_path = cfg->control_path,
		.host = cfg->host,
		.vms = vms,
		.repl = &repl,
		.replication = replication,
		.on_shutdown = stop_loop,
		.shutdown_data = loop,
	};
	control = control_create(loop, &control_cfg);
	if (!control)
		goto out;
	if (cfg->http[0]) {
		http = http_endpoint_create(loop, cfg->http, vms, replication, err, sizeof(err));
		if (!http) {
			log_error("%s", err);
			goto out;
		}
	}
	log_info("remusdbd %s running on host %s (pid %d), %d VM(s), state in %s",
		 REMUSDBD_VERSION, cfg->host, (int)getpid(), loaded, cfg->state_dir);
	/*
	 * systemd's Type=notify: ready once the control socket accepts
	 * (and, with --listen and --http, replication and the metrics and
	 * health endpoint do).  Without NOTIFY_SOCKET this does nothing.
	 */
	sd_notifyf(0, "READY=1\nMAINPID=%d\nSTATUS=host %s: %d VM(s), control %s%s%s",
		   (int)getpid(), cfg->host, loaded, cfg->control_path,
		   cfg->listen[0] ? ", replication on " : "", cfg->listen);
	if (event_loop_run(loop) < 0)
		log_error("event loop failed: %s", strerror(errno));
	else
		status = EXIT_CLEAN;
out:
	http_endpoint_destroy(http);
	control_destroy(control);
	replication_server_destroy(replication);
	vm_registry_destroy(vms);
	heartbeat_service_destroy(repl.heartbeats);
	if (signal_fd >= 0) {
		event_loop_unwatch(loop, signal_fd);
		close(signal_fd);
	}
	event_loop_destroy(loop);
	unmap_later_drain();
	log_info("remusdbd stopped");
	return status;
}

int main(int argc, char **argv)
{
	struct config cfg;
	char err[512];

	if (config_load(&cfg, argc, argv, err, sizeof(err)) < 0) {
		fprintf(stderr, "remusdbd: %s\nTry 'remusdbd --help'.\n", err);
		return EXIT_USAGE;
	}
	if (cfg.show_help) {
		config_print_usage(argv[0]);
		return EXIT_CLEAN;
	}
	if (cfg.etcd[0] && witness_check_endpoints(cfg.etcd, err, sizeof(err)) < 0) {
		fprintf(stderr, "remusdbd: --etcd: %s\n", err);
		return EXIT_USAGE;
	}
	if (log_open(cfg.log_path[0] ? cfg.log_path : NULL, cfg.log_level) < 0) {
		fprintf(stderr, "remusdbd: cannot open log file %s: %s\n",
			cfg.log_path, strerror(errno));
		return EXIT_FAILURE_RUNTIME;
	}
	int status = run(&cfg);
	log_close();
	return status;
}
