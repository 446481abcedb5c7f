/* Daemon configuration: defaults, config file, command line (config.h). */
#include "base/config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* VALUE_UINT is 1..3600000: a zero interval, size or timeout is a typo, not
 * a setting.  VALUE_UINT_OR_OFF admits 0 for the options whose help gives it
 * a meaning ("0 for none", "0: never"). */
enum value_kind { VALUE_STRING, VALUE_LOG_LEVEL, VALUE_FLAG, VALUE_UINT, VALUE_UINT_OR_OFF,
		  VALUE_CACHE_SIZE, VALUE_MEMORY_LIMIT };

struct option_spec {
	const char *key;
	enum value_kind kind;
	size_t offset; /* of the char[] field in struct config */
	size_t size;
	int file_allowed;
	const char *help;
};

#define FIELD(f) offsetof(struct config, f), sizeof(((struct config *)0)->f)

static const struct option_spec options[] = {
	{ "host", VALUE_STRING, FIELD(host), 1, "lab host name used in logs (default: hostname)" },
	{ "control", VALUE_STRING, FIELD(control_path), 1, "control socket path (default " CONFIG_DEFAULT_CONTROL ")" },
	{ "state-dir", VALUE_STRING, FIELD(state_dir), 1, "directory of persisted VM definitions (default " CONFIG_DEFAULT_STATE_DIR ")" },
	{ "log", VALUE_STRING, FIELD(log_path), 1, "log file (default: stderr)" },
	{ "log-level", VALUE_LOG_LEVEL, 0, 0, 1, "debug, info, warn or error (default info)" },
	{ "config", VALUE_STRING, FIELD(config_path), 0, "read settings from this file first" },
	{ "run-dir", VALUE_STRING, FIELD(run_dir), 1, "runtime directory; VM run dirs are <run-dir>/vms/<vm> (default " CONFIG_DEFAULT_RUN_DIR ")" },
	{ "listen", VALUE_STRING, FIELD(listen), 1, "ADDR:PORT to accept protected VMs from primaries on (backup role)" },
	{ "http", VALUE_STRING, FIELD(http), 1, "ADDR:PORT of the HTTP endpoint: /metrics (Prometheus), /primary?vm=NAME and /replica?vm=NAME (200 or 503); off by default" },
	{ "psk-file", VALUE_STRING, FIELD(psk_file), 1, "pre-shared key file authenticating primary and backup (mode 600)" },
	{ "etcd", VALUE_STRING, FIELD(etcd), 1, "etcd client URLs for split-brain arbitration, comma-separated" },
	{ "fence-command", VALUE_STRING, FIELD(fence_command), 1, "shell command run before a takeover (e.g. power off the old primary)" },
	{ "heartbeat-ms", VALUE_UINT, FIELD(heartbeat_ms), 1, "heartbeat interval in ms (default 50)" },
	{ "peer-timeout-ms", VALUE_UINT, FIELD(peer_timeout_ms), 1, "declare the peer dead after this much silence (default 200)" },
	{ "heartbeat-rt-priority", VALUE_UINT_OR_OFF, FIELD(heartbeat_rt_priority), 1, "SCHED_FIFO priority (1-99) of the heartbeat thread, 0 for none (default 10)" },
	{ "etcd-timeout-ms", VALUE_UINT, FIELD(etcd_timeout_ms), 1, "timeout of one etcd operation (default 1000)" },
	{ "max-inflight", VALUE_UINT, FIELD(max_inflight), 1, "epochs shipped but not yet acknowledged before checkpoints wait (default 4)" },
	{ "pause-boost", VALUE_UINT_OR_OFF, FIELD(pause_boost), 1, "nice levels a protected VM's QEMU's scheduling group is raised by while it pauses for a checkpoint (1-20, default 10; 0: no boost)" },
	{ "read-index-mb", VALUE_UINT, FIELD(read_index_mb), 1, "memory in MiB of each protected VM's disk read tracking index, 41 bytes per 4 KiB block remembered (1-16384, default 64)" },
	{ "compress-cache", VALUE_CACHE_SIZE, 0, 0, 1, "each protected VM's cache of sent pages for checkpoint compression: a share of guest RAM (\"10%\", the default; 1-100%) or a size (\"256M\", \"2G\"; 1 MiB-64 GiB)" },
	{ "compress-cache-mb", VALUE_UINT, FIELD(compress_cache_mb), 1, "the same in MiB (1-65536)" },
	{ "memory-limit", VALUE_MEMORY_LIMIT, 0, 0, 1, "the memory this backup's replicas may take together (their images, epoch staging, deferred frames and the takeover's copy: backup/replica_memory.h); a protection that does not fit is refused: \"auto\" (the default: the host's MemTotal less 1 GiB) or a size (\"20G\"; 64 MiB-16 TiB)" },
	{ "foreground", VALUE_FLAG, 0, 0, 1, "accepted for compatibility; remusdbd never daemonizes itself" },
	{ "restore", VALUE_STRING, FIELD(restore), 1, "how a takeover restores the guest's memory: \"shared\" (the default) has QEMU map the image's main RAM where it lies and streams only the rest, falling back to eager where it cannot (a launcher such as libvirt's, a command line with its own memory backend, a fork holding the image); \"eager\" writes every page into QEMU before it runs; \"lazy\" runs it at once and serves pages on demand by postcopy" },
	{ "retire-replicas-after", VALUE_UINT_OR_OFF, FIELD(retire_replicas_s), 1, "seconds after which a replica whose VM is gone (passive, failed, or taken over and since removed) leaves status (default 600, 0: never; `forget` retires it at once)" },
	{ "reprotect", VALUE_STRING, FIELD(reprotect), 1, "\"on\" (the default): a primary whose backup was lost tries it again and re-protects the VM when it answers (docs/operations.md, \"Automatic re-protection\"); \"off\": it stays unprotected until protected by hand" },
	{ "reprotect-first-ms", VALUE_UINT, FIELD(reprotect_first_ms), 1, "the first wait in ms before the lost backup is tried again, doubled after each failed try (default 1000)" },
	{ "reprotect-max-ms", VALUE_UINT, FIELD(reprotect_max_ms), 1, "the longest wait in ms between two tries (default 30000)" },
	{ "unsafe-no-flow-reset", VALUE_FLAG, 0, 0, 1, "DEBUG negative control: a takeover resets no connection, so those whose clients saw output after the restored checkpoint stall (commit protection)" },
	{ "help", VALUE_FLAG, 0, 0, 0, "show this help" },
};

