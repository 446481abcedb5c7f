/*
 * The takeover's QEMU: the primary's command line, with the primary's run
 * dir replaced by ours and without what a QEMU here does without, plus
 * -incoming; started as our own child (we reap it) in its own session.
 *
 * With the image's main RAM shared, QEMU maps the memfd the backup kept
 * that block in (ram_image.h): the memfd goes to the child as fd
 * SHARED_RAM_FD, and QEMU opens it again by /proc/self/fd, so it needs
 * no access to the daemon's own /proc entry.  The RAM block keeps the
 * name the primary's stream gives it (x-use-canonical-path-for-ramblock-id
 * off), and share=on makes the guest's memory that memfd itself.
 */
#include "backup/failover_qemu.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/guest_process.h"
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

#define SHARED_RAM_FD 3

static bool runs_qemu(const char *argv0)
{
	const char *base = strrchr(argv0, '/');

	return !strncmp(base ? base + 1 : argv0, "qemu-system-", strlen("qemu-system-"));
}

bool failover_qemu_can_share_ram(const struct vm_config *config, char *why, size_t whylen)
{
	if (!config->qemu_argc || !runs_qemu(config->qemu_argv[0])) {
		snprintf(why, whylen, "the command line runs %s, not qemu-system-*",
			 config->qemu_argc ? config->qemu_argv[0] : "nothing");
		return false;
	}
	for (size_t i = 1; i < config->qemu_argc; i++) {
		const char *arg = config->qemu_argv[i];

		if (!strcmp(arg, "-mem-path") || !strcmp(arg, "-numa") ||
		    strstr(arg, "memory-backend")) {
			snprintf(why, whylen, "the command line chooses its own memory (%s)", arg);
			return false;
		}
	}
	return true;
}

static char **build_argv(const struct vm_config *config, const char *run_dir, bool lazy,
			 const struct failover_shared_ram *ram, char *err, size_t errlen)
{
	const char *primary_dir = config->run_dir;
	size_t n = config->qemu_argc;
	char **out = calloc(n + 9, sizeof(char *));
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
	if (ram && ram->fd >= 0) {
		char object[256];

		snprintf(object, sizeof(object), "memory-backend-file,id=%s,size=%llu,"
			 "mem-path=/proc/self/fd/%d,share=on,"
			 "x-use-canonical-path-for-ramblock-id=off", FAILOVER_SHARED_RAM_BLOCK,
			 (unsigned long long)ram->length, SHARED_RAM_FD);
		out[k++] = strdup("-object");
		out[k++] = strdup(object);
		out[k++] = strdup("-machine");
		out[k++] = strdup("memory-backend=" FAILOVER_SHARED_RAM_BLOCK);
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
	for (size_t i = 0; i < k; i++) {
		if (!out[i]) {
			snprintf(err, errlen, "out of memory");
			goto fail;
		}
	}
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
			  const struct failover_shared_ram *ram, const char *name,
			  char *err, size_t errlen)
{
	char **argv = build_argv(config, run_dir, lazy, ram, err, errlen);
	int ram_fd = -1;
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
	if (ram && ram->fd >= 0) {
		/* Above SHARED_RAM_FD, so that the dup2 always clears close-on-exec. */
		ram_fd = fcntl(ram->fd, F_DUPFD_CLOEXEC, SHARED_RAM_FD + 1);
		if (ram_fd < 0) {
			snprintf(err, errlen, "cannot hand the image's RAM to QEMU: %s",
				 strerror(errno));
			posix_spawn_file_actions_destroy(&fa);
			free_argv(argv);
			return -1;
		}
		posix_spawn_file_actions_adddup2(&fa, ram_fd, SHARED_RAM_FD);
	}
	posix_spawnattr_init(&attr);
	/* Its own session: the daemon's signals and death must not reach it. */
	posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID);
	int rc = posix_spawnp(&pid, argv[0], &fa, &attr, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&attr);
	if (ram_fd >= 0)
		close(ram_fd);
	if (rc != 0)
		snprintf(err, errlen, "cannot start %s: %s", argv[0], strerror(rc));
	else
		log_info("vm %s: started QEMU (pid %d) with -incoming%s", name, (int)pid,
			 ram_fd >= 0 ? ", its RAM mapped from the image" : "");
	char why[160];
	if (rc == 0 && guest_process_demote(pid, why, sizeof(why)) < 0)
		log_warn("vm %s: QEMU keeps the daemon's OOM protection or priority: %s", name,
			 why);
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
