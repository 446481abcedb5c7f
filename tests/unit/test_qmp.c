/*
 * QMP: the message splitter on canned QEMU output, and a real qmp_client
 * on the event loop against a scripted QMP server on a temporary socket.
 */
#include <CUnit/CUnit.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/event_loop.h"
#include "qemu/qmp.h"
#include "suites.h"

#define GREETING                                                          \
	"{\"QMP\": {\"version\": {\"qemu\": {\"micro\": 0, \"minor\": 2, " \
	"\"major\": 7}, \"package\": \"Debian 1:7.2+dfsg-7\"}, "            \
	"\"capabilities\": [\"oob\"]}}\r\n"

/* Null-safe: a missing member fails the test instead of crashing it. */
#define ASSERT_JSON_STRING(json, expected)                       \
	do {                                                     \
		const char *actual_ = json_string_value(json);   \
		CU_ASSERT_PTR_NOT_NULL(actual_);                 \
		if (actual_)                                     \
			CU_ASSERT_STRING_EQUAL(actual_, expected); \
	} while (0)

/* ---- qmp_parse_message ---- */

static void test_parse_greeting(void)
{
	size_t consumed = 0;
	json_t *msg = qmp_parse_message(GREETING, strlen(GREETING), &consumed);

	CU_ASSERT_PTR_NOT_NULL_FATAL(msg);
	CU_ASSERT_EQUAL(consumed, strlen(GREETING));
	json_t *major = json_object_get(
		json_object_get(json_object_get(json_object_get(msg, "QMP"),
						"version"), "qemu"), "major");
	CU_ASSERT_EQUAL(json_integer_value(major), 7);
	json_decref(msg);
}

static void test_parse_return_error_event_in_sequence(void)
{
	const char stream[] =
		"{\"return\": {}, \"id\": 1}\r\n"
		"{\"error\": {\"class\": \"GenericError\", \"desc\": \"no\"}, \"id\": 2}\r\n"
		"{\"timestamp\": {\"seconds\": 1, \"microseconds\": 5}, "
		"\"event\": \"STOP\"}\r\n";
	size_t len = strlen(stream), pos = 0, consumed;
	json_t *msg;

	msg = qmp_parse_message(stream, len, &consumed);
	CU_ASSERT_PTR_NOT_NULL_FATAL(msg);
	CU_ASSERT_PTR_NOT_NULL(json_object_get(msg, "return"));
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(msg, "id")), 1);
	CU_ASSERT_EQUAL(consumed, strlen("{\"return\": {}, \"id\": 1}\r\n"));
	json_decref(msg);
	pos += consumed;

	msg = qmp_parse_message(stream + pos, len - pos, &consumed);
	CU_ASSERT_PTR_NOT_NULL_FATAL(msg);
	ASSERT_JSON_STRING(json_object_get(
		json_object_get(msg, "error"), "class"), "GenericError");
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(msg, "id")), 2);
	json_decref(msg);
	pos += consumed;

	msg = qmp_parse_message(stream + pos, len - pos, &consumed);
	CU_ASSERT_PTR_NOT_NULL_FATAL(msg);
	ASSERT_JSON_STRING(json_object_get(msg, "event"), "STOP");
	json_decref(msg);
	pos += consumed;
	CU_ASSERT_EQUAL(pos, len);

	msg = qmp_parse_message(stream + pos, len - pos, &consumed);
	CU_ASSERT_PTR_NULL(msg);
	CU_ASSERT_EQUAL(consumed, 0);
}

static void test_parse_partial_line_needs_more(void)
{
	const char full[] = "{\"return\": {\"status\": \"running\"}, \"id\": 9}\r\n";
	size_t consumed = 99;

	/* Every proper prefix, including one ending in '\r', is incomplete. */
	for (size_t len = 0; len < strlen(full); len++) {
		json_t *msg = qmp_parse_message(full, len, &consumed);
		CU_ASSERT_PTR_NULL(msg);
		CU_ASSERT_EQUAL(consumed, 0);
		json_decref(msg);
	}
	json_t *msg = qmp_parse_message(full, strlen(full), &consumed);
	CU_ASSERT_PTR_NOT_NULL(msg);
	CU_ASSERT_EQUAL(consumed, strlen(full));
	json_decref(msg);
}

