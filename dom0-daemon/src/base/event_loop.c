/* The epoll event loop and its timers (event_loop.h says why our own). */
#include "base/event_loop.h"

#include "base/loop_turns.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

struct watched_fd {
	int mask;
	fd_handler handler;
	void *data;
};

struct timer {
	long long id;
	int64_t due_ms;
	timer_handler handler;
	void *data;
	int deleted;
	struct timer *next;
};

struct event_loop {
	int epoll_fd;
	struct watched_fd *fds;
	int fds_capacity;
	struct timer *timers;
	long long next_timer_id;
	int stopped;
	struct loop_turns turns;
};

int64_t monotonic_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t wall_clock_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t monotonic_ms(void)
{
	return monotonic_us() / 1000;
}

event_loop *event_loop_create(void)
{
	event_loop *loop = calloc(1, sizeof(*loop));

	if (!loop)
		return NULL;
	loop->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
	if (loop->epoll_fd < 0) {
		free(loop);
		return NULL;
	}
	loop->next_timer_id = 1;
	loop_turns_init(&loop->turns, monotonic_us());
	return loop;
}

void event_loop_destroy(event_loop *loop)
{
	if (!loop)
		return;
	while (loop->timers) {
		struct timer *t = loop->timers;

		loop->timers = t->next;
		free(t);
	}
	close(loop->epoll_fd);
	free(loop->fds);
	free(loop);
}

static int ensure_capacity(event_loop *loop, int fd)
{
	if (fd < loop->fds_capacity)
		return 0;
	int capacity = loop->fds_capacity ? loop->fds_capacity : 64;
	while (capacity <= fd)
		capacity *= 2;
	struct watched_fd *grown = realloc(loop->fds, sizeof(*grown) * capacity);
	if (!grown)
		return -1;
	memset(grown + loop->fds_capacity, 0,
	       sizeof(*grown) * (capacity - loop->fds_capacity));
	loop->fds = grown;
	loop->fds_capacity = capacity;
	return 0;
}

static uint32_t epoll_bits(int mask)
{
	return ((mask & EV_READABLE) ? EPOLLIN : 0) |
	       ((mask & EV_WRITABLE) ? EPOLLOUT : 0);
}

static int apply_mask(event_loop *loop, int fd, int old_mask, int new_mask)
{
	struct epoll_event ev = { .events = epoll_bits(new_mask), .data.fd = fd };
	int op;

	if (old_mask == new_mask)
		return 0;
	if (new_mask == EV_NONE)
		op = EPOLL_CTL_DEL;
	else if (old_mask == EV_NONE)
		op = EPOLL_CTL_ADD;
	else
		op = EPOLL_CTL_MOD;
	return epoll_ctl(loop->epoll_fd, op, fd, &ev);
}

int event_loop_watch(event_loop *loop, int fd, int mask, fd_handler handler,
		     void *data)
{
	if (fd < 0) {
		errno = EBADF;
		return -1;
	}
	if (ensure_capacity(loop, fd) < 0)
		return -1;
	struct watched_fd *w = &loop->fds[fd];
	if (apply_mask(loop, fd, w->mask, mask) < 0)
		return -1;
	w->mask = mask;
	w->handler = mask ? handler : NULL;
	w->data = mask ? data : NULL;
	return 0;
}

int event_loop_set_mask(event_loop *loop, int fd, int mask)
{
	if (fd < 0 || fd >= loop->fds_capacity || !loop->fds[fd].handler) {
		errno = EBADF;
		return -1;
	}
	return event_loop_watch(loop, fd, mask, loop->fds[fd].handler,
				loop->fds[fd].data);
}

int event_loop_mask(const event_loop *loop, int fd)
{
	if (fd < 0 || fd >= loop->fds_capacity)
		return EV_NONE;
	return loop->fds[fd].mask;
}

void event_loop_unwatch(event_loop *loop, int fd)
{
	if (fd >= 0 && fd < loop->fds_capacity)
		event_loop_watch(loop, fd, EV_NONE, NULL, NULL);
}

long long event_loop_add_timer(event_loop *loop, long ms, timer_handler handler,
			       void *data)
{
	struct timer *t = calloc(1, sizeof(*t));

	if (!t)
		return -1;
	t->id = loop->next_timer_id++;
	t->due_ms = monotonic_ms() + ms;
	t->handler = handler;
	t->data = data;
	t->next = loop->timers;
	loop->timers = t;
	return t->id;
}

void event_loop_del_timer(event_loop *loop, long long timer_id)
{
	/* Only marked here: the timer list may be being walked right now. */
	for (struct timer *t = loop->timers; t; t = t->next)
		if (t->id == timer_id)
			t->deleted = 1;
}

static int next_timeout_ms(const event_loop *loop)
{
	int64_t now = monotonic_ms();
	int64_t soonest = -1;

	for (const struct timer *t = loop->timers; t; t = t->next) {
		if (t->deleted)
			continue;
		int64_t wait = t->due_ms > now ? t->due_ms - now : 0;
		if (soonest < 0 || wait < soonest)
			soonest = wait;
	}
	return soonest > 1000 ? 1000 : (int)soonest;
}

static void run_due_timers(event_loop *loop)
{
	int64_t now = monotonic_ms();

	for (struct timer *t = loop->timers; t; t = t->next) {
		if (t->deleted || t->due_ms > now)
			continue;
		long again = t->handler(loop, t->id, t->data);
		if (again == TIMER_DONE)
			t->deleted = 1;
		else
			t->due_ms = monotonic_ms() + again;
	}
	struct timer **link = &loop->timers;
	while (*link) {
		struct timer *t = *link;
		if (t->deleted) {
			*link = t->next;
			free(t);
		} else {
			link = &t->next;
		}
	}
}

int event_loop_run_once(event_loop *loop, int timeout_ms)
{
	struct epoll_event events[64];
	int timeout = next_timeout_ms(loop);

	/* Never sleep past a due timer, and never longer than the caller allows. */
	if (timeout_ms >= 0 && (timeout < 0 || timeout_ms < timeout))
		timeout = timeout_ms;
	int n = epoll_wait(loop->epoll_fd, events, 64, timeout);
	if (n < 0)
		return errno == EINTR ? 0 : -1;
	int64_t turn_start_us = monotonic_us();
	for (int i = 0; i < n; i++) {
		int fd = events[i].data.fd;
		int ready = 0;

		if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
			ready |= EV_READABLE;
		if (events[i].events & (EPOLLOUT | EPOLLHUP | EPOLLERR))
			ready |= EV_WRITABLE;
		/*
		 * An earlier handler in this batch may have stopped
		 * watching this fd; deliver only what is still wanted.
		 */
		if (fd >= loop->fds_capacity)
			continue;
		ready &= loop->fds[fd].mask;
		if (ready && loop->fds[fd].handler)
			loop->fds[fd].handler(loop, fd, loop->fds[fd].data, ready);
	}
	run_due_timers(loop);
	loop_turns_observe(&loop->turns, (uint64_t)(monotonic_us() - turn_start_us));
	return n;
}

const struct loop_turns *event_loop_turns(const event_loop *loop)
{
	return &loop->turns;
}

int event_loop_run(event_loop *loop)
{
	loop->stopped = 0;
	while (!loop->stopped)
		if (event_loop_run_once(loop, -1) < 0)
			return -1;
	return 0;
}

void event_loop_stop(event_loop *loop)
{
	loop->stopped = 1;
}
