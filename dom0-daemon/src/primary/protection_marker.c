/* The marker of a protected VM that a restarted daemon acts on (protection_marker.h). */
#include "primary/protection_marker.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/state_file.h"

static int marker_dir(char *out, size_t len, const char *state_dir)
{
	return snprintf(out, len, "%s/protected", state_dir) < (int)len ? 0 : -1;
}

int protection_marker_save(const char *state_dir, const struct protection_marker *m,
			   char *err, size_t errlen)
{
	char dir[PATH_MAX], file_name[sizeof(m->vm) + 8];

	if (marker_dir(dir, sizeof(dir), state_dir) < 0) {
		snprintf(err, errlen, "state directory path too long");
		return -1;
	}
	snprintf(file_name, sizeof(file_name), "%s.json", m->vm);
	json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:I}", "vm", m->vm, "backup", m->backup,
			      "ownership", m->ownership.raw, "owner", m->ownership.owner,
			      "generation", (json_int_t)m->ownership.generation);
	char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	if (!text) {
		snprintf(err, errlen, "cannot write the protection marker of %s: out of memory",
			 m->vm);
		return -1;
	}
	int rc = state_file_replace(dir, file_name, text, err, errlen);
	free(text);
	return rc;
}

void protection_marker_delete(const char *state_dir, const char *vm)
{
	char dir[PATH_MAX], file_name[NAME_MAX + 1], err[256];

	if (marker_dir(dir, sizeof(dir), state_dir) < 0 ||
	    snprintf(file_name, sizeof(file_name), "%s.json", vm) >= (int)sizeof(file_name))
		return;
	if (state_file_remove(dir, file_name, err, sizeof(err)) < 0)
		log_warn("vm %s: %s", vm, err);
}

static int marker_from_json(const json_t *o, struct protection_marker *m)
{
	const char *vm = json_string_value(json_object_get(o, "vm"));
	const char *backup = json_string_value(json_object_get(o, "backup"));
	const char *raw = json_string_value(json_object_get(o, "ownership"));
	const char *owner = json_string_value(json_object_get(o, "owner"));
	json_t *gen = json_object_get(o, "generation");

	if (!vm || !backup || !raw || !owner || !json_is_integer(gen) ||
	    strlen(vm) >= sizeof(m->vm) || strlen(backup) >= sizeof(m->backup) ||
	    strlen(raw) >= sizeof(m->ownership.raw) ||
	    strlen(owner) >= sizeof(m->ownership.owner))
		return -1;
	memset(m, 0, sizeof(*m));
	strcpy(m->vm, vm);
	strcpy(m->backup, backup);
	strcpy(m->ownership.raw, raw);
	strcpy(m->ownership.owner, owner);
	m->ownership.generation = (uint64_t)json_integer_value(gen);
	m->ownership.exists = true;
	return 0;
}

struct load_visit {
	void (*visit)(const struct protection_marker *m, void *data);
	void *data;
};

static void load_marker_file(const char *stem, const char *path, void *data)
{
	struct load_visit *load = data;
	struct protection_marker m;
	json_t *o = json_load_file(path, 0, NULL);

	(void)stem;
	if (!o || marker_from_json(o, &m) < 0)
		log_error("protection marker %s is unreadable; ignoring it", path);
	else
		load->visit(&m, load->data);
	json_decref(o);
}

void protection_marker_load_all(const char *state_dir,
				void (*visit)(const struct protection_marker *m, void *data),
				void *data)
{
	char dir[PATH_MAX];
	struct load_visit load = { visit, data };

	if (marker_dir(dir, sizeof(dir), state_dir) == 0)
		state_file_each_json(dir, load_marker_file, &load);
}
