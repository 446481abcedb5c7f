/* Durable per-VM files in the state directory (state_file.h). */
#include "base/state_file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/fs_util.h"

/* Makes a rename or unlink in dir durable: without it the directory entry
 * may still name the old file after a power cut. */
static void sync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (fd >= 0) {
		fsync(fd);
		close(fd);
	}
}

int state_file_replace(const char *dir, const char *file_name, const char *text, char *err,
		       size_t errlen)
{
	char path[PATH_MAX], tmp[PATH_MAX];

	if (snprintf(path, sizeof(path), "%s/%s", dir, file_name) >= (int)sizeof(path) ||
	    snprintf(tmp, sizeof(tmp), "%s/.%s.tmp", dir, file_name) >= (int)sizeof(tmp)) {
		snprintf(err, errlen, "state directory path too long");
		return -1;
	}
	if (mkdir_p(dir) < 0) {
		snprintf(err, errlen, "cannot create %.200s: %s", dir, strerror(errno));
		return -1;
	}
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || pwrite_all(fd, text, strlen(text), 0) < 0 || fsync(fd) < 0) {
		snprintf(err, errlen, "cannot write %.200s: %s", tmp, strerror(errno));
		if (fd >= 0)
			close(fd);
		unlink(tmp);
		return -1;
	}
	if (close(fd) < 0 || rename(tmp, path) < 0) {
		snprintf(err, errlen, "cannot write %.200s: %s", path, strerror(errno));
		unlink(tmp);
		return -1;
	}
	sync_dir(dir);
	return 0;
}

int state_file_remove(const char *dir, const char *file_name, char *err, size_t errlen)
{
	char path[PATH_MAX];

	if (snprintf(path, sizeof(path), "%s/%s", dir, file_name) >= (int)sizeof(path)) {
		snprintf(err, errlen, "state directory path too long");
		return -1;
	}
	if (unlink(path) < 0 && errno != ENOENT) {
		snprintf(err, errlen, "cannot delete %.200s: %s", path, strerror(errno));
		return -1;
	}
	sync_dir(dir);
	return 0;
}

void state_file_each_json(const char *dir,
			  void (*visit)(const char *stem, const char *path, void *data),
			  void *data)
{
	DIR *d = opendir(dir);
	struct dirent *e;

	if (!d)
		return;
	while ((e = readdir(d))) {
		char stem[NAME_MAX + 1], path[PATH_MAX];
		size_t n = strlen(e->d_name);

		if (e->d_name[0] == '.' || n < 6 || strcmp(e->d_name + n - 5, ".json") != 0)
			continue;
		if (snprintf(path, sizeof(path), "%s/%s", dir, e->d_name) >= (int)sizeof(path))
			continue;
		memcpy(stem, e->d_name, n - 5);
		stem[n - 5] = '\0';
		visit(stem, path, data);
	}
	closedir(d);
}
