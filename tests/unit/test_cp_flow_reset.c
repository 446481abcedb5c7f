/*
 * Commit protection's fail-safe reset (issue 10), unit by unit:
 * - the classifier reads TCP's sequence fields (SYN/FIN count, Ethernet
 *   padding does not);
 * - output commit in CP mode records each flow's position at every cut
 *   (FLOW_STATE) and says FLOW_AHEAD before it lets bytes out beyond the
 *   last cut, or a bare ACK of client bytes beyond the cut's, and only then;
 * - the two frames round-trip and malformed ones are refused;
 * - the backup resets exactly the flows named by a notice of a cut no
 *   older than the restored one (a notice one cut older is the control);
 * - the reset engine's frames have valid checksums, and every ACK of a
 *   reset flow is answered by an RST at its acknowledgement number.
 */
#include <CUnit/CUnit.h>
#include <string.h>

#include "base/be.h"
#include "relay/cp_flow_reset.h"
#include "primary/output_commit.h"
#include "wire/cp_flow_msg.h"
#include "backup/cp_flow_positions.h"
#include "suites.h"

#define DSCP 47
static const uint8_t GUEST_MAC[6] = { 0x52, 0x54, 0, 0, 0, 1 };
static const uint8_t PEER_MAC[6] = { 0x02, 0x01, 10, 77, 0, 9 };

/* 10.0.0.1:sport -> 10.0.0.2:5432 (the guest's side), `payload` bytes, 6 bytes of padding. */
static size_t tcp4(uint8_t *f, uint16_t sport, uint32_t seq, uint32_t ack, uint8_t flags,
		   uint16_t payload, uint8_t dscp)
{
	size_t len = 14 + 20 + 20 + payload + 6;

	memset(f, 0, len);
	memcpy(f, PEER_MAC, 6);
	memcpy(f + 6, GUEST_MAC, 6);
	f[12] = 0x08;
	uint8_t *ip = f + 14, *tcp = ip + 20;
	ip[0] = 0x45;
	ip[1] = (uint8_t)(dscp << 2);
	store_be16(ip + 2, (uint16_t)(40 + payload));
	ip[9] = 6;
	ip[12] = 10, ip[15] = 1, ip[16] = 10, ip[19] = 2;
	store_be16(tcp, sport);
	store_be16(tcp + 2, 5432);
	store_be32(tcp + 4, seq);
	store_be32(tcp + 8, ack);
	tcp[12] = 0x50;
	tcp[13] = flags;
	return len;
}

static void test_tcp_fields(void)
{
	uint8_t f[2000];
	struct cp_flow_frame c;

	cp_flow_frame_classify(f, tcp4(f, 1000, 0xfffffff0, 77, CP_TCP_ACK, 100, 0), DSCP, &c);
	CU_ASSERT_TRUE(c.seq_valid);
	CU_ASSERT_EQUAL(c.seq, 0xfffffff0);
	CU_ASSERT_EQUAL(c.ack, 77);
	CU_ASSERT_EQUAL(c.seg_len, 100); /* the padding is not data */
	CU_ASSERT_EQUAL(memcmp(c.src_mac, GUEST_MAC, 6), 0);
	CU_ASSERT_EQUAL(memcmp(c.dst_mac, PEER_MAC, 6), 0);
	cp_flow_frame_classify(f, tcp4(f, 1000, 5, 0, CP_TCP_SYN, 0, 0), DSCP, &c);
	CU_ASSERT_EQUAL(c.seg_len, 1);
	cp_flow_frame_classify(f, tcp4(f, 1000, 5, 0, CP_TCP_FIN | CP_TCP_ACK, 3, 0), DSCP, &c);
	CU_ASSERT_EQUAL(c.seg_len, 4);
	/* A header cut short: ports known, sequence not. */
	cp_flow_frame_classify(f, 14 + 20 + 12, DSCP, &c);
	CU_ASSERT_TRUE(c.tcp);
	CU_ASSERT_FALSE(c.seq_valid);
	/* Serial arithmetic across the wrap. */
	CU_ASSERT_TRUE(cp_flow_frame_seq_after(5, 0xfffffff0));
	CU_ASSERT_FALSE(cp_flow_frame_seq_after(0xfffffff0, 5));
}

