/* Commit protection's reading of a guest frame: flow, TCP fields, mark (cp_flow_frame.h). */
#include "relay/cp_flow_frame.h"

#include <string.h>

#include "base/be.h"

#define ETH_HEADER 14
#define ETHERTYPE_IPV4 0x0800
#define ETHERTYPE_IPV6 0x86dd
#define ETHERTYPE_VLAN 0x8100
#define IPPROTO_TCP_NUM 6
#define IPV6_HEADER 40

/*
 * The TCP header at off; ip_payload is what the IP header says follows
 * it (so Ethernet padding is not mistaken for data).
 */
static void parse_tcp(const uint8_t *frame, size_t len, size_t off, size_t ip_payload,
		      struct cp_flow_frame *out)
{
	if (len < off + 4)
		return;
	out->key.sport = load_be16(frame + off);
	out->key.dport = load_be16(frame + off + 2);
	out->tcp = true;
	if (len < off + 20)
		return;
	size_t doff = (size_t)(frame[off + 12] >> 4) * 4;
	if (doff < 20 || doff > ip_payload || len < off + doff)
		return;
	out->seq_valid = true;
	out->seq = load_be32(frame + off + 4);
	out->ack = load_be32(frame + off + 8);
	out->tcp_flags = frame[off + 13];
	out->seg_len = (uint32_t)(ip_payload - doff) + !!(out->tcp_flags & CP_TCP_SYN) +
		       !!(out->tcp_flags & CP_TCP_FIN);
}

static void parse_ipv4(const uint8_t *frame, size_t len, size_t off, uint8_t dscp,
		       struct cp_flow_frame *out)
{
	if (len < off + 20 || frame[off] >> 4 != 4)
		return;
	size_t ihl = (size_t)(frame[off] & 0x0f) * 4;
	if (ihl < 20 || len < off + ihl)
		return;
	out->ip = true;
	out->ip_offset = off;
	out->marked = frame[off + 1] >> 2 == dscp;
	out->key.family = 4;
	memcpy(out->key.src, frame + off + 12, 4);
	memcpy(out->key.dst, frame + off + 16, 4);
	/*
	 * Only a first (or unfragmented) piece carries the ports; a
	 * fragment's length says nothing of the segment's.
	 */
	uint16_t frag = load_be16(frame + off + 6);
	bool later_fragment = (frag & 0x1fff) != 0, more_fragments = (frag & 0x2000) != 0;
	size_t total = load_be16(frame + off + 2);
	if (frame[off + 9] == IPPROTO_TCP_NUM && !later_fragment)
		parse_tcp(frame, len, off + ihl,
			  total >= ihl && !more_fragments ? total - ihl : 0, out);
}

static void parse_ipv6(const uint8_t *frame, size_t len, size_t off, uint8_t dscp,
		       struct cp_flow_frame *out)
{
	if (len < off + IPV6_HEADER || frame[off] >> 4 != 6)
		return;
	uint8_t tclass = (uint8_t)((frame[off] & 0x0f) << 4 | frame[off + 1] >> 4);
	out->ip = true;
	out->ip_offset = off;
	out->marked = tclass >> 2 == dscp;
	out->key.family = 6;
	memcpy(out->key.src, frame + off + 8, 16);
	memcpy(out->key.dst, frame + off + 24, 16);
	/* TCP right after the fixed header; extension headers stay "not TCP". */
	if (frame[off + 6] == IPPROTO_TCP_NUM)
		parse_tcp(frame, len, off + IPV6_HEADER, load_be16(frame + off + 4), out);
}

void cp_flow_frame_classify(const uint8_t *frame, size_t len, uint8_t dscp,
			    struct cp_flow_frame *out)
{
	size_t off = ETH_HEADER;

	memset(out, 0, sizeof(*out));
	if (len < ETH_HEADER)
		return;
	memcpy(out->dst_mac, frame, 6);
	memcpy(out->src_mac, frame + 6, 6);
	uint16_t type = load_be16(frame + 12);
	if (type == ETHERTYPE_VLAN) {
		if (len < ETH_HEADER + 4)
			return;
		type = load_be16(frame + 16);
		off += 4;
	}
	if (type == ETHERTYPE_IPV4)
		parse_ipv4(frame, len, off, dscp, out);
	else if (type == ETHERTYPE_IPV6)
		parse_ipv6(frame, len, off, dscp, out);
}

void cp_flow_frame_clear_mark(uint8_t *frame, const struct cp_flow_frame *f)
{
	uint8_t *ip = frame + f->ip_offset;

	if (!f->ip)
		return;
	if (f->key.family == 4) {
		/* RFC 1624: HC' = ~(~HC + ~m + m'), m the 16-bit word holding TOS. */
		uint16_t old_word = load_be16(ip), new_word = (uint16_t)(old_word & 0xff03);
		uint32_t sum = (uint16_t)~load_be16(ip + 10);
		sum += (uint16_t)~old_word;
		sum += new_word;
		while (sum >> 16)
			sum = (sum & 0xffff) + (sum >> 16);
		uint16_t check = (uint16_t)~sum;
		ip[1] &= 0x03;
		ip[10] = (uint8_t)(check >> 8);
		ip[11] = (uint8_t)check;
	} else {
		/* Traffic class spans the low nibble of byte 0 and the high one of byte 1. */
		ip[0] &= 0xf0;
		ip[1] &= 0x3f;
	}
}
