/*
 * remusdbd-pagesrc: a fork's page source, a child of remusdbd (fork.c).
 *
 * Why a separate process: the snapshot of a 1 GiB guest is parsed and
 * served for seconds to minutes, and a clone whose page source dies must
 * fail on its own while the parent VM runs on.  Kept out of remusdbd, a
 * crash here (or a kill in the page-source-death test) touches neither
 * the parent's disk export nor its NIC relay, and the daemon's event
 * loop never parses a gigabyte.  The memory is freed by exiting, which
 * is when the last clone has all its pages.
 *
 * Protocol with remusdbd: arguments say where QEMU migrates to and how
 * many clones to expect; stdin carries `serve ID unix:PATH` or
 * `serve ID tcp:ADDR:PORT` lines; stdout carries one JSON object per
 * line (event "captured", "progress", "clone", "failed", "done").
 * Exit status 0 when every clone got every page.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <sys/un.h>
#include <unistd.h>

#include "event_loop.h"
#include "inet_socket.h"
#include "log.h"
#include "postcopy_source.h"
#include "snapshot_capture.h"
#include "unix_socket.h"

#define MAX_CLONES 16
#define PROGRESS_MS 250
#define CAPTURE_READ (1u << 20)

struct clone_slot {
	char id[64];
	struct postcopy_session *session;
	bool ended, ok;
	char reason[256];
};

static struct {
	event_loop *loop;
	const char *capture_path;
	int listen_fd, mig_fd;
	struct snapshot_capture *capture;
	struct postcopy_fork *fork;
	int64_t capture_started_us, captured_us;
	unsigned expected;
	uint64_t push_rate;
	struct clone_slot clones[MAX_CLONES];
	unsigned nclones, ended, failed;
	char line[1024];
	size_t line_len;
	bool stdin_open;
	int exit_code;
} P = { .listen_fd = -1, .mig_fd = -1, .stdin_open = true };

static void emit(json_t *obj)
{
	char *text = json_dumps(obj, JSON_COMPACT);

	if (text) {
		printf("%s\n", text);
		fflush(stdout);
		free(text);
	}
	json_decref(obj);
}

static void finish(int code, const char *why)
{
	if (why)
		emit(json_pack("{s:s, s:s}", "event", code ? "failed" : "done", "error", why));
	else
		emit(json_pack("{s:s}", "event", "done"));
	P.exit_code = code;
	event_loop_stop(P.loop);
}

static json_t *clone_json(const struct clone_slot *c)
{
	struct postcopy_session_stats st;

	postcopy_session_get_stats(c->session, &st);
	return json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:s}",
			 "id", c->id, "state", postcopy_session_state_name(st.state),
			 "requests", (json_int_t)st.requests,
			 "pages_requested", (json_int_t)st.pages_requested,
			 "pages_pushed", (json_int_t)st.pages_pushed,
			 "pages_total", (json_int_t)st.pages_total,
			 "bytes_sent", (json_int_t)st.bytes_sent,
			 "latency_p50_us", (json_int_t)st.latency_p50_us,
			 "latency_p99_us", (json_int_t)st.latency_p99_us,
			 "latency_samples", (json_int_t)st.latency_samples,
			 "elapsed_ms", st.running_us ? ((st.done_us ? st.done_us : monotonic_us()) -
						       st.running_us) / 1000.0 : 0.0,
			 "error", st.error);
}

static void on_clone_done(void *opaque, struct postcopy_session *s, bool ok,
			  const char *reason)
{
	struct clone_slot *c = opaque;
	json_t *o = clone_json(c);

	c->ended = true;
	c->ok = ok;
	snprintf(c->reason, sizeof(c->reason), "%s", reason);
	json_object_set_new(o, "event", json_string("clone"));
	emit(o);
	P.ended++;
	P.failed += !ok;
	if (P.ended == P.expected)
		finish(P.failed ? 1 : 0, P.failed ? "a clone's page transfer failed" : NULL);
}

static int connect_addr(const char *addr, char *err, size_t errlen)
{
	int fd;

	if (!strncmp(addr, "unix:", 5)) {
		struct sockaddr_un sun = { .sun_family = AF_UNIX };

		if (strlen(addr + 5) >= sizeof(sun.sun_path)) {
			snprintf(err, errlen, "socket path too long");
			return -1;
		}
		strcpy(sun.sun_path, addr + 5);
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (fd >= 0 && connect(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0 &&
		    errno != EINPROGRESS && errno != EAGAIN) {
			snprintf(err, errlen, "connect %s: %s", addr, strerror(errno));
			close(fd);
			return -1;
		}
		return fd;
	}
	if (!strncmp(addr, "tcp:", 4)) {
		struct sockaddr_in sin;

		if (inet_parse_address(addr + 4, false, &sin, err, errlen) < 0)
			return -1;
		fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (fd >= 0 && connect(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0 &&
		    errno != EINPROGRESS) {
			snprintf(err, errlen, "connect %s: %s", addr, strerror(errno));
			close(fd);
			return -1;
		}
		return fd;
	}
	snprintf(err, errlen, "bad address %s (unix:PATH or tcp:A.B.C.D:PORT)", addr);
	return -1;
}

static void serve(const char *id, const char *addr)
{
	char err[256] = "";
	struct clone_slot *c;
	int fd;

	if (!P.fork) {
		emit(json_pack("{s:s, s:s, s:s}", "event", "error", "id", id, "error",
			       "no snapshot yet"));
		return;
	}
	if (P.nclones == MAX_CLONES || P.nclones == P.expected) {
		emit(json_pack("{s:s, s:s, s:s}", "event", "error", "id", id, "error",
			       "more clones than announced"));
		return;
	}
	c = &P.clones[P.nclones];
	snprintf(c->id, sizeof(c->id), "%s", id);
	fd = connect_addr(addr, err, sizeof(err));
	if (fd >= 0)
		c->session = postcopy_session_start(P.loop, P.fork, fd, on_clone_done, c,
						    err, sizeof(err));
	if (!c->session) {
		if (fd >= 0)
			close(fd);
		emit(json_pack("{s:s, s:s, s:s}", "event", "error", "id", id, "error", err));
		return;
	}
	P.nclones++;
}

static void on_stdin(event_loop *loop, int fd, void *data, int ready)
{
	ssize_t n = read(fd, P.line + P.line_len, sizeof(P.line) - 1 - P.line_len);

	if (n <= 0) {
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			return;
		/* remusdbd went away: serve who we serve, accept no more. */
		event_loop_unwatch(loop, fd);
		P.stdin_open = false;
		P.expected = P.nclones;
		if (P.fork && P.ended == P.expected)
			finish(P.failed ? 1 : 0, P.failed ? "a clone's page transfer failed" : NULL);
		return;
	}
	P.line_len += (size_t)n;
	char *nl;
	while ((nl = memchr(P.line, '\n', P.line_len))) {
		char id[64], addr[200];

		*nl = 0;
		if (sscanf(P.line, "serve %63s %199s", id, addr) == 2)
			serve(id, addr);
		else
			emit(json_pack("{s:s, s:s}", "event", "error", "error", "unknown command"));
		size_t used = (size_t)(nl - P.line) + 1;
		memmove(P.line, nl + 1, P.line_len - used);
		P.line_len -= used;
	}
	if (P.line_len == sizeof(P.line) - 1)
		P.line_len = 0; /* an over-long line: drop it */
}

