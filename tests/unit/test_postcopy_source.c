/*
 * postcopy_source end to end: a session on an event loop writes to one end
 * of a socketpair, the test plays the clone QEMU on the other (pc_reader
 * parses what arrives and checks each page against the image; requests
 * and SHUT go back as return-path messages).  Single-threaded: the test
 * steps the loop and reads between steps.
 */
#include <CUnit/CUnit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/be.h"
#include "base/event_loop.h"
#include "qemu/migration_writer.h"
#include "pc_reader.h"
#include "fork/postcopy_source.h"
#include "fork/postcopy_wire.h"
#include "suites.h"

#define PC_PAGES 512
#define VGA_PAGES 8
#define TOTAL (PC_PAGES + VGA_PAGES)
#define MAX_STEPS 20000

struct clone {
	event_loop *loop;
	struct postcopy_session *s;
	int fd;                /* the clone's end; -1 once closed */
	struct pc_reader r;
	bool closed_by_peer;
	int done_calls;
	bool ok;
	char reason[256];
};

static void on_done(void *opaque, struct postcopy_session *s, bool ok, const char *reason)
{
	struct clone *c = opaque;

	CU_ASSERT_PTR_EQUAL(s, c->s);
	c->done_calls++;
	c->ok = ok;
	snprintf(c->reason, sizeof(c->reason), "%s", reason);
}

