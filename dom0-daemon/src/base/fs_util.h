/* Small filesystem helpers: directories made as needed, whole reads and writes. */
#ifndef REMUSDB_FS_UTIL_H
#define REMUSDB_FS_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* mkdir -p with mode 0755.  Returns 0, or -1 with errno set. */
int mkdir_p(const char *path);
/* mkdir -p of the directory holding path (e.g. a socket's). */
int mkdir_parent(const char *path);
/*
 * pwrite(2) of all len bytes at offset, over short writes and EINTR.
 * Returns 0, or -1 with errno set (EIO if the file took nothing).
 */
int pwrite_all(int fd, const void *buf, size_t len, uint64_t offset);
/*
 * read(2) of len bytes (at most SSIZE_MAX), over short reads and EINTR.
 * Returns how many were read, fewer than len only at end of file, or -1
 * with errno set.  End of file is a count, not an error: the callers
 * read files whose length they do not know (a key, a short image).
 */
ssize_t read_full(int fd, void *buf, size_t len);
/* The same with pread(2) from offset: the file position does not move. */
ssize_t pread_full(int fd, void *buf, size_t len, uint64_t offset);
/*
 * Makes [offset, offset+length) read as zeros: a punched hole where the
 * filesystem can, written zeros where not.  0, or -1 with errno set.
 */
int punch_or_zero(int fd, uint64_t offset, uint64_t length);

#endif