/* ---- the primary: positions at cuts, notices before early releases ---- */

struct sink_log {
	int frames;           /* frames the "NIC" took */
	int frames_at_notice[16]; /* frames the NIC had taken when each notice came */
	struct cp_flow_msg_ahead ahead[16];
	int ahead_count;
	struct cp_flow_msg_record records[16];
	int record_count;
	uint64_t record_epoch;
};

static int nic(void *opaque, const uint8_t *frame, size_t len)
{
	((struct sink_log *)opaque)->frames++;
	return 0;
}

static int on_state(void *opaque, uint64_t epoch, const struct cp_flow_msg_record *r,
		    uint32_t count)
{
	struct sink_log *log = opaque;

	for (uint32_t i = 0; i < count && log->record_count < 16; i++)
		log->records[log->record_count++] = r[i];
	log->record_epoch = epoch;
	return 0;
}

static void on_ahead(void *opaque, const struct cp_flow_msg_ahead *a)
{
	struct sink_log *log = opaque;

	if (log->ahead_count < 16) {
		log->frames_at_notice[log->ahead_count] = log->frames;
		log->ahead[log->ahead_count++] = *a;
	}
}

static struct output_commit *cp_output(struct sink_log *log)
{
	struct output_commit *oc = output_commit_create(1 << 20, false, nic, log);
	struct output_commit_flow_sink s = { .opaque = log, .state = on_state, .ahead = on_ahead };

	CU_ASSERT_EQUAL_FATAL(output_commit_enable_cp(oc, DSCP), 0);
	output_commit_set_flow_sink(oc, &s);
	output_commit_cut(oc, 0);
	return oc;
}

static void send(struct output_commit *oc, uint32_t seq, uint16_t payload, uint8_t dscp)
{
	uint8_t f[2000];

	output_commit_hold(oc, f, (uint32_t)tcp4(f, 1000, seq, 500, CP_TCP_ACK, payload, dscp));
}

static void test_positions_and_notices(void)
{
	struct sink_log log = { 0 };
	struct output_commit *oc = cp_output(&log);

	/* Epoch 1: 100 bytes leave at once, before any cut: ahead of everything. */
	send(oc, 1000, 100, 0);
	CU_ASSERT_EQUAL(log.frames, 1);
	CU_ASSERT_EQUAL_FATAL(log.ahead_count, 1);
	CU_ASSERT_EQUAL(log.frames_at_notice[0], 0); /* told before the frame left */
	CU_ASSERT_EQUAL(log.ahead[0].epoch, 0);
	CU_ASSERT_EQUAL(log.ahead[0].released_end, 1100);
	CU_ASSERT_EQUAL(memcmp(log.ahead[0].peer_mac, PEER_MAC, 6), 0);
	/* A marked reply is held: no notice, it leaves with its epoch. */
	send(oc, 1100, 10, DSCP);
	CU_ASSERT_EQUAL(log.frames, 1);
	CU_ASSERT_EQUAL(log.ahead_count, 1);

	/* Cut 1: the flow's position is recorded as of the cut. */
	output_commit_cut(oc, 1);
	CU_ASSERT_EQUAL_FATAL(log.record_count, 1);
	CU_ASSERT_EQUAL(log.record_epoch, 1);
	CU_ASSERT_EQUAL(log.records[0].sent_end, 1110);
	CU_ASSERT_EQUAL(log.records[0].ack, 500);
	CU_ASSERT_EQUAL(log.records[0].flags, 0);

	/* Epoch 2: a retransmission of cut bytes is not ahead; a bare ACK neither. */
	output_commit_ack(oc, 1);
	CU_ASSERT_EQUAL(log.frames, 2);
	send(oc, 1000, 100, 0);
	send(oc, 1110, 0, 0);
	CU_ASSERT_EQUAL(log.frames, 4);
	CU_ASSERT_EQUAL(log.ahead_count, 1);
	/* New bytes are: the notice names cut 1 and the end released. */
	send(oc, 1110, 50, 0);
	CU_ASSERT_EQUAL_FATAL(log.ahead_count, 2);
	CU_ASSERT_EQUAL(log.ahead[1].epoch, 1);
	CU_ASSERT_EQUAL(log.ahead[1].released_end, 1160);

	/* A cut with no movement since records nothing. */
	output_commit_cut(oc, 2);
	int before = log.record_count;
	output_commit_cut(oc, 3);
	CU_ASSERT_EQUAL(log.record_count, before);
	output_commit_destroy(oc);
}

