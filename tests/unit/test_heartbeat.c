/* Heartbeat datagrams and the heartbeat thread, over real UDP sockets on loopback. */
#include <CUnit/CUnit.h>
#include <arpa/inet.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "wire/heartbeat.h"
#include "suites.h"

static const uint8_t psk[] = "0123456789abcdef-test-key";
static uint8_t nonce_p[REPL_NONCE_SIZE] = { 1 }, nonce_b[REPL_NONCE_SIZE] = { 2 };

/* ---- the datagram ---------------------------------------------------- */

static void test_wire_round_trip_and_tamper(void)
{
	uint64_t id, id2;
	uint8_t key[HEARTBEAT_KEY_SIZE], key2[HEARTBEAT_KEY_SIZE], d[HEARTBEAT_DATAGRAM_SIZE];
	struct heartbeat_msg m = { .flags = HEARTBEAT_FROM_PRIMARY, .seq = 7, .sent_us = 99 }, got;
	const char *err;

	CU_ASSERT_EQUAL(heartbeat_link_secret(psk, sizeof(psk), nonce_p, nonce_b, &id, key), 0);
	CU_ASSERT_EQUAL(heartbeat_link_secret(psk, sizeof(psk), nonce_p, nonce_b, &id2, key2), 0);
	CU_ASSERT_EQUAL(id, id2);
	CU_ASSERT_EQUAL(memcmp(key, key2, sizeof(key)), 0);
	/* Swapping the nonces (the other role's view) gives another link. */
	CU_ASSERT_EQUAL(heartbeat_link_secret(psk, sizeof(psk), nonce_b, nonce_p, &id2, key2), 0);
	CU_ASSERT_NOT_EQUAL(id, id2);

	m.link_id = id;
	CU_ASSERT_EQUAL(heartbeat_encode(&m, key, d), 0);
	CU_ASSERT_EQUAL(heartbeat_peek(d, sizeof(d), &got, &err), 0);
	CU_ASSERT_EQUAL(got.link_id, id);
	CU_ASSERT_EQUAL(got.seq, 7);
	CU_ASSERT_EQUAL(got.sent_us, 99);
	CU_ASSERT_EQUAL(got.flags, HEARTBEAT_FROM_PRIMARY);
	CU_ASSERT_TRUE(heartbeat_verify(d, key));
	CU_ASSERT_FALSE(heartbeat_verify(d, key2));
	d[17] ^= 1; /* the sequence, under the MAC */
	CU_ASSERT_FALSE(heartbeat_verify(d, key));
}

static void test_wire_rejects_malformed(void)
{
	uint8_t d[HEARTBEAT_DATAGRAM_SIZE] = { 0 };
	struct heartbeat_msg m = { .link_id = 1 }, got;
	uint8_t key[HEARTBEAT_KEY_SIZE] = { 0 };
	const char *err = NULL;

	CU_ASSERT_EQUAL(heartbeat_encode(&m, key, d), 0);
	CU_ASSERT_EQUAL(heartbeat_peek(d, sizeof(d) - 1, &got, &err), -1);
	CU_ASSERT_STRING_EQUAL(err, "wrong datagram size");
	d[4] = 2;
	CU_ASSERT_EQUAL(heartbeat_peek(d, sizeof(d), &got, &err), -1);
	CU_ASSERT_STRING_EQUAL(err, "unsupported heartbeat version");
	d[0] = 'X';
	CU_ASSERT_EQUAL(heartbeat_peek(d, sizeof(d), &got, &err), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "magic"));
}

/* ---- the thread -------------------------------------------------------- */

struct silence_seen {
	int calls;
	int64_t silent_ms;
};

static void on_silence(void *opaque, int64_t silent_ms)
{
	struct silence_seen *s = opaque;

	s->calls++;
	s->silent_ms = silent_ms;
}

static struct heartbeat_service *service(event_loop *loop, unsigned stall_ms)
{
	struct heartbeat_service_config cfg = {
		.bind_addr = NULL, .interval_ms = 10,
		.rt_priority = HEARTBEAT_DEFAULT_RT_PRIORITY, .loop_stall_ms = stall_ms,
	};
	char err[256] = "";
	struct heartbeat_service *s = heartbeat_service_create(loop, &cfg, err, sizeof(err));

