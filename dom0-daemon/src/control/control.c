/*
 * The control socket: one JSON request and one JSON reply per line
 * (control.h).  This file owns the socket and its clients and dispatches
 * each request to its command (control_host.c, control_replication.c,
 * control_fork.c).
 */
#include "control/control.h"
#include "control/control_internal.h"
#include "control/control_json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/accept_policy.h"
#include "base/buffer.h"
#include "base/log.h"
#include "base/unix_socket.h"

/* One request is a small JSON object: 64 KiB means a confused client. */
#define MAX_LINE (64 * 1024)
/* Stop reading requests while this much reply text is unread. */
#define OUTPUT_HIGH_WATER (1024 * 1024)
#define MAX_CLIENTS 32

struct control_client {
	struct control_server *control;
	int fd;
	unsigned id;
	int closing; /* reply to shutdown sent: close after the flush */
	struct buffer in;
	struct buffer out;
	struct control_client *next;
};

struct control_server {
	struct control_context ctx; /* the commands' view: loop and config */
	char *socket_path;
	char *host;
	int listen_fd;
	struct accept_policy accept;
	unsigned next_client_id;
	unsigned n_clients;
	struct control_client *clients;
};

static const struct {
	const char *name;
	json_t *(*run)(const struct control_context *ctx, json_t *request);
} commands[] = {
	{ "ping", cmd_ping },
	{ "status", cmd_status },
	{ "vm-add", cmd_vm_add },
	{ "vm-remove", cmd_vm_remove },
	{ "shutdown", cmd_shutdown },
	{ "protect", cmd_protect },
	{ "unprotect", cmd_unprotect },
	{ "failover", cmd_failover },
	{ "reset-stats", cmd_reset_stats },
	{ "dirty-census", cmd_dirty_census },
	{ "hold-checkpoint", cmd_hold_checkpoint },
	{ "release-checkpoint", cmd_release_checkpoint },
	{ "switchover", cmd_switchover },
	{ "switchover-cancel", cmd_switchover_cancel },
	{ "image-checksums", cmd_image_checksums },
	{ "forget", cmd_forget },
	{ "fork-start", cmd_fork_start },
	{ "fork-serve", cmd_fork_serve },
	{ "fork-release", cmd_fork_release },
	{ "vm-release", cmd_vm_release },
};

json_t *control_execute(struct control_server *control, json_t *request)
{
	const char *cmd;
	json_t *reply = NULL;

	if (!json_is_object(request))
		return error_reply("a request must be a JSON object like "
				   "{\"cmd\": \"ping\"}");
	if ((reply = string_member(request, "cmd", &cmd)))
		return reply;
	size_t i = 0;
	while (i < sizeof(commands) / sizeof(commands[0]) &&
	       strcmp(cmd, commands[i].name) != 0)
		i++;
	if (i == sizeof(commands) / sizeof(commands[0]))
		reply = error_reply("unknown command '%.40s' (known: ping, status, "
				    "vm-add, vm-remove, shutdown, protect, unprotect, failover, "
				    "reset-stats, hold-checkpoint, release-checkpoint, "
				    "image-checksums)", cmd);
	else
		reply = commands[i].run(&control->ctx, request);
	if (!reply)
		return error_reply("out of memory");
	json_t *id = json_object_get(request, "id");
	if (id)
		json_object_set(reply, "id", id);
	return reply;
}

/* ---- connections -------------------------------------------------- */

static void client_close(struct control_client *c)
{
	struct control_server *control = c->control;

	for (struct control_client **link = &control->clients; *link;
	     link = &(*link)->next) {
		if (*link == c) {
			*link = c->next;
			break;
		}
	}
	event_loop_unwatch(control->ctx.loop, c->fd);
	close(c->fd);
	buffer_free(&c->in);
	buffer_free(&c->out);
	control->n_clients--;
	free(c);
}

static int queue_reply(struct control_client *c, json_t *reply)
{
	char *text = reply ? json_dumps(reply, JSON_COMPACT) : NULL;
	int rc = -1;

	if (text && buffer_append(&c->out, text, strlen(text)) == 0 &&
	    buffer_append(&c->out, "\n", 1) == 0)
		rc = 0;
	free(text);
	return rc;
}

/* Handles one request line.  Returns 1 if the daemon should shut down. */
static int handle_line(struct control_client *c, char *line, size_t len)
{
	json_error_t jerr;
	json_t *request = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
	json_t *reply;
	int shutdown = 0;

	if (!request) {
		reply = error_reply("request is not valid JSON (column %d: %s); "
				    "send one JSON object per line", jerr.column,
				    jerr.text);
	} else {
		reply = control_execute(c->control, request);
		json_t *cmd = json_object_get(request, "cmd");
		shutdown = json_is_string(cmd) &&
			   !strcmp(json_string_value(cmd), "shutdown") &&
			   json_is_true(json_object_get(reply, "ok"));
		if (json_is_string(cmd))
			log_debug("control client #%u: %s -> %s", c->id,
				  json_string_value(cmd),
				  json_is_true(json_object_get(reply, "ok")) ? "ok" : "error");
	}
	json_decref(request);
	if (queue_reply(c, reply) < 0)
		log_error("control client #%u: cannot queue a reply (out of memory)",
			  c->id);
	json_decref(reply);
	return shutdown;
}

static int is_blank(const char *p, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r')
			return 0;
	return 1;
}