static void test_remus_sends_no_notices(void)
{
	struct sink_log log = { 0 };
	struct output_commit *oc = output_commit_create(1 << 20, false, nic, &log);
	struct output_commit_flow_sink s = { .opaque = &log, .state = on_state, .ahead = on_ahead };

	output_commit_set_flow_sink(oc, &s);
	output_commit_cut(oc, 0);
	send(oc, 1000, 100, 0);
	output_commit_cut(oc, 1);
	CU_ASSERT_EQUAL(log.frames, 0); /* held, as Remus holds everything */
	CU_ASSERT_EQUAL(log.ahead_count, 0);
	CU_ASSERT_EQUAL(log.record_count, 0);
	output_commit_destroy(oc);
}

/* ---- the wire ---------------------------------------------------------- */

static struct cp_flow_key key4(uint16_t sport)
{
	struct cp_flow_key k = { .family = 4, .sport = sport, .dport = 5432 };

	k.src[0] = 10, k.src[3] = 1, k.dst[0] = 10, k.dst[3] = 2;
	return k;
}

static void test_frames_round_trip(void)
{
	struct buffer b;
	struct repl_frame f;
	const char *err = NULL;
	struct cp_flow_msg_record r[2] = { { .key = key4(1), .sent_end = 7, .ack = 9 },
					 { .key = key4(2), .flags = CP_FLOW_MSG_FORGET } };
	struct cp_flow_msg_ahead a = { .epoch = 42, .key = key4(3), .released_end = 0xfffffffe };

	buffer_init(&b);
	CU_ASSERT_EQUAL_FATAL(cp_flow_msg_put_state(&b, 5, r, 2), 0);
	CU_ASSERT_EQUAL_FATAL(repl_frame_parse(buffer_head(&b), buffer_len(&b), &f, &err),
			      (ssize_t)(8 + 12 + 2 * 58));
	struct cp_flow_msg_state s;
	CU_ASSERT_EQUAL_FATAL(cp_flow_msg_decode_state(&f, &s, &err), 0);
	CU_ASSERT_EQUAL(s.epoch, 5);
	CU_ASSERT_EQUAL_FATAL(s.count, 2);
	struct cp_flow_msg_record back;
	cp_flow_msg_state_record(&s, 1, &back);
	CU_ASSERT_EQUAL(memcmp(&back.key, &r[1].key, sizeof(back.key)), 0);
	CU_ASSERT_EQUAL(back.flags, CP_FLOW_MSG_FORGET);
	cp_flow_msg_state_record(&s, 0, &back);
	CU_ASSERT_EQUAL(back.sent_end, 7);
	CU_ASSERT_EQUAL(back.ack, 9);

	/* A count that does not match the length, and a key that is not canonical. */
	uint8_t *p = (uint8_t *)buffer_head(&b);
	p[8 + 11] = 3;
	CU_ASSERT_EQUAL(cp_flow_msg_decode_state(&f, &s, &err), -1);
	p[8 + 11] = 2;
	p[8 + 12 + 1 + 5] = 1; /* an IPv4 key with a byte beyond its 4 address bytes */
	CU_ASSERT_EQUAL(cp_flow_msg_decode_state(&f, &s, &err), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "key"));
	buffer_clear(&b);

	CU_ASSERT_EQUAL_FATAL(cp_flow_msg_put_ahead(&b, &a), 0);
	CU_ASSERT_EQUAL_FATAL(repl_frame_parse(buffer_head(&b), buffer_len(&b), &f, &err), 69);
	struct cp_flow_msg_ahead a2;
	CU_ASSERT_EQUAL_FATAL(cp_flow_msg_decode_ahead(&f, &a2, &err), 0);
	CU_ASSERT_EQUAL(a2.epoch, 42);
	CU_ASSERT_EQUAL(a2.released_end, 0xfffffffe);
	f.length = 60;
	CU_ASSERT_EQUAL(cp_flow_msg_decode_ahead(&f, &a2, &err), -1);
	struct cp_flow_key bad = key4(1);
	bad.family = 5;
	a.key = bad;
	CU_ASSERT_EQUAL(cp_flow_msg_put_ahead(&b, &a), -1);
	CU_ASSERT_EQUAL(cp_flow_msg_put_state(&b, 1, r, 0), -1);
	buffer_free(&b);
}

