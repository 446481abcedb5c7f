/*
 * Automatic re-protection's rules (primary/reprotect_policy.c): the
 * backoff between tries, how an ending is classified from what the
 * connection noted, and whether it is retried.  The endings that must
 * never be retried (the operator's unprotect, a fence, a refused key or
 * version, a local failure, a protection that never got protected) are
 * each checked against an otherwise retryable case, so that a rule that
 * retried too much fails here.
 */
#include <CUnit/CUnit.h>
#include <limits.h>

#include "primary/reprotect_policy.h"
#include "suites.h"
#include "wire/repl_proto.h"

static void test_backoff_doubles_to_the_cap(void)
{
	struct reprotect_backoff b = { .first_ms = 1000, .max_ms = 30000 };
	static const unsigned want[] = { 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000 };

	for (unsigned i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		CU_ASSERT_EQUAL(reprotect_delay_ms(&b, i), want[i]);
	/* Any number of tries: no overflow, no shift past the width. */
	CU_ASSERT_EQUAL(reprotect_delay_ms(&b, 64), 30000);
	CU_ASSERT_EQUAL(reprotect_delay_ms(&b, UINT_MAX), 30000);
}

static void test_backoff_edges(void)
{
	struct reprotect_backoff flat = { .first_ms = 500, .max_ms = 500 };
	struct reprotect_backoff odd = { .first_ms = 300, .max_ms = 1000 };
	struct reprotect_backoff huge = { .first_ms = 3000000, .max_ms = 3600000 };

	CU_ASSERT_EQUAL(reprotect_delay_ms(&flat, 0), 500);
	CU_ASSERT_EQUAL(reprotect_delay_ms(&flat, 5), 500);
	CU_ASSERT_EQUAL(reprotect_delay_ms(&odd, 1), 600);
	CU_ASSERT_EQUAL(reprotect_delay_ms(&odd, 2), 1000); /* 1200 capped, not 1200 */
	CU_ASSERT_EQUAL(reprotect_delay_ms(&huge, 1), 3600000);
	CU_ASSERT_EQUAL(reprotect_delay_ms(&huge, 40), 3600000);
}

static enum reprotect_verdict decide(enum protection_end end, bool was_protected)
{
	struct reprotect_facts f = {
		.enabled = true, .end = end, .was_protected = was_protected,
		.settings_known = true,
	};

	return reprotect_decide(&f);
}

static void test_only_a_lost_backup_is_retried(void)
{
	CU_ASSERT_EQUAL(decide(END_BACKUP_LOST, true), REPROTECT_RETRY);
	CU_ASSERT_EQUAL(decide(END_BACKUP_UNREACHABLE, true), REPROTECT_RETRY);
	/* The negative controls: the same protection, ended otherwise. */
	CU_ASSERT_EQUAL(decide(END_OPERATOR, true), REPROTECT_OPERATOR);
	CU_ASSERT_EQUAL(decide(END_FENCED, true), REPROTECT_FENCED);
	CU_ASSERT_EQUAL(decide(END_REFUSED, true), REPROTECT_REFUSED);
	CU_ASSERT_EQUAL(decide(END_FAILED, true), REPROTECT_FAILED);
	/* `protect` that never got protected reports its failure; nothing retries it. */
	CU_ASSERT_EQUAL(decide(END_BACKUP_LOST, false), REPROTECT_NEVER_PROTECTED);
	CU_ASSERT_EQUAL(decide(END_BACKUP_UNREACHABLE, false), REPROTECT_NEVER_PROTECTED);
}

static void test_switch_and_settings(void)
{
	struct reprotect_facts f = {
		.enabled = false, .end = END_BACKUP_LOST, .was_protected = true,
		.settings_known = true,
	};

	CU_ASSERT_EQUAL(reprotect_decide(&f), REPROTECT_DISABLED);
	f.enabled = true;
	f.settings_known = false; /* recovered after a restart: no protect request kept */
	CU_ASSERT_EQUAL(reprotect_decide(&f), REPROTECT_NO_SETTINGS);
	f.was_protected = false;
	CU_ASSERT_EQUAL(reprotect_decide(&f), REPROTECT_NO_SETTINGS);
	/* The operator's ending is reported as such even with the switch off. */
	f.enabled = false;
	f.settings_known = true;
	f.end = END_OPERATOR;
	CU_ASSERT_EQUAL(reprotect_decide(&f), REPROTECT_OPERATOR);
	for (int v = REPROTECT_DISABLED; v <= REPROTECT_NO_SETTINGS; v++)
		CU_ASSERT_TRUE(reprotect_verdict_why(v)[0] != '\0');
	CU_ASSERT_STRING_EQUAL(reprotect_verdict_why(REPROTECT_RETRY), "");
}

static enum protection_end classify(enum protection_end seen, bool refused, uint16_t code,
				    bool unreachable)
{
	struct reprotect_notes n = {
		.refused = refused, .refused_code = code, .unreachable = unreachable,
	};

	return reprotect_classify(seen, &n);
}

static void test_classify_refusals(void)
{
	/* A wrong key or version fails the handshake (code 0) or is answered with an ERROR. */
	CU_ASSERT_EQUAL(classify(END_FAILED, true, 0, false), END_REFUSED);
	CU_ASSERT_EQUAL(classify(END_FAILED, true, REPL_ERR_AUTH, false), END_REFUSED);
	CU_ASSERT_EQUAL(classify(END_FAILED, true, REPL_ERR_VERSION, false), END_REFUSED);
	CU_ASSERT_EQUAL(classify(END_BACKUP_LOST, true, REPL_ERR_PROTOCOL, false), END_REFUSED);
	CU_ASSERT_EQUAL(classify(END_BACKUP_LOST, true, REPL_ERR_REFUSED, false), END_REFUSED);
	/* ... even when the connection also closed: the refusal decides. */
	CU_ASSERT_EQUAL(classify(END_FAILED, true, REPL_ERR_AUTH, true), END_REFUSED);
	CU_ASSERT_EQUAL(decide(classify(END_FAILED, true, 0, false), true), REPROTECT_REFUSED);
	/* A busy backup (it still holds the old session) takes us later. */
	CU_ASSERT_EQUAL(classify(END_FAILED, true, REPL_ERR_BUSY, false), END_BACKUP_UNREACHABLE);
	CU_ASSERT_EQUAL(classify(END_BACKUP_LOST, true, REPL_ERR_BUSY, false), END_BACKUP_LOST);
	CU_ASSERT_EQUAL(classify(END_FAILED, true, REPL_ERR_INTERNAL, false),
			END_BACKUP_UNREACHABLE);
}

static void test_classify_unreachable_and_others(void)
{
	CU_ASSERT_EQUAL(classify(END_FAILED, false, 0, true), END_BACKUP_UNREACHABLE);
	/* A local failure with nothing noted stays a failure: not retried. */
	CU_ASSERT_EQUAL(classify(END_FAILED, false, 0, false), END_FAILED);
	CU_ASSERT_EQUAL(classify(END_BACKUP_LOST, false, 0, false), END_BACKUP_LOST);
	CU_ASSERT_EQUAL(classify(END_BACKUP_LOST, false, 0, true), END_BACKUP_LOST);
	/* Notes never turn an operator's stop or a fence into something retried. */
	CU_ASSERT_EQUAL(classify(END_OPERATOR, false, 0, true), END_OPERATOR);
	CU_ASSERT_EQUAL(classify(END_FENCED, true, REPL_ERR_BUSY, true), END_FENCED);
}

int register_reprotect_policy_tests(void)
{
	CU_pSuite s = CU_add_suite("reprotect_policy", NULL, NULL);

	if (!s ||
	    !CU_add_test(s, "backoff doubles from first to max", test_backoff_doubles_to_the_cap) ||
	    !CU_add_test(s, "backoff edges", test_backoff_edges) ||
	    !CU_add_test(s, "only a lost backup is retried", test_only_a_lost_backup_is_retried) ||
	    !CU_add_test(s, "the switch and kept settings", test_switch_and_settings) ||
	    !CU_add_test(s, "refusals are final unless busy", test_classify_refusals) ||
	    !CU_add_test(s, "unreachable and other endings",
			 test_classify_unreachable_and_others))
		return -1;
	return 0;
}
