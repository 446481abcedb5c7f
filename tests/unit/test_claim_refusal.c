/*
 * The line `protect` fails with when etcd names another host as the VM's
 * owner: operators act on it, so it must name the owner and the command
 * that retires a stale owner, with this VM and this host in it.
 */
#include <CUnit/CUnit.h>
#include <string.h>

#include "primary/protection.h"
#include "suites.h"

static void test_names_owner_and_retire_command(void)
{
	char why[640];

	protection_foreign_owner_reason(why, sizeof(why), "db2", "backup", 2, "primary");
	CU_ASSERT_STRING_EQUAL(why, "etcd says VM db2 is owned by host backup (generation 2), "
			       "not by primary: refusing to protect; if backup no longer runs "
			       "db2, `remusdb owner retire db2 --host primary` clears the stale "
			       "owner");
}

/* The command is this VM's and this host's, not a fixed example. */
static void test_command_follows_vm_and_host(void)
{
	char why[640];

	protection_foreign_owner_reason(why, sizeof(why), "pg-7", "hostB", 41, "hostA");
	CU_ASSERT_PTR_NOT_NULL(strstr(why, "`remusdb owner retire pg-7 --host hostA`"));
	CU_ASSERT_PTR_NOT_NULL(strstr(why, "owned by host hostB (generation 41)"));
	CU_ASSERT_PTR_NULL(strstr(why, "db2"));
}

/* A short buffer gets a truncated, terminated line, never an overrun. */
static void test_truncates(void)
{
	char why[24];

	memset(why, 'x', sizeof(why));
	protection_foreign_owner_reason(why, sizeof(why), "db2", "backup", 2, "primary");
	CU_ASSERT_EQUAL(strlen(why), sizeof(why) - 1);
	CU_ASSERT_EQUAL(strncmp(why, "etcd says VM db2 is own", sizeof(why) - 1), 0);
}

int register_claim_refusal_tests(void)
{
	CU_pSuite suite = CU_add_suite("claim_refusal", NULL, NULL);

	if (!suite ||
	    !CU_add_test(suite, "the refusal names the owner and `remusdb owner retire`",
			 test_names_owner_and_retire_command) ||
	    !CU_add_test(suite, "the command names this VM and this host",
			 test_command_follows_vm_and_host) ||
	    !CU_add_test(suite, "a short buffer truncates", test_truncates))
		return -1;
	return 0;
}