/* ---- the backup's decision --------------------------------------------- */

struct picked {
	struct cp_flow_reset_target t[8];
	int n;
};

static int pick(void *opaque, const struct cp_flow_reset_target *t)
{
	struct picked *p = opaque;

	if (p->n < 8)
		p->t[p->n++] = *t;
	return 0;
}

static void commit_one(struct cp_flow_positions *pos, uint64_t epoch,
		       const struct cp_flow_msg_record *r)
{
	struct buffer b;
	struct repl_frame f;
	struct cp_flow_msg_state s;

	buffer_init(&b);
	CU_ASSERT_EQUAL_FATAL(cp_flow_msg_put_state(&b, epoch, r, 1), 0);
	repl_frame_parse(buffer_head(&b), buffer_len(&b), &f, NULL);
	CU_ASSERT_EQUAL_FATAL(cp_flow_msg_decode_state(&f, &s, NULL), 0);
	CU_ASSERT_EQUAL(cp_flow_positions_stage(pos, &s), 0);
	CU_ASSERT_EQUAL(cp_flow_positions_commit(pos, epoch), 0);
	buffer_free(&b);
}

static void test_backup_resets_what_is_ahead(void)
{
	struct cp_flow_positions *pos = cp_flow_positions_create();
	struct cp_flow_msg_record r = { .key = key4(1), .sent_end = 1110, .ack = 500 };
	memcpy(r.guest_mac, GUEST_MAC, 6);
	memcpy(r.peer_mac, PEER_MAC, 6);
	struct cp_flow_msg_ahead at_cut_4 = { .epoch = 4, .key = key4(1), .released_end = 1160 };
	struct cp_flow_msg_ahead at_cut_3 = { .epoch = 3, .key = key4(2), .released_end = 90 };
	struct picked p = { 0 };
	long verify = -1;

	commit_one(pos, 4, &r);
	CU_ASSERT_EQUAL(cp_flow_positions_ahead(pos, &at_cut_4), 0);
	CU_ASSERT_EQUAL(cp_flow_positions_ahead(pos, &at_cut_3), 0);
	/* Restoring 4: flow 1 let bytes out after cut 4; flow 2's bytes are in 4. */
	CU_ASSERT_EQUAL(cp_flow_positions_to_reset(pos, 4, pick, &p, &verify), 1);
	CU_ASSERT_EQUAL(verify, 0); /* flow 2 has no committed position to verify */
	CU_ASSERT_FALSE(p.t[0].verify);
	CU_ASSERT_EQUAL(memcmp(&p.t[0].key, &r.key, sizeof(r.key)), 0);
	CU_ASSERT_TRUE(p.t[0].client_seq_known);
	CU_ASSERT_EQUAL(p.t[0].client_seq, 1160);
	CU_ASSERT_TRUE(p.t[0].guest_seq_known);
	CU_ASSERT_EQUAL(p.t[0].guest_seq, 500);
	CU_ASSERT_EQUAL(memcmp(p.t[0].peer_mac, PEER_MAC, 6), 0);
	/* Restoring 3 (its ack was the last): both are ahead of it. */
	p.n = 0;
	CU_ASSERT_EQUAL(cp_flow_positions_to_reset(pos, 3, pick, &p, &verify), 2);
	/* Once 5 is committed, the notice of cut 4 is history. */
	r.sent_end = 1160;
	commit_one(pos, 5, &r);
	p.n = 0;
	CU_ASSERT_EQUAL(cp_flow_positions_to_reset(pos, 5, pick, &p, &verify), 0);
	/* ... but flow 1 is still verified against its client, from its position in 5. */
	CU_ASSERT_EQUAL(verify, 1);
	CU_ASSERT_EQUAL_FATAL(p.n, 1);
	CU_ASSERT_TRUE(p.t[0].verify);
	CU_ASSERT_EQUAL(p.t[0].cut_end, 1160);
	/* A staged, uncommitted FLOW_STATE does not count; a discarded one never will. */
	struct cp_flow_positions_stats st;
	cp_flow_positions_get_stats(pos, &st);
	CU_ASSERT_EQUAL(st.committed_flows, 2);
	CU_ASSERT_EQUAL(st.ahead_notices, 2);
	cp_flow_positions_destroy(pos);
}

