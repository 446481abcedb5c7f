/*
 * Shared by the control socket's files: what a command may use of the
 * daemon (struct control_context) and the commands control.c dispatches
 * to.  The commands see no socket; their replies are built with
 * control_json.h.
 */
#ifndef REMUSDB_CONTROL_INTERNAL_H
#define REMUSDB_CONTROL_INTERNAL_H

#include <jansson.h>

#include "control/control.h"

/*
 * The daemon as the commands see it.  config's strings (socket_path,
 * host) are the server's own copies.
 */
struct control_context {
	event_loop *loop;
	struct control_config config;
};

/* control_host.c */
json_t *cmd_ping(const struct control_context *ctx, json_t *request);
json_t *cmd_status(const struct control_context *ctx, json_t *request);
json_t *cmd_vm_add(const struct control_context *ctx, json_t *request);
json_t *cmd_vm_remove(const struct control_context *ctx, json_t *request);
json_t *cmd_shutdown(const struct control_context *ctx, json_t *request);

/* control_replication.c */
json_t *cmd_protect(const struct control_context *ctx, json_t *request);
json_t *cmd_unprotect(const struct control_context *ctx, json_t *request);
json_t *cmd_failover(const struct control_context *ctx, json_t *request);
json_t *cmd_reset_stats(const struct control_context *ctx, json_t *request);
json_t *cmd_dirty_census(const struct control_context *ctx, json_t *request);
json_t *cmd_hold_checkpoint(const struct control_context *ctx, json_t *request);
json_t *cmd_release_checkpoint(const struct control_context *ctx, json_t *request);
json_t *cmd_switchover(const struct control_context *ctx, json_t *request);
json_t *cmd_switchover_cancel(const struct control_context *ctx, json_t *request);
json_t *cmd_image_checksums(const struct control_context *ctx, json_t *request);
json_t *cmd_forget(const struct control_context *ctx, json_t *request);
/* control_fork.c */
json_t *cmd_fork_start(const struct control_context *ctx, json_t *request);
json_t *cmd_fork_serve(const struct control_context *ctx, json_t *request);
json_t *cmd_fork_release(const struct control_context *ctx, json_t *request);
json_t *cmd_vm_release(const struct control_context *ctx, json_t *request);

#endif
