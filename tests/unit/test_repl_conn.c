/*
 * repl_conn_finish over real loopback TCP: the last frame reaches the
 * peer before the FIN even when the peer sent bytes we never read and
 * megabytes are still queued, which a plain close() loses to an RST.
 */
#include <CUnit/CUnit.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/buffer.h"
#include "base/event_loop.h"
#include "wire/repl_conn.h"
#include "wire/repl_proto.h"
#include "suites.h"

/* More than loopback's socket buffers hold, so the BYE is still ours at close. */
#define FILLER (16u << 20)

struct peer_view {
	size_t got;
	uint8_t tail[256];
	size_t tail_len;
	int eof;
	int error; /* errno of a failed read, 0 if none */
};

static void tcp_pair(int *ours, int *theirs)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int l = socket(AF_INET, SOCK_STREAM, 0);

	CU_ASSERT_FATAL(l >= 0);
	CU_ASSERT_EQUAL_FATAL(bind(l, (struct sockaddr *)&a, sizeof(a)), 0);
	CU_ASSERT_EQUAL_FATAL(listen(l, 1), 0);
	CU_ASSERT_EQUAL_FATAL(getsockname(l, (struct sockaddr *)&a, &len), 0);
	*ours = socket(AF_INET, SOCK_STREAM, 0);
	CU_ASSERT_EQUAL_FATAL(connect(*ours, (struct sockaddr *)&a, sizeof(a)), 0);
	*theirs = accept(l, NULL, NULL);
	CU_ASSERT_FATAL(*theirs >= 0);
	close(l);
	CU_ASSERT_EQUAL(fcntl(*ours, F_SETFL, O_NONBLOCK), 0);
	CU_ASSERT_EQUAL(fcntl(*theirs, F_SETFL, O_NONBLOCK), 0);
}

static int on_frame(void *opaque, const struct repl_frame *f)
{
	(void)opaque;
	(void)f;
	return 0;
}

static void on_closed(void *opaque, const char *why)
{
	(void)why;
	*(int *)opaque = 1;
}

/* Reads what has arrived, keeping the stream's last bytes. */
static void peer_reads(int fd, struct peer_view *v)
{
	static uint8_t chunk[1 << 16];

	while (!v->eof && !v->error) {
		ssize_t n = read(fd, chunk, sizeof(chunk));
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		if (n < 0) {
			v->error = errno;
			return;
		}
		if (n == 0) {
			v->eof = 1;
			return;
		}
		v->got += (size_t)n;
		size_t keep = (size_t)n < sizeof(v->tail) ? (size_t)n : sizeof(v->tail);
		size_t old = v->tail_len + keep > sizeof(v->tail) ? sizeof(v->tail) - keep
								 : v->tail_len;
		memmove(v->tail, v->tail + v->tail_len - old, old);
		memcpy(v->tail + old, chunk + n - keep, keep);
		v->tail_len = old + keep;
	}
}

/*
 * Our side queues FILLER bytes and a BYE while the peer's 64 KiB sit
 * unread in our socket, then ends the connection with `finish` (else
 * repl_conn_destroy).  Returns what the peer saw; *bye gets the BYE.
 */
static struct peer_view end_connection(bool finish, struct buffer *bye, int *our_fd_out)
{
	event_loop *loop = event_loop_create();
	struct peer_view v = { 0 };
	int ours, theirs, closed = 0;
	static uint8_t acks[1 << 16];

