/* libmicrohttpd on the daemon's event loop (http_endpoint.h). */
#include "control/http_endpoint.h"

#include <microhttpd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/event_loop.h"
#include "base/inet_socket.h"
#include "base/loop_turns.h"
#include "base/log.h"
#include "base/metrics.h"
#include "backup/replication_server.h"
#include "vm/vm.h"

/* A few scrapers and health checkers, not the world. */
#define HTTP_MAX_CONNECTIONS 32
#define HTTP_CONNECTION_TIMEOUT_S 10
/* The longest MHD is left alone even when it asks for no timeout. */
#define HTTP_MAX_WAIT_MS 1000

struct http_endpoint {
	event_loop *loop;
	struct MHD_Daemon *mhd;
	int epoll_fd;
	long long timer;
	uint16_t port;
	const struct vm_registry *vms;
	const struct replication_server *replication;
};

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	char line[512];

	vsnprintf(line, sizeof(line), fmt, ap);
	line[strcspn(line, "\n")] = 0;
	log_warn("http: %s", line);
}

static long run_mhd(event_loop *loop, long long id, void *data);

/*
 * Lets MHD do what is ready, then sets the timer to when it next wants a
 * turn (a timeout to enforce, or work left over: 0).  The timer is made
 * anew each time, as the next deadline may be sooner than the one set.
 */
static void turn(struct http_endpoint *h)
{
	MHD_UNSIGNED_LONG_LONG ms = HTTP_MAX_WAIT_MS;

	MHD_run(h->mhd);
	if (MHD_get_timeout(h->mhd, &ms) != MHD_YES || ms > HTTP_MAX_WAIT_MS)
		ms = HTTP_MAX_WAIT_MS;
	if (h->timer)
		event_loop_del_timer(h->loop, h->timer);
	h->timer = event_loop_add_timer(h->loop, (long)ms, run_mhd, h);
	if (h->timer < 0)
		h->timer = 0; /* out of memory: the next readable event retries */
}

static long run_mhd(event_loop *loop, long long id, void *data)
{
	struct http_endpoint *h = data;

	h->timer = 0; /* this one ends; turn() sets the next */
	turn(h);
	return TIMER_DONE;
}

static void on_epoll_readable(event_loop *loop, int fd, void *data, int ready)
{
	turn(data);
}

