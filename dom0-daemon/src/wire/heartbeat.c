/* The heartbeat thread and its links (heartbeat.h says why a thread). */
#include "wire/heartbeat.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"
#include "wire/repl_conn.h"

/* The thread wakes at least this often to check for silence. */
#define CHECK_PERIOD_MS 5
/* IP precedence "network control": heartbeats go before bulk traffic in any queue. */
#define HEARTBEAT_TOS 0xc0

struct heartbeat_link {
	struct heartbeat_service *service;
	struct heartbeat_link *next;
	uint64_t id;
	uint8_t key[HEARTBEAT_KEY_SIZE];
	uint8_t tx_flags;             /* HEARTBEAT_FROM_PRIMARY or 0 */
	struct sockaddr_in peer;
	bool peer_known;
	unsigned timeout_ms;
	int64_t last_heard_us;
	uint64_t tx_seq, rx_seq;
	bool expired;                 /* the thread saw the timeout pass */
	bool reported;                /* the loop called on_silence */
	int64_t silent_at_expiry_ms;
	heartbeat_silence_fn on_silence;
	void *opaque;
	/* statistics, reset by reset-stats */
	uint64_t sent, received, rejected;
	int64_t max_silence_us;
	uint64_t silences;
	uint32_t silence_ms[HEARTBEAT_SILENCE_BUCKETS];
};

struct heartbeat_service {
	event_loop *loop;
	int sock;
	int notify_fd;      /* thread -> loop: a link expired */
	int wake_fd;        /* loop -> thread: stop */
	pthread_t thread;
	bool thread_started;
	pthread_mutex_t lock; /* priority-inheriting: the RT thread never waits behind a preempted loop */
	struct heartbeat_link *links;
	unsigned interval_ms;
	unsigned loop_stall_ms;
	int rt_priority;
	long long beat_timer;
	_Atomic int64_t loop_beat_us;
	_Atomic bool stop;
	/* written by the thread, read under the lock */
	int rt_errno;        /* 0: SCHED_FIFO in force */
	uint64_t unknown_datagrams, bad_datagrams, stalled_ticks;
	bool stalled;        /* not sending: the loop is wedged */
	bool logged_stall;
};

static void lock(struct heartbeat_service *s)
{
	pthread_mutex_lock(&s->lock);
}

static void unlock(struct heartbeat_service *s)
{
	pthread_mutex_unlock(&s->lock);
}

static void record_silence(struct heartbeat_link *l, int64_t gap_us)
{
	int64_t ms = gap_us / 1000;

	if (gap_us > l->max_silence_us)
		l->max_silence_us = gap_us;
	l->silence_ms[ms < HEARTBEAT_SILENCE_BUCKETS ? ms : HEARTBEAT_SILENCE_BUCKETS - 1]++;
	l->silences++;
}

/* ---- the thread ------------------------------------------------------- */

static struct heartbeat_link *find_link(struct heartbeat_service *s, uint64_t id)
{
	for (struct heartbeat_link *l = s->links; l; l = l->next)
		if (l->id == id)
			return l;
	return NULL;
}

static void receive_one(struct heartbeat_service *s, const uint8_t *d, size_t n,
			const struct sockaddr_in *from)
{
	struct heartbeat_msg m;
	const char *err;
	int64_t now = monotonic_us();

	if (heartbeat_peek(d, n, &m, &err) < 0) {
		s->bad_datagrams++;
		return;
	}
	struct heartbeat_link *l = find_link(s, m.link_id);
	if (!l) {
		s->unknown_datagrams++;
		return;
	}
	/* A datagram of our own role is a reflection, never the peer's. */
	if ((m.flags & HEARTBEAT_FROM_PRIMARY) == l->tx_flags || m.seq <= l->rx_seq ||
	    !heartbeat_verify(d, l->key)) {
		l->rejected++;
		return;
	}
	l->rx_seq = m.seq;
	if (!l->peer_known) {
		l->peer = *from;
		l->peer_known = true;
	}
	/* The first gap is the link's setup, not a silence of a live peer. */
	if (l->received > 0)
		record_silence(l, now - l->last_heard_us);
	l->last_heard_us = now;
	l->received++;
	/* Heard again: a later silence is a new one and is reported again. */
	l->expired = l->reported = false;
}