#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

void config_init(struct config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	if (gethostname(cfg->host, sizeof(cfg->host)) < 0 || !cfg->host[0])
		strcpy(cfg->host, "localhost");
	cfg->host[sizeof(cfg->host) - 1] = '\0';
	strcpy(cfg->control_path, CONFIG_DEFAULT_CONTROL);
	strcpy(cfg->state_dir, CONFIG_DEFAULT_STATE_DIR);
	cfg->log_level = LOG_INFO;
	strcpy(cfg->run_dir, CONFIG_DEFAULT_RUN_DIR);
	cfg->heartbeat_ms = CONFIG_DEFAULT_HEARTBEAT_MS;
	cfg->peer_timeout_ms = CONFIG_DEFAULT_PEER_TIMEOUT_MS;
	cfg->heartbeat_rt_priority = CONFIG_DEFAULT_HEARTBEAT_RT_PRIORITY;
	cfg->etcd_timeout_ms = CONFIG_DEFAULT_ETCD_TIMEOUT_MS;
	cfg->max_inflight = CONFIG_DEFAULT_MAX_INFLIGHT;
	cfg->pause_boost = CONFIG_DEFAULT_PAUSE_BOOST;
	cfg->read_index_mb = CONFIG_DEFAULT_READ_INDEX_MB;
	cfg->retire_replicas_s = CONFIG_DEFAULT_RETIRE_REPLICAS_S;
	strcpy(cfg->reprotect, "on");
	strcpy(cfg->restore, "shared");
	cfg->reprotect_first_ms = CONFIG_DEFAULT_REPROTECT_FIRST_MS;
	cfg->reprotect_max_ms = CONFIG_DEFAULT_REPROTECT_MAX_MS;
}

static const struct option_spec *find_option(const char *key, size_t len)
{
	for (size_t i = 0; i < N_OPTIONS; i++)
		if (strlen(options[i].key) == len && memcmp(options[i].key, key, len) == 0)
			return &options[i];
	return NULL;
}

static int parse_bool(const char *v, int *out)
{
	static const char *const yes[] = { "1", "yes", "true", "on" };
	static const char *const no[] = { "0", "no", "false", "off" };

	for (size_t i = 0; i < 4; i++) {
		if (strcmp(v, yes[i]) == 0)
			return *out = 1, 0;
		if (strcmp(v, no[i]) == 0)
			return *out = 0, 0;
	}
	return -1;
}

/*
 * A size: N with an optional K/M/G/T suffix (bytes without one), from min
 * to max bytes.  0, or -1 when it is not one or out of range.
 */
