/*
 * A small epoll event loop in the style of Redis' ae.
 *
 * Why our own loop and not libevent/libuv: remusdbd watches a handful of
 * descriptors (listening sockets, a few NBD/stream/QMP connections, taps)
 * plus a few millisecond timers.  The checkpoint path later needs exact
 * control over when each fd is serviced relative to an epoch cut, and a
 * 200-line loop we can read end to end is easier to reason about (and to
 * run under valgrind) than a general library.  Level-triggered epoll keeps
 * handlers simple: a handler that does not drain a socket is called again.
 */
#ifndef REMUSDB_EVENT_LOOP_H
#define REMUSDB_EVENT_LOOP_H

#include <stdint.h>

enum { EV_NONE = 0, EV_READABLE = 1, EV_WRITABLE = 2 };

typedef struct event_loop event_loop;

/* Called with the subset of the fd's watched mask that is ready. */
typedef void (*fd_handler)(event_loop *loop, int fd, void *data, int ready);

/* Returns milliseconds until the next run, or TIMER_DONE to drop the timer. */
#define TIMER_DONE (-1)
typedef long (*timer_handler)(event_loop *loop, long long timer_id, void *data);

event_loop *event_loop_create(void);
void event_loop_destroy(event_loop *loop);

/*
 * Watches fd for `mask` (EV_READABLE|EV_WRITABLE), replacing any previous
 * mask, handler and data.  A mask of EV_NONE stops watching the fd.
 * Returns 0, or -1 with errno set.
 */
int event_loop_watch(event_loop *loop, int fd, int mask, fd_handler handler,
		     void *data);
/* Changes only the mask of an fd already watched (keeps handler and data). */
int event_loop_set_mask(event_loop *loop, int fd, int mask);
int event_loop_mask(const event_loop *loop, int fd);
void event_loop_unwatch(event_loop *loop, int fd);

long long event_loop_add_timer(event_loop *loop, long ms, timer_handler handler,
			       void *data);
void event_loop_del_timer(event_loop *loop, long long timer_id);

/* Runs until event_loop_stop(); returns 0, or -1 if epoll failed. */
int event_loop_run(event_loop *loop);
void event_loop_stop(event_loop *loop);
/*
 * One iteration: waits at most timeout_ms (-1 = until the next timer or
 * event), dispatches ready fds, then due timers.  Returns the number of
 * ready fds (0 on timeout or EINTR), or -1 if epoll failed.  Lets tests
 * drive the loop step by step.
 */
int event_loop_run_once(event_loop *loop, int timeout_ms);

/* How long the loop's turns have been (loop_turns.h), since its creation. */
struct loop_turns;
const struct loop_turns *event_loop_turns(const event_loop *loop);

/* Monotonic clock in milliseconds / microseconds. */
int64_t monotonic_ms(void);
int64_t monotonic_us(void);
/*
 * CLOCK_REALTIME in microseconds: only to compare with a time another
 * process of this host stamped (QEMU's QMP events); it may step.
 */
int64_t wall_clock_us(void);

#endif
