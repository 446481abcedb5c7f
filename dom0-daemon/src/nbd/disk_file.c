/* The raw disk image backend: pread/pwrite at guest offsets (disk_file.h). */
#include "nbd/disk_file.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

/* Bounded so one huge WRITE_ZEROES fallback does not allocate gigabytes. */
#define ZERO_CHUNK (1024 * 1024)

static int size_of_fd(int fd, uint64_t *size)
{
	struct stat st;

	if (fstat(fd, &st) < 0)
		return -errno;
	if (S_ISBLK(st.st_mode)) {
		if (ioctl(fd, BLKGETSIZE64, size) < 0)
			return -errno;
		return 0;
	}
	if (!S_ISREG(st.st_mode))
		return -EINVAL; /* a pipe or directory cannot back a disk */
	*size = (uint64_t)st.st_size;
	return 0;
}

int disk_file_open(struct disk_file *disk, const char *path)
{
	memset(disk, 0, sizeof(*disk));
	disk->fd = -1;
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int err = size_of_fd(fd, &disk->size);
	if (err) {
		close(fd);
		return err;
	}
	disk->path = strdup(path);
	if (!disk->path) {
		close(fd);
		return -ENOMEM;
	}
	disk->fd = fd;
	return 0;
}

void disk_file_close(struct disk_file *disk)
{
	if (disk->fd >= 0)
		close(disk->fd);
	free(disk->path);
	disk->fd = -1;
	disk->path = NULL;
}

int disk_file_read(struct disk_file *disk, void *buf, size_t len, uint64_t offset)
{
	uint8_t *p = buf;

	while (len > 0) {
		ssize_t n = pread(disk->fd, p, len, (off_t)offset);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0) {
			/* The file shrank under us: reads past its end are holes. */
			memset(p, 0, len);
			return 0;
		}
		p += n;
		len -= (size_t)n;
		offset += (uint64_t)n;
	}
	return 0;
}

int disk_file_write(struct disk_file *disk, const void *buf, size_t len,
		    uint64_t offset)
{
	const uint8_t *p = buf;

	while (len > 0) {
		ssize_t n = pwrite(disk->fd, p, len, (off_t)offset);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EIO;
		p += n;
		len -= (size_t)n;
		offset += (uint64_t)n;
	}
	return 0;
}

int disk_file_flush(struct disk_file *disk)
{
	while (fdatasync(disk->fd) < 0) {
		if (errno != EINTR)
			return -errno;
	}
	return 0;
}

static int is_unsupported(int err)
{
	return err == EOPNOTSUPP || err == ENOSYS || err == EINVAL;
}

int disk_file_trim(struct disk_file *disk, uint64_t offset, uint64_t len)
{
	if (fallocate(disk->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
		      (off_t)offset, (off_t)len) == 0)
		return 0;
	return is_unsupported(errno) ? 0 : -errno;
}

static int write_zero_buffers(struct disk_file *disk, uint64_t offset, uint64_t len)
{
	size_t chunk = len < ZERO_CHUNK ? (size_t)len : ZERO_CHUNK;
	void *zeros = calloc(1, chunk ? chunk : 1);
	int err = 0;

	if (!zeros)
		return -ENOMEM;
	while (len > 0 && !err) {
		size_t n = len < chunk ? (size_t)len : chunk;
		err = disk_file_write(disk, zeros, n, offset);
		offset += n;
		len -= n;
	}
	free(zeros);
	return err;
}

int disk_file_write_zeroes(struct disk_file *disk, uint64_t offset, uint64_t len,
			   int may_punch)
{
	/* Punching reads back as zeros and frees space: best when allowed. */
	if (may_punch &&
	    fallocate(disk->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
		      (off_t)offset, (off_t)len) == 0)
		return 0;
	if (fallocate(disk->fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE,
		      (off_t)offset, (off_t)len) == 0)
		return 0;
	if (!is_unsupported(errno))
		return -errno;
	return write_zero_buffers(disk, offset, len);
}

/*
 * Appends [*pos, stop) as one extent, merged with the last one when of the
 * same kind (a file system may split a run of data in several).  Returns 0
 * while there is room for more.
 */
static int add_extent(struct disk_extent *out, size_t max, size_t *count,
		      uint64_t *pos, uint64_t stop, int hole)
{
	if (*count > 0 && out[*count - 1].hole == hole) {
		out[*count - 1].length += stop - *pos;
	} else {
		out[*count].length = stop - *pos;
		out[*count].hole = hole;
		(*count)++;
	}
	*pos = stop;
	return *count == max;
}

void disk_file_extents(struct disk_file *disk, uint64_t offset, uint64_t len,
		       struct disk_extent *out, size_t max, size_t *count)
{
	uint64_t pos = offset, end = offset + len;

	*count = 0;
	while (pos < end) {
		off_t data = lseek(disk->fd, (off_t)pos, SEEK_DATA);
		if (data < 0) {
			/* ENXIO: no data at or after pos, up to the file's end. */
			if (add_extent(out, max, count, &pos, end, errno == ENXIO))
				return;
			continue;
		}
		if ((uint64_t)data > pos) {
			uint64_t stop = (uint64_t)data < end ? (uint64_t)data : end;
			if (add_extent(out, max, count, &pos, stop, 1))
				return;
			continue;
		}
		/* pos is in data: it ends at the next hole (the file's end is one). */
		off_t hole = lseek(disk->fd, (off_t)pos, SEEK_HOLE);
		uint64_t stop = hole < 0 || (uint64_t)hole <= pos || (uint64_t)hole > end
					? end : (uint64_t)hole;
		if (add_extent(out, max, count, &pos, stop, 0))
			return;
	}
}
