/*
 * Raw disk image backend: a regular file (or block device) accessed with
 * plain pread/pwrite at the guest's byte offsets.  No format layer: the
 * NBD export is the file, byte for byte.
 *
 * All functions return 0 on success or a negative errno value, so that
 * callers can map the failure onto an NBD error without reading errno.
 */
#ifndef REMUSDB_DISK_FILE_H
#define REMUSDB_DISK_FILE_H

#include <stddef.h>
#include <stdint.h>

struct disk_file {
	int fd;
	uint64_t size;
	char *path;
};

/* Opens read-write; on failure returns -errno and leaves *disk closed. */
int disk_file_open(struct disk_file *disk, const char *path);
void disk_file_close(struct disk_file *disk);

int disk_file_read(struct disk_file *disk, void *buf, size_t len, uint64_t offset);
int disk_file_write(struct disk_file *disk, const void *buf, size_t len,
		    uint64_t offset);
/* Makes every completed write durable (fdatasync). */
int disk_file_flush(struct disk_file *disk);
/* Deallocates the range; advisory, so "not supported" is reported as success. */
int disk_file_trim(struct disk_file *disk, uint64_t offset, uint64_t len);
/*
 * Makes the range read back as zeros.  may_punch allows deallocating it
 * (NBD_CMD_WRITE_ZEROES without NBD_CMD_FLAG_NO_HOLE).
 */
int disk_file_write_zeroes(struct disk_file *disk, uint64_t offset, uint64_t len,
			   int may_punch);

/*
 * Where the image is allocated: [offset, offset+len) as consecutive
 * extents, each data or a hole (reads as zeros), from the file system's
 * own account (SEEK_DATA/SEEK_HOLE).  At most max extents starting at
 * offset (fewer cover less than len); *count >= 1 on return.  Where the
 * file system cannot tell (no SEEK_HOLE support, a block device, an
 * unexpected error) the rest is reported as data, which is always true:
 * "data" only means "not known to be a hole".  A range past the file's
 * current end (it shrank) is a hole, as disk_file_read reads zeros there.
 */
struct disk_extent {
	uint64_t length;
	int hole;
};
void disk_file_extents(struct disk_file *disk, uint64_t offset, uint64_t len,
		       struct disk_extent *out, size_t max, size_t *count);

#endif
