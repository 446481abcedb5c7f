/*
 * The protect settings a restarted primary re-protects with
 * (primary/protect_settings.c): what is written reads back the same, and
 * the parser refuses every malformed file whole, with one line: not JSON,
 * truncated at any byte, another version or format, a member missing,
 * unknown, duplicated, of the wrong type or out of range.  Each refusal
 * is checked against the valid file it differs from by one small edit,
 * so a parser that accepted too much fails here.
 */
#include <CUnit/CUnit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "primary/protect_settings.h"
#include "suites.h"

static void sample(struct protect_request *req)
{
	memset(req, 0, sizeof(*req));
	snprintf(req->backup, sizeof(req->backup), "10.0.0.2:7788");
	req->interval_ms = 40;
	req->output_commit = true;
	req->compress = true;
	req->read_tracking = false;
	req->commit_protection = true;
	req->cp_dscp = 46;
	req->full_copy = true;                 /* not kept */
	snprintf(req->trace_pages, sizeof(req->trace_pages), "/tmp/trace"); /* not kept */
	snprintf(req->run_dir, sizeof(req->run_dir), "/run/remusdb/primary/db1");
	req->qemu_argv = json_pack("[s, s, s]", "qemu-system-x86_64", "-m", "1024");
}

static char *sample_text(void)
{
	struct protect_request req;

	sample(&req);
	char *text = protect_settings_format("db1", &req);
	json_decref(req.qemu_argv);
	return text;
}

/* Parses text; on success frees what the parse made.  The parse's result. */
static int parse(const char *text, char *err, size_t errlen)
{
	struct protect_request req;
	char vm[VM_NAME_MAX + 1];
	int rc = protect_settings_parse(text, strlen(text), vm, &req, err, errlen);

	if (rc == 0)
		json_decref(req.qemu_argv);
	else
		CU_ASSERT_PTR_NULL(req.qemu_argv);
	return rc;
}

static void test_round_trip(void)
{
	struct protect_request in, out;
	char vm[VM_NAME_MAX + 1], err[256];

	sample(&in);
	char *text = protect_settings_format("db1", &in);
	CU_ASSERT_PTR_NOT_NULL_FATAL(text);
	CU_ASSERT_EQUAL_FATAL(protect_settings_parse(text, strlen(text), vm, &out, err,
						     sizeof(err)), 0);
	CU_ASSERT_STRING_EQUAL(vm, "db1");
	CU_ASSERT_STRING_EQUAL(out.backup, in.backup);
	CU_ASSERT_STRING_EQUAL(out.run_dir, in.run_dir);
	CU_ASSERT_EQUAL(out.interval_ms, 40);
	CU_ASSERT(out.output_commit && out.compress && out.commit_protection);
	CU_ASSERT(!out.read_tracking && !out.unsafe_release_early && !out.debug_resync_omit_extent);
	CU_ASSERT_EQUAL(out.cp_dscp, 46);
	/* A re-protection neither copies everything by request nor traces pages. */
	CU_ASSERT(!out.full_copy);
	CU_ASSERT_STRING_EQUAL(out.trace_pages, "");
	CU_ASSERT(json_equal(out.qemu_argv, in.qemu_argv));
	json_decref(in.qemu_argv);
	json_decref(out.qemu_argv);
	free(text);

	/* No command line: null, and back as NULL. */
	sample(&in);
	json_decref(in.qemu_argv);
	in.qemu_argv = NULL;
	text = protect_settings_format("db1", &in);
	CU_ASSERT_EQUAL(protect_settings_parse(text, strlen(text), vm, &out, err, sizeof(err)), 0);
	CU_ASSERT_PTR_NULL(out.qemu_argv);
	free(text);
}

static void test_truncated_anywhere_is_refused(void)
{
	char *text = sample_text();
	char err[256];
	size_t n = strlen(text);

	CU_ASSERT_EQUAL(parse(text, err, sizeof(err)), 0); /* control: the whole file reads */
	for (size_t cut = 0; cut < n; cut++) {
		char *part = strndup(text, cut);
		/* Only trailing whitespace may go: the object is whole before it. */
		bool whole = strspn(text + cut, " \n") == n - cut;
		int rc = parse(part, err, sizeof(err));
		if (whole ? rc != 0 : rc != -1)
			CU_FAIL("a truncated settings file was misread");
		free(part);
	}
	free(text);
}

/* The sample (argv: its command line, or null) with the first `from` replaced by `to`. */
static char *edited_argv(bool argv, const char *from, const char *to)
{
	struct protect_request req;

	sample(&req);
	if (!argv) {
		json_decref(req.qemu_argv);
		req.qemu_argv = NULL;
	}
	char *text = protect_settings_format("db1", &req);
	json_decref(req.qemu_argv);
	CU_ASSERT_PTR_NOT_NULL_FATAL(text);
	char *at = strstr(text, from);

	CU_ASSERT_PTR_NOT_NULL_FATAL(at);
	char *out = malloc(strlen(text) + strlen(to) + 1);
	size_t head = (size_t)(at - text);
	memcpy(out, text, head);
	strcpy(out + head, to);
	strcat(out, at + strlen(from));
	free(text);
	return out;
}

static char *edited(const char *from, const char *to)
{
	return edited_argv(true, from, to);
}

static void refused_argv(bool argv, const char *from, const char *to, const char *why)
{
	char err[256] = "";
	char *text = edited_argv(argv, from, to);

	CU_ASSERT_EQUAL(parse(text, err, sizeof(err)), -1);
	if (!strstr(err, why)) {
		fprintf(stderr, "\n%s -> %s: '%s' lacks '%s'\n", from, to, err, why);
		CU_FAIL("the refusal does not say why");
	}
	CU_ASSERT_PTR_NULL(strchr(err, '\n'));
	free(text);
}

