/* A guest's QEMU loses the daemon's OOM protection and priority (guest_process.h). */
#include "base/guest_process.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

int guest_process_demote(pid_t pid, char *why, size_t whylen)
{
	char path[64];
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/oom_score_adj", (int)pid);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, "0\n", 2) != 2) {
		snprintf(why, whylen, "cannot reset %s: %s", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	close(fd);
	if (setpriority(PRIO_PROCESS, (id_t)pid, 0) < 0) {
		snprintf(why, whylen, "cannot reset the nice value of pid %d: %s", (int)pid,
			 strerror(errno));
		return -1;
	}
	return 0;
}
