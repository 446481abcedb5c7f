/*
 * The heartbeat datagram: what the two remusdbd of a replication link
 * send each other over UDP, off the TCP stream, to prove they are alive
 * (docs/protocol.md, "Heartbeats").
 *
 * Why a datagram beside the TCP link: a heartbeat queued on the TCP
 * stream waits behind megabytes of epoch data, so the peer's silence
 * measured there is the stream's backlog, not the peer's death.  A
 * datagram is never queued behind anything, and a lost one is simply
 * replaced by the next.
 *
 * Layout (64 bytes, big-endian):
 *   be32 magic "RDHB", u8 version 1, u8 flags, be16 zero,
 *   be64 link id, be64 sequence, be64 sender's monotonic time (us),
 *   32 bytes HMAC-SHA256(link key, the 32 bytes before it).
 * The link id and key are derived from the pre-shared key and both
 * handshake nonces, so only the two authenticated ends of one TCP link
 * can produce datagrams the other accepts, and the increasing sequence
 * stops a recorded datagram from being replayed.
 */
#ifndef REMUSDB_HEARTBEAT_WIRE_H
#define REMUSDB_HEARTBEAT_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "wire/repl_auth.h"

#define HEARTBEAT_MAGIC 0x52444842u /* "RDHB" */
#define HEARTBEAT_VERSION 1
#define HEARTBEAT_SIGNED_SIZE 32
#define HEARTBEAT_DATAGRAM_SIZE (HEARTBEAT_SIGNED_SIZE + REPL_MAC_SIZE)
#define HEARTBEAT_KEY_SIZE REPL_MAC_SIZE
/* flags: which end sent it, so a datagram cannot be reflected back at its sender. */
#define HEARTBEAT_FROM_PRIMARY 0x01

struct heartbeat_msg {
	uint8_t flags;
	uint64_t link_id;
	uint64_t seq;
	uint64_t sent_us;
};

/* The link's id and key, from the PSK and the two handshake nonces. */
int heartbeat_link_secret(const uint8_t *psk, size_t psk_len,
			  const uint8_t primary_nonce[REPL_NONCE_SIZE],
			  const uint8_t backup_nonce[REPL_NONCE_SIZE],
			  uint64_t *link_id, uint8_t key[HEARTBEAT_KEY_SIZE]);

/* Fills out[HEARTBEAT_DATAGRAM_SIZE]; 0, or -1 if the MAC failed. */
int heartbeat_encode(const struct heartbeat_msg *m, const uint8_t key[HEARTBEAT_KEY_SIZE],
		     uint8_t out[HEARTBEAT_DATAGRAM_SIZE]);

/*
 * Reads the header only (to find the link and its key).  Returns 0, or -1
 * with *err naming what is wrong (size, magic, version).
 */
int heartbeat_peek(const uint8_t *d, size_t len, struct heartbeat_msg *m, const char **err);

/* 1 when d's MAC is right under key, else 0.  d was accepted by heartbeat_peek. */
int heartbeat_verify(const uint8_t d[HEARTBEAT_DATAGRAM_SIZE],
		     const uint8_t key[HEARTBEAT_KEY_SIZE]);

#endif