static void drain_socket(struct heartbeat_service *s)
{
	for (;;) {
		uint8_t d[HEARTBEAT_DATAGRAM_SIZE + 1];
		struct sockaddr_in from;
		socklen_t flen = sizeof(from);
		ssize_t n = recvfrom(s->sock, d, sizeof(d), MSG_DONTWAIT,
				     (struct sockaddr *)&from, &flen);
		if (n < 0)
			return; /* EAGAIN, or an ICMP error of an earlier send: nothing to read */
		lock(s);
		receive_one(s, d, (size_t)n, &from);
		unlock(s);
	}
}

static void send_all(struct heartbeat_service *s, int64_t now)
{
	for (struct heartbeat_link *l = s->links; l; l = l->next) {
		struct heartbeat_msg m = {
			.flags = l->tx_flags, .link_id = l->id, .seq = ++l->tx_seq,
			.sent_us = (uint64_t)now,
		};
		uint8_t d[HEARTBEAT_DATAGRAM_SIZE];

		if (!l->peer_known || heartbeat_encode(&m, l->key, d) < 0)
			continue;
		/* One datagram, sent whole or not at all; a lost one is replaced by the next. */
		if (sendto(s->sock, d, sizeof(d), MSG_DONTWAIT, (struct sockaddr *)&l->peer,
			   sizeof(l->peer)) == (ssize_t)sizeof(d))
			l->sent++;
	}
}

/* Marks links silent past their timeout; true when the loop must be told. */
static bool check_silence(struct heartbeat_service *s, int64_t now)
{
	bool tell = false;

	for (struct heartbeat_link *l = s->links; l; l = l->next) {
		int64_t silent_us = now - l->last_heard_us;
		if (!l->expired && silent_us > (int64_t)l->timeout_ms * 1000) {
			l->expired = true;
			l->silent_at_expiry_ms = silent_us / 1000;
			tell = true;
		}
	}
	return tell;
}

static void become_realtime(struct heartbeat_service *s)
{
	struct sched_param sp = { .sched_priority = s->rt_priority };

	s->rt_errno = s->rt_priority > 0
		? pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp) : EPERM;
}