static void clone_start(struct clone *c, event_loop *loop, struct postcopy_fork *f,
			const struct ram_image *img)
{
	int sv[2];
	char err[256] = "";

	memset(c, 0, sizeof(*c));
	c->loop = loop;
	pc_reader_init(&c->r, img);
	CU_ASSERT_EQUAL_FATAL(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
	c->fd = sv[1];
	c->s = postcopy_session_start(loop, f, sv[0], on_done, c, err, sizeof(err));
	CU_ASSERT_PTR_NOT_NULL_FATAL(c->s);
	CU_ASSERT_STRING_EQUAL(err, "");
}

static void clone_free(struct clone *c)
{
	postcopy_session_destroy(c->s);
	if (c->fd >= 0)
		close(c->fd);
	pc_reader_free(&c->r);
}

static void clone_close(struct clone *c)
{
	close(c->fd);
	c->fd = -1;
}

enum until { UNTIL_PREAMBLE, UNTIL_EOF, UNTIL_DONE };

static bool reached(const struct clone *c, enum until u)
{
	switch (u) {
	case UNTIL_PREAMBLE:
		return c->r.preamble_done;
	case UNTIL_EOF:
		return c->r.eof;
	default:
		return c->done_calls > 0;
	}
}

/* Steps the loop, reading and parsing what the clone got, until u. */
static void pump(struct clone *c, enum until u)
{
	/* At least one step, so that a pump after the EOF reads what follows. */
	for (int i = 0; i < MAX_STEPS && (i == 0 || !reached(c, u)) && !c->r.error[0]; i++) {
		CU_ASSERT_FATAL(event_loop_run_once(c->loop, i ? 10 : 0) >= 0);
		while (c->fd >= 0) {
			ssize_t n = pc_reader_read(&c->r, c->fd);

			if (n == 0)
				c->closed_by_peer = true;
			if (n <= 0)
				break;
		}
		pc_reader_parse(&c->r);
	}
	if (c->r.error[0])
		fprintf(stderr, "\nclone reader: %s\n", c->r.error);
	CU_ASSERT_STRING_EQUAL(c->r.error, "");
	CU_ASSERT_FATAL(reached(c, u));
}

static void send_msg(struct clone *c, uint16_t type, const void *payload, uint16_t len)
{
	uint8_t m[4 + 300];

	store_be16(m, type);
	store_be16(m + 2, len);
	memcpy(m + 4, payload, len);
	CU_ASSERT_EQUAL_FATAL(write(c->fd, m, 4 + len), 4 + len);
}

/* REQ_PAGES_ID for a named block, REQ_PAGES when block is NULL. */
static void request(struct clone *c, const char *block, uint64_t page, uint32_t pages)
{
	uint8_t m[13 + 255];
	size_t n = block ? strlen(block) : 0;

	store_be64(m, page * MIG_PAGE_SIZE);
	store_be32(m + 8, pages * MIG_PAGE_SIZE);
	m[12] = (uint8_t)n;
	memcpy(m + 13, block ? block : "", n);
	if (block)
		send_msg(c, PCW_RP_REQ_PAGES_ID, m, (uint16_t)(13 + n));
	else
		send_msg(c, PCW_RP_REQ_PAGES, m, 12);
}

static void shut(struct clone *c, uint32_t error)
{
	uint8_t m[4];

	store_be32(m, error);
	send_msg(c, PCW_RP_SHUT, m, 4);
}

struct setup {
	event_loop *loop;
	struct ram_image *img;
	struct postcopy_fork *fork;
};

static void setup(struct setup *t, const struct page_ref *dirtied, size_t n)
{
	t->loop = event_loop_create();
	t->img = pc_test_image(PC_PAGES, VGA_PAGES, true);
	CU_ASSERT_PTR_NOT_NULL_FATAL(t->loop);
	CU_ASSERT_PTR_NOT_NULL_FATAL(t->img);
	t->fork = postcopy_fork_create(t->img, dirtied, n);
	CU_ASSERT_PTR_NOT_NULL_FATAL(t->fork);
}

static void teardown(struct setup *t)
{
	postcopy_fork_destroy(t->fork);
	ram_image_destroy(t->img);
	event_loop_destroy(t->loop);
}

/* A fresh fork of the test image with one clone session on it. */
static void begin(struct setup *t, struct clone *c, const struct page_ref *dirtied,
		  size_t n)
{
	setup(t, dirtied, n);
	clone_start(c, t->loop, t->fork, t->img);
}

static void end(struct setup *t, struct clone *c)
{
	clone_free(c);
	teardown(t);
}

static void check_all_pages_once(const struct clone *c)
{
	/* pc_reader refuses a page sent twice or with the wrong content. */
	CU_ASSERT_EQUAL(c->r.received, TOTAL);
	CU_ASSERT(c->r.end_section);
	CU_ASSERT_EQUAL(c->r.commands[MIG_CMD_OPEN_RETURN_PATH], 1);
	CU_ASSERT_EQUAL(c->r.commands[MIG_CMD_POSTCOPY_ADVISE], 1);
	CU_ASSERT_EQUAL(c->r.commands[MIG_CMD_POSTCOPY_RAM_DISCARD], 2);
	CU_ASSERT_EQUAL(c->r.commands[MIG_CMD_PACKAGED], 1);
}

/* The first pages to arrive are exactly `want`, in that order. */
static void check_first(const struct clone *c, const struct page_ref *want, size_t n)
{
	for (size_t i = 0; i < n; i++)
		CU_ASSERT_EQUAL(c->r.order[i].block == want[i].block &&
				c->r.order[i].page == want[i].page, 1);
}

/* Requests overtake the sweep; every page once; SHUT(0) (or a close) ends it well. */
static void run_whole_session(bool by_close)
{
	struct setup t;
	struct clone c;
	struct postcopy_session_stats st;

	begin(&t, &c, NULL, 0);
	postcopy_session_get_stats(c.s, &st);
	CU_ASSERT_EQUAL(st.state, PCS_CONNECTING);
	CU_ASSERT_EQUAL(st.pages_total, TOTAL);

	pump(&c, UNTIL_PREAMBLE);
	uint64_t before = c.r.received;
	CU_ASSERT(before < 400 - 100);
	request(&c, "pc.ram", 400, 1);
	request(&c, NULL, 401, 1);       /* same block */
	request(&c, "vga.vram", 5, 2);   /* two pages */
	pump(&c, UNTIL_EOF);
	check_all_pages_once(&c);

	uint64_t at = pc_reader_arrival(&c.r, 0, 400);
	/* Behind at most what the output buffer held (32 pages a run). */
	CU_ASSERT(at > before && at <= before + 70);
	CU_ASSERT_EQUAL(pc_reader_arrival(&c.r, 0, 401), at + 1);
	CU_ASSERT_EQUAL(pc_reader_arrival(&c.r, 1, 5), at + 2);
	CU_ASSERT_EQUAL(pc_reader_arrival(&c.r, 1, 6), at + 3);
	/* The sweep went on in address order, skipping what was requested. */
	CU_ASSERT(pc_reader_arrival(&c.r, 0, 399) < pc_reader_arrival(&c.r, 0, 402));
	CU_ASSERT(pc_reader_arrival(&c.r, 0, 402) > at);
	CU_ASSERT(pc_reader_arrival(&c.r, 1, 0) > pc_reader_arrival(&c.r, 0, PC_PAGES - 1));

	postcopy_session_get_stats(c.s, &st);
	CU_ASSERT_EQUAL(st.state, PCS_FINISHING);
	CU_ASSERT_EQUAL(c.done_calls, 0);
	if (by_close)
		clone_close(&c);
	else
		shut(&c, 0);
	pump(&c, UNTIL_DONE);
	CU_ASSERT_EQUAL(c.done_calls, 1);
	CU_ASSERT(c.ok);
	CU_ASSERT_PTR_NOT_NULL(strstr(c.reason, "all 520 pages sent"));

	postcopy_session_get_stats(c.s, &st);
	CU_ASSERT_EQUAL(st.state, PCS_DONE);
	CU_ASSERT_STRING_EQUAL(postcopy_session_state_name(st.state), "done");
	CU_ASSERT_EQUAL(st.requests, 3);
	CU_ASSERT_EQUAL(st.pages_requested, 4);
	CU_ASSERT_EQUAL(st.pages_requested + st.pages_pushed, TOTAL);
	CU_ASSERT_EQUAL(st.latency_samples, 4);
	CU_ASSERT(st.latency_p50_us <= st.latency_p99_us &&
		  st.latency_p99_us <= st.latency_max_us);
	CU_ASSERT(st.started_us > 0 && st.running_us >= st.started_us &&
		  st.done_us >= st.running_us);
	CU_ASSERT(st.bytes_sent > TOTAL / 3 * MIG_PAGE_SIZE);
	end(&t, &c);
}

static void test_session_shut(void)
{
	run_whole_session(false);
}

static void test_session_close(void)
{
	run_whole_session(true);
}

/* Ends the session one way; the done callback must say `why`. */
static void expect_failure(void (*act)(struct clone *c), const char *why)
{
	struct setup t;
	struct clone c;
	struct postcopy_session_stats st;

	begin(&t, &c, NULL, 0);
	pump(&c, UNTIL_PREAMBLE);
	act(&c);
	pump(&c, UNTIL_DONE);
	CU_ASSERT_EQUAL(c.done_calls, 1);
	CU_ASSERT_FALSE(c.ok);
	if (!strstr(c.reason, why))
		fprintf(stderr, "\nreason \"%s\" lacks \"%s\"\n", c.reason, why);
	CU_ASSERT_PTR_NOT_NULL(strstr(c.reason, why));
	postcopy_session_get_stats(c.s, &st);
	CU_ASSERT_EQUAL(st.state, PCS_FAILED);
	CU_ASSERT_STRING_EQUAL(st.error, c.reason);
	/* Nothing more happens on the loop for a failed session. */
	for (int i = 0; i < 3; i++)
		event_loop_run_once(t.loop, 0);
	CU_ASSERT_EQUAL(c.done_calls, 1);
	end(&t, &c);
}

static void act_close(struct clone *c)
{
	clone_close(c);
}

static void act_shut_early(struct clone *c)
{
	shut(c, 0);
}

static void act_shut_error(struct clone *c)
{
	shut(c, 22);
}

static void act_beyond_block(struct clone *c)
{
	request(c, "pc.ram", PC_PAGES, 1);
}

static void act_straddling_block_end(struct clone *c)
{
	request(c, "vga.vram", VGA_PAGES - 1, 2);
}

static void act_unknown_block(struct clone *c)
{
	request(c, "pc.rom", 0, 1);
}

static void act_unaligned(struct clone *c)
{
	uint8_t m[13 + 6];

	store_be64(m, 100);
	store_be32(m + 8, 4096);
	m[12] = 6;
	memcpy(m + 13, "pc.ram", 6);
	send_msg(c, PCW_RP_REQ_PAGES_ID, m, sizeof(m));
}

static void act_garbage(struct clone *c)
{
	send_msg(c, 77, "", 0);
}

static void test_session_failures(void)
{
	expect_failure(act_close, "pages unsent");
	expect_failure(act_shut_early, "pages unsent");
	expect_failure(act_shut_error, "error 22");
	expect_failure(act_beyond_block, "refused");
	expect_failure(act_straddling_block_end, "refused");
	expect_failure(act_unknown_block, "refused");
	expect_failure(act_unaligned, "refused");
	expect_failure(act_garbage, "type 77");
}

/* Dirtied pages go first, most recent first, then the sweep. */
static void test_dirtied_first(void)
{
	/* Least recent first, as snapshot_capture_redirtied lists them. */
	const struct page_ref dirtied[] = { { 0, 10 }, { 1, 2 }, { 0, 300 } };
	struct setup t;
	struct clone c;

	begin(&t, &c, dirtied, 3);
	pump(&c, UNTIL_EOF);
	check_all_pages_once(&c);
	const struct page_ref first[] = { { 0, 300 }, { 1, 2 }, { 0, 10 }, { 0, 0 } };
	check_first(&c, first, 4);
	CU_ASSERT_EQUAL(pc_reader_arrival(&c.r, 0, 9), 13);
	CU_ASSERT_EQUAL(pc_reader_arrival(&c.r, 0, 11), 14);
	CU_ASSERT_EQUAL(pc_reader_arrival(&c.r, 1, VGA_PAGES - 1), TOTAL);
	shut(&c, 0);
	pump(&c, UNTIL_DONE);
	CU_ASSERT(c.ok);
	end(&t, &c);
}

/*
 * What one clone asked for goes early to the next: after the dirtied
 * pages, before the sweep.  A request for a page already sent is ignored,
 * also after the end of the stream.
 */
static void test_requests_shared_between_clones(void)
{
	const struct page_ref dirtied[] = { { 0, 50 } };
	struct setup t;
	struct clone a, b;

	begin(&t, &a, dirtied, 1);
	pump(&a, UNTIL_PREAMBLE);
	request(&a, "pc.ram", 450, 1);
	request(&a, "vga.vram", 7, 1);
	request(&a, "pc.ram", 50, 1); /* the dirtied page, sent first */
	pump(&a, UNTIL_EOF);
	check_all_pages_once(&a);
	request(&a, "pc.ram", 0, 4);
	for (int i = 0; i < 5; i++)
		pump(&a, UNTIL_EOF); /* the reader refuses any byte after the EOF */
	shut(&a, 0);
	pump(&a, UNTIL_DONE);
	CU_ASSERT(a.ok);

	struct postcopy_session_stats st;
	postcopy_session_get_stats(a.s, &st);
	CU_ASSERT_EQUAL(st.requests, 4);
	CU_ASSERT_EQUAL(st.pages_requested, 2);

	clone_start(&b, t.loop, t.fork, t.img);
	pump(&b, UNTIL_EOF);
	check_all_pages_once(&b);
	const struct page_ref first[] = { { 0, 50 }, { 0, 450 }, { 1, 7 }, { 0, 0 } };
	check_first(&b, first, 4);
	clone_close(&b);
	pump(&b, UNTIL_DONE);
	CU_ASSERT(b.ok);
	clone_free(&a);
	clone_free(&b);
	teardown(&t);
}

static void test_session_needs_device_state(void)
{
	event_loop *loop = event_loop_create();
	struct ram_image *img = pc_test_image(4, 1, false);
	struct postcopy_fork *f = img ? postcopy_fork_create(img, NULL, 0) : NULL;
	char err[256] = "";
	int sv[2];

	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	CU_ASSERT_EQUAL_FATAL(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
	CU_ASSERT_PTR_NULL(postcopy_session_start(loop, f, sv[0], on_done, NULL, err,
						  sizeof(err)));
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "no device state"));
	close(sv[0]);
	close(sv[1]);
	postcopy_session_destroy(NULL);
	postcopy_fork_destroy(f);
	ram_image_destroy(img);
	event_loop_destroy(loop);
}

int register_postcopy_source_tests(void)
{
	CU_pSuite suite = CU_add_suite("postcopy_source", NULL, NULL);

	if (!suite)
		return -1;
	if (!CU_add_test(suite, "session: requests first, every page once, SHUT",
			 test_session_shut) ||
	    !CU_add_test(suite, "session: the clone closes at the end",
			 test_session_close) ||
	    !CU_add_test(suite, "session failures", test_session_failures) ||
	    !CU_add_test(suite, "dirtied pages first, most recent first",
			 test_dirtied_first) ||
	    !CU_add_test(suite, "requests shared between clones",
			 test_requests_shared_between_clones) ||
	    !CU_add_test(suite, "session needs device state",
			 test_session_needs_device_state))
		return -1;
	return 0;
}
