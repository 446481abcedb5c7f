/*
 * Unix stream socket helpers shared by the NBD server, the control socket,
 * the network relay and the QMP client.
 */
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
/*
 * Connects a non-blocking, close-on-exec socket to path.  A unix connect
 * is done or refused at once (ENOENT before the listener exists,
 * ECONNREFUSED after it exits, EAGAIN with a full backlog), never
 * EINPROGRESS, so every failure means "try again later".  Returns the fd,
 * or -1 with errno set (ENAMETOOLONG for a path that does not fit).
 */
int unix_connect(const char *path);

#endif
