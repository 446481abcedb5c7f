/* Persistence of VM definitions, one JSON file each (vm_store.h). */
#include "vm/vm_store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fs_util.h"
#include "base/log.h"

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

/* Makes a rename or unlink in dir durable. */
static void sync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (fd >= 0) {
		fsync(fd);
		close(fd);
	}
}

static int write_all(int fd, const char *text, size_t len)
{
	while (len > 0) {
		ssize_t n = write(fd, text, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		text += n;
		len -= (size_t)n;
	}
	return 0;
}

int vm_store_save(const char *vms_dir, const struct vm_definition *def, char *err,
		  size_t errlen)
{
	char path[PATH_MAX], tmp[PATH_MAX];
	json_t *obj = vm_definition_to_json(def);
	char *text = NULL;
	int fd = -1;

	snprintf(path, sizeof(path), "%s/%s.json", vms_dir, def->name);
	snprintf(tmp, sizeof(tmp), "%s/.%s.json.tmp", vms_dir, def->name);
	if (!obj || json_object_set_new(obj, "format", json_integer(STORE_FORMAT)) < 0 ||
	    !(text = json_dumps(obj, JSON_INDENT(2) | JSON_SORT_KEYS))) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0 || write_all(fd, text, strlen(text)) < 0 ||
	    write_all(fd, "\n", 1) < 0 || fsync(fd) < 0) {
		snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
		goto fail;
	}
	close(fd);
	fd = -1;
	if (rename(tmp, path) < 0) {
		snprintf(err, errlen, "cannot rename %s to %s: %s", tmp, path,
			 strerror(errno));
		goto fail;
	}
	sync_dir(vms_dir);
	free(text);
	json_decref(obj);
	return 0;
fail:
	if (fd >= 0)
		close(fd);
	unlink(tmp);
	free(text);
	json_decref(obj);
	return -1;
}

int vm_store_delete(const char *vms_dir, const char *name, char *err,
		    size_t errlen)
{
	char path[PATH_MAX];

	snprintf(path, sizeof(path), "%s/%s.json", vms_dir, name);
	if (unlink(path) < 0 && errno != ENOENT) {
		snprintf(err, errlen, "cannot delete %s: %s", path, strerror(errno));
		return -1;
	}
	sync_dir(vms_dir);
	return 0;
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
