/* The asynchronous QMP client on the event loop (qmp.h). */
#include "qemu/qmp.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/buffer.h"
#include "base/log.h"
#include "base/unix_socket.h"

/* QEMU may not be up yet, or is restarting: poll its socket at this pace. */
#define RECONNECT_DELAY_MS 200
/*
 * Longest message we buffer.  Real replies are a few KiB (query-block of
 * a big VM stays far below); a peer sending more without a newline is not
 * a QMP server we understand.
 */
#define QMP_MAX_MESSAGE (1024 * 1024)
#define READ_CHUNK (64 * 1024)
#define READS_PER_WAKEUP 16

enum qmp_state {
	QMP_DISCONNECTED,
	QMP_AWAIT_GREETING,
	QMP_AWAIT_CAPABILITIES,
	QMP_READY,
};

struct qmp_command {
	struct qmp_command *next;
	json_int_t id;
	char *line; /* serialized, without the line terminator */
	int sent;
	qmp_reply_cb cb;
	void *data;
	/* Frees data when the command is dropped without its callback. */
	void (*drop_data)(void *data);
};

struct qmp_client {
	event_loop *loop;
	char *socket_path;
	qmp_event_cb on_event;
	void *user;
	int fd; /* -1 while disconnected */
	enum qmp_state state;
	unsigned connection; /* bumped on disconnect: spots a stale handler */
	long long reconnect_timer; /* 0 when none is armed */
	unsigned connect_failures; /* consecutive; an outage is logged once */
	struct buffer in;
	struct buffer out;
	/* In issue order; sent ones always precede unsent ones. */
	struct qmp_command *head, *tail;
	json_int_t next_id;
	json_int_t capabilities_id;
	char version[64];
	/*
	 * Callbacks may destroy the client.  While a handler is on the stack
	 * destroy only releases resources and marks the client; the handler
	 * frees it on the way out.
	 */
	int dispatching;
	int destroyed;
};

static int is_blank(const char *p, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r')
			return 0;
	return 1;
}

json_t *qmp_parse_message(const char *data, size_t len, size_t *consumed)
{
	size_t pos = 0;

	*consumed = 0;
	if (len == 0)
		return NULL;
	for (;;) {
		const char *newline = memchr(data + pos, '\n', len - pos);
		if (!newline)
			return NULL; /* blank lines so far stay for the next call */
		size_t end = (size_t)(newline - data);
		if (is_blank(data + pos, end - pos)) {
			pos = end + 1;
			continue;
		}
		/* jansson skips the '\r' of "\r\n" as whitespace. */
		json_error_t error;
		json_t *message = json_loadb(data + pos, end - pos, 0, &error);
		*consumed = end + 1;
		if (message && !json_is_object(message)) {
			json_decref(message);
			message = NULL;
		}
		return message;
	}
}

static void try_connect(struct qmp_client *qmp);

static long reconnect_timer_fired(event_loop *loop, long long id, void *data)
{
	struct qmp_client *qmp = data;

	qmp->reconnect_timer = 0;
	try_connect(qmp);
	return TIMER_DONE;
}

static void schedule_reconnect(struct qmp_client *qmp)
{
	if (qmp->reconnect_timer)
		return;
	long long id = event_loop_add_timer(qmp->loop, RECONNECT_DELAY_MS,
					    reconnect_timer_fired, qmp);
	if (id < 0) {
		log_error("qmp %s: cannot arm reconnect timer", qmp->socket_path);
		return;
	}
	qmp->reconnect_timer = id;
}

/* Commands dropped without their callbacks: what they own goes with them. */
static void free_commands(struct qmp_command *cmd)
{
	while (cmd) {
		struct qmp_command *next = cmd->next;

		if (cmd->drop_data)
			cmd->drop_data(cmd->data);
		free(cmd->line);
		free(cmd);
		cmd = next;
	}
}

