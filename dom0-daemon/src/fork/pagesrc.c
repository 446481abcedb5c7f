/* The clones' side of a fork's page source; see pagesrc.h. */
#include "fork/pagesrc.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/inet_socket.h"
#include "base/log.h"
#include "fork/postcopy_source.h"

#define PROGRESS_MS 250

struct clone_slot {
	char id[64];
	struct postcopy_session *session;
	bool ended, ok;
	char reason[256];
};

static struct {
	event_loop *loop;
	struct postcopy_fork *fork;
	unsigned expected;
	uint64_t push_rate;
	struct clone_slot clones[PAGESRC_MAX_CLONES];
	unsigned nclones, ended, failed;
	char line[1024];
	size_t line_len;
	bool stdin_open;
	int exit_code;
} P;

void pagesrc_emit(json_t *obj)
{
	/*
	 * write(2), not stdio: in a fork of remusdbd (vm_fork.c) stdout's
	 * FILE may hold whatever the daemon had buffered.
	 */
	char *text = json_dumps(obj, JSON_COMPACT);

	if (text) {
		size_t len = strlen(text), off = 0;

		text[len++] = '\n'; /* replaces the NUL: written by length */
		while (off < len) {
			ssize_t n = write(STDOUT_FILENO, text + off, len - off);

			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				break; /* remusdbd is gone: nobody to tell */
			off += (size_t)n;
		}
		free(text);
	}
	json_decref(obj);
}

static void finish(int code, const char *why)
{
	if (why)
		pagesrc_emit(json_pack("{s:s, s:s}", "event", code ? "failed" : "done", "error", why));
	else
		pagesrc_emit(json_pack("{s:s}", "event", "done"));
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
	pagesrc_emit(o);
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
		pagesrc_emit(json_pack("{s:s, s:s, s:s}", "event", "error", "id", id, "error",
			       "no snapshot yet"));
		return;
	}
	if (P.nclones == PAGESRC_MAX_CLONES || P.nclones == P.expected) {
		pagesrc_emit(json_pack("{s:s, s:s, s:s}", "event", "error", "id", id, "error",
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
		pagesrc_emit(json_pack("{s:s, s:s, s:s}", "event", "error", "id", id, "error", err));
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
			pagesrc_emit(json_pack("{s:s, s:s}", "event", "error", "error", "unknown command"));
		size_t used = (size_t)(nl - P.line) + 1;
		memmove(P.line, nl + 1, P.line_len - used);
		P.line_len -= used;
	}
	if (P.line_len == sizeof(P.line) - 1)
		P.line_len = 0; /* an over-long line: drop it */
}

void pagesrc_fail(const char *why)
{
	finish(1, why);
}

static long on_progress(event_loop *loop, long long id, void *data)
{
	json_t *arr = json_array();

	for (unsigned i = 0; i < P.nclones; i++)
		json_array_append_new(arr, clone_json(&P.clones[i]));
	pagesrc_emit(json_pack("{s:s, s:o}", "event", "progress", "clones", arr));
	return PROGRESS_MS;
}

void pagesrc_init(event_loop *loop, unsigned expected, uint64_t push_rate)
{
	memset(&P, 0, sizeof(P));
	P.loop = loop;
	P.expected = expected;
	P.push_rate = push_rate;
	P.stdin_open = true;
}

int pagesrc_snapshot_ready(const struct ram_image *img, const struct page_ref *dirtied,
			   size_t ndirtied, json_t *details)
{
	json_t *ev = json_pack("{s:s, s:I, s:I}", "event", "captured",
			       "pages_total", (json_int_t)ram_image_pages_total(img),
			       "pages_written", (json_int_t)ram_image_pages_written(img));

	P.fork = postcopy_fork_create(img, dirtied, ndirtied);
	if (!P.fork) {
		json_decref(ev);
		json_decref(details);
		finish(1, "out of memory");
		return -1;
	}
	postcopy_fork_set_push_rate(P.fork, P.push_rate);
	json_object_update(ev, details);
	json_decref(details);
	pagesrc_emit(ev);
	return 0;
}

int pagesrc_run(void)
{
	fcntl(STDIN_FILENO, F_SETFL, fcntl(STDIN_FILENO, F_GETFL) | O_NONBLOCK);
	event_loop_watch(P.loop, STDIN_FILENO, EV_READABLE, on_stdin, NULL);
	event_loop_add_timer(P.loop, PROGRESS_MS, on_progress, NULL);
	event_loop_run(P.loop);
	for (unsigned i = 0; i < P.nclones; i++)
		postcopy_session_destroy(P.clones[i].session);
	postcopy_fork_destroy(P.fork);
	P.fork = NULL;
	return P.exit_code;
}
