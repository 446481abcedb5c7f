/*
 * Commit protection's view of one of the guest's outgoing frames
 * (RemusDB, thesis section 3.5): which TCP flow it belongs to, its TCP
 * sequence fields, and whether the guest's remusdb_cp module marked it
 * (its DSCP); and clearing that mark.  What output commit holds per flow
 * is cp_flow_table.h.
 *
 * A frame is parsed as Ethernet (one 802.1Q tag at most), then IPv4 or
 * IPv6, then TCP.  Anything else is "not TCP".  The mark is checked on
 * every IP frame whatever its payload, so a marked frame is never let
 * out early because its transport could not be parsed (an IPv4 fragment,
 * an IPv6 extension header): those are held too.
 */
#ifndef REMUSDB_CP_FLOW_FRAME_H
#define REMUSDB_CP_FLOW_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cp_flow_key {
	uint8_t family;   /* 4 or 6; IPv4 addresses in the first 4 bytes */
	uint8_t src[16];
	uint8_t dst[16];
	uint16_t sport, dport;
};

#define CP_TCP_FIN 0x01
#define CP_TCP_SYN 0x02
#define CP_TCP_RST 0x04
#define CP_TCP_ACK 0x10

struct cp_flow_frame {
	bool ip;          /* IPv4 or IPv6 */
	bool tcp;         /* key is valid */
	bool marked;      /* the IP header carries the protection DSCP */
	size_t ip_offset; /* of the IP header in the frame */
	struct cp_flow_key key;
	/*
	 * The TCP header is whole in the frame: the fields below are valid.
	 * seg_len counts what the segment occupies in sequence space
	 * (payload, plus one each for SYN and FIN), from the IP length
	 * fields, so Ethernet padding never counts.
	 */
	bool seq_valid;
	uint32_t seq, ack;
	uint8_t tcp_flags;
	uint32_t seg_len;
	uint8_t dst_mac[6], src_mac[6];
};

/* Serial number arithmetic (RFC 1982) on TCP sequence numbers: a after b. */
static inline bool cp_flow_frame_seq_after(uint32_t a, uint32_t b)
{
	return (int32_t)(a - b) > 0;
}

/* Reads what cp_flow_frame says of `frame`; never fails (short or odd frames are "not IP"). */
void cp_flow_frame_classify(const uint8_t *frame, size_t len, uint8_t dscp,
			    struct cp_flow_frame *out);

/*
 * Sets the DSCP of a classified IP frame to 0, keeping the ECN bits, and
 * fixes the IPv4 header checksum (incrementally, RFC 1624).  IPv6 has no
 * header checksum and TCP's pseudo-header covers neither TOS nor traffic
 * class, so nothing else changes.
 */
void cp_flow_frame_clear_mark(uint8_t *frame, const struct cp_flow_frame *f);

#endif
