/* The postcopy source sessions of a fork; see postcopy_source.h. */
#include "fork/postcopy_source.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/buffer.h"
#include "qemu/migration_writer.h"
#include "fork/postcopy_wire.h"

#define OUTPUT_HIGH_WATER (128u * 1024)
#define PUSH_RUN_PAGES 32   /* pages per background section */
#define READ_CHUNK 4096
#define MAX_LATENCY_SAMPLES (1u << 20)

struct bitmap_set {
	uint64_t *words[RAM_IMAGE_MAX_BLOCKS];
};

struct postcopy_fork {
	const struct ram_image *img;
	struct page_ref *dirtied;
	size_t dirtied_count;
	/* Pages any clone asked for, first request first, each once. */
	struct page_ref *requested;
	size_t requested_count, requested_cap;
	struct bitmap_set requested_bits;
	uint64_t push_rate; /* bytes per second, 0 = unlimited */
};

struct pending_page {
	struct page_ref ref;
	int64_t asked_us;
};

struct latency_mark {
	uint64_t written_target; /* bytes_queued after the page */
	int64_t asked_us;
};

struct postcopy_session {
	event_loop *loop;
	struct postcopy_fork *fork;
	int fd;
	enum postcopy_session_state state;
	postcopy_done_cb cb;
	void *opaque;
	struct buffer out;
	struct pcw_rp_parser rp;
	struct bitmap_set sent;
	uint64_t sent_count;
	/* Requested, not yet sent; FIFO. */
	struct pending_page *urgent;
	size_t urgent_head, urgent_count, urgent_cap;
	/* Queued, waiting to be written, to time. */
	struct latency_mark *marks;
	size_t marks_head, marks_count, marks_cap;
	uint32_t *samples;
	size_t samples_count, samples_cap;
	/* Background cursors: dirtied (from the end), requested log, sweep. */
	size_t dirty_left, log_next;
	uint32_t sweep_block;
	uint64_t sweep_page;
	uint64_t bytes_queued;
	/* Background push budget (postcopy_fork_set_push_rate). */
	int64_t push_budget, budget_at_us;
	long long refill_timer;
	struct postcopy_session_stats stats;
};

static bool bit_test(const struct bitmap_set *s, struct page_ref r)
{
	return s->words[r.block][r.page / 64] & (1ull << (r.page % 64));
}

static void bit_set(struct bitmap_set *s, struct page_ref r)
{
	s->words[r.block][r.page / 64] |= 1ull << (r.page % 64);
}

static int bitmap_alloc(struct bitmap_set *s, const struct ram_image *img)
{
	for (size_t i = 0; i < ram_image_block_count(img); i++) {
		uint64_t pages = ram_image_block(img, i)->length / MIG_PAGE_SIZE;

		s->words[i] = calloc(pages / 64 + 1, sizeof(uint64_t));
		if (!s->words[i])
			return -1;
	}
	return 0;
}

static void bitmap_free(struct bitmap_set *s)
{
	for (size_t i = 0; i < RAM_IMAGE_MAX_BLOCKS; i++)
		free(s->words[i]);
}

static int grow(void **arr, size_t *cap, size_t need, size_t elem)
{
	if (need <= *cap)
		return 0;
	size_t ncap = *cap ? *cap * 2 : 256;
	while (ncap < need)
		ncap *= 2;
	void *n = realloc(*arr, ncap * elem);
	if (!n)
		return -1;
	*arr = n;
	*cap = ncap;
	return 0;
}

/* ---- the fork ------------------------------------------------------------ */

struct postcopy_fork *postcopy_fork_create(const struct ram_image *img,
					   const struct page_ref *dirtied,
					   size_t dirtied_count)
{
	struct postcopy_fork *f = calloc(1, sizeof(*f));

	if (!f)
		return NULL;
	f->img = img;
	f->dirtied = malloc((dirtied_count ? dirtied_count : 1) * sizeof(*dirtied));
	if (!f->dirtied || bitmap_alloc(&f->requested_bits, img) < 0) {
		postcopy_fork_destroy(f);
		return NULL;
	}
	if (dirtied_count)
		memcpy(f->dirtied, dirtied, dirtied_count * sizeof(*dirtied));
	f->dirtied_count = dirtied_count;
	return f;
}

void postcopy_fork_destroy(struct postcopy_fork *f)
{
	if (!f)
		return;
	free(f->dirtied);
	free(f->requested);
	bitmap_free(&f->requested_bits);
	free(f);
}

void postcopy_fork_set_push_rate(struct postcopy_fork *f, uint64_t bytes_per_sec)
{
	f->push_rate = bytes_per_sec;
}

