/*
 * The negotiation of the replication protocol's version (docs/protocol.md,
 * "Versions and upgrades"), as pure functions: which version a primary
 * offers, what a backup's refusal says about the versions it speaks, and
 * the one-line messages both sides write when there is no version in
 * common.  repl_handshake.c applies them; keeping them free of state and
 * I/O lets the unit tests walk every pair of ranges.
 *
 * Why negotiate in HELLO and ERROR rather than in a new message: the
 * daemons already deployed (version 1 only) read nothing but HELLO's
 * magic and version from a newer peer and answer ERROR(1).  So a backup
 * opens with the lowest version it speaks (version 1's bytes when it
 * speaks 1), the primary offers the highest version it speaks, and a
 * backup that does not speak the offer says in its ERROR(1) which
 * versions it does, in a fixed text form ("supported 1..2").  A
 * version-1 backup's ERROR(1) has no such text: it speaks 1..1.  The
 * primary then retries once with the highest version both speak, or
 * stops with a line that names both ranges.
 */
#ifndef REMUSDB_REPL_VERSION_H
#define REMUSDB_REPL_VERSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Versions lo..hi; {0, 0} when not known. */
struct repl_version_range {
	uint16_t lo, hi;
};

/* The versions this build speaks: REPL_PROTOCOL_MIN..REPL_PROTOCOL_MAX. */
struct repl_version_range repl_version_ours(void);
bool repl_version_known(struct repl_version_range r);
bool repl_version_in(struct repl_version_range r, uint16_t version);

/* The highest version both ranges hold, or 0 when they are disjoint (or one is unknown). */
uint16_t repl_version_common(struct repl_version_range a, struct repl_version_range b);

/*
 * The version a primary offers in its HELLO: the highest common one when
 * the backup's range is known and overlaps ours; otherwise our highest,
 * which a backup that does not speak it refuses with its range.
 */
uint16_t repl_version_offer(struct repl_version_range ours, struct repl_version_range backup);

/*
 * The backup's range as its ERROR(REPL_ERR_VERSION) reason tells it: the
 * reason starts with "supported LO..HI" (decimal, 1 <= LO <= HI <= 65535,
 * no leading zeros), then ends or goes on with "; ".  A reason without
 * that start comes from a version-1 daemon (its HELLO said version 1),
 * which speaks 1..1; from any other, the range stays unknown.  Returns
 * the range, {0, 0} when unknown.
 */
struct repl_version_range repl_version_from_refusal(const char *reason, size_t len,
						    uint16_t backup_hello_version);

/*
 * The backup's ERROR(1) reason when the primary offers `offered`, which
 * it does not speak: "supported LO..HI; " and a sentence for the log that
 * says which daemon to upgrade.  Returns what snprintf returns.
 */
int repl_version_refusal_reason(char *buf, size_t n, struct repl_version_range ours,
				uint16_t offered);

/*
 * The primary's line when no version is common: "backup PEER speaks
 * replication protocol LO..HI, this daemon LO..HI: upgrade the older
 * daemon (the backup) first".  Returns what snprintf returns.
 */
int repl_version_mismatch_line(char *buf, size_t n, const char *peer,
			       struct repl_version_range ours,
			       struct repl_version_range backup);

/*
 * The version binding (docs/protocol.md, "Versions and upgrades"): every
 * nonce this build puts in its HELLO ends with REPL_VERSION_STAMP_SIZE
 * bytes, the magic "RDBv" and the range it speaks (lo, hi: big endian),
 * after 24 random bytes.  Both nonces are inside both MACs of every
 * version, so once a side has verified its peer's MAC the peer's range
 * is authenticated: a daemon that finds the session's version below the
 * highest both speak knows the negotiation was talked down (a forged
 * refusal) and refuses it.  A nonce of an older daemon is random bytes
 * whose tail matches the magic once in 2^32: its range reads unknown.
 */
#define REPL_VERSION_STAMP_SIZE 8
void repl_version_stamp_nonce(uint8_t *nonce, size_t nonce_len, struct repl_version_range ours);
/* The range a peer's nonce claims, {0, 0} when it carries none. */
struct repl_version_range repl_version_from_nonce(const uint8_t *nonce, size_t nonce_len);
/*
 * True when a session at `version` was talked down: both ranges known
 * and their highest common version above it.
 */
bool repl_version_downgraded(struct repl_version_range ours, struct repl_version_range peer,
			     uint16_t version);
/*
 * The backup's ERROR(1) reason for a downgraded offer (it starts with
 * "supported LO..HI; " like every refusal, so the primary retries with
 * the common version).  Returns what snprintf returns.
 */
int repl_version_downgrade_reason(char *buf, size_t n, struct repl_version_range ours,
				  struct repl_version_range primary, uint16_t offered);

#endif
