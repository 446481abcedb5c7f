/*
 * The daemon's HTTP endpoint (--http ADDR:PORT): GET /metrics (Prometheus
 * text), /primary?vm=NAME and /replica?vm=NAME (or /primary/NAME,
 * /replica/NAME): 200 or 503 for load balancers, as Patroni's REST API
 * answers.  docs/operations.md documents it.
 *
 * libmicrohttpd parses HTTP; it runs in external mode on the daemon's own
 * loop, with no thread of its own: its epoll fd is watched here, MHD_run()
 * never waits, and a timer serves its connection timeouts.  So a request
 * reads the daemon's state on the thread that owns it, and a slow or
 * stuck client costs a socket, never the loop.
 */
#ifndef REMUSDB_HTTP_ENDPOINT_H
#define REMUSDB_HTTP_ENDPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "base/event_loop.h"

struct vm_registry;
struct replication_server;
struct http_endpoint;

/* addr is "ADDR:PORT" (port 0 picks one); NULL with a message in err. */
struct http_endpoint *http_endpoint_create(event_loop *loop, const char *addr,
					   const struct vm_registry *vms,
					   const struct replication_server *replication,
					   char *err, size_t errlen);
uint16_t http_endpoint_port(const struct http_endpoint *h);
void http_endpoint_destroy(struct http_endpoint *h);

#endif
