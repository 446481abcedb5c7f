/* Resetting the flows a takeover cannot continue (cp_flow_reset.h). */
#include "relay/cp_flow_reset.h"

#include <stdlib.h>
#include <string.h>

#include "base/be.h"

#define ETH_HEADER 14
#define TCP_HEADER 20
/* A probe's sequence number: this far behind a position is outside any window. */
#define PROBE_DISTANCE 0x40000000u
/* RSTs answering one side's ACKs, at most: enough for a challenge and a retransmission. */
#define MAX_ANSWERS 4
#define NEVER_MARKED 64 /* no DSCP: cp_flow_frame_classify's mark is of no interest here */

struct side {
	bool known;     /* pos is the best guess we have */
	bool exact;     /* pos came from an ACK of that side's own */
	uint32_t pos;
	unsigned answers;
};

struct target {
	struct cp_flow_reset_target t;
	struct side client, guest;
	bool undecided; /* a verified flow whose client has not answered yet */
	bool released;  /* consistent, or a SYN reused the 4-tuple: left alone */
};

struct cp_flow_reset {
	struct cp_flow_reset_io io;
	struct target *targets;
	size_t count, cap;
	bool guest_running;
	struct cp_flow_reset_stats stats;
};

static uint32_t sum_bytes(uint32_t sum, const uint8_t *p, size_t n)
{
	for (size_t i = 0; i + 1 < n; i += 2)
		sum += load_be16(p + i);
	if (n & 1)
		sum += (uint32_t)p[n - 1] << 8;
	return sum;
}

static uint16_t fold(uint32_t sum)
{
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return (uint16_t)~sum;
}

size_t cp_flow_reset_build(uint8_t *out, const struct cp_flow_key *key,
			   const uint8_t dst_mac[6], const uint8_t src_mac[6], uint32_t seq,
			   uint32_t ack, uint8_t flags)
{
	bool v4 = key->family == 4;
	size_t ip_len = v4 ? 20 : 40, addr_len = v4 ? 4 : 16;
	uint8_t *ip = out + ETH_HEADER, *tcp = ip + ip_len;
	uint32_t sum;

	memcpy(out, dst_mac, 6);
	memcpy(out + 6, src_mac, 6);
	store_be16(out + 12, v4 ? 0x0800 : 0x86dd);
	memset(ip, 0, ip_len + TCP_HEADER);
	if (v4) {
		ip[0] = 0x45;
		store_be16(ip + 2, (uint16_t)(ip_len + TCP_HEADER));
		store_be16(ip + 6, 0x4000); /* don't fragment */
		ip[8] = 64;
		ip[9] = 6;
		memcpy(ip + 12, key->src, 4);
		memcpy(ip + 16, key->dst, 4);
		store_be16(ip + 10, fold(sum_bytes(0, ip, 20)));
	} else {
		ip[0] = 0x60;
		store_be16(ip + 4, TCP_HEADER);
		ip[6] = 6;
		ip[7] = 64;
		memcpy(ip + 8, key->src, 16);
		memcpy(ip + 24, key->dst, 16);
	}
	store_be16(tcp, key->sport);
	store_be16(tcp + 2, key->dport);
	store_be32(tcp + 4, seq);
	store_be32(tcp + 8, ack);
	tcp[12] = (TCP_HEADER / 4) << 4;
	tcp[13] = flags;
	/* A window is required of a segment that is not RST, and harmless on one. */
	store_be16(tcp + 14, flags & CP_TCP_RST ? 0 : 1024);
	/* The pseudo-header: addresses, protocol, TCP length. */
	sum = sum_bytes(0, key->src, addr_len);
	sum = sum_bytes(sum, key->dst, addr_len);
	sum += 6 + TCP_HEADER;
	sum = sum_bytes(sum, tcp, TCP_HEADER);
	store_be16(tcp + 16, fold(sum));
	return ETH_HEADER + ip_len + TCP_HEADER;
}

struct cp_flow_reset *cp_flow_reset_create(const struct cp_flow_reset_io *io)
{
	struct cp_flow_reset *fr = calloc(1, sizeof(*fr));

	if (fr)
		fr->io = *io;
	return fr;
}

void cp_flow_reset_destroy(struct cp_flow_reset *fr)
{
	if (!fr)
		return;
	free(fr->targets);
	free(fr);
}

int cp_flow_reset_add(struct cp_flow_reset *fr, const struct cp_flow_reset_target *t)
{
	if (fr->count == fr->cap) {
		size_t cap = fr->cap ? fr->cap * 2 : 16;
		struct target *grown = realloc(fr->targets, cap * sizeof(*grown));
		if (!grown)
			return -1;
		fr->targets = grown;
		fr->cap = cap;
	}
	struct target *x = &fr->targets[fr->count++];
	memset(x, 0, sizeof(*x));
	x->t = *t;
	x->client = (struct side){ .known = t->client_seq_known, .pos = t->client_seq };
	x->guest = (struct side){ .known = t->guest_seq_known, .pos = t->guest_seq };
	if (t->verify) {
		/* Nothing known to be reset: only the probe, from the guest's cut position. */
		x->undecided = true;
		x->client = (struct side){ .pos = t->cut_end };
	} else {
		fr->stats.flows++;
	}
	return 0;
}

/* The key as the client sends: addresses and ports swapped. */
static struct cp_flow_key reversed(const struct cp_flow_key *k)
{
	struct cp_flow_key r = *k;

	memcpy(r.src, k->dst, 16);
	memcpy(r.dst, k->src, 16);
	r.sport = k->dport;
	r.dport = k->sport;
	return r;
}

