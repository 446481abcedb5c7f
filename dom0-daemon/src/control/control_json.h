/*
 * Reply builders and request checks for the control socket's commands
 * (control_json.c), so every command answers in the same shape.
 */
#ifndef REMUSDB_CONTROL_JSON_H
#define REMUSDB_CONTROL_JSON_H

#include <jansson.h>

/* {"ok": false, "error": <the formatted text>}. */
__attribute__((format(printf, 1, 2))) json_t *error_reply(const char *fmt, ...);
/* {"ok": true}. */
json_t *ok_reply(void);
/* Rejects members other than cmd, id and the NULL-terminated allowed list. */
json_t *check_members(json_t *request, const char *const *allowed);
/* NULL and *out set, or an error reply. */
json_t *string_member(json_t *request, const char *key, const char **out);

#endif
