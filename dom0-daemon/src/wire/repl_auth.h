/*
 * Peer authentication for the replication protocol: a pre-shared key
 * (PSK) on both hosts and a mutual HMAC-SHA256 challenge over both
 * sides' random nonces (docs/protocol.md, "Connection sequence").
 *
 * Why a PSK and not TLS: the two remusdbd of a pair are configured
 * together by one operator, so a shared secret file is the simplest thing
 * that stops a stray or hostile process from feeding a backup epochs or
 * from receiving a VM's memory.  Each side proves knowledge of the key
 * over nonces that include the other side's fresh one, so a recorded
 * handshake cannot be replayed.  This authenticates the peers only; the
 * stream itself is neither encrypted nor MACed (the epoch checksum is an
 * integrity check against bugs, not against an attacker), so the
 * replication link must be a trusted network.
 */
#ifndef REMUSDB_REPL_AUTH_H
#define REMUSDB_REPL_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define REPL_NONCE_SIZE 32
#define REPL_MAC_SIZE 32
#define REPL_PSK_MIN 16
#define REPL_PSK_MAX 1024
/*
 * The MAC labels: AUTH (primary -> backup) and AUTH_OK (backup -> primary).
 * Versions 1 and 2 MAC label || nonce || nonce; from version 3 on the
 * MACs bind the session's version too: label_v3 || nonce || nonce ||
 * version (2 bytes, big endian), so a HELLO whose version field was
 * changed on the way fails authentication (repl_auth_mac_bound).
 */
#define REPL_AUTH_LABEL_PRIMARY "remusdb-repl-v1 primary"
#define REPL_AUTH_LABEL_BACKUP "remusdb-repl-v1 backup"
#define REPL_AUTH_LABEL_PRIMARY_V3 "remusdb-repl-v3 primary"
#define REPL_AUTH_LABEL_BACKUP_V3 "remusdb-repl-v3 backup"
/* The first version whose MACs bind it. */
#define REPL_AUTH_BINDS_VERSION 3

/*
 * Loads a pre-shared key file: its whole content, one trailing newline
 * ("\n" or "\r\n") stripped, 16..1024 bytes.  The file must be a regular
 * file that neither group nor others can access (mode & 077 == 0).  key
 * has room for REPL_PSK_MAX bytes.  Returns 0, or -1 with err saying
 * what is wrong and what to do ("chmod 600 FILE").
 */
int repl_psk_load(const char *path, uint8_t *key, size_t *key_len, char *err,
		  size_t errlen);
/* Fresh random bytes from getrandom(); 0, or -1 with errno set. */
int repl_nonce_fill(uint8_t nonce[REPL_NONCE_SIZE]);
/* HMAC-SHA256 (OpenSSL); 0, or -1 if OpenSSL failed. */
int repl_hmac_sha256(const uint8_t *key, size_t key_len, const uint8_t *msg,
		     size_t msg_len, uint8_t out[REPL_MAC_SIZE]);
/*
 * out = HMAC-SHA256(key, label || a || b), the label without its NUL.
 * Returns 0; on the (out-of-memory) failure of OpenSSL returns -1 and
 * fills out with random bytes, so that a caller ignoring the result still
 * cannot authenticate anybody.
 */
int repl_auth_mac(const uint8_t *key, size_t key_len, const char *label,
		  const uint8_t a[REPL_NONCE_SIZE], const uint8_t b[REPL_NONCE_SIZE],
		  uint8_t out[REPL_MAC_SIZE]);
/* The same with the version appended (2 bytes, big endian): versions 3 and later. */
int repl_auth_mac_bound(const uint8_t *key, size_t key_len, const char *label,
			const uint8_t a[REPL_NONCE_SIZE], const uint8_t b[REPL_NONCE_SIZE],
			uint16_t version, uint8_t out[REPL_MAC_SIZE]);
/* Constant-time comparison of two MACs (CRYPTO_memcmp). */
bool repl_auth_check(const uint8_t expected[REPL_MAC_SIZE],
		     const uint8_t got[REPL_MAC_SIZE]);

#endif
