/* The state directory's per-VM files (base/state_file.c): replaced whole,
 * removed, listed without the temporary files of a replacement. */
#include <CUnit/CUnit.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/state_file.h"
#include "suites.h"

static char root[64];
static char err[512];

static int make_root(void)
{
	snprintf(root, sizeof(root), "/tmp/rdb-state-file-XXXXXX");
	return mkdtemp(root) ? 0 : -1;
}

static int remove_root(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	return system(cmd) == 0 ? 0 : -1;
}

static char *slurp(const char *path)
{
	static char buf[256];
	FILE *f = fopen(path, "r");

	if (!f)
		return NULL;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	return buf;
}

static void test_replace_creates_the_directory_and_replaces_whole(void)
{
	char dir[128], path[160];
	struct stat st;

	snprintf(dir, sizeof(dir), "%s/kind", root);
	snprintf(path, sizeof(path), "%s/db1.json", dir);
	CU_ASSERT_EQUAL(state_file_replace(dir, "db1.json", "{\"a\":1}", err, sizeof(err)), 0);
	CU_ASSERT_STRING_EQUAL(slurp(path), "{\"a\":1}");
	CU_ASSERT_EQUAL(state_file_replace(dir, "db1.json", "{}", err, sizeof(err)), 0);
	CU_ASSERT_STRING_EQUAL(slurp(path), "{}");
	CU_ASSERT_EQUAL(stat(path, &st), 0);
	CU_ASSERT_EQUAL(st.st_mode & 0777, 0600);
	/* No temporary file is left behind. */
	snprintf(path, sizeof(path), "%s/.db1.json.tmp", dir);
	CU_ASSERT_EQUAL(access(path, F_OK), -1);
}

static void test_replace_fails_in_one_line_and_keeps_the_old_file(void)
{
	char dir[128], blocker[160], path[160];

	snprintf(dir, sizeof(dir), "%s/ro", root);
	CU_ASSERT_EQUAL(state_file_replace(dir, "db2.json", "old", err, sizeof(err)), 0);
	/* A directory where the temporary file must go: the write fails. */
	snprintf(blocker, sizeof(blocker), "%s/.db2.json.tmp", dir);
	CU_ASSERT_EQUAL(mkdir(blocker, 0700), 0);
	err[0] = '\0';
	CU_ASSERT_EQUAL(state_file_replace(dir, "db2.json", "new", err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "cannot write"));
	CU_ASSERT_PTR_NOT_NULL(strstr(err, ".db2.json.tmp"));
	snprintf(path, sizeof(path), "%s/db2.json", dir);
	CU_ASSERT_STRING_EQUAL(slurp(path), "old");
	rmdir(blocker);
}

static int visits;
static char seen[4][32];

static void count_visit(const char *stem, const char *path, void *data)
{
	(void)data;
	CU_ASSERT_PTR_NOT_NULL(strstr(path, stem));
	if (visits < 4)
		snprintf(seen[visits], sizeof(seen[0]), "%s", stem);
	visits++;
}

static void test_remove_and_list(void)
{
	char dir[128], path[160];
	FILE *f;

	snprintf(dir, sizeof(dir), "%s/list", root);
	CU_ASSERT_EQUAL(state_file_replace(dir, "a.json", "1", err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(state_file_replace(dir, "b.json", "2", err, sizeof(err)), 0);
	/* What a listing must skip: a crashed replacement's temporary file,
	 * another suffix, and a bare ".json". */
	const char *others[] = { ".c.json.tmp", ".hidden.json", "notes.txt", ".json" };
	for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, others[i]);
		f = fopen(path, "w");
		CU_ASSERT_PTR_NOT_NULL_FATAL(f);
		fclose(f);
	}
	visits = 0;
	state_file_each_json(dir, count_visit, NULL);
	CU_ASSERT_EQUAL(visits, 2);
	CU_ASSERT(!strcmp(seen[0], "a") || !strcmp(seen[1], "a"));
	CU_ASSERT_EQUAL(state_file_remove(dir, "a.json", err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(state_file_remove(dir, "a.json", err, sizeof(err)), 0); /* gone is fine */
	visits = 0;
	state_file_each_json(dir, count_visit, NULL);
	CU_ASSERT_EQUAL(visits, 1);
	CU_ASSERT_STRING_EQUAL(seen[0], "b");
	visits = 0;
	snprintf(path, sizeof(path), "%s/missing", root);
	state_file_each_json(path, count_visit, NULL);
	CU_ASSERT_EQUAL(visits, 0);
}

int register_state_file_tests(void)
{
	CU_pSuite suite = CU_add_suite("state_file", make_root, remove_root);

	if (!suite ||
	    !CU_add_test(suite, "replace creates the directory and replaces whole",
			 test_replace_creates_the_directory_and_replaces_whole) ||
	    !CU_add_test(suite, "a failed replace says so and keeps the old file",
			 test_replace_fails_in_one_line_and_keeps_the_old_file) ||
	    !CU_add_test(suite, "remove, and the listing skips temporary files",
			 test_remove_and_list))
		return -1;
	return 0;
}
