/* The replication handshake for both roles (repl_handshake.h). */
#include "wire/repl_handshake.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/config.h"
#include "wire/heartbeat_wire.h"
#include "witness/witness.h"

_Static_assert(sizeof(((struct repl_hello *)0)->nonce) == REPL_NONCE_SIZE,
	       "HELLO carries one handshake nonce");
_Static_assert(REPL_MAC_SIZE == 32 && REPL_NONCE_SIZE == 32,
	       "repl_msg_session.c puts 32-byte MACs (AUTH) and nonces (HELLO) on the wire");
_Static_assert(CONFIG_HOST_MAX - 1 <= REPL_NAME_MAX,
	       "any --host fits in HELLO's name");
_Static_assert(REPL_NAME_MAX <= WITNESS_OWNER_MAX,
	       "a peer's HELLO name fits in an etcd owner value");

static enum repl_handshake_result refuse(struct repl_handshake *h, uint16_t code,
					 const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static enum repl_handshake_result refuse(struct repl_handshake *h, uint16_t code,
					 const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(h->error, sizeof(h->error), fmt, ap);
	va_end(ap);
	h->error_code = code;
	return REPL_HANDSHAKE_FAILED;
}

int repl_handshake_init(struct repl_handshake *h, enum repl_role role, const uint8_t *psk,
			size_t psk_len, const char *host, const uint8_t *nonce)
{
	memset(h, 0, sizeof(*h));
	h->role = role;
	h->psk = psk;
	h->psk_len = psk_len;
	h->host = host;
	if (nonce) {
		memcpy(h->nonce, nonce, REPL_NONCE_SIZE);
		return 0;
	}
	if (repl_nonce_fill(h->nonce) < 0)
		return -1;
	/* Our range, authenticated by both MACs: what catches a talked-down session. */
	repl_version_stamp_nonce(h->nonce, REPL_NONCE_SIZE, repl_version_ours());
	return 0;
}

int repl_handshake_put_hello(const struct repl_handshake *h, struct buffer *out)
{
	struct repl_hello mine;

	memset(&mine, 0, sizeof(mine));
	/* A backup opens with its lowest; a primary offers (before it chose: its highest). */
	mine.version = h->role == REPL_ROLE_BACKUP ? REPL_PROTOCOL_MIN
		       : h->offered ? h->offered : REPL_PROTOCOL_MAX;
	mine.role = (uint8_t)h->role;
	memcpy(mine.nonce, h->nonce, REPL_NONCE_SIZE);
	snprintf(mine.name, sizeof(mine.name), "%s", h->host);
	return repl_put_hello(out, &mine);
}

/* The session's version as this side knows it during the handshake. */
static uint16_t session_version(const struct repl_handshake *h)
{
	return h->role == REPL_ROLE_PRIMARY ? h->offered : h->version;
}

/*
 * The MAC a side sends: its own label, then the nonce of the side that
 * must verify it (fresh on that side: no replay), then its own, and from
 * version 3 on the session's version (repl_auth.h): a version field
 * changed on the way makes the two sides MAC different versions.
 */
static int mac_of(const struct repl_handshake *h, enum repl_role sender,
		  uint8_t mac[REPL_MAC_SIZE])
{
	bool mine = sender == h->role;
	bool primary = sender == REPL_ROLE_PRIMARY;
	uint16_t version = session_version(h);
	const uint8_t *a = mine ? h->peer_nonce : h->nonce, *b = mine ? h->nonce : h->peer_nonce;

	if (version >= REPL_AUTH_BINDS_VERSION)
		return repl_auth_mac_bound(h->psk, h->psk_len, primary ? REPL_AUTH_LABEL_PRIMARY_V3
					   : REPL_AUTH_LABEL_BACKUP_V3, a, b, version, mac);
	return repl_auth_mac(h->psk, h->psk_len, primary ? REPL_AUTH_LABEL_PRIMARY
			     : REPL_AUTH_LABEL_BACKUP, a, b, mac);
}

/*
 * The peer proved the key, and with it the range its nonce claims: a
 * session below the highest version both speak was talked down.
 */
static enum repl_handshake_result check_not_downgraded(struct repl_handshake *h)
{
	struct repl_version_range ours = repl_version_ours();
	struct repl_version_range peer = repl_version_from_nonce(h->peer_nonce, REPL_NONCE_SIZE);
	uint16_t version = session_version(h);
	char reason[sizeof(h->error)];

	if (!repl_version_downgraded(ours, peer, version))
		return REPL_HANDSHAKE_MORE;
	if (h->role == REPL_ROLE_BACKUP) {
		repl_version_downgrade_reason(reason, sizeof(reason), ours, peer, version);
		return refuse(h, REPL_ERR_VERSION, "%s", reason);
	}
	return refuse(h, REPL_ERR_VERSION, "the backup proves it speaks replication protocol "
		      "%u..%u, yet this session was negotiated down to %u: a refusal that said "
		      "otherwise was forged; refusing the session", peer.lo, peer.hi, version);
}

/* The backup decides the session's version: the primary's offer, if we speak it. */
static enum repl_handshake_result backup_checks_version(struct repl_handshake *h,
							uint16_t offered)
{
	char reason[sizeof(h->error)];

	if (repl_version_in(repl_version_ours(), offered)) {
		h->version = offered;
		return REPL_HANDSHAKE_MORE;
	}
	repl_version_refusal_reason(reason, sizeof(reason), repl_version_ours(), offered);
	return refuse(h, REPL_ERR_VERSION, "%s", reason);
}

static enum repl_handshake_result on_hello(struct repl_handshake *h,
					   const struct repl_frame *f, struct buffer *out)
{
	enum repl_role want = h->role == REPL_ROLE_PRIMARY ? REPL_ROLE_BACKUP
							   : REPL_ROLE_PRIMARY;
	struct repl_hello peer;
	uint8_t mac[REPL_MAC_SIZE];
	const char *err;

	if (h->got_hello)
		return refuse(h, REPL_ERR_PROTOCOL, "a second HELLO");
	if (repl_decode_hello(f, &peer, &err) < 0)
		return refuse(h, REPL_ERR_PROTOCOL, "bad HELLO: %s", err);
	h->peer_hello_version = peer.version;
	if (h->role == REPL_ROLE_BACKUP) {
		if (backup_checks_version(h, peer.version) == REPL_HANDSHAKE_FAILED)
			return REPL_HANDSHAKE_FAILED;
	} else {
		/* A backup's HELLO carries the lowest version it speaks: a range
		 * learnt with another lowest one belongs to a replaced daemon. */
		if (h->backup_range.lo != peer.version)
			h->backup_range = (struct repl_version_range){ 0, 0 };
		h->offered = repl_version_offer(repl_version_ours(), h->backup_range);
		/*
		 * A backup whose lowest version is above our highest wrote the
		 * rest in a layout we cannot read: we offer ours without AUTH
		 * (we have no nonce to answer), and its refusal tells its range.
		 */
		if (peer.version > REPL_PROTOCOL_MAX) {
			if (repl_handshake_put_hello(h, out) < 0)
				return refuse(h, REPL_ERR_INTERNAL, "cannot queue HELLO (out of "
					      "memory)");
			return REPL_HANDSHAKE_MORE;
		}
	}
	if (peer.role != want)
		return refuse(h, REPL_ERR_PROTOCOL, want == REPL_ROLE_BACKUP ?
			      "the peer is not a backup remusdbd (it says role %u)" :
			      "only a primary may connect (the peer says role %u)", peer.role);
	memcpy(h->peer_nonce, peer.nonce, REPL_NONCE_SIZE);
	snprintf(h->peer_name, sizeof(h->peer_name), "%s", peer.name);
	h->got_hello = true;
	if (h->role == REPL_ROLE_BACKUP)
		return REPL_HANDSHAKE_MORE; /* AUTH comes next */
	/* The primary answers with its HELLO and proves the key at once. */
	if (mac_of(h, REPL_ROLE_PRIMARY, mac) < 0)
		return refuse(h, REPL_ERR_INTERNAL, "HMAC-SHA256 failed (OpenSSL)");
	if (repl_handshake_put_hello(h, out) < 0 || repl_put_auth(out, REPL_AUTH, mac) < 0)
		return refuse(h, REPL_ERR_INTERNAL, "cannot queue HELLO and AUTH "
			      "(out of memory)");
	return REPL_HANDSHAKE_MORE;
}

static enum repl_handshake_result on_auth(struct repl_handshake *h,
					  const struct repl_frame *f, struct buffer *out)
{
	enum repl_role peer = h->role == REPL_ROLE_PRIMARY ? REPL_ROLE_BACKUP
							   : REPL_ROLE_PRIMARY;
	uint8_t expected[REPL_MAC_SIZE], mine[REPL_MAC_SIZE];
	const uint8_t *mac;
	const char *err;

	if (!h->got_hello)
		return refuse(h, REPL_ERR_PROTOCOL, "%s before HELLO",
			      repl_type_name(f->type));
	if (repl_decode_auth(f, &mac, &err) < 0)
		return refuse(h, REPL_ERR_PROTOCOL, "bad %s: %s", repl_type_name(f->type), err);
	/* A failed HMAC leaves random bytes in expected: never a match. */
	(void)mac_of(h, peer, expected);
	if (!repl_auth_check(expected, mac))
		return refuse(h, REPL_ERR_AUTH, h->role == REPL_ROLE_BACKUP ?
			      "authentication failed: the pre-shared keys differ (or the "
			      "handshake was altered on the way)" :
			      "the backup does not know our pre-shared key: refusing to "
			      "replicate to it (check --psk-file on both hosts)");
	if (check_not_downgraded(h) == REPL_HANDSHAKE_FAILED)
		return REPL_HANDSHAKE_FAILED;
	if (h->role == REPL_ROLE_BACKUP) {
		if (mac_of(h, REPL_ROLE_BACKUP, mine) < 0)
			return refuse(h, REPL_ERR_INTERNAL, "HMAC-SHA256 failed (OpenSSL)");
		if (repl_put_auth(out, REPL_AUTH_OK, mine) < 0)
			return refuse(h, REPL_ERR_INTERNAL, "cannot queue AUTH_OK "
				      "(out of memory)");
	}
	if (h->role == REPL_ROLE_PRIMARY)
		h->version = h->offered; /* the backup accepted it */
	h->done = true;
	return REPL_HANDSHAKE_DONE;
}

uint16_t repl_handshake_on_version_refusal(struct repl_handshake *h, const struct repl_error *e,
					   const char *peer)
{
	struct repl_version_range ours = repl_version_ours();
	struct repl_version_range backup =
		repl_version_from_refusal(e->reason, e->reason_len, h->peer_hello_version);

	h->error_code = REPL_ERR_VERSION;
	if (!repl_version_known(backup)) {
		snprintf(h->error, sizeof(h->error), "backup %s refused replication protocol %u "
			 "and did not say which versions it speaks (this daemon speaks %u..%u): "
			 "%.*s", peer, h->offered, ours.lo, ours.hi, (int)e->reason_len, e->reason);
		return 0;
	}
	h->backup_range = backup;
	uint16_t common = repl_version_common(ours, backup);
	if (!common) {
		repl_version_mismatch_line(h->error, sizeof(h->error), peer, ours, backup);
		return 0;
	}
	if (common == h->offered) {
		snprintf(h->error, sizeof(h->error), "backup %s refused replication protocol %u "
			 "although it says it speaks %u..%u: %.*s", peer, common, backup.lo,
			 backup.hi, (int)e->reason_len, e->reason);
		return 0;
	}
	return common;
}

enum repl_handshake_result repl_handshake_on_frame(struct repl_handshake *h,
						   const struct repl_frame *f,
						   struct buffer *out)
{
	uint16_t auth_type = h->role == REPL_ROLE_PRIMARY ? REPL_AUTH_OK : REPL_AUTH;

	if (h->done)
		return refuse(h, REPL_ERR_PROTOCOL, "%s after the handshake",
			      repl_type_name(f->type));
	if (f->type == REPL_HELLO)
		return on_hello(h, f, out);
	if (f->type == auth_type)
		return on_auth(h, f, out);
	return refuse(h, REPL_ERR_PROTOCOL, "unexpected %s during the handshake",
		      repl_type_name(f->type));
}

int repl_handshake_link_secret(const struct repl_handshake *h, uint64_t *link_id,
			       uint8_t key[REPL_MAC_SIZE])
{
	bool primary = h->role == REPL_ROLE_PRIMARY;

	if (!h->done)
		return -1;
	return heartbeat_link_secret(h->psk, h->psk_len, primary ? h->nonce : h->peer_nonce,
				     primary ? h->peer_nonce : h->nonce, link_id, key);
}
