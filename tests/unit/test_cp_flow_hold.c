/*
 * Commit protection on the primary: frames are classified (flow, mark),
 * a marked frame's DSCP is cleared with a valid IPv4 header checksum,
 * and output commit in CP mode holds marked frames for their epoch,
 * holds unmarked ones only behind a held frame of their own flow, and
 * lets everything else out at once.  Without CP every frame waits.
 */
#include <CUnit/CUnit.h>
#include <string.h>

#include "relay/cp_flow_frame.h"
#include "relay/cp_flow_table.h"
#include "primary/output_commit.h"
#include "suites.h"

#define DSCP 47
#define FRAME 80

/*
 * An Ethernet + IPv4 + TCP frame from 10.0.0.1:sport to 10.0.0.2:5432,
 * with `dscp` and ECN bits 01, a valid header checksum, and `tag` as
 * its first payload byte.
 */
static size_t ipv4_tcp(uint8_t *f, uint16_t sport, uint8_t dscp, uint8_t tag)
{
	memset(f, 0, FRAME);
	f[12] = 0x08; /* IPv4 */
	uint8_t *ip = f + 14;
	ip[0] = 0x45;
	ip[1] = (uint8_t)(dscp << 2 | 1);
	ip[3] = FRAME - 14;
	ip[8] = 64;
	ip[9] = 6;
	ip[12] = 10, ip[15] = 1;
	ip[16] = 10, ip[19] = 2;
	uint32_t sum = 0;
	for (int i = 0; i < 20; i += 2)
		sum += (uint32_t)(ip[i] << 8 | ip[i + 1]);
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	ip[10] = (uint8_t)(~sum >> 8);
	ip[11] = (uint8_t)~sum;
	uint8_t *tcp = ip + 20;
	tcp[0] = (uint8_t)(sport >> 8), tcp[1] = (uint8_t)sport;
	tcp[2] = 5432 >> 8, tcp[3] = 5432 & 0xff;
	tcp[12] = 0x50;
	tcp[20] = tag;
	return FRAME;
}

static bool ipv4_checksum_ok(const uint8_t *f)
{
	uint32_t sum = 0;

	for (int i = 0; i < 20; i += 2)
		sum += (uint32_t)(f[14 + i] << 8 | f[14 + i + 1]);
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return sum == 0xffff;
}

static size_t ipv6_tcp(uint8_t *f, uint8_t dscp, uint8_t next_header)
{
	memset(f, 0, FRAME);
	f[12] = 0x86, f[13] = 0xdd;
	uint8_t *ip = f + 14;
	uint8_t tclass = (uint8_t)(dscp << 2 | 2);
	ip[0] = (uint8_t)(0x60 | tclass >> 4);
	ip[1] = (uint8_t)(tclass << 4);
	ip[6] = next_header;
	ip[23] = 1, ip[39] = 2;
	ip[40] = 0x12, ip[41] = 0x34, ip[42] = 0x15, ip[43] = 0x38;
	return FRAME;
}

static void test_classify(void)
{
	uint8_t f[FRAME];
	struct cp_flow_frame c;

	cp_flow_frame_classify(f, ipv4_tcp(f, 40000, DSCP, 0), DSCP, &c);
	CU_ASSERT(c.ip && c.tcp && c.marked);
	CU_ASSERT_EQUAL(c.key.family, 4);
	CU_ASSERT_EQUAL(c.key.sport, 40000);
	CU_ASSERT_EQUAL(c.key.dport, 5432);
	cp_flow_frame_classify(f, ipv4_tcp(f, 40000, 46, 0), DSCP, &c);
	CU_ASSERT(c.ip && c.tcp && !c.marked); /* a neighbouring code point is not ours */
	/* A later IPv4 fragment: marked, but no ports. */
	ipv4_tcp(f, 40000, DSCP, 0);
	f[14 + 7] = 10;
	cp_flow_frame_classify(f, FRAME, DSCP, &c);
	CU_ASSERT(c.ip && c.marked && !c.tcp);
	cp_flow_frame_classify(f, ipv6_tcp(f, DSCP, 6), DSCP, &c);
	CU_ASSERT(c.ip && c.tcp && c.marked);
	CU_ASSERT_EQUAL(c.key.family, 6);
	CU_ASSERT_EQUAL(c.key.sport, 0x1234);
	/* An extension header: still marked, not parsed as TCP. */
	cp_flow_frame_classify(f, ipv6_tcp(f, DSCP, 0), DSCP, &c);
	CU_ASSERT(c.ip && c.marked && !c.tcp);
	/* 802.1Q */
	uint8_t v[FRAME + 4];
	ipv4_tcp(f, 40000, DSCP, 0);
	memcpy(v, f, 12);
	v[12] = 0x81, v[13] = 0x00, v[14] = 0, v[15] = 5;
	memcpy(v + 16, f + 12, FRAME - 12);
	cp_flow_frame_classify(v, sizeof(v), DSCP, &c);
	CU_ASSERT(c.ip && c.tcp && c.marked && c.ip_offset == 18);
	/* ARP, and frames too short for their headers. */
	memset(f, 0, FRAME);
	f[12] = 0x08, f[13] = 0x06;
	cp_flow_frame_classify(f, FRAME, DSCP, &c);
	CU_ASSERT(!c.ip && !c.marked);
	for (size_t len = 0; len < 14 + 20; len++) {
		ipv4_tcp(f, 1, DSCP, 0);
		cp_flow_frame_classify(f, len, DSCP, &c);
		CU_ASSERT(!c.ip && !c.marked);
	}
	ipv4_tcp(f, 1, DSCP, 0);
	cp_flow_frame_classify(f, 14 + 20 + 3, DSCP, &c); /* IP, ports cut off */
	CU_ASSERT(c.ip && c.marked && !c.tcp);
}