static void test_parse_garbage_lines_are_skippable(void)
{
	const char *garbage[] = { "not json at all\r\n", "{\"unterminated\": \r\n",
				  "[1, 2, 3]\r\n", "\"a string\"\n", "42\r\n",
				  "{} {}\r\n", "\x01\xff\xfe\r\n" };

	for (size_t i = 0; i < sizeof(garbage) / sizeof(garbage[0]); i++) {
		size_t consumed = 0;
		json_t *msg = qmp_parse_message(garbage[i], strlen(garbage[i]),
						&consumed);
		CU_ASSERT_PTR_NULL(msg);
		CU_ASSERT_EQUAL(consumed, strlen(garbage[i]));
		json_decref(msg);
	}

	/* After skipping the garbage line, the next message parses. */
	const char mixed[] = "garbage\r\n{\"return\": {}}\r\n";
	size_t consumed;
	json_t *msg = qmp_parse_message(mixed, strlen(mixed), &consumed);
	CU_ASSERT_PTR_NULL(msg);
	CU_ASSERT_EQUAL(consumed, strlen("garbage\r\n"));
	msg = qmp_parse_message(mixed + consumed, strlen(mixed) - consumed,
				&consumed);
	CU_ASSERT_PTR_NOT_NULL(msg);
	CU_ASSERT_EQUAL(consumed, strlen("{\"return\": {}}\r\n"));
	json_decref(msg);
}

static void test_parse_newline_only_and_blank_lines(void)
{
	const char stream[] = "\r\n\n  \r\n{\"event\": \"RESUME\"}\n{\"return\": {}}\n";
	size_t consumed;
	json_t *msg = qmp_parse_message(stream, strlen(stream), &consumed);

	CU_ASSERT_PTR_NOT_NULL_FATAL(msg);
	ASSERT_JSON_STRING(json_object_get(msg, "event"), "RESUME");
	/* Blank lines are swallowed together with the message after them. */
	CU_ASSERT_EQUAL(consumed, strlen("\r\n\n  \r\n{\"event\": \"RESUME\"}\n"));
	json_decref(msg);

	size_t rest = strlen(stream) - consumed;
	msg = qmp_parse_message(stream + consumed, rest, &consumed);
	CU_ASSERT_PTR_NOT_NULL(msg);
	CU_ASSERT_EQUAL(consumed, rest);
	json_decref(msg);

	/* Only blank lines: nothing to hand out yet. */
	msg = qmp_parse_message("\r\n\n", 3, &consumed);
	CU_ASSERT_PTR_NULL(msg);
	CU_ASSERT_EQUAL(consumed, 0);
}

/* ---- qmp_client against a scripted server ---- */

struct reply_record {
	int calls;
	int got_null;
	json_t *reply; /* our own reference */
};

static void record_reply(struct qmp_client *qmp, json_t *reply, void *data)
{
	struct reply_record *r = data;

	r->calls++;
	r->got_null = reply == NULL;
	json_decref(r->reply);
	r->reply = reply ? json_incref(reply) : NULL;
}

struct event_record {
	int calls;
	char name[32];
	json_t *data;
	int64_t qemu_time_us;
};

static void record_event(struct qmp_client *qmp, const char *event,
			 json_t *data, int64_t qemu_time_us, void *user)
{
	struct event_record *e = user;

	e->calls++;
	e->qemu_time_us = qemu_time_us;
	snprintf(e->name, sizeof(e->name), "%s", event);
	json_decref(e->data);
	e->data = data ? json_incref(data) : NULL;
}

