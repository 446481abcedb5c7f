/* Command-line and config-file parsing. */
#include <CUnit/CUnit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/config.h"
#include "suites.h"

static char err[512];

static int parse_args(struct config *cfg, int argc, char **argv)
{
	err[0] = '\0';
	return config_parse_args(cfg, argc, argv, err, sizeof(err));
}

static void test_defaults(void)
{
	struct config cfg;

	config_init(&cfg);
	CU_ASSERT_STRING_EQUAL(cfg.control_path, CONFIG_DEFAULT_CONTROL);
	CU_ASSERT_STRING_EQUAL(cfg.state_dir, CONFIG_DEFAULT_STATE_DIR);
	CU_ASSERT_STRING_EQUAL(cfg.log_path, "");
	CU_ASSERT_EQUAL(cfg.log_level, LOG_INFO);
	CU_ASSERT(strlen(cfg.host) > 0);
	CU_ASSERT_EQUAL(cfg.show_help, 0);
}

static void test_args_both_syntaxes(void)
{
	struct config cfg;
	char *argv[] = { "remusdbd", "--host", "labA", "--control=/run/x.sock",
			 "--state-dir", "/var/tmp/st", "--log-level=debug",
			 "--log", "/tmp/r.log", "--foreground", NULL };

	config_init(&cfg);
	CU_ASSERT_EQUAL(parse_args(&cfg, 10, argv), 0);
	CU_ASSERT_STRING_EQUAL(cfg.host, "labA");
	CU_ASSERT_STRING_EQUAL(cfg.control_path, "/run/x.sock");
	CU_ASSERT_STRING_EQUAL(cfg.state_dir, "/var/tmp/st");
	CU_ASSERT_STRING_EQUAL(cfg.log_path, "/tmp/r.log");
	CU_ASSERT_EQUAL(cfg.log_level, LOG_DEBUG);
}

static void test_args_errors(void)
{
	struct config cfg;
	char *unknown[] = { "remusdbd", "--colour", "red" };
	char *missing[] = { "remusdbd", "--host" };
	char *bare[] = { "remusdbd", "labA" };
	char *level[] = { "remusdbd", "--log-level", "loud" };
	char *empty[] = { "remusdbd", "--state-dir=" };
	char *help[] = { "remusdbd", "--help" };

	config_init(&cfg);
	CU_ASSERT_EQUAL(parse_args(&cfg, 3, unknown), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "--colour"));
	CU_ASSERT_EQUAL(parse_args(&cfg, 2, missing), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "--host needs a value"));
	CU_ASSERT_EQUAL(parse_args(&cfg, 2, bare), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "labA"));
	CU_ASSERT_EQUAL(parse_args(&cfg, 3, level), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "loud"));
	CU_ASSERT_EQUAL(parse_args(&cfg, 2, empty), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "empty value"));
	CU_ASSERT_EQUAL(parse_args(&cfg, 2, help), 0);
	CU_ASSERT_EQUAL(cfg.show_help, 1);
}

static void test_control_path_too_long(void)
{
	struct config cfg;
	char path[200];
	char *argv[] = { "remusdbd", "--control", path };

	memset(path, 'a', sizeof(path) - 1);
	path[0] = '/';
	path[sizeof(path) - 1] = '\0';
	config_init(&cfg);
	CU_ASSERT_EQUAL(parse_args(&cfg, 3, argv), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "too long"));
	CU_ASSERT_STRING_EQUAL(cfg.control_path, CONFIG_DEFAULT_CONTROL);
}

static void test_file_text(void)
{
	struct config cfg;
	const char *text =
		"# remusdbd settings\n"
		"\n"
		"host = labB\n"
		"  control=/run/remus/c.sock  \r\n"
		"state-dir = \"/srv/remus state\"\n"
		"log-level = warn\n"
		"foreground = yes";  /* no trailing newline */

	config_init(&cfg);
	CU_ASSERT_EQUAL(config_parse_file_text(&cfg, text, "t.conf", err, sizeof(err)), 0);
	CU_ASSERT_STRING_EQUAL(cfg.host, "labB");
	CU_ASSERT_STRING_EQUAL(cfg.control_path, "/run/remus/c.sock");
	CU_ASSERT_STRING_EQUAL(cfg.state_dir, "/srv/remus state");
	CU_ASSERT_EQUAL(cfg.log_level, LOG_WARN);
}