/*
 * Ends the connection and fails every outstanding command with a NULL
 * reply: whether QEMU executed a sent one is unknown, and a new QEMU
 * instance should not run commands meant for the old one.
 */
static void disconnect(struct qmp_client *qmp, const char *why)
{
	log_warn("qmp %s: connection %s; reconnecting", qmp->socket_path, why);
	event_loop_unwatch(qmp->loop, qmp->fd);
	close(qmp->fd);
	qmp->fd = -1;
	qmp->state = QMP_DISCONNECTED;
	qmp->connection++;
	qmp->version[0] = '\0';
	buffer_clear(&qmp->in);
	buffer_clear(&qmp->out);

	/* Detached first: callbacks may queue new commands (they wait for
	 * the next connection) or destroy the client. */
	struct qmp_command *failed = qmp->head;
	qmp->head = qmp->tail = NULL;
	while (failed && !qmp->destroyed) {
		struct qmp_command *cmd = failed;

		failed = cmd->next;
		if (cmd->cb)
			cmd->cb(qmp, NULL, cmd->data);
		free(cmd->line);
		free(cmd);
	}
	free_commands(failed);
	if (!qmp->destroyed)
		schedule_reconnect(qmp);
}

/* Appends line + "\r\n" to the output, all or nothing. */
static int queue_line(struct qmp_client *qmp, const char *line)
{
	size_t len = strlen(line);
	uint8_t *dst = buffer_reserve(&qmp->out, len + 2);

	if (!dst)
		return -1;
	memcpy(dst, line, len);
	memcpy(dst + len, "\r\n", 2);
	buffer_commit(&qmp->out, len + 2);
	/* If this fails the data still goes out at the next flush_out(). */
	event_loop_set_mask(qmp->loop, qmp->fd, EV_READABLE | EV_WRITABLE);
	return 0;
}

/* Returns -1 if the connection was closed. */
static int send_unsent(struct qmp_client *qmp)
{
	for (struct qmp_command *cmd = qmp->head; cmd; cmd = cmd->next) {
		if (cmd->sent)
			continue;
		if (queue_line(qmp, cmd->line) < 0) {
			disconnect(qmp, "failed: out of memory");
			return -1;
		}
		cmd->sent = 1;
	}
	return 0;
}

/* Returns -1 if the connection was closed. */
static int flush_out(struct qmp_client *qmp)
{
	while (buffer_len(&qmp->out) > 0) {
		/* MSG_NOSIGNAL: QEMU going away must not SIGPIPE the daemon. */
		ssize_t n = send(qmp->fd, buffer_head(&qmp->out),
				 buffer_len(&qmp->out), MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			disconnect(qmp, strerror(errno));
			return -1;
		}
		buffer_consume(&qmp->out, (size_t)n);
	}
	event_loop_set_mask(qmp->loop, qmp->fd,
			    EV_READABLE |
			    (buffer_len(&qmp->out) ? EV_WRITABLE : 0));
	return 0;
}

static void handle_greeting(struct qmp_client *qmp, json_t *message)
{
	json_int_t major, minor, micro;

	if (json_unpack(message, "{s:{s:{s:{s:I,s:I,s:I}}}}", "QMP", "version",
			"qemu", "major", &major, "minor", &minor, "micro",
			&micro) == 0)
		snprintf(qmp->version, sizeof(qmp->version),
			 "%" JSON_INTEGER_FORMAT ".%" JSON_INTEGER_FORMAT
			 ".%" JSON_INTEGER_FORMAT, major, minor, micro);
	else
		log_warn("qmp %s: greeting without a QEMU version",
			 qmp->socket_path);
	log_info("qmp %s: QEMU %s greeted; negotiating capabilities",
		 qmp->socket_path, qmp->version[0] ? qmp->version : "(unknown)");

	char line[96];
	qmp->capabilities_id = qmp->next_id++;
	snprintf(line, sizeof(line),
		 "{\"execute\":\"qmp_capabilities\",\"id\":%" JSON_INTEGER_FORMAT "}",
		 qmp->capabilities_id);
	if (queue_line(qmp, line) < 0) {
		disconnect(qmp, "failed: out of memory");
		return;
	}
	qmp->state = QMP_AWAIT_CAPABILITIES;
}

