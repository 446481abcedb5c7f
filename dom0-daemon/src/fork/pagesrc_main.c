/*
 * remusdbd-pagesrc: the page source of an unprotected parent's fork, an
 * exec'd child of remusdbd (vm_fork.c).
 *
 * Why a separate process: the snapshot of a 1 GiB guest is parsed and
 * served for seconds to minutes, and a clone whose page source dies must
 * fail on its own while the parent VM runs on.  Kept out of remusdbd, a
 * crash here (or a kill in the page-source-death test) touches neither
 * the parent's disk export nor its NIC relay, and the daemon's event
 * loop never parses a gigabyte.  The memory is freed by exiting, which
 * is when the last clone has all its pages.
 *
 * This file is the capture: the parent migrates (plain precopy) into
 * --capture-socket and snapshot_capture.h turns the stream into an
 * image.  Serving it is pagesrc.c, which a protected VM's fork from its
 * backup shares.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/event_loop.h"
#include "base/log.h"
#include "fork/pagesrc.h"
#include "fork/snapshot_capture.h"
#include "base/unix_socket.h"

#define CAPTURE_READ (1u << 20)

static struct {
	const char *capture_path;
	int listen_fd, mig_fd;
	struct snapshot_capture *capture;
	int64_t capture_started_us;
} C = { .listen_fd = -1, .mig_fd = -1 };

static void captured(void)
{
	struct snapshot_capture_stats st;
	size_t ndirty;
	const struct page_ref *dirty = snapshot_capture_redirtied(C.capture, &ndirty);

	snapshot_capture_get_stats(C.capture, &st);
	pagesrc_snapshot_ready(snapshot_capture_image(C.capture), dirty, ndirty, json_pack(
		"{s:I, s:I, s:I, s:I, s:I, s:f}",
		"stream_bytes", (json_int_t)st.stream_bytes,
		"pages", (json_int_t)st.pages, "zero_pages", (json_int_t)st.zero_pages,
		"redirtied", (json_int_t)st.redirtied,
		"device_bytes", (json_int_t)st.device_bytes,
		"capture_ms", (monotonic_us() - C.capture_started_us) / 1000.0));
}

static void on_migration(event_loop *loop, int fd, void *data, int ready)
{
	static uint8_t buf[CAPTURE_READ];
	ssize_t n = read(fd, buf, sizeof(buf));
	const char *err = NULL;

	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (n < 0) {
		pagesrc_fail(strerror(errno));
		return;
	}
	if (n == 0) {
		event_loop_unwatch(loop, fd);
		close(fd);
		C.mig_fd = -1;
		if (snapshot_capture_finish(C.capture, &err) < 0)
			pagesrc_fail(err);
		else
			captured();
		return;
	}
	if (snapshot_capture_feed(C.capture, buf, (size_t)n, &err) < 0)
		pagesrc_fail(err);
}

static void on_listen(event_loop *loop, int fd, void *data, int ready)
{
	int c = unix_accept(fd);

	if (c < 0)
		return;
	/* One migration only: stop listening, the path goes away. */
	event_loop_unwatch(loop, fd);
	close(fd);
	C.listen_fd = -1;
	unlink(C.capture_path);
	C.mig_fd = c;
	C.capture_started_us = monotonic_us();
	event_loop_watch(loop, c, EV_READABLE, on_migration, NULL);
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
	unsigned expected = 0;
	uint64_t push_rate = 0;
	char err[256];

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--capture-socket") && i + 1 < argc)
			C.capture_path = argv[++i];
		else if (!strcmp(argv[i], "--clones") && i + 1 < argc)
			expected = (unsigned)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--push-mbps") && i + 1 < argc)
			push_rate = strtoull(argv[++i], NULL, 10) * 1000000 / 8;
		else if (!strcmp(argv[i], "--log") && i + 1 < argc)
			log_path = argv[++i];
		else
			return usage();
	}
	if (!C.capture_path || expected == 0 || expected > PAGESRC_MAX_CLONES)
		return usage();
	signal(SIGPIPE, SIG_IGN);
	if (log_open(log_path, LOG_INFO) < 0)
		return 1;
	event_loop *loop = event_loop_create();
	C.capture = snapshot_capture_new();
	if (!loop || !C.capture)
		return 1;
	pagesrc_init(loop, expected, push_rate);
	C.listen_fd = unix_listen(C.capture_path, err, sizeof(err));
	if (C.listen_fd < 0) {
		fprintf(stderr, "remusdbd-pagesrc: %s\n", err);
		return 1;
	}
	event_loop_watch(loop, C.listen_fd, EV_READABLE, on_listen, NULL);
	pagesrc_emit(json_pack("{s:s, s:i}", "event", "listening", "pid", (int)getpid()));
	int code = pagesrc_run();
	snapshot_capture_free(C.capture);
	if (C.listen_fd >= 0) {
		close(C.listen_fd);
		unlink(C.capture_path);
	}
	if (C.mig_fd >= 0)
		close(C.mig_fd);
	event_loop_destroy(loop);
	return code;
}
