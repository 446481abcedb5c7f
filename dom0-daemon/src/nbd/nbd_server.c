/*
 * NBD server: an export's listening sockets.  It accepts each client and
 * hands it to nbd_conn.c with the protocol's step; the phases live in
 * nbd_handshake.c and nbd_transmission.c, what is served in nbd_export.c.
 *
 * Disk I/O is synchronous (pread/pwrite/fdatasync inside the event
 * handler).  That is acceptable here because each export serves one VM
 * whose QEMU waits for the reply anyway, the image lives on a local
 * filesystem where reads and writes mostly hit the page cache, and a
 * single thread gives a total order of disk operations that the
 * checkpoint code will later rely on.  The cost is that an fdatasync
 * stalls the whole loop for its duration.
 */
#include "nbd/nbd_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/inet_socket.h"
#include "nbd/nbd_conn_internal.h"
#include "nbd/nbd_proto.h"
#include "base/unix_socket.h"

#define MAX_CONNECTIONS 16

/* Runs the step of the phase c is in: the handshake's, then transmission's. */
static int serve_phase(struct nbd_conn *c)
{
	if (c->phase == PHASE_TRANSMISSION)
		return nbd_transmission_step(c);
	return nbd_handshake_step(c);
}

static void on_listen_readable(event_loop *loop, int fd, void *data, int ready)
{
	struct nbd_export *export = data;
	int tcp = fd == export->tcp_listen_fd;
	struct accept_policy *policy = tcp ? &export->tcp_accept : &export->accept;

	for (;;) {
		struct sockaddr_in peer;
		socklen_t peer_len = sizeof(peer);
		char from[64] = "";
		int conn_fd = accept_policy_accept(policy, tcp ? (struct sockaddr *)&peer : NULL,
						   tcp ? &peer_len : NULL);
		if (conn_fd < 0)
			return;
		if (tcp) {
			int one = 1;
			char ip[INET_ADDRSTRLEN] = "?";

			/* Replies are small and a client waits for each one. */
			setsockopt(conn_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
			inet_ntop(AF_INET, &peer.sin_addr, ip, sizeof(ip));
			snprintf(from, sizeof(from), " over TCP from %s:%u", ip,
				 ntohs(peer.sin_port));
		}
		if (export->stats.connections_current >= MAX_CONNECTIONS) {
			log_warn("nbd export '%s': refusing a connection, already %d open",
				 export->name, MAX_CONNECTIONS);
			close(conn_fd);
			continue;
		}
		nbd_conn_start(export, conn_fd, from, serve_phase);
	}
}

static int start_listener(struct nbd_export *export, int fd,
			  struct accept_policy *policy, const char *kind)
{
	char what[112];

	snprintf(what, sizeof(what), "nbd export '%s'%s", export->name, kind);
	if (accept_policy_start(policy, export->loop, fd, what, on_listen_readable,
				export) < 0) {
		log_error("nbd export '%s': epoll: %s", export->name, strerror(errno));
		return -1;
	}
	return 0;
}

/* The unix socket, and TCP when tcp_listen is not NULL.  -1 (logged). */
static int export_listen(struct nbd_export *export, const char *tcp_listen)
{
	char err[256];

	export->listen_fd = unix_listen(export->socket_path, err, sizeof(err));
	if (export->listen_fd < 0) {
		log_error("nbd export '%s': %s", export->name, err);
		return -1;
	}
	if (start_listener(export, export->listen_fd, &export->accept, "") < 0)
		return -1;
	if (!tcp_listen)
		return 0;
	export->tcp_listen_fd = inet_listen(tcp_listen, err, sizeof(err));
	if (export->tcp_listen_fd < 0) {
		log_error("nbd export '%s': %s", export->name, err);
		return -1;
	}
	return start_listener(export, export->tcp_listen_fd, &export->tcp_accept,
			      " (TCP)");
}

struct nbd_export *nbd_export_create(event_loop *loop, const char *name,
				     const char *socket_path,
				     const char *disk_path)
{
	struct nbd_export *export = nbd_export_open_image(loop, name, socket_path, disk_path);

	if (!export)
		return NULL;
	if (export_listen(export, NULL) < 0) {
		nbd_export_destroy(export);
		return NULL;
	}
	log_info("nbd export '%s': serving %s (%llu bytes) on %s", name, disk_path,
		 (unsigned long long)export->disk.size, socket_path);
	return export;
}

struct nbd_export *nbd_export_open_unserved(event_loop *loop, const char *name,
					    const char *disk_path)
{
	return nbd_export_open_image(loop, name, "", disk_path);
}

struct nbd_export *nbd_export_create_read_only(event_loop *loop, const char *name,
					       const char *socket_path,
					       const char *tcp_listen,
					       const struct nbd_read_backend *backend)
{
	struct nbd_export *export = nbd_export_alloc(loop, name, socket_path);

	if (!export)
		return NULL;
	export->read_only = true;
	/* Nothing changes a frozen view: every connection reads the same. */
	export->transmission_flags = NBD_FLAG_HAS_FLAGS | NBD_FLAG_READ_ONLY |
				     NBD_FLAG_SEND_FLUSH | NBD_FLAG_CAN_MULTI_CONN;
	export->disk.size = backend->size;
	export->disk.path = strdup(backend->what);
	if (!export->disk.path) {
		log_error("nbd export '%s': out of memory", name);
		goto fail;
	}
	if (export_listen(export, tcp_listen) < 0)
		goto fail;
	/* Only now: a failed creation must not call release(). */
	export->backend = *backend;
	export->backend.what = export->disk.path;
	char tcp[48] = "";
	if (tcp_listen)
		snprintf(tcp, sizeof(tcp), " and TCP port %u", nbd_export_tcp_port(export));
	log_info("nbd export '%s': serving %s (%llu bytes, read-only) on %s%s", name,
		 export->disk.path, (unsigned long long)export->disk.size, socket_path, tcp);
	return export;
fail:
	nbd_export_destroy(export);
	return NULL;
}

void nbd_export_destroy(struct nbd_export *export)
{
	if (!export)
		return;
	nbd_export_detach_hooks(export);
	while (export->conns)
		nbd_conn_close(export->conns);
	if (export->listen_fd >= 0) {
		accept_policy_stop(&export->accept);
		close(export->listen_fd);
		/* Ours only if we listened on it: a refused path is left alone. */
		unlink(export->socket_path);
	}
	if (export->tcp_listen_fd >= 0) {
		accept_policy_stop(&export->tcp_accept);
		close(export->tcp_listen_fd);
	}
	nbd_export_free(export);
}

uint16_t nbd_export_tcp_port(const struct nbd_export *export)
{
	return export->tcp_listen_fd >= 0 ? inet_local_port(export->tcp_listen_fd) : 0;
}