static void handle_capabilities_reply(struct qmp_client *qmp, json_t *message)
{
	if (json_object_get(message, "error")) {
		char *text = json_dumps(message, JSON_COMPACT);

		log_error("qmp %s: qmp_capabilities refused: %s",
			  qmp->socket_path, text ? text : "?");
		free(text);
		disconnect(qmp, "closed: capability negotiation failed");
		return;
	}
	qmp->state = QMP_READY;
	log_info("qmp %s: ready", qmp->socket_path);
	send_unsent(qmp);
}

static void handle_reply(struct qmp_client *qmp, json_t *message)
{
	json_t *id = json_object_get(message, "id");

	if (qmp->state == QMP_AWAIT_CAPABILITIES && json_is_integer(id) &&
	    json_integer_value(id) == qmp->capabilities_id) {
		handle_capabilities_reply(qmp, message);
		return;
	}
	struct qmp_command **link = &qmp->head;
	while (*link && !((*link)->sent && json_is_integer(id) &&
			  (*link)->id == json_integer_value(id)))
		link = &(*link)->next;
	struct qmp_command *cmd = *link;
	if (!cmd) {
		char *text = json_dumps(message, JSON_COMPACT);

		log_warn("qmp %s: reply matching no command: %.200s",
			 qmp->socket_path, text ? text : "?");
		free(text);
		return;
	}
	*link = cmd->next;
	if (qmp->tail == cmd) {
		/* Recompute the tail: cmd was last. */
		qmp->tail = NULL;
		for (struct qmp_command *c = qmp->head; c; c = c->next)
			qmp->tail = c;
	}
	if (cmd->cb)
		cmd->cb(qmp, message, cmd->data);
	free(cmd->line);
	free(cmd);
}

/* {"seconds": S, "microseconds": U} (qapi/qmp-event.c), or 0. */
static int64_t event_time_us(const json_t *timestamp)
{
	json_t *s = json_object_get(timestamp, "seconds");
	json_t *u = json_object_get(timestamp, "microseconds");

	if (!json_is_integer(s) || !json_is_integer(u) || json_integer_value(s) < 0 ||
	    json_integer_value(u) < 0 || json_integer_value(u) >= 1000000 ||
	    json_integer_value(s) > INT64_MAX / 1000000 - 1)
		return 0;
	return (int64_t)json_integer_value(s) * 1000000 + (int64_t)json_integer_value(u);
}

static void handle_message(struct qmp_client *qmp, json_t *message)
{
	json_t *event = json_object_get(message, "event");

	if (qmp->state == QMP_AWAIT_GREETING) {
		if (json_object_get(message, "QMP"))
			handle_greeting(qmp, message);
		else
			log_warn("qmp %s: message before the greeting ignored",
				 qmp->socket_path);
	} else if (json_is_string(event)) {
		if (qmp->on_event)
			qmp->on_event(qmp, json_string_value(event),
				      json_object_get(message, "data"),
				      event_time_us(json_object_get(message, "timestamp")),
				      qmp->user);
	} else if (json_object_get(message, "return") ||
		   json_object_get(message, "error")) {
		handle_reply(qmp, message);
	} else {
		log_debug("qmp %s: unrecognised message ignored",
			  qmp->socket_path);
	}
}

static void log_garbage(const struct qmp_client *qmp, const char *line,
			size_t len)
{
	char shown[81];
	size_t n = len < sizeof(shown) - 1 ? len : sizeof(shown) - 1;

	/* Whatever the peer sent, the log line stays one printable line. */
	for (size_t i = 0; i < n; i++)
		shown[i] = (line[i] >= 0x20 && line[i] < 0x7f) ? line[i] : '?';
	shown[n] = '\0';
	log_warn("qmp %s: ignoring %zu-byte line that is not a JSON object: %s%s",
		 qmp->socket_path, len, shown, len > n ? "..." : "");
}