static void refused(const char *from, const char *to, const char *why)
{
	refused_argv(true, from, to, why);
}

static void accepted(const char *from, const char *to)
{
	char err[256];
	char *text = edited(from, to);

	if (parse(text, err, sizeof(err)) != 0) {
		fprintf(stderr, "\n%s -> %s refused: %s\n", from, to, err);
		CU_FAIL("a valid edit was refused");
	}
	free(text);
}

static void test_version_and_format(void)
{
	refused("\"version\": 1", "\"version\": 2", "version 2: this remusdbd reads version 1");
	refused("\"version\": 1", "\"version\": 0", "member version");
	refused("\"version\": 1", "\"version\": \"1\"", "member version");
	refused("remusdb-protect-settings", "remusdb-protect-setting", "format is not");
	accepted("\"version\": 1", "\"version\":1"); /* control: the same version */
}

static void test_members(void)
{
	refused("\"compress\": true,", "", "member compress is missing");
	refused("\"compress\": true,", "\"compress\": true, \"colour\": 1,", "unknown member colour");
	refused("\"compress\": true,", "\"compress\": true, \"compress\": true,", "not JSON");
	refused("\"compress\": true", "\"compress\": 1", "compress must be true or false");
	refused("\"interval_ms\": 40", "\"interval_ms\": 4", "interval_ms must be an integer");
	refused("\"interval_ms\": 40", "\"interval_ms\": 40.0", "interval_ms must be an integer");
	refused("\"cp_dscp\": 46", "\"cp_dscp\": 64", "cp_dscp must be an integer in 0..63");
	refused("\"vm\": \"db1\"", "\"vm\": \"db 1\"", "not a VM name");
	refused("\"vm\": \"db1\"", "\"vm\": \"\"", "member vm must be a string");
	refused("\"run_dir\": \"/run", "\"run_dir\": \"run", "absolute path");
	refused("\"backup\": \"10.0.0.2:7788\"", "\"backup\": null", "member backup");
	refused("\"qemu-system-x86_64\"", "7", "hold strings only");
	refused_argv(false, "\"qemu_argv\": null", "\"qemu_argv\": \"qemu\"",
		     "qemu_argv must be null or an array");
	refused_argv(false, "\"qemu_argv\": null", "\"qemu_argv\": []",
		     "qemu_argv must be null or an array");
	refused("{", "[{", "not JSON");
	refused("}", "} x", "not JSON");
	/* Controls: the same members with other valid values. */
	accepted("\"interval_ms\": 40", "\"interval_ms\": 500");
	accepted("\"cp_dscp\": 46", "\"cp_dscp\": 63");
	accepted("\"vm\": \"db1\"", "\"vm\": \"db_1-b\"");
}

static void test_save_load_delete(void)
{
	char dir[] = "/tmp/remusdbd-settings-test-XXXXXX", err[512], path[PATH_MAX];
	struct protect_request in, out;

	CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
	CU_ASSERT_EQUAL(protect_settings_load(dir, "db1", &out, err, sizeof(err)), 0);
	sample(&in);
	CU_ASSERT_EQUAL_FATAL(protect_settings_save(dir, "db1", &in, err, sizeof(err)), 0);
	snprintf(path, sizeof(path), "%s/protect-settings/db1.json.tmp", dir);
	CU_ASSERT_EQUAL(access(path, F_OK), -1); /* renamed, not left behind */
	CU_ASSERT_EQUAL(protect_settings_load(dir, "db1", &out, err, sizeof(err)), 1);
	CU_ASSERT_STRING_EQUAL(out.backup, "10.0.0.2:7788");
	json_decref(out.qemu_argv);
	/* A file that names another VM than its own is not read as this one's. */
	snprintf(path, sizeof(path), "%s/protect-settings/db1.json", dir);
	char other[PATH_MAX];
	snprintf(other, sizeof(other), "%s/protect-settings/db2.json", dir);
	CU_ASSERT_EQUAL(link(path, other), 0);
	CU_ASSERT_EQUAL(protect_settings_load(dir, "db2", &out, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "names db1, not db2"));
	protect_settings_delete(dir, "db2");
	/* A truncated file on disk is refused with its path. */
	CU_ASSERT_EQUAL(truncate(path, 20), 0);
	CU_ASSERT_EQUAL(protect_settings_load(dir, "db1", &out, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "db1.json: not JSON"));
	CU_ASSERT_PTR_NULL(out.qemu_argv);
	protect_settings_delete(dir, "db1");
	CU_ASSERT_EQUAL(protect_settings_load(dir, "db1", &out, err, sizeof(err)), 0);
	json_decref(in.qemu_argv);
	snprintf(path, sizeof(path), "%s/protect-settings", dir);
	CU_ASSERT_EQUAL(rmdir(path), 0);
	CU_ASSERT_EQUAL(rmdir(dir), 0);
}

int register_protect_settings_tests(void)
{
	CU_pSuite s = CU_add_suite("protect_settings", NULL, NULL);

	if (!s ||
	    !CU_add_test(s, "written settings read back the same", test_round_trip) ||
	    !CU_add_test(s, "a file cut at any byte is refused", test_truncated_anywhere_is_refused) ||
	    !CU_add_test(s, "another version or format is refused", test_version_and_format) ||
	    !CU_add_test(s, "members: missing, unknown, typed, ranged", test_members) ||
	    !CU_add_test(s, "save, load, delete", test_save_load_delete))
		return -1;
	return 0;
}