static void test_clear_mark(void)
{
	uint8_t f[FRAME];
	struct cp_flow_frame c;

	for (unsigned dscp = 1; dscp < 64; dscp++) {
		ipv4_tcp(f, (uint16_t)(1000 + dscp), (uint8_t)dscp, 0);
		CU_ASSERT(ipv4_checksum_ok(f));
		cp_flow_frame_classify(f, FRAME, (uint8_t)dscp, &c);
		cp_flow_frame_clear_mark(f, &c);
		CU_ASSERT_EQUAL(f[15], 1); /* DSCP 0, ECN kept */
		CU_ASSERT(ipv4_checksum_ok(f));
	}
	ipv6_tcp(f, DSCP, 6);
	cp_flow_frame_classify(f, FRAME, DSCP, &c);
	cp_flow_frame_clear_mark(f, &c);
	CU_ASSERT_EQUAL(f[14], 0x60);
	CU_ASSERT_EQUAL(f[15], 0x20); /* traffic class 0x02: ECN kept */
	cp_flow_frame_classify(f, FRAME, DSCP, &c);
	CU_ASSERT(!c.marked);
}

static void test_flow_counts(void)
{
	struct cp_flow_table *t = cp_flow_table_create();
	uint8_t f[FRAME];
	struct cp_flow_frame a, b;

	CU_ASSERT_PTR_NOT_NULL_FATAL(t);
	cp_flow_frame_classify(f, ipv4_tcp(f, 1, 0, 0), DSCP, &a);
	cp_flow_frame_classify(f, ipv4_tcp(f, 2, 0, 0), DSCP, &b);
	CU_ASSERT_EQUAL(cp_flow_table_add(t, &a.key), 0);
	CU_ASSERT_EQUAL(cp_flow_table_add(t, &a.key), 0);
	CU_ASSERT_EQUAL(cp_flow_table_add(t, &b.key), 0);
	CU_ASSERT_EQUAL(cp_flow_table_held(t, &a.key), 2);
	CU_ASSERT_EQUAL(cp_flow_table_count(t), 2);
	cp_flow_table_remove(t, &a.key);
	cp_flow_table_remove(t, &b.key);
	cp_flow_table_remove(t, &b.key); /* unknown now: nothing happens */
	CU_ASSERT_EQUAL(cp_flow_table_held(t, &a.key), 1);
	CU_ASSERT_EQUAL(cp_flow_table_held(t, &b.key), 0);
	CU_ASSERT_EQUAL(cp_flow_table_count(t), 1);
	cp_flow_table_clear(t);
	CU_ASSERT_EQUAL(cp_flow_table_count(t), 0);
	cp_flow_table_destroy(t);
}

struct wire {
	uint8_t tags[64];  /* each released frame's payload tag, in order */
	uint8_t tos[64];
	bool checksums_ok;
	size_t count;
	int refuse;        /* refuse this many frames (a busy NIC) */
};

static int to_wire(void *opaque, const uint8_t *frame, size_t len)
{
	struct wire *w = opaque;

	if (w->refuse > 0) {
		w->refuse--;
		return 1;
	}
	if (w->count < sizeof(w->tags) && len >= FRAME) {
		w->tags[w->count] = frame[14 + 40];
		w->tos[w->count] = frame[15];
		if (frame[12] == 0x08 && frame[13] == 0 && !ipv4_checksum_ok(frame))
			w->checksums_ok = false;
		w->count++;
	}
	return 0;
}

static void send_frame(struct output_commit *oc, uint16_t sport, uint8_t dscp, uint8_t tag)
{
	uint8_t f[FRAME];

	CU_ASSERT_EQUAL(output_commit_hold(oc, f, (uint32_t)ipv4_tcp(f, sport, dscp, tag)), 1);
}

/* Output commit in CP mode, epoch 1 open, releasing to `w`. */
static struct output_commit *cp_output(struct wire *w)
{
	struct output_commit *oc = output_commit_create(1 << 20, false, to_wire, w);

	CU_ASSERT_PTR_NOT_NULL_FATAL(oc);
	CU_ASSERT_EQUAL(output_commit_enable_cp(oc, DSCP), 0);
	output_commit_cut(oc, 0);
	return oc;
}