static void expect_file_error(const char *text, const char *needle)
{
	struct config cfg;

	config_init(&cfg);
	err[0] = '\0';
	CU_ASSERT_EQUAL(config_parse_file_text(&cfg, text, "f.conf", err, sizeof(err)), -1);
	if (!strstr(err, needle))
		fprintf(stderr, "\n  error '%s' lacks '%s'\n", err, needle);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, needle));
}

static void test_file_errors_name_the_line(void)
{
	expect_file_error("host = a\nbogus = 1\n", "f.conf:2: unknown key 'bogus'");
	expect_file_error("# c\n\nhost =\n", "f.conf:3: missing value for 'host'");
	expect_file_error("host a\n", "f.conf:1: expected 'key = value'");
	expect_file_error("= x\n", "f.conf:1: missing key");
	expect_file_error("log-level = chatty\n", "f.conf:1: log level 'chatty'");
	expect_file_error("host = a\nhost = b\n", "f.conf:2: 'host' is set twice");
	expect_file_error("config = /etc/other.conf\n", "unknown key 'config'");
	expect_file_error("foreground = maybe\n", "not a boolean");
	expect_file_error("--host = a\n", "unknown key '--host'");
}

static void test_timings_must_fit_together(void)
{
	struct config cfg;

	config_init(&cfg);
	CU_ASSERT_EQUAL(cfg.heartbeat_rt_priority, CONFIG_DEFAULT_HEARTBEAT_RT_PRIORITY);
	CU_ASSERT_EQUAL(config_check(&cfg, err, sizeof(err)), 0);
	cfg.heartbeat_ms = 100;
	cfg.peer_timeout_ms = 199; /* one lost datagram would end the link */
	CU_ASSERT_EQUAL(config_check(&cfg, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "at least two heartbeats"));
	cfg.peer_timeout_ms = 200;
	CU_ASSERT_EQUAL(config_check(&cfg, err, sizeof(err)), 0);
	cfg.heartbeat_rt_priority = 100;
	CU_ASSERT_EQUAL(config_check(&cfg, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "--heartbeat-rt-priority 100"));
}