/* Returns -1 when c must be closed, 1 for shutdown, else 0. */
static int process_lines(struct control_client *c)
{
	while (buffer_len(&c->in) && buffer_len(&c->out) < OUTPUT_HIGH_WATER &&
	       !c->closing) {
		char *start = (char *)buffer_head(&c->in);
		char *nl = memchr(start, '\n', buffer_len(&c->in));
		if (!nl) {
			if (buffer_len(&c->in) >= MAX_LINE) {
				log_warn("control client #%u: request line longer than "
					 "%d bytes without a newline; closing",
					 c->id, MAX_LINE);
				return -1;
			}
			return 0;
		}
		size_t len = (size_t)(nl - start);
		if (len >= MAX_LINE) {
			log_warn("control client #%u: request line of %zu bytes exceeds "
				 "%d; closing", c->id, len, MAX_LINE);
			return -1;
		}
		int shutdown = 0;
		/* Blank lines (e.g. a bare Enter from socat) are ignored. */
		if (!is_blank(start, len))
			shutdown = handle_line(c, start, len);
		buffer_consume(&c->in, len + 1);
		if (shutdown)
			return 1;
	}
	return 0;
}

static int client_rearm(struct control_client *c)
{
	if (buffer_write_fd(&c->out, c->fd) < 0) {
		log_info("control client #%u: send failed: %s", c->id, strerror(errno));
		return -1;
	}
	if (c->closing && buffer_len(&c->out) == 0)
		return -1;
	int mask = buffer_len(&c->out) ? EV_WRITABLE : 0;
	if (!c->closing && buffer_len(&c->out) < OUTPUT_HIGH_WATER)
		mask |= EV_READABLE;
	return event_loop_set_mask(c->control->ctx.loop, c->fd, mask);
}

static void on_client_event(event_loop *loop, int fd, void *data, int ready)
{
	struct control_client *c = data;
	struct control_server *control = c->control;

	if (ready & EV_READABLE) {
		ssize_t n = buffer_read_fd(&c->in, fd, 16 * 1024);
		if (n == 0) {
			if (buffer_len(&c->in))
				log_info("control client #%u: closed with an "
					 "unterminated request (no newline)", c->id);
			client_close(c);
			return;
		}
		if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
			client_close(c);
			return;
		}
	}
	int r = process_lines(c);
	if (r < 0) {
		client_close(c);
		return;
	}
	if (r == 1)
		c->closing = 1;
	if (client_rearm(c) < 0) {
		client_close(c);
		c = NULL;
	}
	/* Last: the callback may stop the loop (and destroy everything later). */
	if (r == 1 && control->ctx.config.on_shutdown) {
		log_info("shutdown requested on the control socket");
		control->ctx.config.on_shutdown(control->ctx.config.shutdown_data);
	}
}

static void on_listen_readable(event_loop *loop, int fd, void *data, int ready)
{
	struct control_server *control = data;

	for (;;) {
		int conn_fd = accept_policy_accept(&control->accept, NULL, NULL);
		if (conn_fd < 0)
			return;
		if (control->n_clients >= MAX_CLIENTS) {
			log_warn("control: refusing a client, already %d connected",
				 MAX_CLIENTS);
			close(conn_fd);
			continue;
		}
		struct control_client *c = calloc(1, sizeof(*c));
		if (!c || event_loop_watch(loop, conn_fd, EV_READABLE,
					   on_client_event, c) < 0) {
			log_error("control: cannot take a client: %s", strerror(errno));
			free(c);
			close(conn_fd);
			continue;
		}
		c->control = control;
		c->fd = conn_fd;
		c->id = ++control->next_client_id;
		buffer_init(&c->in);
		buffer_init(&c->out);
		c->next = control->clients;
		control->clients = c;
		control->n_clients++;
		log_debug("control client #%u connected", c->id);
	}
}

struct control_server *control_create(event_loop *loop,
				      const struct control_config *config)
{
	char err[256];
	struct control_server *control = calloc(1, sizeof(*control));

	if (!control) {
		log_error("control: out of memory");
		return NULL;
	}
	control->ctx.loop = loop;
	control->ctx.config = *config;
	control->listen_fd = -1;
	control->socket_path = strdup(config->socket_path);
	control->host = strdup(config->host ? config->host : "");
	if (!control->socket_path || !control->host) {
		log_error("control: out of memory");
		goto fail;
	}
	control->ctx.config.socket_path = control->socket_path;
	control->ctx.config.host = control->host;
	control->listen_fd = unix_listen(config->socket_path, err, sizeof(err));
	if (control->listen_fd < 0) {
		log_error("control socket: %s", err);
		goto fail;
	}
	if (accept_policy_start(&control->accept, loop, control->listen_fd,
				"control socket", on_listen_readable, control) < 0) {
		log_error("control socket: epoll: %s", strerror(errno));
		goto fail;
	}
	log_info("control socket listening on %s", config->socket_path);
	return control;
fail:
	control_destroy(control);
	return NULL;
}

void control_destroy(struct control_server *control)
{
	if (!control)
		return;
	while (control->clients)
		client_close(control->clients);
	if (control->listen_fd >= 0) {
		accept_policy_stop(&control->accept);
		close(control->listen_fd);
		unlink(control->socket_path);
	}
	free(control->socket_path);
	free(control->host);
	free(control);
}