static void send_to_client(struct cp_flow_reset *fr, struct target *x, uint32_t seq, uint8_t flags)
{
	uint8_t f[ETH_HEADER + 40 + TCP_HEADER];
	size_t n = cp_flow_reset_build(f, &x->t.key, x->t.peer_mac, x->t.guest_mac, seq, 0, flags);

	fr->io.to_lan(fr->io.opaque, f, n);
	if (flags & CP_TCP_RST)
		fr->stats.client_rsts++;
	else
		fr->stats.probes++;
}

static void send_to_guest(struct cp_flow_reset *fr, struct target *x, uint32_t seq, uint8_t flags)
{
	uint8_t f[ETH_HEADER + 40 + TCP_HEADER];
	struct cp_flow_key k = reversed(&x->t.key);
	size_t n = cp_flow_reset_build(f, &k, x->t.guest_mac, x->t.peer_mac, seq, 0, flags);

	fr->io.to_guest(fr->io.opaque, f, n);
	if (flags & CP_TCP_RST)
		fr->stats.guest_rsts++;
	else
		fr->stats.probes++;
}

/* An RST at the best guess (if any) and a probe that brings the exact position. */
static void hit_client(struct cp_flow_reset *fr, struct target *x)
{
	if (x->released || x->client.exact)
		return;
	if (x->client.known && !x->undecided)
		send_to_client(fr, x, x->client.pos, CP_TCP_RST);
	send_to_client(fr, x, x->client.pos - PROBE_DISTANCE, CP_TCP_ACK);
}

static void hit_guest(struct cp_flow_reset *fr, struct target *x)
{
	if (x->released || x->undecided || x->guest.exact)
		return;
	if (x->guest.known)
		send_to_guest(fr, x, x->guest.pos, CP_TCP_RST);
	send_to_guest(fr, x, x->guest.pos - PROBE_DISTANCE, CP_TCP_ACK);
}

void cp_flow_reset_clients(struct cp_flow_reset *fr)
{
	for (size_t i = 0; i < fr->count; i++)
		hit_client(fr, &fr->targets[i]);
}

void cp_flow_reset_guest(struct cp_flow_reset *fr)
{
	fr->guest_running = true;
	for (size_t i = 0; i < fr->count; i++)
		hit_guest(fr, &fr->targets[i]);
}

void cp_flow_reset_retry(struct cp_flow_reset *fr)
{
	cp_flow_reset_clients(fr);
	if (fr->guest_running)
		cp_flow_reset_guest(fr);
}

static struct target *find(struct cp_flow_reset *fr, const struct cp_flow_key *k)
{
	for (size_t i = 0; i < fr->count; i++)
		if (!memcmp(&fr->targets[i].t.key, k, sizeof(*k)))
			return &fr->targets[i];
	return NULL;
}

/*
 * A frame of a reset flow from one side: a SYN is a new connection on
 * the same 4-tuple (left alone from then on); an ACK tells that side's
 * exact position, which the RST that answers it uses.
 */
static int on_frame(struct cp_flow_reset *fr, struct target *x, const struct cp_flow_frame *f,
		    struct side *side, bool from_client)
{
	if (x->released)
		return 0;
	if ((f->tcp_flags & CP_TCP_SYN) && !(f->tcp_flags & CP_TCP_ACK) && from_client) {
		x->released = true;
		fr->stats.flows_released++;
		return 0;
	}
	fr->stats.frames_dropped++;
	if (x->undecided) {
		/* Held back until the client says where it is; only its ACK decides. */
		if (!from_client || !(f->tcp_flags & CP_TCP_ACK) || (f->tcp_flags & CP_TCP_RST))
			return 1;
		x->undecided = false;
		if (!cp_flow_frame_seq_after(f->ack, x->t.cut_end)) {
			x->released = true;
			fr->stats.verified_consistent++;
			return 1;
		}
		fr->stats.verified_ahead++;
		fr->stats.flows++;
		if (fr->guest_running)
			hit_guest(fr, x);
	}
	if (!(f->tcp_flags & CP_TCP_ACK) || (f->tcp_flags & CP_TCP_RST) ||
	    side->answers >= MAX_ANSWERS)
		return 1;
	if (!side->exact)
		from_client ? fr->stats.exact_client++ : fr->stats.exact_guest++;
	side->exact = side->known = true;
	side->pos = f->ack;
	side->answers++;
	if (from_client)
		send_to_client(fr, x, f->ack, CP_TCP_RST);
	else
		send_to_guest(fr, x, f->ack, CP_TCP_RST);
	return 1;
}

int cp_flow_reset_from_guest(void *opaque, const uint8_t *frame, uint32_t len)
{
	struct cp_flow_reset *fr = opaque;
	struct cp_flow_frame f;

	cp_flow_frame_classify(frame, len, NEVER_MARKED, &f);
	struct target *x = f.seq_valid ? find(fr, &f.key) : NULL;
	return x ? on_frame(fr, x, &f, &x->guest, false) : 0;
}

int cp_flow_reset_from_lan(void *opaque, const uint8_t *frame, uint32_t len)
{
	struct cp_flow_reset *fr = opaque;
	struct cp_flow_frame f;

	cp_flow_frame_classify(frame, len, NEVER_MARKED, &f);
	if (!f.seq_valid)
		return 0;
	struct cp_flow_key k = reversed(&f.key);
	struct target *x = find(fr, &k);
	return x ? on_frame(fr, x, &f, &x->client, true) : 0;
}

void cp_flow_reset_get_stats(const struct cp_flow_reset *fr, struct cp_flow_reset_stats *out)
{
	*out = fr->stats;
}