static void *heartbeat_thread(void *arg)
{
	struct heartbeat_service *s = arg;
	int64_t next_send = 0;

	pthread_setname_np(pthread_self(), "remusdb-hb"); /* ps -L, top -H */

	lock(s);
	become_realtime(s);
	unlock(s);
	while (!atomic_load(&s->stop)) {
		int64_t now = monotonic_us();
		bool tell;

		lock(s);
		s->stalled = now - atomic_load(&s->loop_beat_us) > (int64_t)s->loop_stall_ms * 1000;
		if (now >= next_send) {
			if (s->stalled)
				s->stalled_ticks++;
			else
				send_all(s, now);
			next_send = now + (int64_t)s->interval_ms * 1000;
		}
		tell = check_silence(s, now);
		unlock(s);
		if (tell) {
			uint64_t one = 1;
			/* A full eventfd counter already says "look": nothing is lost. */
			if (write(s->notify_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
				break;
		}
		int64_t wait_ms = (next_send - monotonic_us()) / 1000;
		if (wait_ms > CHECK_PERIOD_MS)
			wait_ms = CHECK_PERIOD_MS;
		if (wait_ms < 0)
			wait_ms = 0;
		struct pollfd pfd[2] = {
			{ .fd = s->sock, .events = POLLIN },
			{ .fd = s->wake_fd, .events = POLLIN },
		};
		if (poll(pfd, 2, (int)wait_ms) > 0 && (pfd[0].revents & POLLIN))
			drain_socket(s);
	}
	return NULL;
}

/* ---- the loop side ------------------------------------------------------ */

static long on_loop_beat(event_loop *loop, long long id, void *data)
{
	struct heartbeat_service *s = data;
	bool log_stall;

	atomic_store(&s->loop_beat_us, monotonic_us());
	lock(s);
	log_stall = s->stalled_ticks > 0 && !s->logged_stall;
	s->logged_stall |= log_stall;
	unlock(s);
	if (log_stall)
		log_error("heartbeat: the event loop was wedged for over %u ms; heartbeats "
			  "were withheld so that peers would not trust a stuck daemon",
			  s->loop_stall_ms);
	return HEARTBEAT_LOOP_BEAT_MS;
}

struct expiry {
	heartbeat_silence_fn fn;
	void *opaque;
	int64_t silent_ms;
};

static void on_notify(event_loop *loop, int fd, void *data, int ready)
{
	struct heartbeat_service *s = data;
	uint64_t count;

	if (read(fd, &count, sizeof(count)) < 0 && errno != EAGAIN)
		log_warn("heartbeat: reading the eventfd: %s", strerror(errno));
	/*
	 * Callbacks run outside the lock and may remove links (their own or
	 * others'), so take one expired link at a time and look again.
	 */
	for (;;) {
		struct expiry e = { 0 };

		lock(s);
		for (struct heartbeat_link *l = s->links; l; l = l->next)
			if (l->expired && !l->reported) {
				l->reported = true;
				e = (struct expiry){ l->on_silence, l->opaque, l->silent_at_expiry_ms };
				break;
			}
		unlock(s);
		if (!e.fn)
			return;
		e.fn(e.opaque, e.silent_ms);
	}
}

static int open_socket(const char *bind_addr, char *err, size_t errlen)
{
	struct sockaddr_in addr = { .sin_family = AF_INET };
	int tos = HEARTBEAT_TOS;

	if (bind_addr && repl_parse_address(bind_addr, &addr, err, errlen) < 0)
		return -1;
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(err, errlen, "heartbeat socket: %s", strerror(errno));
		return -1;
	}
	/* Best effort: a host that ignores TOS still delivers the datagram. */
	(void)setsockopt(fd, IPPROTO_IP, IP_TOS, &tos, sizeof(tos));
	if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
		snprintf(err, errlen, "cannot bind the heartbeat socket to %s (UDP): %s",
			 bind_addr ? bind_addr : "an ephemeral port", strerror(errno));
		close(fd);
		return -1;
	}
	return fd;
}

static int init_lock(pthread_mutex_t *m)
{
	pthread_mutexattr_t a;
	int rc = pthread_mutexattr_init(&a);

	if (rc == 0)
		rc = pthread_mutexattr_setprotocol(&a, PTHREAD_PRIO_INHERIT);
	if (rc == 0)
		rc = pthread_mutex_init(m, &a);
	pthread_mutexattr_destroy(&a);
	return rc;
}

struct heartbeat_service *heartbeat_service_create(event_loop *loop,
						   const struct heartbeat_service_config *cfg,
						   char *err, size_t errlen)
{
	struct heartbeat_service *s = calloc(1, sizeof(*s));

	if (!s || init_lock(&s->lock) != 0) {
		snprintf(err, errlen, "out of memory");
		free(s);
		return NULL;
	}
	s->loop = loop;
	s->interval_ms = cfg->interval_ms ? cfg->interval_ms : 1;
	s->loop_stall_ms = cfg->loop_stall_ms ? cfg->loop_stall_ms
					      : HEARTBEAT_DEFAULT_LOOP_STALL_MS;
	s->rt_priority = cfg->rt_priority;
	s->notify_fd = s->wake_fd = -1;
	atomic_store(&s->loop_beat_us, monotonic_us());
	s->sock = open_socket(cfg->bind_addr, err, errlen);
	if (s->sock < 0)
		goto fail;
	s->notify_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (s->notify_fd < 0 || s->wake_fd < 0 ||
	    event_loop_watch(loop, s->notify_fd, EV_READABLE, on_notify, s) < 0) {
		snprintf(err, errlen, "heartbeat eventfd: %s", strerror(errno));
		goto fail;
	}
	s->beat_timer = event_loop_add_timer(loop, HEARTBEAT_LOOP_BEAT_MS, on_loop_beat, s);
	if (s->beat_timer <= 0) {
		snprintf(err, errlen, "out of memory (heartbeat timer)");
		goto fail;
	}
	int rc = pthread_create(&s->thread, NULL, heartbeat_thread, s);
	if (rc != 0) {
		snprintf(err, errlen, "cannot start the heartbeat thread: %s", strerror(rc));
		goto fail;
	}
	s->thread_started = true;
	return s;
fail:
	heartbeat_service_destroy(s);
	return NULL;
}

