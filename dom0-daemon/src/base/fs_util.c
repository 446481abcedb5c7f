/* Small filesystem helpers (fs_util.h). */
#include "base/fs_util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

int pwrite_all(int fd, const void *buf, size_t len, uint64_t offset)
{
	const uint8_t *p = buf;

	while (len > 0) {
		ssize_t n = pwrite(fd, p, len, (off_t)offset);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			if (n == 0)
				errno = EIO;
			return -1;
		}
		p += n;
		len -= (size_t)n;
		offset += (uint64_t)n;
	}
	return 0;
}

/*
 * The loop both whole reads share: read() from the file position when
 * positional is false, pread() at offset when it is true.  EOF ends it
 * early with the count so far, which both callers treat as normal.
 */
static ssize_t read_until_full(int fd, void *buf, size_t len, bool positional,
			       uint64_t offset)
{
	uint8_t *p = buf;
	size_t got = 0;

	while (got < len) {
		ssize_t n = positional ? pread(fd, p + got, len - got, (off_t)(offset + got))
				       : read(fd, p + got, len - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -1;
		if (n == 0)
			break;
		got += (size_t)n;
	}
	return (ssize_t)got;
}

ssize_t read_full(int fd, void *buf, size_t len)
{
	return read_until_full(fd, buf, len, false, 0);
}

ssize_t pread_full(int fd, void *buf, size_t len, uint64_t offset)
{
	return read_until_full(fd, buf, len, true, offset);
}

int punch_or_zero(int fd, uint64_t offset, uint64_t length)
{
	static const uint8_t zeros[64 * 1024];

	/* Punching keeps an image sparse; where the filesystem cannot, zeros are written. */
	if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
		      (off_t)offset, (off_t)length) == 0)
		return 0;
	if (errno != EOPNOTSUPP && errno != ENOSYS && errno != EINVAL &&
	    errno != ENODEV)
		return -1;
	while (length > 0) {
		uint64_t n = length < sizeof(zeros) ? length : sizeof(zeros);

		if (pwrite_all(fd, zeros, n, offset) < 0)
			return -1;
		offset += n;
		length -= n;
	}
	return 0;
}
