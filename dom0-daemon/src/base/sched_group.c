/* The daemon's scheduling group follows its nice value (sched_group.h). */
#include "base/sched_group.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define AUTOGROUP_ENABLED "/proc/sys/kernel/sched_autogroup_enabled"
#define OWN_AUTOGROUP "/proc/self/autogroup"

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

int sched_group_follow_nice(char *said, size_t len)
{
	char text[64];
	int own, group;

	if (read_small(AUTOGROUP_ENABLED, text, sizeof(text)) < 0 || text[0] != '1') {
		snprintf(said, len, "autogroup is off: the nice value weighs against every thread");
		return 0;
	}
	errno = 0;
	own = getpriority(PRIO_PROCESS, 0);
	if (own == -1 && errno) {
		snprintf(said, len, "cannot read our nice value: %s", strerror(errno));
		return -1;
	}
	if (read_small(OWN_AUTOGROUP, text, sizeof(text)) < 0) {
		snprintf(said, len, "cannot read %s: %s", OWN_AUTOGROUP, strerror(errno));
		return -1;
	}
	if (sched_group_parse_nice(text, &group) < 0) {
		snprintf(said, len, "%s says \"%.*s\", not \"/autogroup-N nice V\"", OWN_AUTOGROUP,
			 (int)strcspn(text, "\n"), text);
		return -1;
	}
	if (own == 0 || own == group) {
		snprintf(said, len, "session group at nice %d, as the daemon", group);
		return 0;
	}
	int fd = open(OWN_AUTOGROUP, O_WRONLY | O_CLOEXEC);
	int n = snprintf(text, sizeof(text), "%d\n", own);
	if (fd < 0 || write(fd, text, (size_t)n) != n) {
		snprintf(said, len, "cannot set %s to nice %d: %s", OWN_AUTOGROUP, own,
			 strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	close(fd);
	snprintf(said, len, "session group set from nice %d to the daemon's %d", group, own);
	return 1;
}
