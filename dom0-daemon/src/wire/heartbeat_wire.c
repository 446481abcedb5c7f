/* Encoding, decoding and signing of heartbeat datagrams (heartbeat_wire.h). */
#include "wire/heartbeat_wire.h"

#include <string.h>

#include "base/be.h"

#define LABEL_KEY "remusdb-heartbeat-v1 key"
#define LABEL_ID "remusdb-heartbeat-v1 id"

_Static_assert(HEARTBEAT_SIGNED_SIZE == 4 + 1 + 1 + 2 + 8 + 8 + 8,
	       "the signed header is exactly its fields");

int heartbeat_link_secret(const uint8_t *psk, size_t psk_len,
			  const uint8_t primary_nonce[REPL_NONCE_SIZE],
			  const uint8_t backup_nonce[REPL_NONCE_SIZE],
			  uint64_t *link_id, uint8_t key[HEARTBEAT_KEY_SIZE])
{
	uint8_t id[REPL_MAC_SIZE];

	if (repl_auth_mac(psk, psk_len, LABEL_KEY, primary_nonce, backup_nonce, key) < 0 ||
	    repl_auth_mac(psk, psk_len, LABEL_ID, primary_nonce, backup_nonce, id) < 0)
		return -1;
	*link_id = load_be64(id);
	return 0;
}

int heartbeat_encode(const struct heartbeat_msg *m, const uint8_t key[HEARTBEAT_KEY_SIZE],
		     uint8_t out[HEARTBEAT_DATAGRAM_SIZE])
{
	store_be32(out, HEARTBEAT_MAGIC);
	out[4] = HEARTBEAT_VERSION;
	out[5] = m->flags;
	out[6] = out[7] = 0;
	store_be64(out + 8, m->link_id);
	store_be64(out + 16, m->seq);
	store_be64(out + 24, m->sent_us);
	return repl_hmac_sha256(key, HEARTBEAT_KEY_SIZE, out, HEARTBEAT_SIGNED_SIZE,
				out + HEARTBEAT_SIGNED_SIZE);
}

int heartbeat_peek(const uint8_t *d, size_t len, struct heartbeat_msg *m, const char **err)
{
	if (len != HEARTBEAT_DATAGRAM_SIZE) {
		*err = "wrong datagram size";
		return -1;
	}
	if (load_be32(d) != HEARTBEAT_MAGIC) {
		*err = "not a remusdb heartbeat (bad magic)";
		return -1;
	}
	if (d[4] != HEARTBEAT_VERSION) {
		*err = "unsupported heartbeat version";
		return -1;
	}
	m->flags = d[5];
	m->link_id = load_be64(d + 8);
	m->seq = load_be64(d + 16);
	m->sent_us = load_be64(d + 24);
	return 0;
}

int heartbeat_verify(const uint8_t d[HEARTBEAT_DATAGRAM_SIZE],
		     const uint8_t key[HEARTBEAT_KEY_SIZE])
{
	uint8_t mac[REPL_MAC_SIZE];

	if (repl_hmac_sha256(key, HEARTBEAT_KEY_SIZE, d, HEARTBEAT_SIGNED_SIZE, mac) < 0)
		return 0;
	return repl_auth_check(mac, d + HEARTBEAT_SIGNED_SIZE);
}