static void destroy_from_callback(struct qmp_client *qmp, json_t *reply,
				  void *data)
{
	struct qmp_client **owner = data;

	qmp_client_destroy(qmp);
	*owner = NULL;
}

struct fake_server {
	event_loop *loop;
	char dir[64];
	char path[108];
	int listen_fd;
	int conn_fd;
	char in[8192];
	size_t in_len;
};

static void pump(event_loop *loop, int ms)
{
	int64_t until = monotonic_ms() + ms;

	while (monotonic_ms() < until)
		event_loop_run_once(loop, 5);
}

/* Runs the loop until *flag becomes nonzero or ~2 s pass. */
static int pump_until(event_loop *loop, const int *flag)
{
	int64_t until = monotonic_ms() + 2000;

	while (!*flag && monotonic_ms() < until)
		event_loop_run_once(loop, 5);
	return *flag;
}

static int server_listen(struct fake_server *srv)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };

	srv->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (srv->listen_fd < 0)
		return -1;
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", srv->path);
	if (bind(srv->listen_fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 ||
	    listen(srv->listen_fd, 4) < 0)
		return -1;
	return 0;
}

/* The client connects from its retry timer; wait for it while pumping. */
static int server_accept(struct fake_server *srv)
{
	int64_t until = monotonic_ms() + 2000;
	struct pollfd pfd = { .fd = srv->listen_fd, .events = POLLIN };

	while (monotonic_ms() < until) {
		event_loop_run_once(srv->loop, 5);
		if (poll(&pfd, 1, 0) == 1) {
			srv->conn_fd = accept4(srv->listen_fd, NULL, NULL,
					       SOCK_NONBLOCK | SOCK_CLOEXEC);
			srv->in_len = 0;
			return srv->conn_fd;
		}
	}
	return -1;
}

static void server_send(struct fake_server *srv, const char *text)
{
	size_t len = strlen(text);

	CU_ASSERT_EQUAL_FATAL(write(srv->conn_fd, text, len), (ssize_t)len);
}

/* Next line the client sent, parsed; NULL after ~2 s without one. */
static json_t *server_read_message(struct fake_server *srv)
{
	int64_t until = monotonic_ms() + 2000;

	for (;;) {
		char *nl = memchr(srv->in, '\n', srv->in_len);
		if (nl) {
			size_t line = (size_t)(nl - srv->in) + 1;
			json_t *msg = json_loadb(srv->in, line, 0, NULL);
			CU_ASSERT(line >= 2 && srv->in[line - 2] == '\r');
			memmove(srv->in, srv->in + line, srv->in_len - line);
			srv->in_len -= line;
			return msg;
		}
		if (monotonic_ms() >= until)
			return NULL;
		event_loop_run_once(srv->loop, 5);
		ssize_t n = read(srv->conn_fd, srv->in + srv->in_len,
				 sizeof(srv->in) - srv->in_len);
		if (n > 0)
			srv->in_len += (size_t)n;
	}
}

/* Reads one command, checks its name, returns its id (or -1). */
static json_int_t server_expect_command(struct fake_server *srv,
					const char *command)
{
	json_t *msg = server_read_message(srv);
	json_int_t id = -1;

	CU_ASSERT_PTR_NOT_NULL(msg);
	if (!msg)
		return -1;
	const char *execute = json_string_value(json_object_get(msg, "execute"));
	CU_ASSERT_PTR_NOT_NULL(execute);
	if (execute)
		CU_ASSERT_STRING_EQUAL(execute, command);
	json_t *jid = json_object_get(msg, "id");
	CU_ASSERT(json_is_integer(jid));
	if (json_is_integer(jid))
		id = json_integer_value(jid);
	json_decref(msg);
	return id;
}

static void server_reply(struct fake_server *srv, json_int_t id,
			 const char *body, const char *eol)
{
	char line[512];

	snprintf(line, sizeof(line), "{%s, \"id\": %" JSON_INTEGER_FORMAT "}%s",
		 body, id, eol);
	server_send(srv, line);
}