static int parse_size(const char *value, uint64_t min, uint64_t max, uint64_t *bytes)
{
	char *end;
	unsigned long long n, unit = 1;

	errno = 0;
	n = strtoull(value, &end, 10);
	if (errno || end == value || value[0] == '-')
		return -1;
	if (*end && !end[1]) {
		switch (*end) {
		case 'k': case 'K': unit = 1ULL << 10; break;
		case 'm': case 'M': unit = 1ULL << 20; break;
		case 'g': case 'G': unit = 1ULL << 30; break;
		case 't': case 'T': unit = 1ULL << 40; break;
		default: return -1;
		}
	} else if (*end) {
		return -1;
	}
	if (n > max / unit || n * unit < min)
		return -1;
	*bytes = n * unit;
	return 0;
}

/* --compress-cache: "N%" of guest RAM, or a size, rounded down to whole MiB. */
static int apply_cache_size(struct config *cfg, const char *value, const char *where,
			    char *err, size_t errlen)
{
	char *end;
	unsigned long long n;
	uint64_t bytes;

	errno = 0;
	n = strtoull(value, &end, 10);
	if (!errno && end != value && value[0] != '-' && strcmp(end, "%") == 0 &&
	    n >= 1 && n <= 100) {
		cfg->compress_cache_percent = (unsigned)n;
		cfg->compress_cache_mb = 0;
		return 0;
	}
	if (strchr(value, '%') || parse_size(value, 1ULL << 20, 64ULL << 30, &bytes) < 0) {
		snprintf(err, errlen, "%s: '%s' is neither a share of guest RAM (1%%-100%%) nor a "
			 "size from 1M to 64G", where, value);
		return -1;
	}
	cfg->compress_cache_mb = (unsigned)(bytes >> 20);
	cfg->compress_cache_percent = 0;
	return 0;
}

/* --memory-limit: "auto", or a size, in whole MiB. */
static int apply_memory_limit(struct config *cfg, const char *value, const char *where,
			      char *err, size_t errlen)
{
	uint64_t bytes;

	if (!strcmp(value, "auto")) {
		cfg->memory_limit_mb = 0;
		return 0;
	}
	if (parse_size(value, 64ULL << 20, 16ULL << 40, &bytes) < 0) {
		snprintf(err, errlen, "%s: '%s' is neither \"auto\" nor a size from 64M to 16T",
			 where, value);
		return -1;
	}
	cfg->memory_limit_mb = bytes >> 20;
	return 0;
}

/* where is "--key" or "file:line" for messages. */
static int apply(struct config *cfg, const struct option_spec *opt, const char *value,
		 const char *where, char *err, size_t errlen)
{
	enum log_level level;
	int flag;

	switch (opt->kind) {
	case VALUE_LOG_LEVEL:
		if (log_parse_level(value, &level) < 0) {
			snprintf(err, errlen, "%s: log level '%s' is not one of "
				 "debug, info, warn, error", where, value);
			return -1;
		}
		cfg->log_level = level;
		return 0;
	case VALUE_FLAG:
		if (parse_bool(value, &flag) < 0) {
			snprintf(err, errlen, "%s: '%s' is not a boolean "
				 "(use yes/no, true/false, 1/0)", where, value);
			return -1;
		}
		if (strcmp(opt->key, "help") == 0)
			cfg->show_help = flag;
		else if (strcmp(opt->key, "unsafe-no-flow-reset") == 0)
			cfg->unsafe_no_flow_reset = flag;
		return 0;
	case VALUE_UINT:
	case VALUE_UINT_OR_OFF: {
		unsigned long lowest = opt->kind == VALUE_UINT_OR_OFF ? 0 : 1;
		char *end;
		unsigned long n;

		errno = 0;
		n = strtoul(value, &end, 10);
		if (errno || end == value || *end || value[0] == '-' || n < lowest ||
		    n > 3600000) {
			snprintf(err, errlen, "%s: '%s' is not a number between %lu "
				 "and 3600000", where, value, lowest);
			return -1;
		}
		*(unsigned *)((char *)cfg + opt->offset) = (unsigned)n;
		return 0;
	}
	case VALUE_CACHE_SIZE:
		return apply_cache_size(cfg, value, where, err, errlen);
	case VALUE_MEMORY_LIMIT:
		return apply_memory_limit(cfg, value, where, err, errlen);
	case VALUE_STRING:
		if (!value[0]) {
			snprintf(err, errlen, "%s: empty value for '%s'", where, opt->key);
			return -1;
		}
		if (strlen(value) >= opt->size) {
			snprintf(err, errlen, "%s: value for '%s' is too long "
				 "(at most %zu characters)", where, opt->key,
				 opt->size - 1);
			return -1;
		}
		if (!strcmp(opt->key, "restore") && strcmp(value, "shared") &&
		    strcmp(value, "eager") && strcmp(value, "lazy")) {
			snprintf(err, errlen, "%s: restore must be \"shared\", \"eager\" or \"lazy\", "
				 "not '%s'",
				 where, value);
			return -1;
		}
		if (!strcmp(opt->key, "reprotect") && strcmp(value, "on") && strcmp(value, "off")) {
			snprintf(err, errlen, "%s: reprotect must be \"on\" or \"off\", not '%s'",
				 where, value);
			return -1;
		}
		strcpy((char *)cfg + opt->offset, value);
		return 0;
	}
	return -1;
}

