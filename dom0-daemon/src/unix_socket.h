/* Unix stream socket helpers shared by the NBD server and the control socket. */
#ifndef REMUSDB_UNIX_SOCKET_H
#define REMUSDB_UNIX_SOCKET_H

#include <stddef.h>


/*
 * Creates a non-blocking listening socket at path.  A socket file left by
 * a killed daemon is removed first; a path that a live process still
 * listens on, or that is not a socket, is refused.  Returns the fd, or -1
 * with a message in err.
 */
int unix_listen(const char *path, char *err, size_t errlen);
/* Accepts one non-blocking, close-on-exec connection (-1, errno set). */
int unix_accept(int listen_fd);

#endif