/* Returns -1 if the connection was closed or the client destroyed. */
static int dispatch_buffered(struct qmp_client *qmp)
{
	unsigned connection = qmp->connection;

	for (;;) {
		size_t consumed;
		json_t *message = qmp_parse_message(
			(const char *)buffer_head(&qmp->in),
			buffer_len(&qmp->in), &consumed);

		if (consumed == 0)
			break;
		if (!message)
			log_garbage(qmp, (const char *)buffer_head(&qmp->in),
				    consumed);
		buffer_consume(&qmp->in, consumed);
		if (message) {
			handle_message(qmp, message);
			json_decref(message);
		}
		if (qmp->destroyed || qmp->connection != connection)
			return -1;
	}
	if (buffer_len(&qmp->in) > QMP_MAX_MESSAGE) {
		log_error("qmp %s: message longer than %d bytes without a line "
			  "end", qmp->socket_path, QMP_MAX_MESSAGE);
		disconnect(qmp, "closed: message too long");
		return -1;
	}
	return 0;
}

/* Returns -1 if the connection was closed or the client destroyed. */
static int read_and_dispatch(struct qmp_client *qmp)
{
	for (int i = 0; i < READS_PER_WAKEUP; i++) {
		ssize_t n = buffer_read_fd(&qmp->in, qmp->fd, READ_CHUNK);

		if (n < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			disconnect(qmp, strerror(errno));
			return -1;
		}
		if (n == 0) {
			disconnect(qmp, "closed by QEMU");
			return -1;
		}
		if (dispatch_buffered(qmp) < 0)
			return -1;
	}
	return 0;
}

static void release_resources(struct qmp_client *qmp)
{
	if (qmp->reconnect_timer)
		event_loop_del_timer(qmp->loop, qmp->reconnect_timer);
	qmp->reconnect_timer = 0;
	if (qmp->fd >= 0) {
		event_loop_unwatch(qmp->loop, qmp->fd);
		close(qmp->fd);
		qmp->fd = -1;
	}
	free_commands(qmp->head);
	qmp->head = qmp->tail = NULL;
	buffer_free(&qmp->in);
	buffer_free(&qmp->out);
}

static void qmp_handler(event_loop *loop, int fd, void *data, int ready)
{
	struct qmp_client *qmp = data;
	int closed = 0;

	qmp->dispatching++;
	if (ready & EV_WRITABLE)
		closed = flush_out(qmp) < 0;
	if (!closed && (ready & EV_READABLE))
		closed = read_and_dispatch(qmp) < 0;
	/* Replies to what callbacks just issued go out without another wait. */
	if (!closed && !qmp->destroyed && buffer_len(&qmp->out) > 0)
		flush_out(qmp);
	if (--qmp->dispatching == 0 && qmp->destroyed) {
		free(qmp->socket_path);
		free(qmp);
	}
}

static void try_connect(struct qmp_client *qmp)
{
	int fd = unix_connect(qmp->socket_path);

	if (fd < 0) {
		if (qmp->connect_failures++ == 0)
			log_info("qmp %s: waiting for QEMU (%s)", qmp->socket_path,
				 strerror(errno));
		schedule_reconnect(qmp);
		return;
	}
	if (event_loop_watch(qmp->loop, fd, EV_READABLE, qmp_handler, qmp) < 0) {
		log_error("qmp %s: cannot watch socket: %s", qmp->socket_path,
			  strerror(errno));
		close(fd);
		schedule_reconnect(qmp);
		return;
	}
	qmp->fd = fd;
	qmp->connect_failures = 0;
	qmp->state = QMP_AWAIT_GREETING;
	log_info("qmp %s: connected", qmp->socket_path);
}

