/*
 * Shared by the control socket's command files: reply builders and
 * request checks, so every command answers in the same shape.
 */
#ifndef REMUSDB_CONTROL_INTERNAL_H
#define REMUSDB_CONTROL_INTERNAL_H

#include <jansson.h>

#include "control/control.h"

__attribute__((format(printf, 1, 2))) json_t *error_reply(const char *fmt, ...);
json_t *ok_reply(void);
/* Rejects members other than cmd, id and the NULL-terminated allowed list. */
json_t *check_members(json_t *request, const char *const *allowed);
/* NULL and *out set, or an error reply. */
json_t *string_member(json_t *request, const char *key, const char **out);

/* control_replication.c */
json_t *cmd_protect(struct control_server *control, json_t *request);
json_t *cmd_unprotect(struct control_server *control, json_t *request);
json_t *cmd_failover(struct control_server *control, json_t *request);
json_t *cmd_reset_stats(struct control_server *control, json_t *request);
json_t *cmd_hold_checkpoint(struct control_server *control, json_t *request);
json_t *cmd_release_checkpoint(struct control_server *control, json_t *request);
json_t *cmd_image_checksums(struct control_server *control, json_t *request);
json_t *cmd_forget(struct control_server *control, json_t *request);
/* control_fork.c */
json_t *cmd_fork_start(struct control_server *control, json_t *request);
json_t *cmd_fork_serve(struct control_server *control, json_t *request);
json_t *cmd_fork_release(struct control_server *control, json_t *request);
json_t *cmd_vm_release(struct control_server *control, json_t *request);
/* The server's config, for the command files. */
const struct control_config *control_get_config(const struct control_server *control);
event_loop *control_get_loop(const struct control_server *control);

#endif