int config_parse_args(struct config *cfg, int argc, char **argv, char *err,
		      size_t errlen)
{
	for (int i = 1; i < argc; i++) {
		const char *arg = argv[i];
		char where[96];

		if (strncmp(arg, "--", 2) != 0 || !arg[2]) {
			snprintf(err, errlen, "unexpected argument '%s' "
				 "(options look like --key value)", arg);
			return -1;
		}
		const char *key = arg + 2;
		const char *eq = strchr(key, '=');
		size_t key_len = eq ? (size_t)(eq - key) : strlen(key);
		const struct option_spec *opt = find_option(key, key_len);
		if (!opt) {
			snprintf(err, errlen, "unknown option '--%.*s' (see --help)",
				 (int)key_len, key);
			return -1;
		}
		snprintf(where, sizeof(where), "--%s", opt->key);
		const char *value = eq ? eq + 1 : NULL;
		if (opt->kind == VALUE_FLAG) {
			if (!value)
				value = "yes";
		} else if (!value) {
			if (i + 1 >= argc) {
				snprintf(err, errlen, "%s needs a value", where);
				return -1;
			}
			value = argv[++i];
		}
		if (apply(cfg, opt, value, where, err, errlen) < 0)
			return -1;
	}
	return 0;
}

static char *trim(char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	char *end = s + strlen(s);
	while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r'))
		*--end = '\0';
	return s;
}

/* Handles one line (modifiable copy).  seen marks keys already set by the file. */
static int parse_line(struct config *cfg, char *line, const char *where, int *seen,
		      char *err, size_t errlen)
{
	char *text = trim(line);

	if (!text[0] || text[0] == '#')
		return 0;
	char *eq = strchr(text, '=');
	if (!eq) {
		snprintf(err, errlen, "%s: expected 'key = value', got '%.60s'",
			 where, text);
		return -1;
	}
	*eq = '\0';
	char *key = trim(text);
	char *value = trim(eq + 1);
	if (!key[0]) {
		snprintf(err, errlen, "%s: missing key before '='", where);
		return -1;
	}
	const struct option_spec *opt = find_option(key, strlen(key));
	if (!opt || !opt->file_allowed) {
		snprintf(err, errlen, "%s: unknown key '%.40s' (see remusdbd "
			 "--help for the keys)", where, key);
		return -1;
	}
	if (!value[0]) {
		snprintf(err, errlen, "%s: missing value for '%s'", where, key);
		return -1;
	}
	size_t len = strlen(value);
	if (len >= 2 && value[0] == '"' && value[len - 1] == '"') {
		value[len - 1] = '\0';
		value++;
	}
	if (seen[opt - options]) {
		snprintf(err, errlen, "%s: '%s' is set twice", where, key);
		return -1;
	}
	seen[opt - options] = 1;
	return apply(cfg, opt, value, where, err, errlen);
}

int config_parse_file_text(struct config *cfg, const char *text,
			   const char *origin, char *err, size_t errlen)
{
	int seen[N_OPTIONS] = { 0 };
	int line_no = 0;
	const char *p = text;

	while (*p) {
		const char *nl = strchr(p, '\n');
		size_t len = nl ? (size_t)(nl - p) : strlen(p);
		char where[PATH_MAX + 32];

		line_no++;
		snprintf(where, sizeof(where), "%s:%d", origin, line_no);
		if (memchr(p, '\0', len)) {
			snprintf(err, errlen, "%s: NUL byte in line", where);
			return -1;
		}
		char *line = strndup(p, len);
		if (!line) {
			snprintf(err, errlen, "%s: out of memory", where);
			return -1;
		}
		int rc = parse_line(cfg, line, where, seen, err, errlen);
		free(line);
		if (rc < 0)
			return -1;
		p = nl ? nl + 1 : p + len;
	}
	return 0;
}