	CU_ASSERT_PTR_NOT_NULL_FATAL(s);
	return s;
}

static struct sockaddr_in address_of(struct heartbeat_service *s)
{
	json_t *st = heartbeat_service_status_json(s);
	struct sockaddr_in a = { .sin_family = AF_INET };

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	a.sin_port = htons((uint16_t)json_integer_value(json_object_get(st, "udp_port")));
	json_decref(st);
	return a;
}

/* A primary's and a backup's end of one link, each on its own service. */
struct pair {
	event_loop *loop;
	struct heartbeat_service *ps, *bs;
	struct heartbeat_link *pl, *bl;
	struct silence_seen p_seen, b_seen;
	struct sockaddr_in backup_addr;
};

static void pair_open(struct pair *x, unsigned timeout_ms, bool backup_key_differs,
		      unsigned stall_ms)
{
	struct heartbeat_link_config c = { .timeout_ms = timeout_ms, .on_silence = on_silence };

	memset(x, 0, sizeof(*x));
	x->loop = event_loop_create();
	x->ps = service(x->loop, stall_ms);
	x->bs = service(x->loop, 0);
	x->backup_addr = address_of(x->bs);
	heartbeat_link_secret(psk, sizeof(psk), nonce_p, nonce_b, &c.id, c.key);
	c.we_are_primary = true;
	c.peer = &x->backup_addr;
	c.opaque = &x->p_seen;
	x->pl = heartbeat_link_add(x->ps, &c);
	if (backup_key_differs)
		c.key[0] ^= 0xff;
	c.we_are_primary = false;
	c.peer = NULL;
	c.opaque = &x->b_seen;
	x->bl = heartbeat_link_add(x->bs, &c);
	CU_ASSERT_PTR_NOT_NULL_FATAL(x->pl);
	CU_ASSERT_PTR_NOT_NULL_FATAL(x->bl);
}

static void pair_close(struct pair *x)
{
	heartbeat_link_remove(x->pl);
	heartbeat_link_remove(x->bl);
	heartbeat_service_destroy(x->ps);
	heartbeat_service_destroy(x->bs);
	event_loop_destroy(x->loop);
}

static void run_for(event_loop *loop, int ms)
{
	int64_t end = monotonic_ms() + ms;

	while (monotonic_ms() < end)
		event_loop_run_once(loop, 5);
}

static void test_live_peers_stay_quiet_and_measure_silence(void)
{
	struct pair x;
	struct heartbeat_link_stats st;

	pair_open(&x, 500, false, 0);
	run_for(x.loop, 300);
	CU_ASSERT_EQUAL(x.p_seen.calls, 0);
	CU_ASSERT_EQUAL(x.b_seen.calls, 0);
	heartbeat_link_get_stats(x.bl, &st);
	CU_ASSERT_TRUE(st.peer_known); /* learned from the primary's datagrams */
	CU_ASSERT_TRUE(st.received > 5);
	CU_ASSERT_EQUAL(st.rejected, 0);
	CU_ASSERT_TRUE(st.max_silence_ms < 500);
	heartbeat_link_get_stats(x.pl, &st);
	CU_ASSERT_TRUE(st.received > 5); /* the backup answers to the learned address */
	CU_ASSERT_TRUE(st.p50_ms <= st.p99_ms && st.p99_ms <= (unsigned)st.max_silence_ms);
	/* The histogram holds every counted silence, near the 10 ms interval. */
	json_t *link = heartbeat_link_status_json(x.pl);
	json_t *hist = json_object_get(link, "silence_histogram_ms"), *bucket;
	json_int_t counted = 0;
	size_t i;
	json_array_foreach(hist, i, bucket)
		counted += json_integer_value(json_array_get(bucket, 1));
	CU_ASSERT_TRUE(json_array_size(hist) > 0);
	CU_ASSERT_EQUAL(counted, json_integer_value(json_object_get(link, "silences_counted")));
	json_decref(link);
	json_t *svc = heartbeat_service_status_json(x.ps);
	/* The unit tests run as root, as remusdbd does: SCHED_FIFO must be granted. */
	CU_ASSERT_TRUE(json_is_true(json_object_get(svc, "realtime")));
	json_decref(svc);
	pair_close(&x);
}

