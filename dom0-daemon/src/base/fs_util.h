/* Small filesystem helpers: directories made as needed, whole writes. */
#ifndef REMUSDB_FS_UTIL_H
#define REMUSDB_FS_UTIL_H

#include <stddef.h>
#include <stdint.h>

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
 * Makes [offset, offset+length) read as zeros: a punched hole where the
 * filesystem can, written zeros where not.  0, or -1 with errno set.
 */
int punch_or_zero(int fd, uint64_t offset, uint64_t length);

#endif