static void captured(void)
{
	struct snapshot_capture_stats st;
	size_t ndirty;
	const struct page_ref *dirty = snapshot_capture_redirtied(P.capture, &ndirty);
	struct ram_image *img = snapshot_capture_image(P.capture);

	P.captured_us = monotonic_us();
	snapshot_capture_get_stats(P.capture, &st);
	P.fork = postcopy_fork_create(img, dirty, ndirty);
	if (!P.fork) {
		finish(1, "out of memory");
		return;
	}
	postcopy_fork_set_push_rate(P.fork, P.push_rate);
	emit(json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f}", "event", "captured",
		       "stream_bytes", (json_int_t)st.stream_bytes,
		       "pages", (json_int_t)st.pages, "zero_pages", (json_int_t)st.zero_pages,
		       "redirtied", (json_int_t)st.redirtied,
		       "device_bytes", (json_int_t)st.device_bytes,
		       "pages_total", (json_int_t)ram_image_pages_total(img),
		       "pages_written", (json_int_t)ram_image_pages_written(img),
		       "capture_ms", (P.captured_us - P.capture_started_us) / 1000.0));
}

static void on_migration(event_loop *loop, int fd, void *data, int ready)
{
	static uint8_t buf[CAPTURE_READ];
	ssize_t n = read(fd, buf, sizeof(buf));
	const char *err = NULL;

	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (n < 0) {
		finish(1, strerror(errno));
		return;
	}
	if (n == 0) {
		event_loop_unwatch(loop, fd);
		close(fd);
		P.mig_fd = -1;
		if (snapshot_capture_finish(P.capture, &err) < 0)
			finish(1, err);
		else
			captured();
		return;
	}
	if (snapshot_capture_feed(P.capture, buf, (size_t)n, &err) < 0)
		finish(1, err);
}

