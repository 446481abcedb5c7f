/* The daemon's scheduling group follows its nice value (sched_group.h). */
#include "base/sched_group.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define AUTOGROUP_ENABLED "/proc/sys/kernel/sched_autogroup_enabled"

int sched_group_parse_nice(const char *text, int *nice)
{
	const char *word = strstr(text, " nice ");
	char *end;
	long v;

	if (strncmp(text, "/autogroup-", 11) != 0 || !word)
		return -1;
	errno = 0;
	v = strtol(word + 6, &end, 10);
	if (errno || end == word + 6 || (*end && *end != '\n') || v < -20 || v > 19)
		return -1;
	*nice = (int)v;
	return 0;
}

/* The first bytes of path, NUL-terminated.  0, or -1 with errno. */
static int read_small(const char *path, char *buf, size_t len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -1;
	n = read(fd, buf, len - 1);
	int saved = errno;
	close(fd);
	if (n < 0) {
		errno = saved;
		return -1;
	}
	buf[n] = '\0';
	return 0;
}

int sched_group_parse_cpu_cgroup(const char *text, bool v2_cpu_on, char *path, size_t len)
{
	int found = 0;

	for (const char *line = text; *line;) {
		const char *end = strchr(line, '\n');
		size_t n = end ? (size_t)(end - line) : strlen(line);
		const char *c1 = memchr(line, ':', n);
		const char *c2 = c1 ? memchr(c1 + 1, ':', n - (size_t)(c1 + 1 - line)) : NULL;

		if (c2) {
			const char *ctl = c1 + 1, *where = c2 + 1;
			size_t ctl_len = (size_t)(c2 - ctl), where_len = n - (size_t)(where - line);
			bool v2 = ctl_len == 0 && c1 - line == 1 && line[0] == '0';
			bool cpu = false;

			/* v1: "N:cpu,cpuacct:/path"; the list names cpu exactly */
			for (const char *w = ctl; !v2 && w < c2;) {
				const char *comma = memchr(w, ',', (size_t)(c2 - w));
				size_t wl = comma ? (size_t)(comma - w) : (size_t)(c2 - w);
				if (wl == 3 && !memcmp(w, "cpu", 3))
					cpu = true;
				w += wl + 1;
			}
			if (cpu || v2) {
				found = 1;
				if ((cpu || v2_cpu_on) && !(where_len == 1 && where[0] == '/')) {
					snprintf(path, len, "%.*s", (int)where_len, where);
					return 1;
				}
			}
		}
		line += n + (end ? 1 : 0);
	}
	return found ? 0 : -1;
}

/* 1 with its path when pid is in a cpu cgroup, 0 when not or unknown. */
static int in_cpu_cgroup(pid_t pid, char *path, size_t len)
{
	char file[48], text[2048], ctl[256] = "";

	snprintf(file, sizeof(file), "/proc/%d/cgroup", (int)pid);
	if (read_small(file, text, sizeof(text)) < 0)
		return 0;
	/* The unified root delegates cpu: pure v2 at /sys/fs/cgroup, hybrid below it. */
	if (read_small("/sys/fs/cgroup/cgroup.subtree_control", ctl, sizeof(ctl)) < 0)
		read_small("/sys/fs/cgroup/unified/cgroup.subtree_control", ctl, sizeof(ctl));
	bool v2_cpu_on = false;
	char *save = NULL;
	for (char *w = strtok_r(ctl, " \n", &save); w; w = strtok_r(NULL, " \n", &save))
		if (!strcmp(w, "cpu"))
			v2_cpu_on = true;
	return sched_group_parse_cpu_cgroup(text, v2_cpu_on, path, len) == 1;
}

static bool autogroup_enabled(void)
{
	char text[8];

	return read_small(AUTOGROUP_ENABLED, text, sizeof(text)) == 0 && text[0] == '1';
}

