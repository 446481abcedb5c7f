/* The protocol version's negotiation, pure functions (repl_version.h). */
#include "wire/repl_version.h"

#include <stdio.h>
#include <string.h>

#include "wire/repl_proto.h"

#define SUPPORTED "supported "
#define STAMP_MAGIC "RDBv"

struct repl_version_range repl_version_ours(void)
{
	return (struct repl_version_range){ REPL_PROTOCOL_MIN, REPL_PROTOCOL_MAX };
}

bool repl_version_known(struct repl_version_range r)
{
	return r.lo >= 1 && r.lo <= r.hi;
}

bool repl_version_in(struct repl_version_range r, uint16_t version)
{
	return repl_version_known(r) && version >= r.lo && version <= r.hi;
}

uint16_t repl_version_common(struct repl_version_range a, struct repl_version_range b)
{
	if (!repl_version_known(a) || !repl_version_known(b))
		return 0;
	uint16_t hi = a.hi < b.hi ? a.hi : b.hi;
	uint16_t lo = a.lo > b.lo ? a.lo : b.lo;
	return lo <= hi ? hi : 0;
}

uint16_t repl_version_offer(struct repl_version_range ours, struct repl_version_range backup)
{
	uint16_t common = repl_version_common(ours, backup);

	return common ? common : ours.hi;
}

/*
 * A decimal 1..65535 without leading zeros at s (n bytes left): its
 * length, or 0 when there is none.
 */
static size_t parse_version(const char *s, size_t n, uint16_t *out)
{
	uint32_t v = 0;
	size_t i = 0;

	while (i < n && s[i] >= '0' && s[i] <= '9' && i < 5) {
		v = v * 10 + (uint32_t)(s[i] - '0');
		i++;
	}
	if (i == 0 || s[0] == '0' || v > 0xffff || (i < n && s[i] >= '0' && s[i] <= '9'))
		return 0;
	*out = (uint16_t)v;
	return i;
}

struct repl_version_range repl_version_from_refusal(const char *reason, size_t len,
						    uint16_t backup_hello_version)
{
	const struct repl_version_range unknown = { 0, 0 };
	const size_t prefix = strlen(SUPPORTED);
	struct repl_version_range r;
	size_t at, k;

	if (len < prefix || memcmp(reason, SUPPORTED, prefix) != 0)
		return backup_hello_version == 1 ? (struct repl_version_range){ 1, 1 } : unknown;
	at = prefix;
	if (!(k = parse_version(reason + at, len - at, &r.lo)))
		return unknown;
	at += k;
	if (len - at < 2 || memcmp(reason + at, "..", 2) != 0)
		return unknown;
	at += 2;
	if (!(k = parse_version(reason + at, len - at, &r.hi)))
		return unknown;
	at += k;
	if (at != len && (len - at < 2 || memcmp(reason + at, "; ", 2) != 0))
		return unknown;
	return repl_version_known(r) ? r : unknown;
}

int repl_version_refusal_reason(char *buf, size_t n, struct repl_version_range ours,
				uint16_t offered)
{
	if (offered > ours.hi)
		return snprintf(buf, n, SUPPORTED "%u..%u; the primary offers replication "
				"protocol %u, this daemon speaks %u..%u: the primary retries "
				"with %u if it speaks it, otherwise upgrade this daemon first",
				ours.lo, ours.hi, offered, ours.lo, ours.hi, ours.hi);
	return snprintf(buf, n, SUPPORTED "%u..%u; the primary offers replication protocol "
			"%u, this daemon speaks %u..%u: upgrade the older daemon (the "
			"primary's) first", ours.lo, ours.hi, offered, ours.lo, ours.hi);
}

int repl_version_mismatch_line(char *buf, size_t n, const char *peer,
			       struct repl_version_range ours,
			       struct repl_version_range backup)
{
	return snprintf(buf, n, "backup %s speaks replication protocol %u..%u, this daemon "
			"%u..%u: upgrade the older daemon (%s) first", peer, backup.lo,
			backup.hi, ours.lo, ours.hi,
			backup.hi < ours.lo ? "the backup's" : "this one");
}

void repl_version_stamp_nonce(uint8_t *nonce, size_t nonce_len, struct repl_version_range ours)
{
	uint8_t *t = nonce + nonce_len - REPL_VERSION_STAMP_SIZE;

	memcpy(t, STAMP_MAGIC, 4);
	t[4] = (uint8_t)(ours.lo >> 8);
	t[5] = (uint8_t)ours.lo;
	t[6] = (uint8_t)(ours.hi >> 8);
	t[7] = (uint8_t)ours.hi;
}

struct repl_version_range repl_version_from_nonce(const uint8_t *nonce, size_t nonce_len)
{
	const struct repl_version_range unknown = { 0, 0 };
	const uint8_t *t = nonce + nonce_len - REPL_VERSION_STAMP_SIZE;

	if (nonce_len < REPL_VERSION_STAMP_SIZE || memcmp(t, STAMP_MAGIC, 4) != 0)
		return unknown;
	struct repl_version_range r = { (uint16_t)(t[4] << 8 | t[5]), (uint16_t)(t[6] << 8 | t[7]) };
	return repl_version_known(r) ? r : unknown;
}

bool repl_version_downgraded(struct repl_version_range ours, struct repl_version_range peer,
			     uint16_t version)
{
	uint16_t common = repl_version_common(ours, peer);

	return common && version < common;
}

int repl_version_downgrade_reason(char *buf, size_t n, struct repl_version_range ours,
				  struct repl_version_range primary, uint16_t offered)
{
	return snprintf(buf, n, SUPPORTED "%u..%u; the primary, which proves it speaks %u..%u, "
			"offered replication protocol %u, below the %u both speak: a refusal it "
			"acted on was not this daemon's (forged?), or this daemon was upgraded "
			"since; the primary retries with %u", ours.lo, ours.hi, primary.lo,
			primary.hi, offered, repl_version_common(ours, primary),
			repl_version_common(ours, primary));
}