static void test_silent_peer_is_reported_once_after_timeout(void)
{
	struct pair x;

	pair_open(&x, 100, false, 0);
	run_for(x.loop, 100);
	heartbeat_link_remove(x.pl); /* the primary goes silent without a word */
	x.pl = NULL;
	int64_t silent_from = monotonic_ms();
	run_for(x.loop, 400);
	CU_ASSERT_EQUAL(x.b_seen.calls, 1);
	CU_ASSERT_TRUE(x.b_seen.silent_ms >= 100);
	CU_ASSERT_TRUE(x.b_seen.silent_ms < monotonic_ms() - silent_from + 20);
	pair_close(&x);
}

static void test_wrong_key_is_rejected_and_counts_as_silence(void)
{
	struct pair x;
	struct heartbeat_link_stats st;

	pair_open(&x, 100, true, 0);
	run_for(x.loop, 300);
	heartbeat_link_get_stats(x.bl, &st);
	CU_ASSERT_EQUAL(st.received, 0);
	CU_ASSERT_TRUE(st.rejected > 5);
	CU_ASSERT_FALSE(st.peer_known); /* an unauthenticated sender is never answered */
	CU_ASSERT_EQUAL(x.b_seen.calls, 1);
	CU_ASSERT_EQUAL(x.p_seen.calls, 1);
	pair_close(&x);
}

static void test_replayed_and_reflected_datagrams_are_rejected(void)
{
	struct pair x;
	struct heartbeat_link_stats before, after;
	uint8_t d[HEARTBEAT_DATAGRAM_SIZE];
	struct heartbeat_msg m = { .flags = HEARTBEAT_FROM_PRIMARY, .seq = 1 };
	uint8_t key[HEARTBEAT_KEY_SIZE];
	int fd = socket(AF_INET, SOCK_DGRAM, 0);

	pair_open(&x, 1000, false, 0);
	heartbeat_link_secret(psk, sizeof(psk), nonce_p, nonce_b, &m.link_id, key);
	run_for(x.loop, 100);
	heartbeat_link_get_stats(x.bl, &before);
	/* seq 1 was sent long ago by the real primary: a replay */
	heartbeat_encode(&m, key, d);
	sendto(fd, d, sizeof(d), 0, (struct sockaddr *)&x.backup_addr, sizeof(x.backup_addr));
	/* a far-future seq, correctly signed, but flagged as the backup's own */
	m.flags = 0;
	m.seq = UINT64_MAX / 2;
	heartbeat_encode(&m, key, d);
	sendto(fd, d, sizeof(d), 0, (struct sockaddr *)&x.backup_addr, sizeof(x.backup_addr));
	run_for(x.loop, 50);
	heartbeat_link_get_stats(x.bl, &after);
	CU_ASSERT_EQUAL(after.rejected, before.rejected + 2);
	CU_ASSERT_EQUAL(x.b_seen.calls, 0);
	close(fd);
	pair_close(&x);
}

static void test_wedged_loop_withholds_heartbeats(void)
{
	struct pair x;
	struct heartbeat_link_stats st;

	/* The primary's service gives up after 100 ms without a loop beat. */
	pair_open(&x, 150, false, 100);
	/* Only the thread runs: the loop (both services' loop) is "wedged". */
	usleep(500 * 1000);
	heartbeat_link_get_stats(x.bl, &st);
	CU_ASSERT_TRUE(st.received > 0);   /* it was heard at first ... */
	CU_ASSERT_TRUE(st.expired);        /* ... then withheld for good */
	CU_ASSERT_TRUE(st.max_silence_ms < 100);
	json_t *svc = heartbeat_service_status_json(x.ps);
	CU_ASSERT_TRUE(json_integer_value(json_object_get(svc, "withheld_for_wedged_loop")) > 0);
	json_decref(svc);
	/* Once the loop runs again the backup is told, on the loop thread. */
	run_for(x.loop, 20);
	CU_ASSERT_EQUAL(x.b_seen.calls, 1);
	pair_close(&x);
}