/* A frame of the guest's acknowledging `ack`, with `payload` bytes at seq. */
static void send_acking(struct output_commit *oc, uint32_t seq, uint16_t payload, uint32_t ack)
{
	uint8_t f[2000];

	output_commit_hold(oc, f, (uint32_t)tcp4(f, 1000, seq, ack, CP_TCP_ACK, payload, 0));
}

/*
 * The drill's stalled clients (2026-11-26): the guest's bare ACK of a
 * request left at once, its reply was held, the power went.  The restored
 * guest never got the request and the client never resends it, so the
 * ACK itself is ahead of the cut and must be told, even by one byte.
 */
static void test_a_bare_ack_beyond_the_cut_is_a_notice(void)
{
	struct sink_log log = { 0 };
	struct output_commit *oc = cp_output(&log);

	send_acking(oc, 1000, 100, 500);
	output_commit_cut(oc, 1);
	output_commit_ack(oc, 1);
	CU_ASSERT_EQUAL_FATAL(log.ahead_count, 1); /* the new flow's first bytes */
	/* The control: acknowledging no more than at the cut is not ahead. */
	send_acking(oc, 1100, 0, 500);
	send_acking(oc, 1000, 100, 500);
	CU_ASSERT_EQUAL(log.ahead_count, 1);
	/* One client byte more, acknowledged by a bare ACK: told before it leaves. */
	int frames = log.frames;
	send_acking(oc, 1100, 0, 501);
	CU_ASSERT_EQUAL(log.frames, frames + 1);
	CU_ASSERT_EQUAL_FATAL(log.ahead_count, 2);
	CU_ASSERT_EQUAL(log.frames_at_notice[1], frames);
	CU_ASSERT_EQUAL(log.ahead[1].epoch, 1);
	CU_ASSERT_EQUAL(log.ahead[1].released_end, 1100);
	/* A retransmission of cut bytes that carries a newer ACK is ahead too. */
	send_acking(oc, 1000, 100, 540);
	CU_ASSERT_EQUAL(log.ahead_count, 3);
	/* Cut 2 takes the new acknowledgement: the same ACK again is not ahead of it. */
	output_commit_cut(oc, 2);
	CU_ASSERT_EQUAL(log.records[log.record_count - 1].ack, 540);
	send_acking(oc, 1100, 0, 540);
	CU_ASSERT_EQUAL(log.ahead_count, 3);

	/* The backup, given that notice, resets the flow instead of verifying it. */
	struct cp_flow_positions *pos = cp_flow_positions_create();
	struct cp_flow_msg_record r = log.records[0];
	struct picked p = { 0 };
	long verify = -1;
	commit_one(pos, 1, &r);
	CU_ASSERT_EQUAL(cp_flow_positions_ahead(pos, &log.ahead[1]), 0);
	CU_ASSERT_EQUAL(cp_flow_positions_to_reset(pos, 1, pick, &p, &verify), 1);
	CU_ASSERT_EQUAL(verify, 0);
	CU_ASSERT_FALSE(p.t[0].verify);
	cp_flow_positions_destroy(pos);
	output_commit_destroy(oc);
}

/* ---- the reset engine -------------------------------------------------- */

struct wire {
	uint8_t frames[16][128];
	size_t lens[16];
	bool to_guest[16];
	int n;
};

static int wire_lan(void *opaque, const uint8_t *frame, size_t len)
{
	struct wire *w = opaque;

	if (w->n < 16) {
		memcpy(w->frames[w->n], frame, len);
		w->lens[w->n] = len;
		w->to_guest[w->n++] = false;
	}
	return 0;
}

static int wire_guest(void *opaque, const uint8_t *frame, size_t len)
{
	struct wire *w = opaque;

	if (w->n < 16) {
		memcpy(w->frames[w->n], frame, len);
		w->lens[w->n] = len;
		w->to_guest[w->n++] = true;
	}
	return 0;
}

