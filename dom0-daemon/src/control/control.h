/*
 * The control socket: newline-delimited JSON requests, one JSON line in
 * reply to each.  Requests are {"cmd": "...", ...}; replies are
 * {"ok": true, ...} or {"ok": false, "error": "..."}.  A bad request gets
 * an error reply and the connection stays usable.  Commands:
 *   ping                          -> host, pid, version
 *   status [vm]                   -> vms: [...]  or  vm: {...}
 *   vm-add name disk nbd_socket [net_socket tap bridge mac qmp_socket]
 *                                 -> vm: {...}
 *   vm-remove vm                  -> {}
 *   shutdown                      -> {}, then the daemon stops
 *   protect vm backup interval_ms qemu_argv run_dir [output_commit]
 *                                 -> protection: {...} (then asynchronous)
 *   unprotect vm                  -> protection: {...}
 *   failover vm                   -> {} (takeover on the backup, asynchronous)
 * A request's "id" member, if any, is echoed in the reply.
 */
#ifndef REMUSDB_CONTROL_H
#define REMUSDB_CONTROL_H

#include <jansson.h>

#include "base/event_loop.h"
#include "wire/repl_settings.h"
#include "vm/vm.h"

struct replication_server;

struct control_server;

struct control_config {
	const char *socket_path;
	const char *host;    /* reported by ping */
	struct vm_registry *vms;
	/* Replication; NULL/absent when not configured. */
	const struct repl_settings *repl;
	struct replication_server *replication;
	/* Forks (vm_fork.h). */
	const struct fork_settings *forks;
	/* Called after the reply to `shutdown` was queued. */
	void (*on_shutdown)(void *data);
	void *shutdown_data;
};

/* Listens (a stale socket file is replaced).  NULL on error (logged). */
struct control_server *control_create(event_loop *loop,
				      const struct control_config *config);
/* Closes every client and removes the socket file. */
void control_destroy(struct control_server *control);

/*
 * Executes one request object and returns the reply (new reference).
 * Exposed so that tests can run commands without a socket.
 */
json_t *control_execute(struct control_server *control, json_t *request);

#endif