	CU_ASSERT_PTR_NOT_NULL_FATAL(loop);
	tcp_pair(&ours, &theirs);
	*our_fd_out = ours;
	memset(acks, 'A', sizeof(acks));
	CU_ASSERT_EQUAL(write(theirs, acks, sizeof(acks)), (ssize_t)sizeof(acks));
	struct repl_conn_events ev = { .opaque = &closed, .on_frame = on_frame,
				       .on_closed = on_closed };
	struct repl_conn *c = repl_conn_create(loop, ours, "peer", &ev);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	uint8_t *fill = malloc(FILLER);
	CU_ASSERT_PTR_NOT_NULL_FATAL(fill);
	memset(fill, 'F', FILLER);
	CU_ASSERT_EQUAL(buffer_append(repl_conn_out(c), fill, FILLER), 0);
	free(fill);
	buffer_init(bye);
	CU_ASSERT_EQUAL_FATAL(repl_put_bye(bye, REPL_BYE_UNPROTECT, "unprotect requested"), 0);
	CU_ASSERT_EQUAL(buffer_append(repl_conn_out(c), buffer_head(bye), buffer_len(bye)), 0);
	if (finish)
		repl_conn_finish(c, 5000);
	else
		repl_conn_destroy(c);
	for (int i = 0; i < 20000 && !v.eof && !v.error; i++) {
		event_loop_run_once(loop, 1);
		peer_reads(theirs, &v);
	}
	close(theirs);
	/* The peer closed: a finishing connection sees it and goes. */
	for (int i = 0; i < 50; i++)
		event_loop_run_once(loop, 2);
	CU_ASSERT_EQUAL(closed, 0); /* the owner is never called back */
	event_loop_destroy(loop);
	return v;
}

static void test_finish_delivers_the_bye_then_closes(void)
{
	struct buffer bye;
	int ours;
	struct peer_view v = end_connection(true, &bye, &ours);

	CU_ASSERT_EQUAL(v.error, 0);
	CU_ASSERT_EQUAL(v.eof, 1);
	CU_ASSERT_EQUAL(v.got, FILLER + buffer_len(&bye));
	CU_ASSERT_FATAL(v.tail_len >= buffer_len(&bye));
	CU_ASSERT_EQUAL(memcmp(v.tail + v.tail_len - buffer_len(&bye), buffer_head(&bye),
			       buffer_len(&bye)), 0);
	/* And the connection freed itself once the peer closed. */
	CU_ASSERT_EQUAL(fcntl(ours, F_GETFD), -1);
	buffer_free(&bye);
}

/* The control: the plain close this replaces loses the BYE to an RST. */
static void test_destroy_with_unread_bytes_loses_the_bye(void)
{
	struct buffer bye;
	int ours;
	struct peer_view v = end_connection(false, &bye, &ours);

	CU_ASSERT_EQUAL(v.error, ECONNRESET);
	CU_ASSERT(v.got < FILLER + buffer_len(&bye));
	buffer_free(&bye);
}

static long stop_loop(event_loop *loop, long long id, void *data)
{
	(void)loop;
	(void)id;
	*(int *)data = 1;
	return TIMER_DONE;
}

static void test_finish_gives_up_on_a_silent_peer(void)
{
	event_loop *loop = event_loop_create();
	int ours, theirs, closed = 0, done = 0;
	struct repl_conn_events ev = { .opaque = &closed, .on_frame = on_frame,
				       .on_closed = on_closed };

	CU_ASSERT_PTR_NOT_NULL_FATAL(loop);
	tcp_pair(&ours, &theirs);
	struct repl_conn *c = repl_conn_create(loop, ours, "peer", &ev);
	CU_ASSERT_PTR_NOT_NULL_FATAL(c);
	repl_conn_finish(c, 50);
	event_loop_add_timer(loop, 300, stop_loop, &done);
	while (!done)
		event_loop_run_once(loop, 100);
	/* The peer never closed: ours went after 50 ms anyway. */
	CU_ASSERT_EQUAL(fcntl(ours, F_GETFD), -1);
	char byte;
	CU_ASSERT_EQUAL(read(theirs, &byte, 1), 0); /* it saw our FIN */
	CU_ASSERT_EQUAL(closed, 0);
	close(theirs);
	event_loop_destroy(loop);
}

int register_repl_conn_tests(void)
{
	CU_pSuite suite = CU_add_suite("repl_conn", NULL, NULL);

	if (!suite ||
	    !CU_add_test(suite, "finish delivers the BYE, then closes",
			 test_finish_delivers_the_bye_then_closes) ||
	    !CU_add_test(suite, "destroy with unread bytes loses the BYE (control)",
			 test_destroy_with_unread_bytes_loses_the_bye) ||
	    !CU_add_test(suite, "finish gives up on a silent peer",
			 test_finish_gives_up_on_a_silent_peer))
		return -1;
	return 0;
}
