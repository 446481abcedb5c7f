/* Small filesystem helpers. */
#ifndef REMUSDB_FS_UTIL_H
#define REMUSDB_FS_UTIL_H

/* mkdir -p with mode 0755.  Returns 0, or -1 with errno set. */
int mkdir_p(const char *path);
/* mkdir -p of the directory holding path (e.g. a socket's). */
int mkdir_parent(const char *path);

#endif
