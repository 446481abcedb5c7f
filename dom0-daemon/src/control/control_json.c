/*
 * The control socket's reply builders and request checks, shared by every
 * command so that all of them answer in the same shape: {"ok": true, ...}
 * or {"ok": false, "error": "..."} (control.h).
 */
#include "control/control_json.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

json_t *error_reply(const char *fmt, ...)
{
	char text[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	return json_pack("{s:b, s:s}", "ok", 0, "error", text);
}

json_t *ok_reply(void)
{
	return json_pack("{s:b}", "ok", 1);
}

/* Rejects members other than the listed ones, naming the first offender. */
json_t *check_members(json_t *request, const char *const *allowed)
{
	const char *key;
	json_t *value;

	json_object_foreach(request, key, value) {
		int known = !strcmp(key, "cmd") || !strcmp(key, "id");
		for (const char *const *a = allowed; *a && !known; a++)
			known = !strcmp(key, *a);
		if (!known)
			return error_reply("unknown field '%.40s' for this command", key);
	}
	return NULL;
}

json_t *string_member(json_t *request, const char *key, const char **out)
{
	json_t *value = json_object_get(request, key);

	if (!value)
		return error_reply("missing field '%s'", key);
	if (!json_is_string(value))
		return error_reply("field '%s' must be a string", key);
	*out = json_string_value(value);
	return NULL;
}