static uint16_t sum16(const uint8_t *p, size_t n, uint32_t sum)
{
	for (size_t i = 0; i < n; i += 2)
		sum += load_be16(p + i);
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return (uint16_t)sum;
}

static void test_reset_frames_are_valid(void)
{
	uint8_t f[128];
	struct cp_flow_key k = key4(1000);
	size_t n = cp_flow_reset_build(f, &k, PEER_MAC, GUEST_MAC, 0x12345678, 0, CP_TCP_RST);

	CU_ASSERT_EQUAL_FATAL(n, 54);
	CU_ASSERT_EQUAL(sum16(f + 14, 20, 0), 0xffff); /* IPv4 header */
	/* TCP over its pseudo-header. */
	uint32_t pseudo = sum16(f + 14 + 12, 8, 0) + 6 + 20;
	CU_ASSERT_EQUAL(sum16(f + 34, 20, pseudo), 0xffff);
	struct cp_flow_frame c;
	cp_flow_frame_classify(f, n, DSCP, &c);
	CU_ASSERT_TRUE(c.seq_valid);
	CU_ASSERT_EQUAL(c.seq, 0x12345678);
	CU_ASSERT_EQUAL(c.tcp_flags, CP_TCP_RST);
	CU_ASSERT_EQUAL(memcmp(&c.key, &k, sizeof(k)), 0);

	struct cp_flow_key k6 = { .family = 6, .sport = 1, .dport = 2 };
	k6.src[15] = 1, k6.dst[15] = 2;
	n = cp_flow_reset_build(f, &k6, PEER_MAC, GUEST_MAC, 1, 2, CP_TCP_ACK);
	CU_ASSERT_EQUAL_FATAL(n, 74);
	pseudo = sum16(f + 14 + 8, 32, 0) + 6 + 20;
	CU_ASSERT_EQUAL(sum16(f + 54, 20, pseudo), 0xffff);
}