static void test_read_index_mb(void)
{
	struct config cfg;
	char *ok[] = { "remusdbd", "--read-index-mb=256" };
	char *zero[] = { "remusdbd", "--read-index-mb", "0" };

	config_init(&cfg);
	CU_ASSERT_EQUAL(cfg.read_index_mb, CONFIG_DEFAULT_READ_INDEX_MB);
	CU_ASSERT_EQUAL(parse_args(&cfg, 2, ok), 0);
	CU_ASSERT_EQUAL(cfg.read_index_mb, 256);
	CU_ASSERT_EQUAL(config_check(&cfg, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(parse_args(&cfg, 3, zero), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "--read-index-mb"));
	CU_ASSERT_EQUAL(config_parse_file_text(&cfg, "read-index-mb = 16385\n", "f",
					       err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(config_check(&cfg, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "--read-index-mb 16385"));
}

static void test_compress_cache_mb(void)
{
	struct config cfg;
	char *ok[] = { "remusdbd", "--compress-cache-mb=300" };

	config_init(&cfg);
	CU_ASSERT_EQUAL(cfg.compress_cache_mb, 0); /* a tenth of guest RAM */
	CU_ASSERT_EQUAL(parse_args(&cfg, 2, ok), 0);
	CU_ASSERT_EQUAL(cfg.compress_cache_mb, 300);
	CU_ASSERT_EQUAL(config_check(&cfg, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(config_parse_file_text(&cfg, "compress-cache-mb = 65537\n", "f",
					       err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(config_check(&cfg, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "--compress-cache-mb 65537"));
}

static void test_compress_cache_size_or_share(void)
{
	struct config cfg;
	char *share[] = { "remusdbd", "--compress-cache=25%" };
	char *size[] = { "remusdbd", "--compress-cache", "2G" };
	const char *bad[] = { "0%", "101%", "-5%", "512K", "65G", "10x", "1.5G", "%", "" };

	config_init(&cfg);
	CU_ASSERT_EQUAL(cfg.compress_cache_percent, 0); /* unset: 10% */
	CU_ASSERT_EQUAL(parse_args(&cfg, 2, share), 0);
	CU_ASSERT_EQUAL(cfg.compress_cache_percent, 25);
	CU_ASSERT_EQUAL(cfg.compress_cache_mb, 0);
	CU_ASSERT_EQUAL(parse_args(&cfg, 3, size), 0);
	CU_ASSERT_EQUAL(cfg.compress_cache_mb, 2048);
	CU_ASSERT_EQUAL(cfg.compress_cache_percent, 0);
	CU_ASSERT_EQUAL(config_parse_file_text(&cfg, "compress-cache = 300M\n", "f",
					       err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(cfg.compress_cache_mb, 300);
	CU_ASSERT_EQUAL(config_parse_file_text(&cfg, "compress-cache = 1048576\n", "f",
					       err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(cfg.compress_cache_mb, 1); /* bytes without a suffix */
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char line[64];
		snprintf(line, sizeof(line), "compress-cache = %s\n", bad[i]);
		CU_ASSERT_EQUAL(config_parse_file_text(&cfg, line, "f", err, sizeof(err)), -1);
	}
	CU_ASSERT_EQUAL(config_parse_file_text(&cfg, "compress-cache = 10x\n", "f", err,
					       sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "'10x' is neither a share of guest RAM"));
}

static void test_memory_limit(void)
{
	struct config cfg;
	char *size[] = { "remusdbd", "--memory-limit", "20G" };
	const char *bad[] = { "63M", "17T", "-1G", "1.5G", "10x", "", "Auto" };

	config_init(&cfg);
	CU_ASSERT_EQUAL(cfg.memory_limit_mb, 0); /* auto */
	CU_ASSERT_EQUAL(parse_args(&cfg, 3, size), 0);
	CU_ASSERT_EQUAL(cfg.memory_limit_mb, 20480);
	CU_ASSERT_EQUAL(config_parse_file_text(&cfg, "memory-limit = 64M\n", "f",
					       err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(cfg.memory_limit_mb, 64);
	CU_ASSERT_EQUAL(config_parse_file_text(&cfg, "memory-limit = auto\n", "f",
					       err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(cfg.memory_limit_mb, 0);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char line[64];
		snprintf(line, sizeof(line), "memory-limit = %s\n", bad[i]);
		CU_ASSERT_EQUAL(config_parse_file_text(&cfg, line, "f", err, sizeof(err)), -1);
	}
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "is neither \"auto\" nor a size from 64M to 16T"));
}

static void test_load_file_then_args_override(void)
{
	char path[] = "/tmp/remusdbd-config-XXXXXX";
	int fd = mkstemp(path);
	const char *text = "host = fromfile\nstate-dir = /from/file\n";
	struct config cfg;

	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	char *argv[] = { "remusdbd", "--config", path, "--host", "fromargs" };
	CU_ASSERT_EQUAL(config_load(&cfg, 5, argv, err, sizeof(err)), 0);
	CU_ASSERT_STRING_EQUAL(cfg.host, "fromargs");
	CU_ASSERT_STRING_EQUAL(cfg.state_dir, "/from/file");
	unlink(path);

	char *gone[] = { "remusdbd", "--config", path };
	CU_ASSERT_EQUAL(config_load(&cfg, 3, gone, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "cannot open config file"));
}

/* Automatic re-protection: on by default, "off" by option or file, a backoff that only grows. */
static void test_zero_where_the_help_gives_it_a_meaning(void)
{
	struct config cfg;
	char *no_rt[] = { "remusdbd", "--heartbeat-rt-priority", "0" };
	char *never[] = { "remusdbd", "--retire-replicas-after=0" };
	char *zero_interval[] = { "remusdbd", "--heartbeat-ms", "0" };

	config_init(&cfg);
	CU_ASSERT_EQUAL(parse_args(&cfg, 3, no_rt), 0);
	CU_ASSERT_EQUAL(cfg.heartbeat_rt_priority, 0);
	CU_ASSERT_EQUAL(config_check(&cfg, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(parse_args(&cfg, 2, never), 0);
	CU_ASSERT_EQUAL(cfg.retire_replicas_s, 0);
	CU_ASSERT_EQUAL(config_parse_file_text(&cfg, "heartbeat-rt-priority = 0\n", "f",
					       err, sizeof(err)), 0);
	/* Every other number stays 1 or more: a zero heartbeat is a typo. */
	CU_ASSERT_EQUAL(parse_args(&cfg, 3, zero_interval), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "between 1 and 3600000"));
	CU_ASSERT_EQUAL(config_parse_file_text(&cfg, "retire-replicas-after = -1\n", "f",
					       err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "between 0 and 3600000"));
}

static void test_reprotect(void)
{
	struct config cfg;
	char *off[] = { "remusdbd", "--reprotect", "off", "--reprotect-first-ms=250",
			"--reprotect-max-ms", "4000" };
	char *bad[] = { "remusdbd", "--reprotect", "maybe" };

	config_init(&cfg);
	CU_ASSERT_STRING_EQUAL(cfg.reprotect, "on");
	CU_ASSERT_EQUAL(cfg.reprotect_first_ms, CONFIG_DEFAULT_REPROTECT_FIRST_MS);
	CU_ASSERT_EQUAL(cfg.reprotect_max_ms, CONFIG_DEFAULT_REPROTECT_MAX_MS);
	CU_ASSERT_EQUAL(parse_args(&cfg, 6, off), 0);
	CU_ASSERT_STRING_EQUAL(cfg.reprotect, "off");
	CU_ASSERT_EQUAL(cfg.reprotect_first_ms, 250);
	CU_ASSERT_EQUAL(cfg.reprotect_max_ms, 4000);
	CU_ASSERT_EQUAL(config_check(&cfg, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(parse_args(&cfg, 3, bad), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "reprotect must be \"on\" or \"off\", not 'maybe'"));
	config_init(&cfg);
	CU_ASSERT_EQUAL(config_parse_file_text(&cfg, "reprotect = off\nreprotect-max-ms = 500\n",
					       "f.conf", err, sizeof(err)), 0);
	CU_ASSERT_STRING_EQUAL(cfg.reprotect, "off");
	/* 500 below the default first wait of 1000: the waits would shrink. */
	CU_ASSERT_EQUAL(config_check(&cfg, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "--reprotect-max-ms 500 is below --reprotect-first-ms 1000"));
	cfg.reprotect_max_ms = 1000;
	CU_ASSERT_EQUAL(config_check(&cfg, err, sizeof(err)), 0);
}

int register_config_tests(void)
{
	CU_pSuite suite = CU_add_suite("config", NULL, NULL);

	if (!suite ||
	    !CU_add_test(suite, "defaults", test_defaults) ||
	    !CU_add_test(suite, "args: both syntaxes", test_args_both_syntaxes) ||
	    !CU_add_test(suite, "args: errors", test_args_errors) ||
	    !CU_add_test(suite, "args: control path too long", test_control_path_too_long) ||
	    !CU_add_test(suite, "file text", test_file_text) ||
	    !CU_add_test(suite, "file errors name the line", test_file_errors_name_the_line) ||
	    !CU_add_test(suite, "file then args override", test_load_file_then_args_override) ||
	    !CU_add_test(suite, "timings must fit together", test_timings_must_fit_together) ||
	    !CU_add_test(suite, "read index size", test_read_index_mb) ||
	    !CU_add_test(suite, "compression cache size", test_compress_cache_mb) ||
	    !CU_add_test(suite, "compression cache as a size or a share of RAM",
			 test_compress_cache_size_or_share) ||
	    !CU_add_test(suite, "automatic re-protection", test_reprotect) ||
	    !CU_add_test(suite, "memory limit", test_memory_limit) ||
	    !CU_add_test(suite, "zero where the help gives it a meaning",
			 test_zero_where_the_help_gives_it_a_meaning))
		return -1;
	return 0;
}