void heartbeat_service_destroy(struct heartbeat_service *s)
{
	if (!s)
		return;
	if (s->thread_started) {
		uint64_t one = 1;
		atomic_store(&s->stop, true);
		if (write(s->wake_fd, &one, sizeof(one)) < 0)
			log_warn("heartbeat: waking the thread: %s (it stops within %d ms)",
				 strerror(errno), CHECK_PERIOD_MS);
		pthread_join(s->thread, NULL);
	}
	if (s->beat_timer > 0)
		event_loop_del_timer(s->loop, s->beat_timer);
	if (s->notify_fd >= 0) {
		event_loop_unwatch(s->loop, s->notify_fd);
		close(s->notify_fd);
	}
	if (s->wake_fd >= 0)
		close(s->wake_fd);
	if (s->sock >= 0)
		close(s->sock);
	while (s->links) {
		struct heartbeat_link *l = s->links;
		log_warn("heartbeat: link %016llx still open at shutdown",
			 (unsigned long long)l->id);
		s->links = l->next;
		free(l);
	}
	pthread_mutex_destroy(&s->lock);
	free(s);
}

json_t *heartbeat_service_status_json(struct heartbeat_service *s)
{
	struct sockaddr_in a;
	socklen_t alen = sizeof(a);
	json_t *o;

	if (getsockname(s->sock, (struct sockaddr *)&a, &alen) < 0)
		memset(&a, 0, sizeof(a));
	lock(s);
	o = json_pack("{s:i, s:b, s:s, s:i, s:I, s:I, s:I, s:b}",
		      "interval_ms", (int)s->interval_ms,
		      "realtime", s->rt_errno == 0,
		      "scheduling", s->rt_errno == 0 ? "SCHED_FIFO" : strerror(s->rt_errno),
		      "udp_port", (int)ntohs(a.sin_port),
		      "unknown_link_datagrams", (json_int_t)s->unknown_datagrams,
		      "malformed_datagrams", (json_int_t)s->bad_datagrams,
		      "withheld_for_wedged_loop", (json_int_t)s->stalled_ticks,
		      "loop_wedged", s->stalled);
	unlock(s);
	return o;
}

/* ---- links --------------------------------------------------------------- */

struct heartbeat_link *heartbeat_link_add(struct heartbeat_service *s,
					  const struct heartbeat_link_config *cfg)
{
	struct heartbeat_link *l = calloc(1, sizeof(*l));

	if (!l)
		return NULL;
	l->service = s;
	l->id = cfg->id;
	memcpy(l->key, cfg->key, sizeof(l->key));
	l->tx_flags = cfg->we_are_primary ? HEARTBEAT_FROM_PRIMARY : 0;
	l->tx_seq = cfg->first_seq;
	if (cfg->peer) {
		l->peer = *cfg->peer;
		l->peer_known = true;
	}
	l->timeout_ms = cfg->timeout_ms;
	l->on_silence = cfg->on_silence;
	l->opaque = cfg->opaque;
	l->last_heard_us = monotonic_us();
	lock(s);
	if (find_link(s, l->id)) {
		unlock(s);
		free(l);
		return NULL;
	}
	l->next = s->links;
	s->links = l;
	unlock(s);
	return l;
}

