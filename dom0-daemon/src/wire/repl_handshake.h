/*
 * The replication handshake, both roles: HELLO both ways (magic,
 * version, role, a fresh nonce, the host name), then the primary's AUTH
 * and the backup's AUTH_OK, each an HMAC over both nonces with the
 * pre-shared key (repl_auth.h).  docs/protocol.md, "Connection sequence".
 *
 *   backup                        primary
 *   HELLO(lowest version, Nb) --->
 *                           <---  HELLO(version offered, Np), AUTH(mac_p)
 *   AUTH_OK(mac_b)          --->      (or ERROR(1, "supported LO..HI; ..."))
 *
 * The version is negotiated on the way (repl_version.h): the backup
 * accepts an offer it speaks and refuses any other with its range; the
 * primary's owner then reconnects once with the version both speak
 * (repl_handshake_on_version_refusal says which).
 *
 * One state machine for both sides, so that the version and role rules,
 * the MAC labels and the order of the nonces live in one place.  It only
 * reads frames and appends answers to a buffer: protection_link.c
 * (primary) and replication_server.c (backup) own the connections.
 */
#ifndef REMUSDB_REPL_HANDSHAKE_H
#define REMUSDB_REPL_HANDSHAKE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buffer.h"
#include "wire/repl_auth.h"
#include "wire/repl_proto.h"
#include "wire/repl_version.h"

enum repl_handshake_result {
	REPL_HANDSHAKE_FAILED = -1, /* h->error and h->error_code say why */
	REPL_HANDSHAKE_MORE = 0,    /* go on: answers (if any) are in out */
	REPL_HANDSHAKE_DONE = 1,    /* the peer proved it knows the key */
};

struct repl_handshake {
	enum repl_role role; /* ours */
	const uint8_t *psk;  /* borrowed */
	size_t psk_len;
	const char *host;    /* borrowed: our name in HELLO */
	uint8_t nonce[REPL_NONCE_SIZE];
	uint8_t peer_nonce[REPL_NONCE_SIZE];
	char peer_name[REPL_NAME_MAX + 1];
	/*
	 * The versions: what the peer's HELLO said (a backup's: the lowest it
	 * speaks), the backup's range when known (the primary: from an
	 * earlier refusal, set by the owner after init), what the primary
	 * offered, and the session's version once both agree (0 before).
	 */
	uint16_t peer_hello_version;
	struct repl_version_range backup_range;
	uint16_t offered;
	uint16_t version;
	bool got_hello;
	bool done;
	uint16_t error_code; /* enum repl_error_code, for an ERROR to the peer */
	char error[256];
};

/*
 * Starts a handshake as role.  nonce: the one our HELLO carries when it
 * was already sent, or NULL for a fresh one.  0, or -1 (no randomness).
 */
int repl_handshake_init(struct repl_handshake *h, enum repl_role role, const uint8_t *psk,
			size_t psk_len, const char *host, const uint8_t *nonce);
/*
 * Appends our HELLO (the backup's opening move: with the lowest version
 * we speak).  0, or -1 (errno).
 */
int repl_handshake_put_hello(const struct repl_handshake *h, struct buffer *out);
/* Feeds one frame from the peer; answers go to out. */
enum repl_handshake_result repl_handshake_on_frame(struct repl_handshake *h,
						   const struct repl_frame *f,
						   struct buffer *out);

/*
 * The primary's handling of the backup's ERROR(REPL_ERR_VERSION): learns
 * the backup's range (h->backup_range) and returns the version to offer
 * on a new connection, or 0 when there is none (no common version, or
 * the backup refused the one it says it speaks), with h->error the one
 * line that says so, naming the backup as `peer`.
 */
uint16_t repl_handshake_on_version_refusal(struct repl_handshake *h, const struct repl_error *e,
					   const char *peer);

/*
 * The heartbeat link's id and key for this (completed) handshake
 * (heartbeat_wire.h): both roles derive the same pair.  0, or -1.
 */
int repl_handshake_link_secret(const struct repl_handshake *h, uint64_t *link_id,
			       uint8_t key[REPL_MAC_SIZE]);

#endif
