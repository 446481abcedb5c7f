/* Persistence of VM definitions, one JSON file each (vm_store.h). */
#include "vm/vm_store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fs_util.h"
#include "base/log.h"
#include "base/state_file.h"

/* Bumped when the file layout changes incompatibly. */
#define STORE_FORMAT 1

char *vm_store_open(const char *state_dir, char *err, size_t errlen)
{
	char *dir = NULL;

	if (asprintf(&dir, "%s/vms", state_dir) < 0) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	if (mkdir_p(dir) < 0) {
		snprintf(err, errlen, "cannot create state directory %s: %s", dir,
			 strerror(errno));
		free(dir);
		return NULL;
	}
	return dir;
}

int vm_store_save(const char *vms_dir, const struct vm_definition *def, char *err,
		  size_t errlen)
{
	char file_name[sizeof(def->name) + 8];
	json_t *obj = vm_definition_to_json(def);
	char *text = NULL;
	int rc = -1;

	snprintf(file_name, sizeof(file_name), "%s.json", def->name);
	if (!obj || json_object_set_new(obj, "format", json_integer(STORE_FORMAT)) < 0 ||
	    !(text = json_dumps(obj, JSON_INDENT(2) | JSON_SORT_KEYS)))
		snprintf(err, errlen, "out of memory");
	else
		rc = state_file_replace(vms_dir, file_name, text, err, errlen);
	free(text);
	json_decref(obj);
	return rc;
}

int vm_store_delete(const char *vms_dir, const char *name, char *err,
		    size_t errlen)
{
	char file_name[NAME_MAX + 1];

	if (snprintf(file_name, sizeof(file_name), "%s.json", name) >= (int)sizeof(file_name)) {
		snprintf(err, errlen, "VM name too long: %.40s...", name);
		return -1;
	}
	return state_file_remove(vms_dir, file_name, err, errlen);
}

static int has_suffix(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);

	return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int load_one(const char *path, const char *file_name,
		    struct vm_definition *def, char *err, size_t errlen)
{
	json_error_t jerr;
	json_t *obj = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
	int rc = -1;

	if (!obj) {
		snprintf(err, errlen, "line %d: %s", jerr.line, jerr.text);
		return -1;
	}
	json_t *format = json_object_get(obj, "format");
	if (!json_is_integer(format) || json_integer_value(format) != STORE_FORMAT) {
		snprintf(err, errlen, "missing or unsupported \"format\" (want %d)",
			 STORE_FORMAT);
		goto out;
	}
	json_object_del(obj, "format");
	if (vm_definition_from_json(obj, def, err, errlen) < 0 ||
	    vm_definition_validate(def, err, errlen) < 0)
		goto out;
	/* The file name is the registry key: they must agree. */
	if (strlen(file_name) != strlen(def->name) + 5 ||
	    strncmp(file_name, def->name, strlen(def->name)) != 0) {
		snprintf(err, errlen, "name '%s' does not match the file name",
			 def->name);
		goto out;
	}
	rc = 0;
out:
	json_decref(obj);
	return rc;
}

void vm_store_load_all(const char *vms_dir, vm_store_visit visit, void *data)
{
	struct dirent **entries;
	int n = scandir(vms_dir, &entries, NULL, alphasort);

	if (n < 0) {
		log_error("cannot list %s: %s; no VMs loaded", vms_dir, strerror(errno));
		return;
	}
	for (int i = 0; i < n; i++) {
		const char *file_name = entries[i]->d_name;
		char path[PATH_MAX], err[256];
		struct vm_definition def;

		snprintf(path, sizeof(path), "%s/%s", vms_dir, file_name);
		if (file_name[0] == '.' && has_suffix(file_name, ".json.tmp")) {
			/* A save interrupted before its rename: never valid. */
			log_info("removing unfinished %s", path);
			unlink(path);
		} else if (file_name[0] != '.' && has_suffix(file_name, ".json")) {
			if (load_one(path, file_name, &def, err, sizeof(err)) < 0)
				log_error("ignoring VM definition %s: %s; fix or "
					  "delete the file", path, err);
			else
				visit(&def, data);
		}
		free(entries[i]);
	}
	free(entries);
}
