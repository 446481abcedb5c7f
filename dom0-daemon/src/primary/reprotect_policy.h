/*
 * Automatic re-protection's rules, as pure functions: whether a
 * protection that ended is tried again by itself, and how long to wait
 * before each try (protection_reprotect.c does the trying).
 *
 * Why only a lost backup is retried: that is the one ending that a
 * backup coming back repairs by itself (its daemon restarted, its host
 * rebooted, the link healed), as Patroni re-adds a member that rejoins.
 * The operator's unprotect is a decision; a fenced primary no longer
 * owns the VM; a refusal (another key, another protocol version, a
 * broken rule) fails the same way every time until someone changes
 * something; and a protection that never reached "protected" was never
 * the operator's working setup, so `protect` reports its failure instead.
 */
#ifndef REMUSDB_REPROTECT_POLICY_H
#define REMUSDB_REPROTECT_POLICY_H

#include <stdbool.h>
#include <stdint.h>

/* How a protection ended, as far as re-protection cares. */
enum protection_end {
	END_BACKUP_LOST,        /* the backup went away; etcd left the VM with us */
	END_BACKUP_UNREACHABLE, /* a re-protection's backup did not answer (yet) */
	END_OPERATOR,           /* `unprotect` */
	END_FENCED,             /* etcd gave the VM to the backup, or could not be asked */
	END_REFUSED,            /* the backup refused us: key, version, protocol */
	END_FAILED,             /* anything else: a local fault */
};

/*
 * What the connection noted before the ending: the backup refused (its
 * ERROR code, 0 when the handshake itself failed: another key or
 * version), or could not be reached.
 */
struct reprotect_notes {
	bool refused;
	uint16_t refused_code; /* enum repl_error_code */
	bool unreachable;
};

/*
 * The ending as re-protection sees it.  A refusal is final unless the
 * backup was only busy (it still holds the old session) or short of a
 * resource; a failure noted as unreachable, or refused only for now,
 * is a backup not (yet) back.
 */
enum protection_end reprotect_classify(enum protection_end seen, const struct reprotect_notes *n);

struct reprotect_facts {
	bool enabled;          /* the daemon's --reprotect */
	enum protection_end end;
	bool was_protected;    /* it reached "protected", or is a re-protection itself */
	bool settings_known;   /* its protect request is kept (not a restart's recovery) */
};

enum reprotect_verdict {
	REPROTECT_RETRY,
	REPROTECT_DISABLED,
	REPROTECT_OPERATOR,
	REPROTECT_FENCED,
	REPROTECT_REFUSED,
	REPROTECT_FAILED,
	REPROTECT_NEVER_PROTECTED,
	REPROTECT_NO_SETTINGS,
};

enum reprotect_verdict reprotect_decide(const struct reprotect_facts *f);
/* One line for status and the log: why there is no retry ("" for RETRY). */
const char *reprotect_verdict_why(enum reprotect_verdict v);

/* The waits: first_ms, doubled after each failed try, never above max_ms. */
struct reprotect_backoff {
	unsigned first_ms;
	unsigned max_ms;
};

/* The wait before try number `tries_done` + 1 (0 tries done: first_ms). */
unsigned reprotect_delay_ms(const struct reprotect_backoff *b, unsigned tries_done);

#endif