uint64_t heartbeat_link_retire(struct heartbeat_link *l)
{
	if (!l)
		return 0;
	struct heartbeat_service *s = l->service;

	lock(s);
	for (struct heartbeat_link **p = &s->links; *p; p = &(*p)->next)
		if (*p == l) {
			*p = l->next;
			break;
		}
	/* Read under the lock: the thread numbers each send. */
	uint64_t last_seq = l->tx_seq;
	unlock(s);
	free(l);
	return last_seq;
}

void heartbeat_link_remove(struct heartbeat_link *l)
{
	heartbeat_link_retire(l);
}

void heartbeat_link_set_timeout(struct heartbeat_link *l, unsigned timeout_ms)
{
	lock(l->service);
	l->timeout_ms = timeout_ms;
	unlock(l->service);
}

int64_t heartbeat_link_last_heard_us(struct heartbeat_link *l)
{
	int64_t t;

	lock(l->service);
	t = l->last_heard_us;
	unlock(l->service);
	return t;
}

static unsigned percentile_ms(const struct heartbeat_link *l, double p)
{
	uint64_t rank = (uint64_t)(p / 100.0 * (double)l->silences + 0.999999);
	uint64_t seen = 0;

	if (rank == 0)
		rank = 1;
	for (unsigned ms = 0; ms < HEARTBEAT_SILENCE_BUCKETS; ms++) {
		seen += l->silence_ms[ms];
		if (seen >= rank)
			return ms;
	}
	return 0;
}

static void stats_locked(const struct heartbeat_link *l, struct heartbeat_link_stats *st)
{
	*st = (struct heartbeat_link_stats){
		.sent = l->sent, .received = l->received, .rejected = l->rejected,
		.silences = l->silences, .max_silence_ms = l->max_silence_us / 1000,
		.p50_ms = l->silences ? percentile_ms(l, 50) : 0,
		.p99_ms = l->silences ? percentile_ms(l, 99) : 0,
		.p999_ms = l->silences ? percentile_ms(l, 99.9) : 0,
		.last_heard_age_ms = (monotonic_us() - l->last_heard_us) / 1000,
		.timeout_ms = l->timeout_ms, .peer_known = l->peer_known,
		.expired = l->expired,
	};
}

void heartbeat_link_get_stats(struct heartbeat_link *l, struct heartbeat_link_stats *st)
{
	lock(l->service);
	stats_locked(l, st);
	unlock(l->service);
}

json_t *heartbeat_link_status_json(struct heartbeat_link *l)
{
	struct heartbeat_link_stats st;
	json_t *hist = json_array(), *o;

	/* One snapshot: the histogram and the counters must agree. */
	lock(l->service);
	stats_locked(l, &st);
	for (unsigned ms = 0; hist && ms < HEARTBEAT_SILENCE_BUCKETS; ms++)
		if (l->silence_ms[ms])
			json_array_append_new(hist, json_pack("[i, I]", (int)ms,
							      (json_int_t)l->silence_ms[ms]));
	unlock(l->service);
	o = json_pack("{s:I, s:I, s:I, s:I, s:I, s:i, s:i, s:i, s:I, s:i, s:b, s:o*}",
		      "sent", (json_int_t)st.sent, "received", (json_int_t)st.received,
		      "rejected", (json_int_t)st.rejected,
		      "silences_counted", (json_int_t)st.silences,
		      "max_silence_ms", (json_int_t)st.max_silence_ms,
		      "silence_p50_ms", (int)st.p50_ms, "silence_p99_ms", (int)st.p99_ms,
		      "silence_p999_ms", (int)st.p999_ms,
		      "last_heard_ms", (json_int_t)st.last_heard_age_ms,
		      "timeout_ms", (int)st.timeout_ms, "peer_known", st.peer_known,
		      "silence_histogram_ms", hist);
	return o;
}

void heartbeat_link_reset_stats(struct heartbeat_link *l)
{
	lock(l->service);
	l->sent = l->received = l->rejected = l->silences = 0;
	l->max_silence_us = 0;
	memset(l->silence_ms, 0, sizeof(l->silence_ms));
	unlock(l->service);
}
