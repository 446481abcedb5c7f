/*
 * The accept policy shared by all listeners (see accept_policy.h): what
 * to do with each accept() error so that no listener spins or dies.
 */
#include "base/accept_policy.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"

int accept_policy_start(struct accept_policy *p, event_loop *loop, int listen_fd,
			const char *what, fd_handler on_readable, void *data)
{
	memset(p, 0, sizeof(*p));
	p->loop = loop;
	p->listen_fd = listen_fd;
	p->on_readable = on_readable;
	p->data = data;
	p->backoff_ms = ACCEPT_BACKOFF_FIRST_MS;
	snprintf(p->what, sizeof(p->what), "%s", what);
	return event_loop_watch(loop, listen_fd, EV_READABLE, on_readable, data);
}

static long resume(event_loop *loop, long long id, void *data)
{
	struct accept_policy *p = data;

	p->retry_timer = 0;
	if (event_loop_watch(loop, p->listen_fd, EV_READABLE, p->on_readable, p->data) < 0) {
		log_error("%s: cannot watch the listener again: %s; retrying in %ld ms",
			  p->what, strerror(errno), p->backoff_ms);
		return p->backoff_ms;
	}
	return TIMER_DONE;
}

static void pause_listener(struct accept_policy *p, int err)
{
	if (p->logged_errno != err) {
		log_error("%s: accept: %s; not accepting for %ld ms (logged once until "
			  "an accept succeeds)", p->what, strerror(err), p->backoff_ms);
		p->logged_errno = err;
	}
	p->retry_timer = event_loop_add_timer(p->loop, p->backoff_ms, resume, p);
	if (p->retry_timer < 0) {
		/* No timer, no pause: stay watched rather than deaf forever. */
		p->retry_timer = 0;
		log_error("%s: cannot pause the listener: out of memory", p->what);
		return;
	}
	event_loop_unwatch(p->loop, p->listen_fd);
	p->pauses++;
	p->backoff_ms *= 2;
	if (p->backoff_ms > ACCEPT_BACKOFF_MAX_MS)
		p->backoff_ms = ACCEPT_BACKOFF_MAX_MS;
}

/*
 * Errors that belong to one waiting connection, not to the listener:
 * that connection is gone and the next one may be fine.  Linux passes
 * pending network errors of the new socket to accept() this way.
 */
static bool connection_error(int err)
{
	switch (err) {
	case ECONNABORTED: case EINTR: case EPROTO: case EPERM:
	case ENETDOWN: case ENOPROTOOPT: case EHOSTDOWN: case ENONET:
	case EHOSTUNREACH: case EOPNOTSUPP: case ENETUNREACH:
		return true;
	default:
		return false;
	}
}

int accept_policy_accept(struct accept_policy *p, struct sockaddr *addr,
			 socklen_t *addrlen)
{
	if (p->retry_timer)
		return -1;
	for (;;) {
		socklen_t len = addrlen ? *addrlen : 0;
		int fd = accept4(p->listen_fd, addr, addrlen ? &len : NULL,
				 SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd >= 0) {
			if (addrlen)
				*addrlen = len;
			if (p->pauses)
				log_info("%s: accepting again after %u pause(s)", p->what,
					 p->pauses);
			p->pauses = 0;
			p->logged_errno = 0;
			p->backoff_ms = ACCEPT_BACKOFF_FIRST_MS;
			return fd;
		}
		int err = errno;
		if (err == EAGAIN || err == EWOULDBLOCK)
			return -1;
		if (connection_error(err))
			continue;
		/*
		 * EMFILE, ENFILE, ENOBUFS, ENOMEM: the connection stays in
		 * the backlog and the listener stays readable.  Anything
		 * else is unexpected and may repeat as fast; both back off.
		 */
		pause_listener(p, err);
		errno = err;
		return -1;
	}
}

bool accept_policy_paused(const struct accept_policy *p)
{
	return p->retry_timer != 0;
}

void accept_policy_stop(struct accept_policy *p)
{
	if (p->retry_timer)
		event_loop_del_timer(p->loop, p->retry_timer);
	p->retry_timer = 0;
	if (p->loop && p->listen_fd >= 0)
		event_loop_unwatch(p->loop, p->listen_fd);
}