static void test_reset_engine(void)
{
	struct wire w = { 0 };
	struct cp_flow_reset_io io = { .opaque = &w, .to_lan = wire_lan, .to_guest = wire_guest };
	struct cp_flow_reset *fr = cp_flow_reset_create(&io);
	struct cp_flow_reset_target t = { .key = key4(1000), .client_seq_known = true,
				       .client_seq = 1160, .guest_seq_known = true,
				       .guest_seq = 500 };
	struct cp_flow_frame c;
	uint8_t f[2000];

	memcpy(t.guest_mac, GUEST_MAC, 6);
	memcpy(t.peer_mac, PEER_MAC, 6);
	CU_ASSERT_EQUAL_FATAL(cp_flow_reset_add(fr, &t), 0);
	cp_flow_reset_clients(fr);
	/* The client: an RST at the released end, and a probe far behind it. */
	CU_ASSERT_EQUAL_FATAL(w.n, 2);
	cp_flow_frame_classify(w.frames[0], w.lens[0], DSCP, &c);
	CU_ASSERT_FALSE(w.to_guest[0]);
	CU_ASSERT_EQUAL(c.tcp_flags, CP_TCP_RST);
	CU_ASSERT_EQUAL(c.seq, 1160);
	CU_ASSERT_EQUAL(memcmp(c.dst_mac, PEER_MAC, 6), 0);
	cp_flow_frame_classify(w.frames[1], w.lens[1], DSCP, &c);
	CU_ASSERT_EQUAL(c.tcp_flags, CP_TCP_ACK);
	CU_ASSERT_EQUAL(c.seq, 1160u - 0x40000000u);

	/* The client's answer (it had 1170): dropped, and an RST at exactly 1170. */
	struct cp_flow_key rk = key4(1000); /* the client's side: the guest's key reversed */
	memcpy(rk.src, t.key.dst, 16);
	memcpy(rk.dst, t.key.src, 16);
	rk.sport = 5432, rk.dport = 1000;
	size_t n = cp_flow_reset_build(f, &rk, GUEST_MAC, PEER_MAC, 77, 1170, CP_TCP_ACK);
	CU_ASSERT_EQUAL(cp_flow_reset_from_lan(fr, f, (uint32_t)n), 1);
	CU_ASSERT_EQUAL_FATAL(w.n, 3);
	cp_flow_frame_classify(w.frames[2], w.lens[2], DSCP, &c);
	CU_ASSERT_EQUAL(c.tcp_flags, CP_TCP_RST);
	CU_ASSERT_EQUAL(c.seq, 1170);
	/* Exact now: a retry sends the client nothing more. */
	cp_flow_reset_retry(fr);
	CU_ASSERT_EQUAL(w.n, 3);

	/* The guest runs: RST at its last ack, a probe; its challenge ACK gets the exact RST. */
	cp_flow_reset_guest(fr);
	CU_ASSERT_EQUAL_FATAL(w.n, 5);
	CU_ASSERT_TRUE(w.to_guest[3]);
	cp_flow_frame_classify(w.frames[3], w.lens[3], DSCP, &c);
	CU_ASSERT_EQUAL(c.seq, 500);
	CU_ASSERT_EQUAL(c.key.sport, 5432); /* from the client's side */
	n = cp_flow_reset_build(f, &t.key, PEER_MAC, GUEST_MAC, 1110, 520, CP_TCP_ACK);
	CU_ASSERT_EQUAL(cp_flow_reset_from_guest(fr, f, (uint32_t)n), 1);
	CU_ASSERT_EQUAL_FATAL(w.n, 6);
	cp_flow_frame_classify(w.frames[5], w.lens[5], DSCP, &c);
	CU_ASSERT_TRUE(w.to_guest[5]);
	CU_ASSERT_EQUAL(c.tcp_flags, CP_TCP_RST);
	CU_ASSERT_EQUAL(c.seq, 520);

	/* Another flow passes untouched; a new connection on the same 4-tuple is let be. */
	struct cp_flow_key other = key4(2000);
	n = cp_flow_reset_build(f, &other, PEER_MAC, GUEST_MAC, 1, 1, CP_TCP_ACK);
	CU_ASSERT_EQUAL(cp_flow_reset_from_guest(fr, f, (uint32_t)n), 0);
	n = cp_flow_reset_build(f, &rk, GUEST_MAC, PEER_MAC, 9, 0, CP_TCP_SYN);
	CU_ASSERT_EQUAL(cp_flow_reset_from_lan(fr, f, (uint32_t)n), 0);
	n = cp_flow_reset_build(f, &rk, GUEST_MAC, PEER_MAC, 10, 5, CP_TCP_ACK);
	CU_ASSERT_EQUAL(cp_flow_reset_from_lan(fr, f, (uint32_t)n), 0);
	struct cp_flow_reset_stats st;
	cp_flow_reset_get_stats(fr, &st);
	CU_ASSERT_EQUAL(st.flows, 1);
	CU_ASSERT_EQUAL(st.client_rsts, 2);
	CU_ASSERT_EQUAL(st.guest_rsts, 2);
	CU_ASSERT_EQUAL(st.exact_client, 1);
	CU_ASSERT_EQUAL(st.exact_guest, 1);
	CU_ASSERT_EQUAL(st.flows_released, 1);
	cp_flow_reset_destroy(fr);
}

/*
 * A flow no notice named: a probe only; the guest's frames wait; the
 * client's answer decides.  At the cut position it is left alone; one
 * byte beyond, it is reset (the small bug a lost notice would be).
 */