static void test_commit_protection_release_rule(void)
{
	struct wire w = { .checksums_ok = true };
	struct output_commit *oc = cp_output(&w);
	struct output_commit_cp_stats st;

	send_frame(oc, 1, 0, 'a');      /* flow 1, unmarked, nothing held: leaves */
	CU_ASSERT_EQUAL(w.count, 1);
	send_frame(oc, 1, DSCP, 'C');   /* flow 1's commit ack: held */
	send_frame(oc, 1, 0, 'b');      /* behind it: held */
	send_frame(oc, 2, 0, 'x');      /* flow 2: leaves */
	CU_ASSERT_EQUAL(w.count, 2);
	CU_ASSERT_EQUAL(w.tags[1], 'x');
	output_commit_cut(oc, 1);       /* checkpoint 1 begins */
	send_frame(oc, 1, 0, 'c');      /* flow 1 still holds: behind, in epoch 2 */
	output_commit_ack(oc, 1);       /* C and b leave, in order, C unmarked */
	CU_ASSERT_EQUAL(w.count, 4);
	CU_ASSERT_EQUAL(w.tags[2], 'C');
	CU_ASSERT_EQUAL(w.tos[2], 1);   /* DSCP 0, ECN kept */
	CU_ASSERT_EQUAL(w.tags[3], 'b');
	CU_ASSERT(w.checksums_ok);
	send_frame(oc, 1, 0, 'd');      /* c is still held: d waits too */
	CU_ASSERT_EQUAL(w.count, 4);
	output_commit_cut(oc, 2);
	output_commit_ack(oc, 2);
	CU_ASSERT_EQUAL(w.count, 6);
	CU_ASSERT_EQUAL(w.tags[4], 'c');
	CU_ASSERT_EQUAL(w.tags[5], 'd');
	send_frame(oc, 1, 0, 'e');      /* nothing held any more: leaves */
	CU_ASSERT_EQUAL(w.count, 7);
	/* A NIC that cannot take a frame now: it is held, not lost. */
	w.refuse = 1;
	send_frame(oc, 3, 0, 'z');
	CU_ASSERT_EQUAL(w.count, 7);
	output_commit_cut(oc, 3);
	output_commit_ack(oc, 3);
	CU_ASSERT_EQUAL(w.count, 8);
	CU_ASSERT_EQUAL(w.tags[7], 'z');
	output_commit_get_cp_stats(oc, &st);
	CU_ASSERT_EQUAL(st.marked_held, 1);
	CU_ASSERT_EQUAL(st.held_behind, 3);
	CU_ASSERT_EQUAL(st.held_sink_busy, 1);
	CU_ASSERT_EQUAL(st.released_at_once, 3);
	CU_ASSERT_EQUAL(st.flows_holding, 0);
	output_commit_destroy(oc);
}

/* The control: without CP (Remus) the same frames all wait. */
static void test_without_cp_everything_waits(void)
{
	struct wire w = { .checksums_ok = true };
	struct output_commit *oc = output_commit_create(1 << 20, false, to_wire, &w);

	CU_ASSERT_PTR_NOT_NULL_FATAL(oc);
	output_commit_cut(oc, 0);
	send_frame(oc, 1, 0, 'a');
	send_frame(oc, 2, 0, 'x');
	send_frame(oc, 1, DSCP, 'C');
	CU_ASSERT_EQUAL(w.count, 0);
	output_commit_cut(oc, 1);
	output_commit_ack(oc, 1);
	CU_ASSERT_EQUAL(w.count, 3);
	CU_ASSERT_EQUAL(w.tos[2], (DSCP << 2) | 1); /* not ours to clear */
	output_commit_destroy(oc);
}

/* Fenced: a CP primary drops held frames and forgets its flows. */
static void test_fencing_forgets_flows(void)
{
	struct wire w = { .checksums_ok = true };
	struct output_commit *oc = cp_output(&w);
	struct output_commit_cp_stats st;

	send_frame(oc, 1, DSCP, 'C');
	output_commit_drop_all(oc);
	output_commit_get_cp_stats(oc, &st);
	CU_ASSERT_EQUAL(st.flows_holding, 0);
	send_frame(oc, 1, 0, 'a'); /* fenced: nothing leaves */
	CU_ASSERT_EQUAL(w.count, 0);
	output_commit_destroy(oc);
}

int register_cp_flow_hold_tests(void)
{
	CU_pSuite suite = CU_add_suite("cp_flow_hold", NULL, NULL);

	if (!suite ||
	    !CU_add_test(suite, "frames are classified by flow and mark", test_classify) ||
	    !CU_add_test(suite, "a cleared mark keeps ECN and a valid checksum", test_clear_mark) ||
	    !CU_add_test(suite, "held frames are counted per flow", test_flow_counts) ||
	    !CU_add_test(suite, "commit protection holds marked frames and their flow only",
			 test_commit_protection_release_rule) ||
	    !CU_add_test(suite, "without commit protection every frame waits (control)",
			 test_without_cp_everything_waits) ||
	    !CU_add_test(suite, "fencing drops held frames and forgets the flows",
			 test_fencing_forgets_flows))
		return -1;
	return 0;
}
