/*
 * The takeover's QEMU: the primary's command line, with the primary's run
 * dir replaced by ours and without what a QEMU here does without, plus
 * -incoming; started as our own child (we reap it) in its own session.
 */
#include "backup/failover_qemu.h"

#include <fcntl.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"

extern char **environ;

static char *replace_all(const char *s, const char *from, const char *to)
{
	size_t from_len = strlen(from), to_len = strlen(to), n = 0;

	for (const char *p = s; from_len && (p = strstr(p, from)); p += from_len)
		n++;
	char *outp = malloc(strlen(s) + n * (to_len + 1) + 1);
	char *o = outp;
	if (!outp)
		return NULL;
	while (from_len && *s) {
		const char *hit = strstr(s, from);
		if (!hit)
			break;
		memcpy(o, s, (size_t)(hit - s));
		o += hit - s;
		memcpy(o, to, to_len);
		o += to_len;
		s = hit + from_len;
	}
	strcpy(o, s);
	return outp;
}

/* The primary's arguments a QEMU here does without: it runs as our child, restoring. */
static bool kept_arg(const char *arg)
{
	return strcmp(arg, "-daemonize") && strcmp(arg, "-incoming");
}

static char **build_argv(const struct vm_config *config, const char *run_dir, bool lazy,
			 char *err, size_t errlen)
{
	const char *primary_dir = config->run_dir;
	size_t n = config->qemu_argc;
	char **out = calloc(n + 5, sizeof(char *));
	size_t k = 0;

	if (!out) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	for (size_t i = 0; i < n; i++) {
		const char *arg = config->qemu_argv[i];
		if (!kept_arg(arg))
			continue;
		out[k] = replace_all(arg, primary_dir, run_dir);
		if (!out[k++]) {
			snprintf(err, errlen, "out of memory");
			goto fail;
		}
	}
	if (lazy) {
		/* The capability must be on before -incoming starts listening. */
		out[k++] = strdup("-global");
		out[k++] = strdup("migration.x-postcopy-ram=on");
	}
	out[k++] = strdup("-incoming");
	char incoming[PATH_MAX + 16];
	snprintf(incoming, sizeof(incoming), "unix:%s/incoming.sock", run_dir);
	out[k++] = strdup(incoming);
	return out;
fail:
	for (size_t i = 0; i < k; i++)
		free(out[i]);
	free(out);
	return NULL;
}

static void free_argv(char **argv)
{
	for (size_t i = 0; argv && argv[i]; i++)
		free(argv[i]);
	free(argv);
}

pid_t failover_qemu_spawn(const struct vm_config *config, const char *run_dir, bool lazy,
			  const char *name, char *err, size_t errlen)
{
	char **argv = build_argv(config, run_dir, lazy, err, errlen);
	char log_path[PATH_MAX + 16];
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t attr;
	pid_t pid;

	if (!argv)
		return -1;
	snprintf(log_path, sizeof(log_path), "%s/qemu.log", run_dir);
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
	posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log_path,
					 O_WRONLY | O_CREAT | O_APPEND, 0644);
	posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
	posix_spawnattr_init(&attr);
	/* Its own session: the daemon's signals and death must not reach it. */
	posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
	int rc = posix_spawnp(&pid, argv[0], &fa, &attr, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&attr);
	if (rc != 0)
		snprintf(err, errlen, "cannot start %s: %s", argv[0], strerror(rc));
	else
		log_info("vm %s: started QEMU (pid %d) with -incoming", name, (int)pid);
	free_argv(argv);
	return rc ? -1 : pid;
}

json_t *failover_qemu_command_json(const struct vm_config *config, const char *run_dir)
{
	json_t *argv = json_array();

	for (size_t i = 0; argv && i < config->qemu_argc; i++) {
		if (!kept_arg(config->qemu_argv[i]))
			continue;
		char *arg = replace_all(config->qemu_argv[i], config->run_dir, run_dir);
		if (!arg || json_array_append_new(argv, json_string(arg)) < 0) {
			free(arg);
			json_decref(argv);
			return json_null();
		}
		free(arg);
	}
	return argv ? argv : json_null();
}