static void on_listen(event_loop *loop, int fd, void *data, int ready)
{
	int c = unix_accept(fd);

	if (c < 0)
		return;
	/* One migration only: stop listening, the path goes away. */
	event_loop_unwatch(loop, fd);
	close(fd);
	P.listen_fd = -1;
	unlink(P.capture_path);
	P.mig_fd = c;
	P.capture_started_us = monotonic_us();
	event_loop_watch(loop, c, EV_READABLE, on_migration, NULL);
}

static long on_progress(event_loop *loop, long long id, void *data)
{
	json_t *arr = json_array();

	for (unsigned i = 0; i < P.nclones; i++)
		json_array_append_new(arr, clone_json(&P.clones[i]));
	emit(json_pack("{s:s, s:o}", "event", "progress", "clones", arr));
	return PROGRESS_MS;
}

static int usage(void)
{
	fprintf(stderr, "usage: remusdbd-pagesrc --capture-socket PATH --clones N "
		"[--push-mbps N] [--log FILE]\n");
	return 2;
}

int main(int argc, char **argv)
{
	const char *log_path = NULL;
	char err[256];

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--capture-socket") && i + 1 < argc)
			P.capture_path = argv[++i];
		else if (!strcmp(argv[i], "--clones") && i + 1 < argc)
			P.expected = (unsigned)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--push-mbps") && i + 1 < argc)
			P.push_rate = strtoull(argv[++i], NULL, 10) * 1000000 / 8;
		else if (!strcmp(argv[i], "--log") && i + 1 < argc)
			log_path = argv[++i];
		else
			return usage();
	}
	if (!P.capture_path || P.expected == 0 || P.expected > MAX_CLONES)
		return usage();
	signal(SIGPIPE, SIG_IGN);
	if (log_open(log_path, LOG_INFO) < 0)
		return 1;
	P.loop = event_loop_create();
	P.capture = snapshot_capture_new();
	if (!P.loop || !P.capture)
		return 1;
	P.listen_fd = unix_listen(P.capture_path, err, sizeof(err));
	if (P.listen_fd < 0) {
		fprintf(stderr, "remusdbd-pagesrc: %s\n", err);
		return 1;
	}
	fcntl(STDIN_FILENO, F_SETFL, fcntl(STDIN_FILENO, F_GETFL) | O_NONBLOCK);
	event_loop_watch(P.loop, P.listen_fd, EV_READABLE, on_listen, NULL);
	event_loop_watch(P.loop, STDIN_FILENO, EV_READABLE, on_stdin, NULL);
	event_loop_add_timer(P.loop, PROGRESS_MS, on_progress, NULL);
	emit(json_pack("{s:s, s:i}", "event", "listening", "pid", (int)getpid()));
	event_loop_run(P.loop);
	for (unsigned i = 0; i < P.nclones; i++)
		postcopy_session_destroy(P.clones[i].session);
	postcopy_fork_destroy(P.fork);
	snapshot_capture_free(P.capture);
	if (P.listen_fd >= 0) {
		close(P.listen_fd);
		unlink(P.capture_path);
	}
	if (P.mig_fd >= 0)
		close(P.mig_fd);
	event_loop_destroy(P.loop);
	return P.exit_code;
}
