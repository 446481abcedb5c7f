/* Automatic re-protection's rules: retry or not, and the backoff (reprotect_policy.h). */
#include "primary/reprotect_policy.h"

#include "wire/repl_proto.h"

enum protection_end reprotect_classify(enum protection_end seen, const struct reprotect_notes *n)
{
	bool passing = n->refused && (n->refused_code == REPL_ERR_BUSY ||
				      n->refused_code == REPL_ERR_INTERNAL);

	if (seen != END_BACKUP_LOST && seen != END_FAILED)
		return seen;
	if (n->refused && !passing)
		return END_REFUSED;
	if (seen == END_FAILED && (passing || n->unreachable))
		return END_BACKUP_UNREACHABLE;
	return seen;
}

enum reprotect_verdict reprotect_decide(const struct reprotect_facts *f)
{
	/* What the ending says comes first: it is what the operator must act on. */
	switch (f->end) {
	case END_OPERATOR:
		return REPROTECT_OPERATOR;
	case END_FENCED:
		return REPROTECT_FENCED;
	case END_REFUSED:
		return REPROTECT_REFUSED;
	case END_FAILED:
		return REPROTECT_FAILED;
	case END_BACKUP_LOST:
	case END_BACKUP_UNREACHABLE:
		break;
	}
	if (!f->settings_known)
		return REPROTECT_NO_SETTINGS;
	if (!f->was_protected)
		return REPROTECT_NEVER_PROTECTED;
	if (!f->enabled)
		return REPROTECT_DISABLED;
	return REPROTECT_RETRY;
}

const char *reprotect_verdict_why(enum reprotect_verdict v)
{
	switch (v) {
	case REPROTECT_RETRY:
		return "";
	case REPROTECT_DISABLED:
		return "automatic re-protection is off (--reprotect off): protect it again by hand";
	case REPROTECT_OPERATOR:
		return "unprotected by the operator: not re-protected";
	case REPROTECT_FENCED:
		return "fenced (the VM is not ours to run): not re-protected";
	case REPROTECT_REFUSED:
		return "the backup refused this protection (another key, another version, "
		       "or a broken rule): not retried until it is protected again by hand";
	case REPROTECT_FAILED:
		return "the protection failed here: not retried until it is protected again by hand";
	case REPROTECT_NEVER_PROTECTED:
		return "it never reached protected: `protect` reported the failure, nothing retries it";
	case REPROTECT_NO_SETTINGS:
		return "recovered after remusdbd restarted, without its protect settings: "
		       "protect it again by hand";
	}
	return "?";
}

unsigned reprotect_delay_ms(const struct reprotect_backoff *b, unsigned tries_done)
{
	unsigned long long ms = b->first_ms ? b->first_ms : 1;

	/* Doubling stops at the cap; the shift count stays small whatever tries_done is. */
	for (unsigned i = 0; i < tries_done && ms < b->max_ms; i++)
		ms *= 2;
	return ms > b->max_ms ? b->max_ms : (unsigned)ms;
}
