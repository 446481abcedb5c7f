/*
 * The accept policy of the daemon's listeners: out of descriptors, a
 * listener pauses instead of spinning and accepts again once descriptors
 * free up (shown in a forked child whose fd table is full, so the test
 * runner's own table is never touched); and the replication listener
 * closes connections beyond the cap on unauthenticated sessions, and
 * drops the idle ones after the handshake timeout.
 */
#include <CUnit/CUnit.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/accept_policy.h"
#include "base/event_loop.h"
#include "wire/heartbeat.h"
#include "backup/replication_server.h"
#include "suites.h"
#include "test_ports.h"
#include "base/unix_socket.h"
#include "vm/vm.h"

/* ---- out of descriptors ------------------------------------------------ */

struct listener {
	struct accept_policy policy;
	int handler_calls;
	int accepted;
};

static void on_readable(event_loop *loop, int fd, void *data, int ready)
{
	struct listener *l = data;
	int cfd;

	l->handler_calls++;
	while ((cfd = accept_policy_accept(&l->policy, NULL, NULL)) >= 0) {
		l->accepted++;
		close(cfd);
	}
}

/* What the child saw, sent back through a pipe. */
struct exhaustion_report {
	int setup_ok;
	int handler_calls;     /* during the exhausted window */
	int loop_iterations;   /* during the exhausted window */
	long cpu_ms;           /* CPU the child used during that window */
	int paused;            /* the policy had paused the listener */
	int accepted_while_full;
	int accepted_after;    /* once descriptors were freed */
	long accept_after_ms;  /* from freeing to the accept */
};

#define EXHAUSTED_WINDOW_MS 600

static long cpu_ms(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000L +
	       (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1000L;
}

static void exhaustion_child(int report_fd, const char *path)
{
	struct exhaustion_report rep = { 0 };
	struct listener l = { 0 };
	char err[256];
	int fillers[256], n_fillers = 0;
	event_loop *loop = event_loop_create();
	int listen_fd = unix_listen(path, err, sizeof(err));
	int client = unix_connect(path); /* waits in the backlog */

	if (!loop || listen_fd < 0 || client < 0 ||
	    accept_policy_start(&l.policy, loop, listen_fd, "test listener", on_readable,
				&l) < 0)
		goto report;
	/* A small table, then fill it: the next accept gets EMFILE. */
	int high = 0;
	for (int fd = 0; fd < 64; fd++)
		if (fcntl(fd, F_GETFD) >= 0)
			high = fd;
	/* Only the soft limit: valgrind refuses a change of the hard one. */
	struct rlimit lim;
	if (getrlimit(RLIMIT_NOFILE, &lim) < 0)
		goto report;
	lim.rlim_cur = (rlim_t)high + 16;
	if (setrlimit(RLIMIT_NOFILE, &lim) < 0)
		goto report;
	int fd;
	while (n_fillers < 256 && (fd = dup(0)) >= 0)
		fillers[n_fillers++] = fd;
	if (errno != EMFILE || n_fillers < 4)
		goto report;
	rep.setup_ok = 1;
	long cpu0 = cpu_ms();
	int64_t end = monotonic_ms() + EXHAUSTED_WINDOW_MS;
	while (monotonic_ms() < end) {
		event_loop_run_once(loop, 50);
		rep.loop_iterations++;
	}
	rep.cpu_ms = cpu_ms() - cpu0;
	rep.handler_calls = l.handler_calls;
	rep.paused = accept_policy_paused(&l.policy);
	rep.accepted_while_full = l.accepted;
	for (int i = 0; i < 4; i++)
		close(fillers[--n_fillers]);
	int64_t freed = monotonic_ms();
	while (!l.accepted && monotonic_ms() - freed < 3000)
		event_loop_run_once(loop, 50);
	rep.accepted_after = l.accepted;
	rep.accept_after_ms = (long)(monotonic_ms() - freed);
report:
	if (write(report_fd, &rep, sizeof(rep)) != (ssize_t)sizeof(rep))
		_exit(2);
	_exit(0);
}

/*
 * valgrind only emulates RLIMIT_NOFILE: the kernel still accepts the
 * connection, and valgrind closes it and reports EMFILE, so the
 * connection is gone and can never be accepted "again".
 */
static bool under_valgrind(void)
{
	const char *preload = getenv("LD_PRELOAD");

	return preload && strstr(preload, "vgpreload");
}

static void test_out_of_descriptors_pauses_then_accepts_again(void)
{
	char path[] = "/tmp/remusdb-accept-XXXXXX";
	char sock[64];
	int report[2];
	struct exhaustion_report rep = { 0 };

	if (under_valgrind()) {
		fprintf(stderr, "skipped under valgrind (it fakes EMFILE) ");
		return;
	}

	CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(path));
	snprintf(sock, sizeof(sock), "%s/listen.sock", path);
	CU_ASSERT_EQUAL_FATAL(pipe(report), 0);
	pid_t pid = fork();
	CU_ASSERT_TRUE_FATAL(pid >= 0);
	if (pid == 0) {
		close(report[0]);
		exhaustion_child(report[1], sock);
	}
	close(report[1]);
	ssize_t got = read(report[0], &rep, sizeof(rep));
	close(report[0]);
	int status = -1;
	waitpid(pid, &status, 0);
	unlink(sock);
	rmdir(path);
	CU_ASSERT_EQUAL(got, (ssize_t)sizeof(rep));
	CU_ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CU_ASSERT_TRUE_FATAL(rep.setup_ok);
	/*
	 * 600 ms of pauses of 100, 200, 400 ms: three tries.  A
	 * spinning listener is called tens of thousands of times and burns
	 * the whole window; the loop here mostly sleeps.
	 */
	CU_ASSERT_TRUE(rep.handler_calls >= 1 && rep.handler_calls <= 5);
	CU_ASSERT_TRUE(rep.loop_iterations < 100);
	CU_ASSERT_TRUE(rep.cpu_ms < EXHAUSTED_WINDOW_MS / 4);
	CU_ASSERT_TRUE(rep.paused);
	CU_ASSERT_EQUAL(rep.accepted_while_full, 0);
	/* Freed descriptors are used at the next re-arm, at most 1 s away. */
	CU_ASSERT_EQUAL(rep.accepted_after, 1);
	CU_ASSERT_TRUE(rep.accept_after_ms <= 1500);
	if (rep.handler_calls > 5 || rep.cpu_ms >= EXHAUSTED_WINDOW_MS / 4)
		fprintf(stderr, "\n    %d calls, %d iterations, %ld ms CPU\n",
			rep.handler_calls, rep.loop_iterations, rep.cpu_ms);
}