static void test_client_against_scripted_server(void)
{
	struct fake_server srv = { .listen_fd = -1, .conn_fd = -1 };
	struct reply_record status = { 0 }, name = { 0 }, bogus = { 0 },
			    stop = { 0 }, cont = { 0 };
	struct event_record events = { 0 };

	srv.loop = event_loop_create();
	CU_ASSERT_PTR_NOT_NULL_FATAL(srv.loop);
	snprintf(srv.dir, sizeof(srv.dir), "/tmp/qmp-test.XXXXXX");
	CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(srv.dir));
	snprintf(srv.path, sizeof(srv.path), "%s/qmp.sock", srv.dir);

	/* 1. No socket yet: the client keeps retrying and is not ready. */
	struct qmp_client *qmp = qmp_client_create(srv.loop, srv.path,
						   record_event, &events);
	CU_ASSERT_PTR_NOT_NULL_FATAL(qmp);
	pump(srv.loop, 250);
	CU_ASSERT_FALSE(qmp_client_ready(qmp));
	CU_ASSERT_STRING_EQUAL(qmp_client_qemu_version(qmp), "");
	/* Issued while disconnected: waits for negotiation. */
	CU_ASSERT_EQUAL(qmp_execute(qmp, "query-status", NULL, record_reply,
				    &status), 0);

	/* 2. Server appears; greeting; capabilities come first and alone. */
	CU_ASSERT_EQUAL_FATAL(server_listen(&srv), 0);
	CU_ASSERT_FATAL(server_accept(&srv) >= 0);
	server_send(&srv, GREETING);
	json_int_t caps_id = server_expect_command(&srv, "qmp_capabilities");
	CU_ASSERT_STRING_EQUAL(qmp_client_qemu_version(qmp), "7.2.0");
	pump(srv.loop, 50);
	CU_ASSERT_EQUAL(srv.in_len, 0); /* query-status held back */
	CU_ASSERT_FALSE(qmp_client_ready(qmp));
	server_reply(&srv, caps_id, "\"return\": {}", "\r\n");

	/* 3. Ready: the queued command follows with its own id. */
	json_int_t status_id = server_expect_command(&srv, "query-status");
	CU_ASSERT(qmp_client_ready(qmp));
	CU_ASSERT_NOT_EQUAL(status_id, caps_id);

	json_t *args = json_pack("{s:b}", "verbose", 1);
	CU_ASSERT_EQUAL(qmp_execute(qmp, "query-name", args, record_reply,
				    &name), 0);
	json_t *msg = server_read_message(&srv);
	CU_ASSERT_PTR_NOT_NULL_FATAL(msg);
	ASSERT_JSON_STRING(json_object_get(msg, "execute"), "query-name");
	CU_ASSERT(json_is_true(json_object_get(json_object_get(msg, "arguments"),
					       "verbose")));
	json_int_t name_id = json_integer_value(json_object_get(msg, "id"));
	json_decref(msg);
	CU_ASSERT_NOT_EQUAL(name_id, status_id);

	/* 4. Replies out of order, a "\n"-only line, garbage, an event. */
	char batch[1024];
	snprintf(batch, sizeof(batch),
		 "{\"return\": {\"name\": \"vm1\"}, \"id\": %" JSON_INTEGER_FORMAT "}\n"
		 "this is not json\r\n"
		 "{\"timestamp\": {\"seconds\": 1, \"microseconds\": 2}, "
		 "\"event\": \"STOP\", \"data\": {\"reason\": \"test\"}}\r\n"
		 "{\"return\": {\"status\": \"running\", \"running\": true}, "
		 "\"id\": %" JSON_INTEGER_FORMAT "}\r\n",
		 name_id, status_id);
	server_send(&srv, batch);
	CU_ASSERT_FATAL(pump_until(srv.loop, &status.calls));
	CU_ASSERT_EQUAL(name.calls, 1);
	CU_ASSERT_EQUAL(status.calls, 1);
	ASSERT_JSON_STRING(json_object_get(
		json_object_get(name.reply, "return"), "name"), "vm1");
	ASSERT_JSON_STRING(json_object_get(
		json_object_get(status.reply, "return"), "status"), "running");
	CU_ASSERT_EQUAL(events.calls, 1);
	CU_ASSERT_STRING_EQUAL(events.name, "STOP");
	ASSERT_JSON_STRING(json_object_get(events.data, "reason"), "test");
	/* QEMU's stamp, whole microseconds (qapi/qmp-event.c's timestamp_put) */
	CU_ASSERT_EQUAL(events.qemu_time_us, 1000002);

	/* An event without a usable stamp: 0, never a made-up time. */
	server_send(&srv, "{\"timestamp\": {\"seconds\": 5, \"microseconds\": 1000000}, "
		    "\"event\": \"RESUME\"}\r\n");
	for (int i = 0; i < 400 && events.calls == 1; i++)
		event_loop_run_once(srv.loop, 5);
	CU_ASSERT_EQUAL_FATAL(events.calls, 2);
	CU_ASSERT_STRING_EQUAL(events.name, "RESUME");
	CU_ASSERT_PTR_NULL(events.data);
	CU_ASSERT_EQUAL(events.qemu_time_us, 0);

	/* 5. Error replies reach the callback whole. */
	CU_ASSERT_EQUAL(qmp_execute(qmp, "bogus", NULL, record_reply, &bogus), 0);
	json_int_t bogus_id = server_expect_command(&srv, "bogus");
	server_reply(&srv, bogus_id,
		     "\"error\": {\"class\": \"CommandNotFound\", "
		     "\"desc\": \"The command bogus has not been found\"}",
		     "\r\n");
	CU_ASSERT_FATAL(pump_until(srv.loop, &bogus.calls));
	ASSERT_JSON_STRING(json_object_get(json_object_get(bogus.reply, "error"),
					   "class"), "CommandNotFound");

	/* 6. QEMU goes away with two commands outstanding: both get NULL. */
	CU_ASSERT_EQUAL(qmp_execute(qmp, "stop", NULL, record_reply, &stop), 0);
	CU_ASSERT_EQUAL(qmp_execute(qmp, "cont", NULL, record_reply, &cont), 0);
	server_expect_command(&srv, "stop");
	server_expect_command(&srv, "cont");
	close(srv.conn_fd);
	srv.conn_fd = -1;
	CU_ASSERT_FATAL(pump_until(srv.loop, &cont.calls));
	CU_ASSERT_EQUAL(stop.calls, 1);
	CU_ASSERT(stop.got_null);
	CU_ASSERT_EQUAL(cont.calls, 1);
	CU_ASSERT(cont.got_null);
	CU_ASSERT_FALSE(qmp_client_ready(qmp));
	CU_ASSERT_STRING_EQUAL(qmp_client_qemu_version(qmp), "");
	/* Earlier callbacks are not called again. */
	CU_ASSERT_EQUAL(status.calls, 1);
	CU_ASSERT_EQUAL(name.calls, 1);

	/* 7. It reconnects by itself and negotiates again. */
	CU_ASSERT_FATAL(server_accept(&srv) >= 0);
	server_send(&srv, GREETING);
	json_int_t caps2 = server_expect_command(&srv, "qmp_capabilities");
	CU_ASSERT(caps2 > bogus_id); /* ids keep increasing */
	server_reply(&srv, caps2, "\"return\": {}", "\n");
	int ready = 0;
	int64_t until = monotonic_ms() + 2000;
	while (!(ready = qmp_client_ready(qmp)) && monotonic_ms() < until)
		event_loop_run_once(srv.loop, 5);
	CU_ASSERT(ready);

	/* 8. A callback may destroy the client it was called from. */
	CU_ASSERT_EQUAL(qmp_execute(qmp, "query-status", NULL,
				    destroy_from_callback, &qmp), 0);
	CU_ASSERT_EQUAL(qmp_execute(qmp, "never-answered", NULL, record_reply,
				    &stop), 0);
	json_int_t last_id = server_expect_command(&srv, "query-status");
	server_reply(&srv, last_id, "\"return\": {}", "\r\n");
	until = monotonic_ms() + 2000;
	while (qmp && monotonic_ms() < until)
		event_loop_run_once(srv.loop, 5);
	CU_ASSERT_PTR_NULL(qmp);
	/* Destroy drops outstanding commands silently. */
	CU_ASSERT_EQUAL(stop.calls, 1);

	qmp_client_destroy(qmp); /* NULL: a no-op */
	json_decref(status.reply);
	json_decref(name.reply);
	json_decref(bogus.reply);
	json_decref(events.data);
	if (srv.conn_fd >= 0)
		close(srv.conn_fd);
	close(srv.listen_fd);
	unlink(srv.path);
	rmdir(srv.dir);
	event_loop_destroy(srv.loop);
}

