/*
 * The daemon's scheduling group follows its nice value.
 *
 * Under autogroup (sched(7), "The autogroup feature"; on by default in
 * Debian's kernels) the kernel first shares the CPU between sessions, each
 * a group with a nice value of its own, and a thread's nice value orders it
 * only among its own session's threads.  remusdbd runs in a session of its
 * own (systemd starts every service with setsid, the lab with
 * start_new_session), and so does every guest's QEMU (-daemonize, libvirt,
 * or the setsid of a takeover's QEMU).  So the Nice=-10 that puts the
 * daemon above the guests, as dom0 is in Xen, weighs nothing against them:
 * measured here, a nice -10 busy loop in one session and a nice 0 one in
 * another each got half of a core.  At start the daemon gives its session's
 * group the nice value it was started with.
 *
 * A guest the daemon starts (a takeover's QEMU) has its own session, so a
 * group of its own at nice 0.  Where the daemon runs in a cpu cgroup of its
 * own (a unit with CPUWeight=), autogroup does not apply and the cgroup's
 * weight is what counts; the write is then harmless.
 */
#ifndef REMUSDB_SCHED_GROUP_H
#define REMUSDB_SCHED_GROUP_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/*
 * Parses /proc/PID/autogroup ("/autogroup-25 nice -10\n") into its nice
 * value.  0, or -1 when the text is not that.
 */
int sched_group_parse_nice(const char *text, int *nice);

/*
 * Sets this process's autogroup to its own nice value when autogroup is
 * on and that value is not 0.  Returns 1 with what it did in said, 0 when
 * there was nothing to do (said says why), -1 with the error in said.
 */
int sched_group_follow_nice(char *said, size_t len);

/*
 * Whether /proc/PID/cgroup's text puts the process in a cpu cgroup other
 * than the root, where autogroup does not apply (the kernel uses the
 * cgroup's weight instead): a cgroup v1 line naming the cpu controller
 * with a path other than "/", or, when v2_cpu_on (the unified hierarchy's
 * root delegates the cpu controller), the v2 line "0::PATH" with a PATH
 * other than "/".  1 with the path in path, 0 when not, -1 when the text
 * has neither kind of line.
 */
int sched_group_parse_cpu_cgroup(const char *text, bool v2_cpu_on, char *path, size_t len);

/*
 * Another process's session group, for a guest's pause (primary/
 * pause_boost.h): whether pid is alone in its session under autogroup and
 * in no cpu cgroup, so that its group is its own, nobody else's, and what
 * the kernel weighs (0 with the group's nice in *nice, read on the way;
 * -1 with why; it scans /proc once), and its group's nice read and set
 * (0, or -1 with why).  The read gives 1 with why for a
 * process in the init session (session 0, as under a container's init
 * that never called setsid): its group is the root, which has no autogroup
 * and whose weight cannot be set.
 */
int sched_group_check_own(pid_t pid, int *nice, char *why, size_t len);
int sched_group_get(pid_t pid, int *nice, char *why, size_t len);
int sched_group_set(pid_t pid, int nice, char *why, size_t len);

#endif