static void test_duplicate_link_id_is_refused(void)
{
	struct pair x;
	struct heartbeat_link_config c = { .timeout_ms = 100 };

	pair_open(&x, 1000, false, 0);
	heartbeat_link_secret(psk, sizeof(psk), nonce_p, nonce_b, &c.id, c.key);
	CU_ASSERT_PTR_NULL(heartbeat_link_add(x.ps, &c));
	pair_close(&x);
}

/*
 * A link that replaces another of the same id (the primary's goodbye
 * heartbeats, while its BYE drains) must be heard by the peer: it goes on
 * numbering where the old one stopped.  Control: a successor that starts
 * again at 1 is dropped as a replay until its numbers pass the old link's,
 * so for a shorter time than the old link lived the peer hears only
 * silence (the goodbye's 200 ms against a protection's minutes).
 */
static uint64_t successor_heard(bool continue_numbering, uint64_t *rejected)
{
	struct pair x;
	struct heartbeat_link_stats before, after;
	struct heartbeat_link_config c = { .timeout_ms = 1000, .on_silence = on_silence };

	pair_open(&x, 1000, false, 0);
	run_for(x.loop, 400);
	heartbeat_link_secret(psk, sizeof(psk), nonce_p, nonce_b, &c.id, c.key);
	c.we_are_primary = true;
	c.peer = &x.backup_addr;
	c.opaque = &x.p_seen;
	uint64_t last = heartbeat_link_retire(x.pl);
	CU_ASSERT_TRUE(last > 5);
	/* The old link's datagrams still in flight land before the count. */
	run_for(x.loop, 30);
	heartbeat_link_get_stats(x.bl, &before);
	c.first_seq = continue_numbering ? last : 0;
	x.pl = heartbeat_link_add(x.ps, &c);
	CU_ASSERT_PTR_NOT_NULL_FATAL(x.pl);
	run_for(x.loop, 100);
	heartbeat_link_get_stats(x.bl, &after);
	pair_close(&x);
	*rejected = after.rejected - before.rejected;
	return after.received - before.received;
}

static void test_successor_link_continues_the_numbering(void)
{
	uint64_t rejected;

	CU_ASSERT_TRUE(successor_heard(true, &rejected) > 3);
	CU_ASSERT_EQUAL(rejected, 0);
	/* The control: every datagram of the renumbered successor is a "replay". */
	CU_ASSERT_EQUAL(successor_heard(false, &rejected), 0);
	CU_ASSERT_TRUE(rejected > 3);
}

int register_heartbeat_tests(void)
{
	CU_pSuite s = CU_add_suite("heartbeat", NULL, NULL);

	if (!s)
		return -1;
	if (!CU_add_test(s, "datagram round trip, tampering", test_wire_round_trip_and_tamper) ||
	    !CU_add_test(s, "malformed datagrams", test_wire_rejects_malformed) ||
	    !CU_add_test(s, "live peers, silence measured",
			 test_live_peers_stay_quiet_and_measure_silence) ||
	    !CU_add_test(s, "silent peer reported once", test_silent_peer_is_reported_once_after_timeout) ||
	    !CU_add_test(s, "wrong key", test_wrong_key_is_rejected_and_counts_as_silence) ||
	    !CU_add_test(s, "replay and reflection", test_replayed_and_reflected_datagrams_are_rejected) ||
	    !CU_add_test(s, "wedged loop withholds", test_wedged_loop_withholds_heartbeats) ||
	    !CU_add_test(s, "duplicate link id", test_duplicate_link_id_is_refused) ||
	    !CU_add_test(s, "a successor link continues the numbering",
			 test_successor_link_continues_the_numbering))
		return -1;
	return 0;
}
