/*
 * Commit protection's view of the guest's outgoing frames (RemusDB,
 * thesis section 3.5): which TCP flow a frame belongs to, whether the
 * guest's remusdb_cp module marked it (its DSCP), and how many frames of
 * each flow output commit holds right now.
 *
 * Why per flow: an unmarked frame may leave at once, but not ahead of a
 * held frame of its own connection, or the client would see bytes out
 * of order (and TCP would hold them anyway, or worse, ack a gap).  So a
 * flow with held frames holds its later frames too, marked or not.
 *
 * A frame is parsed as Ethernet (one 802.1Q tag at most), then IPv4 or
 * IPv6, then TCP.  Anything else is "not TCP".  The mark is checked on
 * every IP frame whatever its payload, so a marked frame is never let
 * out early because its transport could not be parsed (an IPv4 fragment,
 * an IPv6 extension header): those are held too.
 */
#ifndef REMUSDB_CP_FLOW_TABLE_H
#define REMUSDB_CP_FLOW_TABLE_H

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

struct cp_frame {
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
static inline bool cp_seq_after(uint32_t a, uint32_t b)
{
	return (int32_t)(a - b) > 0;
}

/* Reads what cp_frame says of `frame`; never fails (short or odd frames are "not IP"). */
void cp_classify(const uint8_t *frame, size_t len, uint8_t dscp, struct cp_frame *out);

/*
 * Sets the DSCP of a classified IP frame to 0, keeping the ECN bits, and
 * fixes the IPv4 header checksum (incrementally, RFC 1624).  IPv6 has no
 * header checksum and TCP's pseudo-header covers neither TOS nor traffic
 * class, so nothing else changes.
 */
void cp_clear_mark(uint8_t *frame, const struct cp_frame *f);

/*
 * What the primary's relay knows of one flow's sequence space, guest
 * side (RemusDB's fail-safe reset, issue 10): how far the guest has sent,
 * how far it had sent at the last checkpoint cut, and how far the relay
 * let bytes out.  The backup resets at failover every flow whose released
 * bytes are ahead of the checkpoint it restores.
 */
struct cp_flow_seq {
	bool seen;             /* sent_end and ack are valid */
	bool cut_known;        /* cut_end is valid (a cut came after the first frame) */
	bool released_any;
	bool changed;          /* sent_end or ack moved since the last cut */
	uint32_t sent_end;     /* highest sequence end the guest sent */
	uint32_t ack;          /* the guest's last acknowledgement (its rcv_nxt, at most) */
	uint32_t cut_end;      /* sent_end at the last cut */
	uint32_t released_end; /* highest sequence end let out to the LAN */
	uint64_t last_epoch;   /* the open epoch of its last frame */
	uint8_t guest_mac[6], peer_mac[6];
};

struct cp_flows;

struct cp_flows *cp_flows_create(void);
void cp_flows_destroy(struct cp_flows *t); /* NULL is a no-op */
/* Frames of the flow held now (0 for an unknown flow). */
uint32_t cp_flows_held(const struct cp_flows *t, const struct cp_flow_key *k);
/* One more frame of the flow is held.  -1 when out of memory. */
int cp_flows_add(struct cp_flows *t, const struct cp_flow_key *k);
/* One frame of the flow left. */
void cp_flows_remove(struct cp_flows *t, const struct cp_flow_key *k);
/* Everything held was dropped (fencing): every flow is forgotten. */
void cp_flows_clear(struct cp_flows *t);
/* Flows with frames held now. */
size_t cp_flows_count(const struct cp_flows *t);
/* Flows known at all (held or tracked). */
size_t cp_flows_known(const struct cp_flows *t);

/* The flow's sequence state, created (zeroed) if new; NULL when out of memory. */
struct cp_flow_seq *cp_flows_seq(struct cp_flows *t, const struct cp_flow_key *k);
/* The flow's sequence state, or NULL for an unknown flow. */
struct cp_flow_seq *cp_flows_find_seq(const struct cp_flows *t, const struct cp_flow_key *k);
/*
 * Calls fn for every known flow; a flow for which fn returns true is
 * forgotten unless frames of it are held.
 */
typedef bool (*cp_flows_visit)(void *opaque, const struct cp_flow_key *k,
			       struct cp_flow_seq *s);
void cp_flows_each(struct cp_flows *t, cp_flows_visit fn, void *opaque);

#endif
