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
#ifndef REMUSDB_CP_FLOWS_H
#define REMUSDB_CP_FLOWS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cp_flow_key {
	uint8_t family;   /* 4 or 6; IPv4 addresses in the first 4 bytes */
	uint8_t src[16];
	uint8_t dst[16];
	uint16_t sport, dport;
};

struct cp_frame {
	bool ip;          /* IPv4 or IPv6 */
	bool tcp;         /* key is valid */
	bool marked;      /* the IP header carries the protection DSCP */
	size_t ip_offset; /* of the IP header in the frame */
	struct cp_flow_key key;
};

/* Reads what cp_frame says of `frame`; never fails (short or odd frames are "not IP"). */
void cp_classify(const uint8_t *frame, size_t len, uint8_t dscp, struct cp_frame *out);

/*
 * Sets the DSCP of a classified IP frame to 0, keeping the ECN bits, and
 * fixes the IPv4 header checksum (incrementally, RFC 1624).  IPv6 has no
 * header checksum and TCP's pseudo-header covers neither TOS nor traffic
 * class, so nothing else changes.
 */
void cp_clear_mark(uint8_t *frame, const struct cp_frame *f);

struct cp_flows;

struct cp_flows *cp_flows_create(void);
void cp_flows_destroy(struct cp_flows *t); /* NULL is a no-op */
/* Frames of the flow held now (0 for an unknown flow). */
uint32_t cp_flows_held(const struct cp_flows *t, const struct cp_flow_key *k);
/* One more frame of the flow is held.  -1 when out of memory. */
int cp_flows_add(struct cp_flows *t, const struct cp_flow_key *k);
/* One frame of the flow left; the flow is forgotten at 0. */
void cp_flows_remove(struct cp_flows *t, const struct cp_flow_key *k);
/* Everything held was dropped (fencing). */
void cp_flows_clear(struct cp_flows *t);
/* Flows with frames held now. */
size_t cp_flows_count(const struct cp_flows *t);

#endif