int sched_group_follow_nice(char *said, size_t len)
{
	char why[160], cgroup[128];
	int own, group;

	if (!autogroup_enabled()) {
		snprintf(said, len, "autogroup is off: the nice value weighs against every thread");
		return 0;
	}
	errno = 0;
	own = getpriority(PRIO_PROCESS, 0);
	if (own == -1 && errno) {
		snprintf(said, len, "cannot read our nice value: %s", strerror(errno));
		return -1;
	}
	int got = sched_group_get(getpid(), &group, why, sizeof(why));
	if (got < 0) {
		snprintf(said, len, "%s", why);
		return -1;
	}
	if (got > 0) {
		/* There the nice value weighs against each session's group directly. */
		snprintf(said, len, "in the init session's root group, which has no autogroup: "
			 "the nice value %d weighs against each session's group", own);
		return 0;
	}
	if (in_cpu_cgroup(getpid(), cgroup, sizeof(cgroup))) {
		snprintf(said, len, "in cpu cgroup %s: its weight counts, not autogroup's", cgroup);
		return 0;
	}
	if (own == 0 || own == group) {
		snprintf(said, len, "session group at nice %d, as the daemon", group);
		return 0;
	}
	if (sched_group_set(getpid(), own, why, sizeof(why)) < 0) {
		snprintf(said, len, "%s", why);
		return -1;
	}
	snprintf(said, len, "session group set from nice %d to the daemon's %d", group, own);
	return 1;
}

/* The session of process pid, or -1 (gone, or unreadable). */
static pid_t session_of(long pid)
{
	char path[64], text[512];

	snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
	if (read_small(path, text, sizeof(text)) < 0)
		return -1;
	/* "pid (comm) state ppid pgrp session ...": comm may hold ") ". */
	const char *rest = strrchr(text, ')');
	int session;
	if (!rest || sscanf(rest + 1, " %*c %*d %*d %d", &session) != 1)
		return -1;
	return (pid_t)session;
}

int sched_group_check_own(pid_t pid, int *nice, char *why, size_t len)
{
	if (!autogroup_enabled()) {
		snprintf(why, len, "autogroup is off");
		return -1;
	}
	pid_t sid = getsid(pid);
	if (sid < 0) {
		snprintf(why, len, "no session for pid %d: %s", (int)pid, strerror(errno));
		return -1;
	}
	char cgroup[128];
	if (in_cpu_cgroup(pid, cgroup, sizeof(cgroup))) {
		snprintf(why, len, "pid %d is in cpu cgroup %s, whose weight counts, not "
			 "autogroup's (raise that cgroup's cpu.weight instead)", (int)pid, cgroup);
		return -1;
	}
	if (sched_group_get(pid, nice, why, len) != 0)
		return -1;
	/*
	 * Its group is its session's: alone in it, the group is its own.  A
	 * daemonized QEMU is (it forks again after setsid, so the session's
	 * leader is gone); one started from a shell shares the shell's.
	 */
	DIR *proc = opendir("/proc");
	if (!proc) {
		snprintf(why, len, "cannot list /proc: %s", strerror(errno));
		return -1;
	}
	struct dirent *d;
	int rc = 0;
	while ((d = readdir(proc))) {
		char *end;
		long other = strtol(d->d_name, &end, 10);
		if (*end || other <= 0 || other == pid)
			continue;
		if (session_of(other) == sid) {
			snprintf(why, len, "pid %d shares its session %d with pid %ld", (int)pid,
				 (int)sid, other);
			rc = -1;
			break;
		}
	}
	closedir(proc);
	return rc;
}

int sched_group_get(pid_t pid, int *nice, char *why, size_t len)
{
	char path[48], text[64];

	snprintf(path, sizeof(path), "/proc/%d/autogroup", (int)pid);
	if (read_small(path, text, sizeof(text)) < 0) {
		snprintf(why, len, "cannot read %s: %s", path, strerror(errno));
		return -1;
	}
	if (!text[0]) {
		/*
		 * The kernel prints nothing for a task whose group is the root
		 * (proc_sched_autogroup_show_task): one in the init session,
		 * session 0, which has no autogroup, and whose root weight
		 * cannot be set (a write gives EINVAL).
		 */
		snprintf(why, len, "pid %d is in the root scheduling group (the init session's, "
			 "session 0), which has no autogroup", (int)pid);
		return 1;
	}
	if (sched_group_parse_nice(text, nice) < 0) {
		snprintf(why, len, "%s says \"%.*s\"", path, (int)strcspn(text, "\n"), text);
		return -1;
	}
	return 0;
}

int sched_group_set(pid_t pid, int nice, char *why, size_t len)
{
	char path[48], text[16];
	int fd, n = snprintf(text, sizeof(text), "%d\n", nice);

	snprintf(path, sizeof(path), "/proc/%d/autogroup", (int)pid);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, text, (size_t)n) != n) {
		snprintf(why, len, "cannot set %s to nice %d: %s", path, nice, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	close(fd);
	return 0;
}
