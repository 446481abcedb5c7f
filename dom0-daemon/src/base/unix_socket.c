/* Unix stream socket helpers (unix_socket.h). */
#include "base/unix_socket.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/fs_util.h"

static int fill_address(struct sockaddr_un *addr, const char *path)
{
	memset(addr, 0, sizeof(*addr));
	addr->sun_family = AF_UNIX;
	if (strlen(path) >= sizeof(addr->sun_path))
		return -1;
	strcpy(addr->sun_path, path);
	return 0;
}

/* 1 when something accepts connections at path, 0 when nobody does. */
static int someone_listens(const struct sockaddr_un *addr)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return 0;
	int live = connect(fd, (const struct sockaddr *)addr, sizeof(*addr)) == 0;
	close(fd);
	return live;
}

static int remove_stale(const struct sockaddr_un *addr, char *err, size_t errlen)
{
	const char *path = addr->sun_path;
	struct stat st;

	if (lstat(path, &st) < 0)
		return errno == ENOENT ? 0 : -1;
	if (!S_ISSOCK(st.st_mode)) {
		snprintf(err, errlen, "%s exists and is not a socket; "
			 "remove it or choose another path", path);
		return -1;
	}
	if (someone_listens(addr)) {
		snprintf(err, errlen, "%s is in use by a running process "
			 "(another remusdbd?)", path);
		return -1;
	}
	if (unlink(path) < 0 && errno != ENOENT) {
		snprintf(err, errlen, "cannot remove stale socket %s: %s", path,
			 strerror(errno));
		return -1;
	}
	return 0;
}

int unix_listen(const char *path, char *err, size_t errlen)
{
	struct sockaddr_un addr;

	if (fill_address(&addr, path) < 0) {
		snprintf(err, errlen, "socket path %s is longer than %zu bytes",
			 path, sizeof(addr.sun_path) - 1);
		return -1;
	}
	/* /run is a tmpfs: the socket's directory may not exist after a boot. */
	if (mkdir_parent(path) < 0) {
		snprintf(err, errlen, "cannot create the directory of %s: %s", path,
			 strerror(errno));
		return -1;
	}
	err[0] = '\0';
	if (remove_stale(&addr, err, errlen) < 0) {
		if (!err[0])
			snprintf(err, errlen, "cannot inspect %s: %s", path,
				 strerror(errno));
		return -1;
	}
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return -1;
	}
	if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 ||
	    listen(fd, 16) < 0) {
		snprintf(err, errlen, "cannot listen on %s: %s", path,
			 strerror(errno));
		close(fd);
		return -1;
	}
	return fd;
}

int unix_accept(int listen_fd)
{
	int fd;

	do {
		fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	} while (fd < 0 && errno == EINTR);
	return fd;
}

int unix_connect(const char *path)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	size_t len = strlen(path);

	if (len >= sizeof(addr.sun_path)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	memcpy(addr.sun_path, path, len);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
		int saved = errno;
		close(fd);
		errno = saved;
		return -1;
	}
	return fd;
}