static int read_file(const char *path, char **out, char *err, size_t errlen)
{
	FILE *f = fopen(path, "r");
	char *text = NULL;
	size_t len = 0;

	if (!f) {
		snprintf(err, errlen, "cannot open config file %s: %s", path,
			 strerror(errno));
		return -1;
	}
	/* A config file is a few lines: 1 MiB means something is wrong. */
	text = malloc(1024 * 1024 + 1);
	if (text)
		len = fread(text, 1, 1024 * 1024 + 1, f);
	int failed = !text || ferror(f) || len > 1024 * 1024;
	fclose(f);
	if (failed) {
		snprintf(err, errlen, "cannot read config file %s (unreadable, "
			 "or larger than 1 MiB)", path);
		free(text);
		return -1;
	}
	if (memchr(text, '\0', len)) {
		snprintf(err, errlen, "config file %s contains NUL bytes "
			 "(not a text file?)", path);
		free(text);
		return -1;
	}
	text[len] = '\0';
	*out = text;
	return 0;
}

int config_check(const struct config *cfg, char *err, size_t errlen)
{
	if (cfg->pause_boost > CONFIG_MAX_PAUSE_BOOST) {
		snprintf(err, errlen, "--pause-boost %u: use 1..%d nice levels, or 0 for none",
			 cfg->pause_boost, CONFIG_MAX_PAUSE_BOOST);
		return -1;
	}
	if (cfg->heartbeat_rt_priority > CONFIG_MAX_RT_PRIORITY) {
		snprintf(err, errlen, "--heartbeat-rt-priority %u: use 1..%d, or 0 for none",
			 cfg->heartbeat_rt_priority, CONFIG_MAX_RT_PRIORITY);
		return -1;
	}
	if (cfg->compress_cache_mb > CONFIG_MAX_COMPRESS_CACHE_MB) {
		snprintf(err, errlen, "--compress-cache-mb %u: use 1..%d MiB per VM",
			 cfg->compress_cache_mb, CONFIG_MAX_COMPRESS_CACHE_MB);
		return -1;
	}
	if (cfg->read_index_mb == 0 || cfg->read_index_mb > CONFIG_MAX_READ_INDEX_MB) {
		snprintf(err, errlen, "--read-index-mb %u: use 1..%d MiB per VM",
			 cfg->read_index_mb, CONFIG_MAX_READ_INDEX_MB);
		return -1;
	}
	if (cfg->reprotect_max_ms < cfg->reprotect_first_ms) {
		snprintf(err, errlen, "--reprotect-max-ms %u is below --reprotect-first-ms %u: the "
			 "wait between tries only grows", cfg->reprotect_max_ms,
			 cfg->reprotect_first_ms);
		return -1;
	}
	if (cfg->heartbeat_ms == 0 || cfg->peer_timeout_ms < 2 * cfg->heartbeat_ms) {
		snprintf(err, errlen, "--peer-timeout-ms %u must be at least two heartbeats "
			 "(--heartbeat-ms %u): one lost datagram must not end a link",
			 cfg->peer_timeout_ms, cfg->heartbeat_ms);
		return -1;
	}
	return 0;
}

int config_load(struct config *cfg, int argc, char **argv, char *err,
		size_t errlen)
{
	struct config first;

	/* A first pass finds --config (and reports bad options early). */
	config_init(&first);
	if (config_parse_args(&first, argc, argv, err, errlen) < 0)
		return -1;
	config_init(cfg);
	if (first.config_path[0] && !first.show_help) {
		char *text;
		if (read_file(first.config_path, &text, err, errlen) < 0)
			return -1;
		int rc = config_parse_file_text(cfg, text, first.config_path, err,
						errlen);
		free(text);
		if (rc < 0)
			return -1;
	}
	if (config_parse_args(cfg, argc, argv, err, errlen) < 0)
		return -1;
	return config_check(cfg, err, errlen);
}

void config_print_usage(const char *program)
{
	printf("Usage: %s [options]\n"
	       "remusdbd %s: serves VM disks over NBD and NICs through a relay.\n\n",
	       program, REMUSDBD_VERSION);
	for (size_t i = 0; i < N_OPTIONS; i++) {
		const struct option_spec *opt = &options[i];
		char left[40];
		snprintf(left, sizeof(left), "--%s%s", opt->key,
			 opt->kind == VALUE_FLAG ? "" : " VALUE");
		printf("  %-22s %s\n", left, opt->help);
	}
	printf("\nA config file holds 'key = value' lines with the same keys "
	       "(no dashes),\n'#' comment lines; the command line overrides it.\n");
}
