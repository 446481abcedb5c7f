/* The protect settings a restarted daemon re-protects with (protect_settings.h). */
#include "primary/protect_settings.h"

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

#define SETTINGS_DIR "protect-settings"
#define ARGV_MAX 4096

/* The members, in the order the file is written and checked. */
static const char *const members[] = {
	"format", "version", "vm", "backup", "interval_ms", "output_commit",
	"unsafe_release_early", "compress", "read_tracking", "commit_protection",
	"cp_dscp", "debug_resync_omit_extent", "run_dir", "qemu_argv", NULL,
};

char *protect_settings_format(const char *vm, const struct protect_request *req)
{
	json_t *argv = req->qemu_argv ? json_deep_copy(req->qemu_argv) : json_null();
	json_t *o = argv ? json_pack(
		"{s:s, s:i, s:s, s:s, s:I, s:b, s:b, s:b, s:b, s:b, s:I, s:b, s:s, s:o}",
		"format", PROTECT_SETTINGS_FORMAT, "version", PROTECT_SETTINGS_VERSION,
		"vm", vm, "backup", req->backup, "interval_ms", (json_int_t)req->interval_ms,
		"output_commit", req->output_commit,
		"unsafe_release_early", req->unsafe_release_early, "compress", req->compress,
		"read_tracking", req->read_tracking, "commit_protection", req->commit_protection,
		"cp_dscp", (json_int_t)req->cp_dscp,
		"debug_resync_omit_extent", req->debug_resync_omit_extent,
		"run_dir", req->run_dir, "qemu_argv", argv) : NULL;
	char *text = o ? json_dumps(o, JSON_INDENT(1) | JSON_PRESERVE_ORDER) : NULL;

	json_decref(o);
	return text;
}

static bool name_ok(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > VM_NAME_MAX)
		return false;
	for (; *s; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
		      (*s >= '0' && *s <= '9') || *s == '_' || *s == '-'))
			return false;
	return true;
}

static int bad(char *err, size_t errlen, const char *fmt, const char *what)
{
	snprintf(err, errlen, fmt, what);
	return -1;
}

static int get_bool(const json_t *o, const char *key, bool *out, char *err, size_t errlen)
{
	json_t *v = json_object_get(o, key);

	if (!json_is_boolean(v))
		return bad(err, errlen, "member %s must be true or false", key);
	*out = json_is_true(v);
	return 0;
}

static int get_uint(const json_t *o, const char *key, json_int_t lo, json_int_t hi,
		    unsigned *out, char *err, size_t errlen)
{
	json_t *v = json_object_get(o, key);

	if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
		snprintf(err, errlen, "member %s must be an integer in %lld..%lld", key,
			 (long long)lo, (long long)hi);
		return -1;
	}
	*out = (unsigned)json_integer_value(v);
	return 0;
}

/* The string member key, shorter than cap and non-empty. */
static int get_string(const json_t *o, const char *key, size_t cap, const char **out,
		      char *err, size_t errlen)
{
	json_t *v = json_object_get(o, key);

	if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) >= cap) {
		snprintf(err, errlen, "member %s must be a string of 1..%zu bytes", key, cap - 1);
		return -1;
	}
	*out = json_string_value(v);
	return 0;
}

static int check_members(const json_t *o, char *err, size_t errlen)
{
	const char *key;
	json_t *v;

	for (size_t i = 0; members[i]; i++)
		if (!json_object_get(o, members[i]))
			return bad(err, errlen, "member %s is missing", members[i]);
	json_object_foreach((json_t *)o, key, v) {
		size_t i = 0;
		while (members[i] && strcmp(members[i], key) != 0)
			i++;
		if (!members[i])
			return bad(err, errlen, "unknown member %.40s", key);
	}
	return 0;
}