void qmp_client_connect_now(struct qmp_client *qmp)
{
	if (qmp->fd >= 0)
		return;
	if (qmp->reconnect_timer)
		event_loop_del_timer(qmp->loop, qmp->reconnect_timer);
	qmp->reconnect_timer = 0;
	try_connect(qmp);
}

bool qmp_client_nobody_listens(const struct qmp_client *qmp)
{
	return qmp->fd < 0 && qmp->connect_failures > 0;
}

struct qmp_client *qmp_client_create(event_loop *loop, const char *socket_path,
				     qmp_event_cb on_event, void *user)
{
	if (!socket_path || !socket_path[0] ||
	    strlen(socket_path) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
		log_error("qmp: bad socket path: %s", socket_path ? socket_path : "(none)");
		return NULL;
	}
	struct qmp_client *qmp = calloc(1, sizeof(*qmp));
	if (!qmp || !(qmp->socket_path = strdup(socket_path))) {
		log_error("qmp %s: out of memory", socket_path);
		free(qmp);
		return NULL;
	}
	qmp->loop = loop;
	qmp->on_event = on_event;
	qmp->user = user;
	qmp->fd = -1;
	qmp->next_id = 1;
	buffer_init(&qmp->in);
	buffer_init(&qmp->out);
	try_connect(qmp);
	return qmp;
}

void qmp_client_destroy(struct qmp_client *qmp)
{
	if (!qmp || qmp->destroyed)
		return;
	release_resources(qmp);
	qmp->destroyed = 1;
	if (qmp->dispatching)
		return; /* qmp_handler frees it once its callbacks return */
	free(qmp->socket_path);
	free(qmp);
}

int qmp_execute(struct qmp_client *qmp, const char *command, json_t *arguments,
		qmp_reply_cb cb, void *data)
{
	return qmp_execute_owning(qmp, command, arguments, cb, data, NULL);
}

int qmp_execute_owning(struct qmp_client *qmp, const char *command, json_t *arguments,
		       qmp_reply_cb cb, void *data, void (*drop_data)(void *data))
{
	json_t *message = NULL;
	struct qmp_command *cmd = NULL;

	if (!qmp || qmp->destroyed || !command)
		goto fail;
	message = json_pack("{s:s, s:I}", "execute", command, "id",
			    (json_int_t)qmp->next_id);
	if (!message)
		goto fail;
	if (arguments) {
		/* json_object_set_new() drops the reference even on failure. */
		int rc = json_object_set_new(message, "arguments", arguments);
		arguments = NULL;
		if (rc < 0)
			goto fail;
	}
	cmd = calloc(1, sizeof(*cmd));
	if (!cmd || !(cmd->line = json_dumps(message, JSON_COMPACT)))
		goto fail;
	json_decref(message);
	message = NULL;
	/* Before capabilities are negotiated it waits; send_unsent() sends it. */
	if (qmp->state == QMP_READY) {
		if (queue_line(qmp, cmd->line) < 0)
			goto fail;
		cmd->sent = 1;
	}
	cmd->id = qmp->next_id++;
	cmd->cb = cb;
	cmd->data = data;
	cmd->drop_data = drop_data;
	if (qmp->tail)
		qmp->tail->next = cmd;
	else
		qmp->head = cmd;
	qmp->tail = cmd;
	return 0;
fail:
	if (cmd)
		free(cmd->line);
	free(cmd);
	json_decref(message);
	json_decref(arguments);
	return -1;
}

int qmp_client_ready(const struct qmp_client *qmp)
{
	return qmp->state == QMP_READY;
}

const char *qmp_client_qemu_version(const struct qmp_client *qmp)
{
	return qmp->version;
}

pid_t qmp_client_peer_pid(const struct qmp_client *qmp)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);

	if (qmp->fd < 0 || getsockopt(qmp->fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
		return 0;
	return cred.pid;
}