static void verify_once(uint32_t client_at, bool expect_reset)
{
	struct wire w = { 0 };
	struct cp_flow_reset_io io = { .opaque = &w, .to_lan = wire_lan, .to_guest = wire_guest };
	struct cp_flow_reset *fr = cp_flow_reset_create(&io);
	struct cp_flow_reset_target t = { .key = key4(1000), .verify = true, .cut_end = 1160,
				       .guest_seq_known = true, .guest_seq = 500 };
	struct cp_flow_key rk = key4(1000);
	struct cp_flow_frame c;
	struct cp_flow_reset_stats st;
	uint8_t f[128];

	memcpy(rk.src, t.key.dst, 16);
	memcpy(rk.dst, t.key.src, 16);
	rk.sport = 5432, rk.dport = 1000;
	memcpy(t.guest_mac, GUEST_MAC, 6);
	memcpy(t.peer_mac, PEER_MAC, 6);
	CU_ASSERT_EQUAL_FATAL(cp_flow_reset_add(fr, &t), 0);
	cp_flow_reset_clients(fr);
	CU_ASSERT_EQUAL_FATAL(w.n, 1);
	cp_flow_frame_classify(w.frames[0], w.lens[0], DSCP, &c);
	CU_ASSERT_EQUAL(c.tcp_flags, CP_TCP_ACK); /* a probe, no RST */
	cp_flow_reset_guest(fr);
	CU_ASSERT_EQUAL(w.n, 1); /* nothing into the guest while undecided */
	size_t n = cp_flow_reset_build(f, &t.key, PEER_MAC, GUEST_MAC, 1160, 500, CP_TCP_ACK);
	CU_ASSERT_EQUAL(cp_flow_reset_from_guest(fr, f, (uint32_t)n), 1); /* held back */

	n = cp_flow_reset_build(f, &rk, GUEST_MAC, PEER_MAC, 500, client_at, CP_TCP_ACK);
	CU_ASSERT_EQUAL(cp_flow_reset_from_lan(fr, f, (uint32_t)n), 1);
	cp_flow_reset_get_stats(fr, &st);
	if (expect_reset) {
		CU_ASSERT_EQUAL(st.verified_ahead, 1);
		CU_ASSERT_EQUAL(st.flows, 1);
		/* The guest (running) at its last ack and a probe; the client exactly where it is. */
		CU_ASSERT_EQUAL_FATAL(w.n, 4);
		cp_flow_frame_classify(w.frames[3], w.lens[3], DSCP, &c);
		CU_ASSERT_FALSE(w.to_guest[3]);
		CU_ASSERT_EQUAL(c.tcp_flags, CP_TCP_RST);
		CU_ASSERT_EQUAL(c.seq, client_at);
		cp_flow_frame_classify(w.frames[1], w.lens[1], DSCP, &c);
		CU_ASSERT_TRUE(w.to_guest[1]);
		CU_ASSERT_EQUAL(c.tcp_flags, CP_TCP_RST);
	} else {
		CU_ASSERT_EQUAL(st.verified_consistent, 1);
		CU_ASSERT_EQUAL(st.flows, 0);
		CU_ASSERT_EQUAL(w.n, 1);
		/* Left alone from now on, both ways. */
		n = cp_flow_reset_build(f, &t.key, PEER_MAC, GUEST_MAC, 1160, 500, CP_TCP_ACK);
		CU_ASSERT_EQUAL(cp_flow_reset_from_guest(fr, f, (uint32_t)n), 0);
		n = cp_flow_reset_build(f, &rk, GUEST_MAC, PEER_MAC, 500, client_at, CP_TCP_ACK);
		CU_ASSERT_EQUAL(cp_flow_reset_from_lan(fr, f, (uint32_t)n), 0);
	}
	cp_flow_reset_destroy(fr);
}

static void test_verify_consistent(void)
{
	verify_once(1160, false);
	verify_once(1100, false); /* behind: the guest resends what the client lacks */
}

static void test_verify_one_byte_ahead(void)
{
	verify_once(1161, true);
}

int register_cp_flow_reset_tests(void)
{
	CU_pSuite suite = CU_add_suite("cp_flow_reset", NULL, NULL);

	if (!suite ||
	    !CU_add_test(suite, "TCP sequence fields", test_tcp_fields) ||
	    !CU_add_test(suite, "positions at cuts, notices before early releases",
			 test_positions_and_notices) ||
	    !CU_add_test(suite, "Remus sends no notices (control)", test_remus_sends_no_notices) ||
	    !CU_add_test(suite, "FLOW_STATE and FLOW_AHEAD round trip", test_frames_round_trip) ||
	    !CU_add_test(suite, "a bare ACK beyond the cut's acknowledgement is a notice",
			 test_a_bare_ack_beyond_the_cut_is_a_notice) ||
	    !CU_add_test(suite, "the backup resets what is ahead of the restored cut",
			 test_backup_resets_what_is_ahead) ||
	    !CU_add_test(suite, "reset frames have valid checksums", test_reset_frames_are_valid) ||
	    !CU_add_test(suite, "the reset engine answers ACKs with exact RSTs", test_reset_engine) ||
	    !CU_add_test(suite, "a verified client at or behind the cut is left alone",
			 test_verify_consistent) ||
	    !CU_add_test(suite, "a verified client one byte ahead is reset",
			 test_verify_one_byte_ahead))
		return -1;
	return 0;
}