static int check_argv(const json_t *argv, char *err, size_t errlen)
{
	size_t i;
	json_t *a;

	if (json_is_null(argv))
		return 0;
	if (!json_is_array(argv) || json_array_size(argv) == 0 || json_array_size(argv) > ARGV_MAX)
		return bad(err, errlen, "member %s must be null or an array of 1..4096 strings",
			   "qemu_argv");
	json_array_foreach(argv, i, a)
		if (!json_is_string(a))
			return bad(err, errlen, "member %s must hold strings only", "qemu_argv");
	return 0;
}

static int from_object(const json_t *o, char vm[VM_NAME_MAX + 1], struct protect_request *req,
		       char *err, size_t errlen)
{
	const char *format, *name, *backup, *run_dir;
	unsigned version;

	if (!json_is_object(o))
		return bad(err, errlen, "%s", "not a JSON object");
	if (check_members(o, err, errlen) < 0)
		return -1;
	if (get_string(o, "format", 64, &format, err, errlen) < 0)
		return -1;
	if (strcmp(format, PROTECT_SETTINGS_FORMAT) != 0)
		return bad(err, errlen, "format is not %s", PROTECT_SETTINGS_FORMAT);
	if (get_uint(o, "version", 1, 65535, &version, err, errlen) < 0)
		return -1;
	if (version != PROTECT_SETTINGS_VERSION) {
		snprintf(err, errlen, "version %u: this remusdbd reads version %d only", version,
			 PROTECT_SETTINGS_VERSION);
		return -1;
	}
	if (get_string(o, "vm", VM_NAME_MAX + 1, &name, err, errlen) < 0)
		return -1;
	if (!name_ok(name))
		return bad(err, errlen, "%s", "member vm is not a VM name (letters, digits, "
			   "'_' and '-')");
	if (get_string(o, "backup", sizeof(req->backup), &backup, err, errlen) < 0 ||
	    get_string(o, "run_dir", sizeof(req->run_dir), &run_dir, err, errlen) < 0)
		return -1;
	if (run_dir[0] != '/')
		return bad(err, errlen, "%s", "member run_dir must be an absolute path");
	if (get_uint(o, "interval_ms", PROTECTION_MIN_INTERVAL_MS, PROTECTION_MAX_INTERVAL_MS,
		     &req->interval_ms, err, errlen) < 0 ||
	    get_uint(o, "cp_dscp", 0, 63, &req->cp_dscp, err, errlen) < 0 ||
	    get_bool(o, "output_commit", &req->output_commit, err, errlen) < 0 ||
	    get_bool(o, "unsafe_release_early", &req->unsafe_release_early, err, errlen) < 0 ||
	    get_bool(o, "compress", &req->compress, err, errlen) < 0 ||
	    get_bool(o, "read_tracking", &req->read_tracking, err, errlen) < 0 ||
	    get_bool(o, "commit_protection", &req->commit_protection, err, errlen) < 0 ||
	    get_bool(o, "debug_resync_omit_extent", &req->debug_resync_omit_extent, err,
		     errlen) < 0)
		return -1;
	json_t *argv = json_object_get(o, "qemu_argv");
	if (check_argv(argv, err, errlen) < 0)
		return -1;
	snprintf(vm, VM_NAME_MAX + 1, "%s", name);
	snprintf(req->backup, sizeof(req->backup), "%s", backup);
	snprintf(req->run_dir, sizeof(req->run_dir), "%s", run_dir);
	req->qemu_argv = json_is_null(argv) ? NULL : json_deep_copy(argv);
	if (!json_is_null(argv) && !req->qemu_argv)
		return bad(err, errlen, "%s", "out of memory");
	return 0;
}

int protect_settings_parse(const char *text, size_t len, char vm[VM_NAME_MAX + 1],
			   struct protect_request *req, char *err, size_t errlen)
{
	json_error_t je;

	memset(req, 0, sizeof(*req));
	vm[0] = '\0';
	if (len > PROTECT_SETTINGS_MAX_BYTES) {
		snprintf(err, errlen, "%zu bytes: longer than %u", len, PROTECT_SETTINGS_MAX_BYTES);
		return -1;
	}
	json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
	if (!o) {
		snprintf(err, errlen, "not JSON: %s (line %d)", je.text, je.line);
		return -1;
	}
	int rc = from_object(o, vm, req, err, errlen);
	json_decref(o);
	if (rc < 0) {
		memset(req, 0, sizeof(*req));
		vm[0] = '\0';
	}
	return rc;
}