/* ---- unauthenticated replication sessions ------------------------------ */

static int tcp_connect(uint16_t port)
{
	struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons(port) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	/* Blocking: a loopback connect completes into the backlog at once. */
	if (fd >= 0 && connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

enum peer_view { PEER_OPEN_SILENT, PEER_GREETED, PEER_CLOSED };

/* Drains what the server sent: closed, greeted (bytes, still open), or silent. */
static enum peer_view look(int fd, bool *greeted)
{
	char buf[4096];

	for (;;) {
		ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
		if (n > 0) {
			*greeted = true;
			continue;
		}
		if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
			return PEER_CLOSED;
		return *greeted ? PEER_GREETED : PEER_OPEN_SILENT;
	}
}

static void pump(event_loop *loop, int ms)
{
	int64_t end = monotonic_ms() + ms;

	while (monotonic_ms() < end)
		event_loop_run_once(loop, 10);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	return remove(path);
}

static void test_unauthenticated_sessions_are_capped(void)
{
	enum { N = REPL_MAX_UNAUTHENTICATED_SESSIONS };
	char dir[] = "/tmp/remusdb-accept-cap-XXXXXX", err[256], addr[32];
	struct repl_settings settings;
	int fds[N + 1];
	bool greeted[N + 1];
	enum peer_view view[N + 1];

	CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
	memset(&settings, 0, sizeof(settings));
	settings.host = "backup";
	settings.run_dir = dir;
	settings.state_dir = dir;
	settings.fence_command = "";
	memset(settings.psk, 7, 32);
	settings.psk_len = 32;
	settings.heartbeat_ms = 100;
	settings.peer_timeout_ms = 60000;
	settings.max_inflight = 4;
	settings.handshake_timeout_ms = 2000; /* the idle ones go sooner than the daemon's 5 s */
	event_loop *loop = event_loop_create();
	struct vm_registry *vms = loop ? vm_registry_create(loop, dir, err, sizeof(err)) : NULL;
	uint16_t port = test_free_port();
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
	struct heartbeat_service_config hb = { .bind_addr = addr, .interval_ms = 100 };
	settings.heartbeats = loop ? heartbeat_service_create(loop, &hb, err, sizeof(err)) : NULL;
	struct replication_server *server = !settings.heartbeats ? NULL :
		vms ? replication_server_create(loop, &settings, addr, vms, err, sizeof(err)) : NULL;
	CU_ASSERT_PTR_NOT_NULL(server);
	if (!server)
		goto out;

	/* One at a time, so that the server sees them in order. */
	for (int i = 0; i <= N; i++) {
		fds[i] = tcp_connect(port);
		greeted[i] = false;
		CU_ASSERT_TRUE(fds[i] >= 0);
		pump(loop, 30);
	}
	pump(loop, 200);
	for (int i = 0; i <= N; i++)
		view[i] = fds[i] >= 0 ? look(fds[i], &greeted[i]) : PEER_CLOSED;
	for (int i = 0; i < N; i++)
		CU_ASSERT_EQUAL(view[i], PEER_GREETED);
	/* The one over the cap is closed at once, with no greeting. */
	CU_ASSERT_EQUAL(view[N], PEER_CLOSED);
	CU_ASSERT_FALSE(greeted[N]);

	/* The handshake timeout (2 s here) still drops the idle ones. */
	bool all_closed = false;
	int64_t end = monotonic_ms() + 8000;
	while (!all_closed && monotonic_ms() < end) {
		pump(loop, 100);
		all_closed = true;
		for (int i = 0; i < N; i++)
			all_closed &= fds[i] < 0 || look(fds[i], &greeted[i]) == PEER_CLOSED;
	}
	CU_ASSERT_TRUE(all_closed);

	/* With them gone, a new connection is greeted again. */
	int again = tcp_connect(port);
	bool again_greeted = false;
	pump(loop, 200);
	CU_ASSERT_TRUE(again >= 0 && look(again, &again_greeted) == PEER_GREETED);
	if (again >= 0)
		close(again);
	for (int i = 0; i <= N; i++)
		if (fds[i] >= 0)
			close(fds[i]);
out:
	replication_server_destroy(server);
	heartbeat_service_destroy(settings.heartbeats);
	vm_registry_destroy(vms);
	event_loop_destroy(loop);
	nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int register_accept_policy_tests(void)
{
	CU_pSuite suite = CU_add_suite("accept_policy", NULL, NULL);

	if (!suite ||
	    !CU_add_test(suite, "out of descriptors: pauses, then accepts again",
			 test_out_of_descriptors_pauses_then_accepts_again) ||
	    !CU_add_test(suite, "unauthenticated replication sessions are capped",
			 test_unauthenticated_sessions_are_capped))
		return -1;
	return 0;
}
