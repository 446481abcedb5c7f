/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * RemusDB commit protection: the socket options of the remusdb_cp guest
 * module, and a tiny inline wrapper for user space (the patched DBMS).
 *
 * A protected TCP socket's packets carry a DSCP code point (the module's
 * "dscp" parameter) that the host's relay reads: it holds them until the
 * checkpoint that covers them is on the backup, and releases everything
 * else at once.  A database protects the client socket just before it
 * sends a commit acknowledgement and deprotects it once the bytes are
 * handed to the kernel.
 *
 * The options live in a private range at level IPPROTO_IP, registered
 * with nf_register_sockopt(); IPv6 TCP sockets take them at IPPROTO_IP
 * too.  Without the module, setsockopt() fails with ENOPROTOOPT and the
 * wrappers report "not available", so a patched DBMS runs unchanged on a
 * guest without it.
 */
#ifndef REMUSDB_CP_H
#define REMUSDB_CP_H

/* "RD" in ASCII: far from every option range Linux assigns at IPPROTO_IP. */
#define REMUSDB_CP_BASE		0x5244
#define REMUSDB_CP_PROTECT	(REMUSDB_CP_BASE + 0)	/* set, no value needed */
#define REMUSDB_CP_DEPROTECT	(REMUSDB_CP_BASE + 1)	/* set, no value needed */
#define REMUSDB_CP_STATE	(REMUSDB_CP_BASE + 2)	/* get: int, 1 if protected */
#define REMUSDB_CP_MAX		(REMUSDB_CP_BASE + 3)

#ifndef __KERNEL__
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>

/*
 * Each returns 0 on success, 1 when the module is not loaded (nothing is
 * protected: the caller goes on unprotected), or -1 with errno set.
 */
static inline int remusdb_cp_set(int fd, int option)
{
	int one = 1;

	if (setsockopt(fd, IPPROTO_IP, option, &one, sizeof(one)) == 0)
		return 0;
	return errno == ENOPROTOOPT ? 1 : -1;
}

static inline int remusdb_cp_protect(int fd)
{
	return remusdb_cp_set(fd, REMUSDB_CP_PROTECT);
}

static inline int remusdb_cp_deprotect(int fd)
{
	return remusdb_cp_set(fd, REMUSDB_CP_DEPROTECT);
}

/* 1 protected, 0 not, -1 with errno (ENOPROTOOPT: no module). */
static inline int remusdb_cp_is_protected(int fd)
{
	int state = 0;
	socklen_t len = sizeof(state);

	if (getsockopt(fd, IPPROTO_IP, REMUSDB_CP_STATE, &state, &len) < 0)
		return -1;
	return state != 0;
}
#endif /* !__KERNEL__ */

#endif /* REMUSDB_CP_H */