static int settings_path(char *out, size_t len, const char *state_dir, const char *vm)
{
	return snprintf(out, len, "%s/" SETTINGS_DIR "/%s.json", state_dir, vm) < (int)len ? 0
											 : -1;
}

static int settings_dir(char *out, size_t len, const char *state_dir)
{
	return snprintf(out, len, "%s/" SETTINGS_DIR, state_dir) < (int)len ? 0 : -1;
}

int protect_settings_save(const char *state_dir, const char *vm,
			  const struct protect_request *req, char *err, size_t errlen)
{
	char dir[PATH_MAX], file_name[VM_NAME_MAX + 8];

	if (settings_dir(dir, sizeof(dir), state_dir) < 0) {
		snprintf(err, errlen, "state directory path too long");
		return -1;
	}
	snprintf(file_name, sizeof(file_name), "%.*s.json", VM_NAME_MAX, vm);
	char *text = protect_settings_format(vm, req);
	if (!text) {
		snprintf(err, errlen, "cannot write the protect settings of %s: out of memory", vm);
		return -1;
	}
	int rc = state_file_replace(dir, file_name, text, err, errlen);
	free(text);
	return rc;
}

int protect_settings_load(const char *state_dir, const char *vm, struct protect_request *req,
			  char *err, size_t errlen)
{
	char path[PATH_MAX], name[VM_NAME_MAX + 1], why[256];
	static char text[PROTECT_SETTINGS_MAX_BYTES + 1];

	memset(req, 0, sizeof(*req));
	if (settings_path(path, sizeof(path), state_dir, vm) < 0) {
		snprintf(err, errlen, "state directory path too long");
		return -1;
	}
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT)
		return 0;
	if (fd < 0) {
		snprintf(err, errlen, "cannot open %.200s: %s", path, strerror(errno));
		return -1;
	}
	ssize_t n = read_full(fd, text, sizeof(text));
	int e = errno;
	close(fd);
	if (n < 0) {
		snprintf(err, errlen, "cannot read %.200s: %s", path, strerror(e));
		return -1;
	}
	if (protect_settings_parse(text, (size_t)n, name, req, why, sizeof(why)) < 0) {
		snprintf(err, errlen, "%.200s: %s", path, why);
		return -1;
	}
	if (strcmp(name, vm) != 0) {
		json_decref(req->qemu_argv);
		memset(req, 0, sizeof(*req));
		snprintf(err, errlen, "%.200s: member vm names %s, not %s", path, name, vm);
		return -1;
	}
	return 1;
}

void protect_settings_delete(const char *state_dir, const char *vm)
{
	char dir[PATH_MAX], file_name[VM_NAME_MAX + 8], err[256];

	if (settings_dir(dir, sizeof(dir), state_dir) < 0)
		return;
	snprintf(file_name, sizeof(file_name), "%.*s.json", VM_NAME_MAX, vm);
	if (state_file_remove(dir, file_name, err, sizeof(err)) < 0)
		log_warn("vm %s: %s", vm, err);
}

struct each_visit {
	void (*visit)(const char *vm, void *data);
	void *data;
};

static void visit_settings_file(const char *stem, const char *path, void *data)
{
	struct each_visit *each = data;

	(void)path;
	if (strlen(stem) <= VM_NAME_MAX)
		each->visit(stem, each->data);
}

void protect_settings_each(const char *state_dir, void (*visit)(const char *vm, void *data),
			   void *data)
{
	char dir[PATH_MAX];
	struct each_visit each = { visit, data };

	if (settings_dir(dir, sizeof(dir), state_dir) == 0)
		state_file_each_json(dir, visit_settings_file, &each);
}
