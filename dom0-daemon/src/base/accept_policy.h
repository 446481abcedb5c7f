/*
 * One accept policy for every listening socket of the daemon (control,
 * NBD, replication).  A listener is watched level-triggered, so an accept
 * that fails while connections wait would be called again at once,
 * forever: when the process or the system is out of descriptors or
 * memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) the listener is unwatched and
 * re-armed after a back-off (100 ms doubling to 1 s) instead.  Aborted
 * connections and interrupted calls are skipped; any other error is
 * logged once and also backs off.
 */
#ifndef REMUSDB_ACCEPT_POLICY_H
#define REMUSDB_ACCEPT_POLICY_H

#include <stdbool.h>
#include <sys/socket.h>

#include "base/event_loop.h"

#define ACCEPT_BACKOFF_FIRST_MS 100
#define ACCEPT_BACKOFF_MAX_MS 1000

struct accept_policy {
	event_loop *loop;
	int listen_fd;
	fd_handler on_readable;
	void *data;
	char what[96];          /* names the listener in log lines */
	long long retry_timer;  /* set while paused */
	long backoff_ms;        /* the next pause */
	int logged_errno;       /* already logged since the last good accept */
	unsigned pauses;        /* since the last good accept */
};

/*
 * Watches listen_fd (non-blocking) and calls on_readable(loop, fd, data)
 * when connections wait; the handler takes them with
 * accept_policy_accept() until it returns -1.  Returns 0, or -1 with
 * errno set.  what names the listener in log lines ("control socket").
 */
int accept_policy_start(struct accept_policy *p, event_loop *loop, int listen_fd,
			const char *what, fd_handler on_readable, void *data);
/*
 * Takes one waiting connection, non-blocking and close-on-exec (addr and
 * addrlen may be NULL).  Returns its fd, or -1 when the handler should
 * return: nothing more waits, or the listener was paused.
 */
int accept_policy_accept(struct accept_policy *p, struct sockaddr *addr,
			 socklen_t *addrlen);
bool accept_policy_paused(const struct accept_policy *p);
/* Stops watching and cancels a pending re-arm; the fd stays open. */
void accept_policy_stop(struct accept_policy *p);

#endif
