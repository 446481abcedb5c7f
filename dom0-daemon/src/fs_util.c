#include "fs_util.h"

#include <errno.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>

int mkdir_p(const char *path)
{
	char buf[PATH_MAX];

	if (strlen(path) >= sizeof(buf)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	strcpy(buf, path);
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(buf, 0755) < 0 && errno != EEXIST)
			return -1;
		*p = '/';
	}
	if (mkdir(buf, 0755) < 0 && errno != EEXIST)
		return -1;
	return 0;
}

int mkdir_parent(const char *path)
{
	char buf[PATH_MAX];

	if (strlen(path) >= sizeof(buf)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	strcpy(buf, path);
	char *slash = strrchr(buf, '/');
	if (!slash || slash == buf)
		return 0; /* relative name in the cwd, or directly under / */
	*slash = '\0';
	return mkdir_p(buf);
}