static void log_request(struct postcopy_fork *f, struct page_ref r)
{
	if (bit_test(&f->requested_bits, r))
		return;
	if (grow((void **)&f->requested, &f->requested_cap, f->requested_count + 1,
		 sizeof(*f->requested)) < 0)
		return; /* only an ordering hint: losing it is harmless */
	bit_set(&f->requested_bits, r);
	f->requested[f->requested_count++] = r;
}

/* ---- session --------------------------------------------------------------- */

const char *postcopy_session_state_name(enum postcopy_session_state s)
{
	static const char *const names[] = { "connecting", "sending", "finishing",
					     "done", "failed" };
	return (unsigned)s < sizeof(names) / sizeof(names[0]) ? names[s] : "?";
}

static void update_watch(struct postcopy_session *s);

static void session_end(struct postcopy_session *s, bool ok, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void session_end(struct postcopy_session *s, bool ok, const char *fmt, ...)
{
	va_list ap;

	if (s->state == PCS_DONE || s->state == PCS_FAILED)
		return;
	va_start(ap, fmt);
	vsnprintf(s->stats.error, sizeof(s->stats.error), fmt, ap);
	va_end(ap);
	s->state = ok ? PCS_DONE : PCS_FAILED;
	s->stats.done_us = monotonic_us();
	event_loop_unwatch(s->loop, s->fd);
	if (s->cb)
		s->cb(s->opaque, s, ok, s->stats.error);
}

static int find_block(const struct ram_image *img, const char *name)
{
	for (size_t i = 0; i < ram_image_block_count(img); i++)
		if (!strcmp(ram_image_block(img, i)->name, name))
			return (int)i;
	return -1;
}

static int on_request(void *opaque, const char *block, uint64_t start, uint32_t len)
{
	struct postcopy_session *s = opaque;
	const struct ram_image *img = s->fork->img;
	int b = find_block(img, block);
	int64_t now = monotonic_us();

	s->stats.requests++;
	if (b < 0 || start % MIG_PAGE_SIZE || len == 0 ||
	    start >= ram_image_block(img, b)->length ||
	    len > ram_image_block(img, b)->length - start)
		return -1;
	for (uint64_t off = start; off < start + len; off += MIG_PAGE_SIZE) {
		struct page_ref r = { (uint32_t)b, off / MIG_PAGE_SIZE };

		log_request(s->fork, r);
		if (bit_test(&s->sent, r)) {
			/* Queued or in flight already: it arrives soon. */
			continue;
		}
		if (grow((void **)&s->urgent, &s->urgent_cap,
			 s->urgent_head + s->urgent_count + 1, sizeof(*s->urgent)) < 0)
			return -1;
		s->urgent[s->urgent_head + s->urgent_count++] =
			(struct pending_page){ r, now };
	}
	return 0;
}

static int on_shut(void *opaque, uint32_t error)
{
	struct postcopy_session *s = opaque;

	if (error)
		session_end(s, false, "the clone ended the migration with error %u", error);
	else if (s->state != PCS_FINISHING || buffer_len(&s->out))
		session_end(s, false, "the clone shut the return path with %llu pages "
			    "unsent", (unsigned long long)(s->stats.pages_total - s->sent_count));
	else
		session_end(s, true, "all %llu pages sent",
			    (unsigned long long)s->stats.pages_total);
	return 0;
}

static int queue_pages(struct postcopy_session *s, struct page_ref r, uint64_t n)
{
	if (pcw_pages(&s->out, s->fork->img, r.block, r.page, n) < 0)
		return -1;
	for (uint64_t i = 0; i < n; i++)
		bit_set(&s->sent, (struct page_ref){ r.block, r.page + i });
	s->sent_count += n;
	return 0;
}

static int mark_latency(struct postcopy_session *s, int64_t asked_us)
{
	if (grow((void **)&s->marks, &s->marks_cap, s->marks_head + s->marks_count + 1,
		 sizeof(*s->marks)) < 0)
		return -1;
	s->marks[s->marks_head + s->marks_count++] = (struct latency_mark){
		s->bytes_queued + buffer_len(&s->out), asked_us };
	return 0;
}

static int next_urgent(struct postcopy_session *s)
{
	while (s->urgent_count) {
		struct pending_page p = s->urgent[s->urgent_head++];

		s->urgent_count--;
		if (!s->urgent_count)
			s->urgent_head = 0;
		if (bit_test(&s->sent, p.ref))
			continue;
		if (queue_pages(s, p.ref, 1) < 0 || mark_latency(s, p.asked_us) < 0)
			return -1;
		s->stats.pages_requested++;
		return 1;
	}
	return 0;
}

/* Next page of phases 1 and 2 not sent yet; 0 when none is left there. */
static int next_listed(struct postcopy_session *s, struct page_ref *r)
{
	while (s->dirty_left) {
		*r = s->fork->dirtied[--s->dirty_left];
		if (!bit_test(&s->sent, *r))
			return 1;
	}
	while (s->log_next < s->fork->requested_count) {
		*r = s->fork->requested[s->log_next++];
		if (!bit_test(&s->sent, *r))
			return 1;
	}
	return 0;
}

static int next_background(struct postcopy_session *s)
{
	const struct ram_image *img = s->fork->img;
	struct page_ref r;

	if (next_listed(s, &r)) {
		if (queue_pages(s, r, 1) < 0)
			return -1;
		s->stats.pages_pushed++;
		return 1;
	}
	while (s->sweep_block < ram_image_block_count(img)) {
		uint64_t pages = ram_image_block(img, s->sweep_block)->length / MIG_PAGE_SIZE;

		while (s->sweep_page < pages &&
		       bit_test(&s->sent, (struct page_ref){ s->sweep_block, s->sweep_page }))
			s->sweep_page++;
		if (s->sweep_page == pages) {
			s->sweep_block++;
			s->sweep_page = 0;
			continue;
		}
		uint64_t n = 0;
		while (n < PUSH_RUN_PAGES && s->sweep_page + n < pages &&
		       !bit_test(&s->sent, (struct page_ref){ s->sweep_block,
							     s->sweep_page + n }))
			n++;
		if (queue_pages(s, (struct page_ref){ s->sweep_block, s->sweep_page }, n) < 0)
			return -1;
		s->sweep_page += n;
		s->stats.pages_pushed += n;
		return 1;
	}
	return 0;
}

#define REFILL_MS 10

static long on_refill(event_loop *loop, long long id, void *data)
{
	struct postcopy_session *s = data;

	s->refill_timer = 0;
	update_watch(s);
	return TIMER_DONE;
}

/* True when the rate cap lets the background push go on now. */
static bool push_allowed(struct postcopy_session *s)
{
	uint64_t rate = s->fork->push_rate;
	int64_t now = monotonic_us();

	if (!rate)
		return true;
	if (!s->budget_at_us)
		s->budget_at_us = now;
	s->push_budget += (int64_t)((uint64_t)(now - s->budget_at_us) * rate / 1000000);
	s->budget_at_us = now;
	if (s->push_budget > (int64_t)OUTPUT_HIGH_WATER)
		s->push_budget = OUTPUT_HIGH_WATER; /* no bursts after a quiet spell */
	if (s->push_budget > 0)
		return true;
	if (!s->refill_timer) {
		s->refill_timer = event_loop_add_timer(s->loop, REFILL_MS, on_refill, s);
		if (s->refill_timer < 0)
			s->refill_timer = 0;
	}
	return false;
}

static int fill_output(struct postcopy_session *s)
{
	while (s->state == PCS_SENDING && buffer_len(&s->out) < OUTPUT_HIGH_WATER) {
		int rc = next_urgent(s);

		if (rc == 0) {
			if (!push_allowed(s))
				break;
			size_t before = buffer_len(&s->out);
			rc = next_background(s);
			s->push_budget -= (int64_t)(buffer_len(&s->out) - before);
		}
		if (rc < 0)
			return -1;
		if (rc == 0) {
			if (pcw_finish(&s->out, s->fork->img) < 0)
				return -1;
			s->state = PCS_FINISHING;
		}
	}
	return 0;
}

static void record_written(struct postcopy_session *s, uint64_t written_total)
{
	int64_t now = monotonic_us();

	while (s->marks_count && s->marks[s->marks_head].written_target <= written_total) {
		int64_t lat = now - s->marks[s->marks_head].asked_us;

		s->marks_head++;
		s->marks_count--;
		if (s->samples_count < MAX_LATENCY_SAMPLES &&
		    grow((void **)&s->samples, &s->samples_cap, s->samples_count + 1,
			 sizeof(*s->samples)) == 0)
			s->samples[s->samples_count++] = lat > UINT32_MAX ? UINT32_MAX : (uint32_t)lat;
	}
	if (!s->marks_count)
		s->marks_head = 0;
}

static void on_io(event_loop *loop, int fd, void *data, int ready)
{
	struct postcopy_session *s = data;

	if (s->state == PCS_CONNECTING) {
		int soerr = 0;
		socklen_t sl = sizeof(soerr);

		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
			soerr = errno;
		if (soerr) {
			session_end(s, false, "cannot connect to the clone: %s", strerror(soerr));
			return;
		}
		s->state = PCS_SENDING;
		s->stats.running_us = monotonic_us();
	}
	if (ready & EV_READABLE) {
		uint8_t buf[READ_CHUNK];
		ssize_t n = recv(fd, buf, sizeof(buf), 0);

		if (n == 0) {
			if (s->state == PCS_FINISHING && !buffer_len(&s->out))
				session_end(s, true, "all %llu pages sent",
					    (unsigned long long)s->stats.pages_total);
			else
				session_end(s, false, "the clone closed the connection "
					    "with %llu pages unsent",
					    (unsigned long long)(s->stats.pages_total - s->sent_count));
			return;
		}
		if (n < 0 && errno != EAGAIN && errno != EINTR) {
			session_end(s, false, "reading the clone's return path: %s",
				    strerror(errno));
			return;
		}
		if (n > 0 && pcw_rp_feed(&s->rp, buf, (size_t)n) < 0) {
			session_end(s, false, "the clone's return path: %s", s->rp.error);
			return;
		}
		if (s->state == PCS_DONE || s->state == PCS_FAILED)
			return;
	}
	if (fill_output(s) < 0) {
		session_end(s, false, "out of memory");
		return;
	}
	size_t before = buffer_len(&s->out);
	if (buffer_write_fd(&s->out, fd) < 0) {
		session_end(s, false, "writing to the clone: %s", strerror(errno));
		return;
	}
	s->bytes_queued += before - buffer_len(&s->out);
	s->stats.bytes_sent = s->bytes_queued;
	record_written(s, s->bytes_queued);
	update_watch(s);
}

static void update_watch(struct postcopy_session *s)
{
	int mask = EV_READABLE;
	/* Capped and out of budget, with nothing requested: the refill timer
	 * wakes us; polling for writable would spin. */
	bool waiting_for_budget = s->refill_timer && !s->urgent_count;

	if (s->state == PCS_CONNECTING || buffer_len(&s->out) ||
	    (s->state == PCS_SENDING && !waiting_for_budget))
		mask |= EV_WRITABLE;
	event_loop_set_mask(s->loop, s->fd, mask);
}

struct postcopy_session *postcopy_session_start(event_loop *loop,
						struct postcopy_fork *f, int fd,
						postcopy_done_cb cb, void *opaque,
						char *err, size_t errlen)
{
	struct postcopy_session *s = calloc(1, sizeof(*s));
	const struct pcw_rp_callbacks rpcb = { .opaque = s, .on_request = on_request,
					       .on_shut = on_shut };

	if (!s) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	s->loop = loop;
	s->fork = f;
	s->fd = fd;
	s->cb = cb;
	s->opaque = opaque;
	s->state = PCS_CONNECTING;
	s->dirty_left = f->dirtied_count;
	buffer_init(&s->out);
	pcw_rp_init(&s->rp, &rpcb);
	s->stats.pages_total = ram_image_pages_total(f->img);
	s->stats.started_us = monotonic_us();
	if (bitmap_alloc(&s->sent, f->img) < 0) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	if (pcw_preamble(&s->out, f->img, err, errlen) < 0)
		goto fail;
	if (event_loop_watch(loop, fd, EV_READABLE | EV_WRITABLE, on_io, s) < 0) {
		snprintf(err, errlen, "cannot watch the clone's socket");
		goto fail;
	}
	return s;
fail:
	s->fd = -1;
	postcopy_session_destroy(s);
	return NULL;
}

void postcopy_session_destroy(struct postcopy_session *s)
{
	if (!s)
		return;
	if (s->fd >= 0) {
		event_loop_unwatch(s->loop, s->fd);
		close(s->fd);
	}
	if (s->refill_timer)
		event_loop_del_timer(s->loop, s->refill_timer);
	buffer_free(&s->out);
	bitmap_free(&s->sent);
	free(s->urgent);
	free(s->marks);
	free(s->samples);
	free(s);
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

void postcopy_session_get_stats(const struct postcopy_session *s,
				struct postcopy_session_stats *out)
{
	*out = s->stats;
	out->state = s->state;
	out->latency_samples = s->samples_count;
	if (s->samples_count) {
		uint32_t *sorted = malloc(s->samples_count * sizeof(*sorted));

		if (sorted) {
			memcpy(sorted, s->samples, s->samples_count * sizeof(*sorted));
			qsort(sorted, s->samples_count, sizeof(*sorted), cmp_u32);
			out->latency_p50_us = sorted[(s->samples_count - 1) / 2];
			out->latency_p99_us = sorted[(s->samples_count - 1) * 99 / 100];
			out->latency_max_us = sorted[s->samples_count - 1];
			free(sorted);
		}
	}
}
