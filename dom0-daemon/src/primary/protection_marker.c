/* The marker of a protected VM that a restarted daemon acts on (protection_marker.h). */
#include "primary/protection_marker.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"

static int marker_path(char *out, size_t len, const char *state_dir, const char *vm)
{
	return snprintf(out, len, "%s/protected/%s.json", state_dir, vm) < (int)len ? 0 : -1;
}

int protection_marker_save(const char *state_dir, const struct protection_marker *m,
			   char *err, size_t errlen)
{
	char dir[PATH_MAX], path[PATH_MAX], tmp[PATH_MAX + 8];

	if (snprintf(dir, sizeof(dir), "%s/protected", state_dir) >= (int)sizeof(dir) ||
	    marker_path(path, sizeof(path), state_dir, m->vm) < 0) {
		snprintf(err, errlen, "state directory path too long");
		return -1;
	}
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
		snprintf(err, errlen, "cannot create %.200s: %s", dir, strerror(errno));
		return -1;
	}
	json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:I}", "vm", m->vm, "backup", m->backup,
			      "ownership", m->ownership.raw, "owner", m->ownership.owner,
			      "generation", (json_int_t)m->ownership.generation);
	int rc = o ? json_dump_file(o, tmp, JSON_COMPACT) : -1;
	json_decref(o);
	if (rc < 0 || rename(tmp, path) < 0) {
		snprintf(err, errlen, "cannot write %.200s: %s", path, strerror(errno));
		unlink(tmp);
		return -1;
	}
	return 0;
}

void protection_marker_delete(const char *state_dir, const char *vm)
{
	char path[PATH_MAX];

	if (marker_path(path, sizeof(path), state_dir, vm) == 0 && unlink(path) < 0 &&
	    errno != ENOENT)
		log_warn("vm %s: cannot remove %s: %s", vm, path, strerror(errno));
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

void protection_marker_load_all(const char *state_dir,
				void (*visit)(const struct protection_marker *m, void *data),
				void *data)
{
	char dir[PATH_MAX];
	DIR *d;
	struct dirent *e;

	if (snprintf(dir, sizeof(dir), "%s/protected", state_dir) >= (int)sizeof(dir))
		return;
	d = opendir(dir);
	if (!d)
		return;
	while ((e = readdir(d))) {
		char path[PATH_MAX + 256];
		size_t n = strlen(e->d_name);
		struct protection_marker m;

		if (n < 6 || strcmp(e->d_name + n - 5, ".json") != 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		json_t *o = json_load_file(path, 0, NULL);
		if (!o || marker_from_json(o, &m) < 0)
			log_error("protection marker %s is unreadable; ignoring it", path);
		else
			visit(&m, data);
		json_decref(o);
	}
	closedir(d);
}