static enum MHD_Result respond(struct MHD_Connection *conn, unsigned status,
			       const char *content_type, char *body, size_t len)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(len, body,
								 MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(body);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
	MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	enum MHD_Result ret = MHD_queue_response(conn, status, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result respond_text(struct MHD_Connection *conn, unsigned status,
				    const char *fmt, ...)
{
	char *body = NULL;
	va_list ap;

	va_start(ap, fmt);
	int n = vasprintf(&body, fmt, ap);
	va_end(ap);
	if (n < 0)
		return MHD_NO;
	return respond(conn, status, "text/plain; charset=utf-8", body, (size_t)n);
}

static json_t *replicas_json(const struct http_endpoint *h)
{
	return h->replication ? replication_server_status_json(h->replication) : json_array();
}

static enum MHD_Result serve_metrics(struct http_endpoint *h, struct MHD_Connection *conn)
{
	json_t *vms = vm_registry_status_json(h->vms);
	json_t *replicas = replicas_json(h);
	json_t *memory = h->replication ? replication_server_memory_json(h->replication) : NULL;
	char *body = NULL;
	size_t len = 0;
	FILE *out = open_memstream(&body, &len);
	json_t *loop = loop_turns_json(event_loop_turns(h->loop), monotonic_us());
	int rc = out && vms && replicas ? metrics_write(out, vms, replicas, memory, loop) : -1;

	if (out && fclose(out) != 0)
		rc = -1;
	json_decref(vms);
	json_decref(replicas);
	json_decref(memory);
	json_decref(loop);
	if (rc < 0) {
		free(body);
		return respond_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR,
				    "cannot format the metrics (out of memory)\n");
	}
	return respond(conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", body, len);
}

/* /primary and /replica: the VM from ?vm= or the path's last part. */
static enum MHD_Result serve_health(struct http_endpoint *h, struct MHD_Connection *conn,
				    bool primary, const char *rest)
{
	const char *name = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "vm");
	char why[256];
	bool ok;

	if (!name || !name[0])
		name = rest[0] == '/' ? rest + 1 : rest;
	if (!name[0])
		return respond_text(conn, MHD_HTTP_BAD_REQUEST,
				    "name the VM: /%s?vm=NAME or /%s/NAME\n",
				    primary ? "primary" : "replica", primary ? "primary" : "replica");
	if (primary) {
		json_t *vms = vm_registry_status_json(h->vms);
		ok = metrics_health_primary(vms, name, why, sizeof(why));
		json_decref(vms);
	} else {
		json_t *replicas = replicas_json(h);
		ok = metrics_health_replica(replicas, name, why, sizeof(why));
		json_decref(replicas);
	}
	return respond_text(conn, ok ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, "%s\n", why);
}

static bool has_prefix(const char *url, const char *word, const char **rest)
{
	size_t n = strlen(word);

	if (strncmp(url, word, n) || (url[n] && url[n] != '/'))
		return false;
	*rest = url + n;
	return true;
}

/* A GET has no body: every request is answered on its first call. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
				  const char *method, const char *version,
				  const char *upload_data, size_t *upload_data_size,
				  void **con_cls)
{
	struct http_endpoint *h = cls;
	const char *rest;

	if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
		return respond_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "GET only\n");
	if (!strcmp(url, "/metrics"))
		return serve_metrics(h, conn);
	if (has_prefix(url, "/primary", &rest))
		return serve_health(h, conn, true, rest);
	if (has_prefix(url, "/replica", &rest))
		return serve_health(h, conn, false, rest);
	return respond_text(conn, MHD_HTTP_NOT_FOUND,
			    "not found; try /metrics, /primary?vm=NAME, /replica?vm=NAME\n");
}

struct http_endpoint *http_endpoint_create(event_loop *loop, const char *addr,
					   const struct vm_registry *vms,
					   const struct replication_server *replication,
					   char *err, size_t errlen)
{
	struct http_endpoint *h = calloc(1, sizeof(*h));
	char why[256];

	if (!h) {
		snprintf(err, errlen, "http: out of memory");
		return NULL;
	}
	h->loop = loop;
	h->vms = vms;
	h->replication = replication;
	/* Our own listener: the same ADDR:PORT parsing and errors as --listen's. */
	int fd = inet_listen(addr, why, sizeof(why));
	if (fd < 0) {
		snprintf(err, errlen, "--http %s: %s", addr, why);
		free(h);
		return NULL;
	}
	h->port = inet_local_port(fd);
	/* No MHD_USE_INTERNAL_POLLING_THREAD: external mode, nothing runs but MHD_run(). */
	h->mhd = MHD_start_daemon(MHD_USE_EPOLL | MHD_USE_ERROR_LOG, 0, NULL, NULL,
				  on_request, h,
				  /* first, or MHD logs the options before it to stderr */
				  MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
				  MHD_OPTION_LISTEN_SOCKET, fd,
				  MHD_OPTION_CONNECTION_LIMIT, (unsigned)HTTP_MAX_CONNECTIONS,
				  MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)HTTP_CONNECTION_TIMEOUT_S,
				  MHD_OPTION_END);
	if (!h->mhd) {
		snprintf(err, errlen, "--http %s: libmicrohttpd would not start", addr);
		close(fd);
		free(h);
		return NULL;
	}
	const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_EPOLL_FD);
	h->epoll_fd = info ? info->epoll_fd : -1;
	if (h->epoll_fd < 0 ||
	    event_loop_watch(loop, h->epoll_fd, EV_READABLE, on_epoll_readable, h) < 0) {
		snprintf(err, errlen, "--http %s: cannot watch libmicrohttpd's epoll fd", addr);
		MHD_stop_daemon(h->mhd);
		free(h);
		return NULL;
	}
	turn(h);
	log_info("http: /metrics, /primary, /replica on %s (port %u)", addr, (unsigned)h->port);
	return h;
}

uint16_t http_endpoint_port(const struct http_endpoint *h)
{
	return h->port;
}

void http_endpoint_destroy(struct http_endpoint *h)
{
	if (!h)
		return;
	if (h->timer)
		event_loop_del_timer(h->loop, h->timer);
	event_loop_unwatch(h->loop, h->epoll_fd);
	MHD_stop_daemon(h->mhd); /* closes the listener and every connection */
	free(h);
}
