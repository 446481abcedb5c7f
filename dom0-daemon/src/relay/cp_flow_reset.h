/*
 * The backup's half of commit protection's fail-safe (issue 10): after a
 * takeover, every flow whose client saw bytes the restored checkpoint
 * never produced (cp_flow_positions.h decides which) is reset both ways, so
 * that its in-flight transaction aborts at once instead of stalling on
 * a connection whose two ends disagree.  The thesis's RemusDB left such
 * connections to time out.
 *
 * An RST is only taken when its sequence number is exactly the
 * receiver's next expected byte (RFC 5961; Linux answers an in-window
 * but inexact one with a "challenge ACK").  The engine knows each side's
 * position only approximately (the client's from the primary's last
 * release, the guest's from its last acknowledgement before the cut),
 * so it sends its best RST and a probe: a bare ACK far behind the
 * receiver's window, which makes that TCP answer with a duplicate ACK
 * carrying its exact position.  Every ACK a side sends on a reset flow,
 * answer or challenge or retransmission, is dropped and answered with an
 * RST at that side's acknowledgement number, which is exact.
 *
 * A flow no notice named is verified the same way: the probe's answer
 * says how far the client got.  Beyond the restored guest's position
 * (cut_end) means the client saw output the notice for which never
 * arrived (the primary died with it queued): the flow is reset.  At or
 * behind it, the flow is consistent and left alone: the restored guest
 * resends whatever the client lacks.  Until the answer, the guest's
 * frames of the flow are held back (dropped: TCP resends them).
 *
 * No sockets, no timers: failover.c feeds it the relay's frames and a
 * tick, and gives it the two ways out.
 */
#ifndef REMUSDB_CP_FLOW_RESET_H
#define REMUSDB_CP_FLOW_RESET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "relay/cp_flow_frame.h"

struct cp_flow_reset_target {
	struct cp_flow_key key;        /* as the guest sends: src is the guest */
	uint8_t guest_mac[6], peer_mac[6];
	bool client_seq_known;
	uint32_t client_seq;           /* the client's next expected byte, best known */
	bool guest_seq_known;
	uint32_t guest_seq;            /* the guest's next expected byte, best known */
	bool verify;                   /* no notice: reset only if the client is beyond cut_end */
	uint32_t cut_end;              /* how far the restored guest had sent */
};

struct cp_flow_reset_io {
	void *opaque;
	int (*to_lan)(void *opaque, const uint8_t *frame, size_t len);
	int (*to_guest)(void *opaque, const uint8_t *frame, size_t len);
};

struct cp_flow_reset_stats {
	uint64_t flows;           /* flows being reset */
	uint64_t client_rsts;     /* RSTs sent to clients */
	uint64_t guest_rsts;      /* RSTs injected into the guest */
	uint64_t probes;          /* bare ACKs sent to learn a position */
	uint64_t exact_client;    /* flows whose client position an ACK of its own gave */
	uint64_t exact_guest;     /* the same for the guest */
	uint64_t frames_dropped;  /* frames of reset flows kept from the other side */
	uint64_t flows_released;  /* a new connection (SYN) reused the 4-tuple */
	uint64_t verified_ahead;  /* verified flows whose client was beyond the cut: reset */
	uint64_t verified_consistent; /* verified flows whose client was not: left alone */
};

struct cp_flow_reset;

struct cp_flow_reset *cp_flow_reset_create(const struct cp_flow_reset_io *io);
void cp_flow_reset_destroy(struct cp_flow_reset *fr); /* NULL is a no-op */
/* 0, or -1 when out of memory. */
int cp_flow_reset_add(struct cp_flow_reset *fr, const struct cp_flow_reset_target *t);
/* RSTs and probes to the clients (the LAN is ours now; the guest may not run yet). */
void cp_flow_reset_clients(struct cp_flow_reset *fr);
/* The guest runs: RSTs and probes into it. */
void cp_flow_reset_guest(struct cp_flow_reset *fr);
/* Again for every side whose exact position no ACK gave yet (a probe can be rate-limited). */
void cp_flow_reset_retry(struct cp_flow_reset *fr);
/* Relay hooks: 1 when the frame belongs to a flow being reset (it is dropped). */
int cp_flow_reset_from_guest(void *fr, const uint8_t *frame, uint32_t len);
int cp_flow_reset_from_lan(void *fr, const uint8_t *frame, uint32_t len);
void cp_flow_reset_get_stats(const struct cp_flow_reset *fr, struct cp_flow_reset_stats *out);

/*
 * Builds an Ethernet + IPv4/IPv6 + TCP frame of 20-byte header and no
 * payload into out (at least 74 bytes): from src to dst of key (key's
 * src is the sender).  Returns its length.  Exposed for the unit tests.
 */
size_t cp_flow_reset_build(uint8_t *out, const struct cp_flow_key *key,
			   const uint8_t dst_mac[6], const uint8_t src_mac[6], uint32_t seq,
			   uint32_t ack, uint8_t flags);

#endif