/* A connection waits in the listener's backlog (unix sockets connect at once). */
static int pending_connection(int listen_fd)
{
	struct pollfd pfd = { .fd = listen_fd, .events = POLLIN };

	return poll(&pfd, 1, 0) == 1;
}

/*
 * qmp_client_connect_now: the takeover's QEMU listens, so the client
 * connects at once, not at its reconnect poll; it cancels that poll (or
 * the poll would open a second connection) and does nothing while
 * connected.  The loop never runs between the call and the checks.
 */
static void test_connect_now_skips_the_reconnect_poll(void)
{
	struct fake_server srv = { .listen_fd = -1, .conn_fd = -1 };

	srv.loop = event_loop_create();
	CU_ASSERT_PTR_NOT_NULL_FATAL(srv.loop);
	snprintf(srv.dir, sizeof(srv.dir), "/tmp/qmp-test.XXXXXX");
	CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(srv.dir));
	snprintf(srv.path, sizeof(srv.path), "%s/qmp.sock", srv.dir);

	/* Nobody listens: the first attempt fails and a reconnect poll is armed. */
	struct qmp_client *qmp = qmp_client_create(srv.loop, srv.path, NULL, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(qmp);
	CU_ASSERT_TRUE(qmp_client_nobody_listens(qmp));
	CU_ASSERT_EQUAL_FATAL(server_listen(&srv), 0);
	CU_ASSERT_FALSE(pending_connection(srv.listen_fd)); /* the poll has not fired */

	qmp_client_connect_now(qmp);
	CU_ASSERT_TRUE_FATAL(pending_connection(srv.listen_fd));
	CU_ASSERT_FALSE(qmp_client_nobody_listens(qmp));
	srv.conn_fd = accept4(srv.listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	CU_ASSERT_TRUE_FATAL(srv.conn_fd >= 0);

	/* Connected: neither a second call nor the old poll's time connects again. */
	qmp_client_connect_now(qmp);
	pump(srv.loop, 300);
	CU_ASSERT_FALSE(pending_connection(srv.listen_fd));

	/* And the connection it made is the one the client speaks on. */
	struct reply_record status = { 0 };
	server_send(&srv, GREETING);
	json_int_t caps = server_expect_command(&srv, "qmp_capabilities");
	server_reply(&srv, caps, "\"return\": {}", "\r\n");
	CU_ASSERT_EQUAL(qmp_execute(qmp, "query-status", NULL, record_reply, &status), 0);
	json_int_t id = server_expect_command(&srv, "query-status");
	server_reply(&srv, id, "\"return\": {\"status\": \"running\"}", "\r\n");
	CU_ASSERT_TRUE(pump_until(srv.loop, &status.calls));
	CU_ASSERT_TRUE(qmp_client_ready(qmp));
	CU_ASSERT_FALSE(status.got_null);
	json_decref(status.reply);

	qmp_client_destroy(qmp);
	close(srv.conn_fd);
	close(srv.listen_fd);
	unlink(srv.path);
	rmdir(srv.dir);
	event_loop_destroy(srv.loop);
}

static void test_execute_validates_and_steals_arguments(void)
{
	event_loop *loop = event_loop_create();
	struct qmp_client *qmp = qmp_client_create(loop, "/nonexistent/qmp.sock",
						   NULL, NULL);

	CU_ASSERT_PTR_NOT_NULL_FATAL(qmp);
	/* The reference is stolen even on failure (ASan would see a leak). */
	CU_ASSERT_EQUAL(qmp_execute(qmp, NULL, json_object(), NULL, NULL), -1);
	CU_ASSERT_EQUAL(qmp_execute(qmp, "stop", json_object(), NULL, NULL), 0);
	qmp_client_destroy(qmp);
	event_loop_destroy(loop);

	char long_path[200];
	memset(long_path, 'a', sizeof(long_path) - 1);
	long_path[sizeof(long_path) - 1] = '\0';
	loop = event_loop_create();
	CU_ASSERT_PTR_NULL(qmp_client_create(loop, long_path, NULL, NULL));
	event_loop_destroy(loop);
}

static int drops_seen;

static void count_drop(void *data)
{
	drops_seen++;
	free(data);
}

/* What a command owns goes with it when the client is destroyed unanswered
 * (here: QEMU never listened), and stays the caller's when it fails. */
static void test_destroy_frees_what_unanswered_commands_own(void)
{
	event_loop *loop = event_loop_create();
	struct qmp_client *qmp = qmp_client_create(loop, "/nonexistent/qmp.sock",
						   NULL, NULL);
	char *kept = strdup("kept");

	CU_ASSERT_PTR_NOT_NULL_FATAL(qmp);
	drops_seen = 0;
	CU_ASSERT_EQUAL(qmp_execute_owning(qmp, "stop", NULL, NULL, strdup("vm1"),
					   count_drop), 0);
	CU_ASSERT_EQUAL(qmp_execute(qmp, "cont", NULL, NULL, kept), 0);
	CU_ASSERT_EQUAL(qmp_execute_owning(qmp, NULL, NULL, NULL, kept, count_drop), -1);
	CU_ASSERT_EQUAL(drops_seen, 0);
	qmp_client_destroy(qmp);
	CU_ASSERT_EQUAL(drops_seen, 1);
	free(kept);
	event_loop_destroy(loop);
}

int register_qmp_tests(void)
{
	CU_pSuite suite = CU_add_suite("qmp", NULL, NULL);

	if (!suite)
		return -1;
	if (!CU_add_test(suite, "parse greeting", test_parse_greeting) ||
	    !CU_add_test(suite, "parse return/error/event",
			 test_parse_return_error_event_in_sequence) ||
	    !CU_add_test(suite, "partial line needs more",
			 test_parse_partial_line_needs_more) ||
	    !CU_add_test(suite, "garbage lines are skippable",
			 test_parse_garbage_lines_are_skippable) ||
	    !CU_add_test(suite, "\\n-only and blank lines",
			 test_parse_newline_only_and_blank_lines) ||
	    !CU_add_test(suite, "client against scripted server",
			 test_client_against_scripted_server) ||
	    !CU_add_test(suite, "connect now skips the reconnect poll",
			 test_connect_now_skips_the_reconnect_poll) ||
	    !CU_add_test(suite, "execute validates and steals arguments",
			 test_execute_validates_and_steals_arguments) ||
	    !CU_add_test(suite, "destroy frees what unanswered commands own",
			 test_destroy_frees_what_unanswered_commands_own))
		return -1;
	return 0;
}
