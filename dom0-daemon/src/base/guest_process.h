/*
 * A guest's QEMU that the daemon starts (a takeover's) must not inherit
 * what the unit gives the daemon: OOMScoreAdjust=-900, so that under
 * memory pressure the kernel kills a guest before the daemon that serves
 * every local VM's disk and NIC, and Nice=-10, so that the daemon runs
 * above the guests.  posix_spawn has no hook in the child, so the parent
 * sets them on the new pid, a few microseconds into its life.  (The
 * daemon's session group's nice, base/sched_group.h, is not inherited:
 * the guest runs in a session, so an autogroup, of its own, at nice 0.)
 */
#ifndef REMUSDB_GUEST_PROCESS_H
#define REMUSDB_GUEST_PROCESS_H

#include <stddef.h>
#include <sys/types.h>

/* oom_score_adj 0 and nice 0 for pid.  0, or -1 with why. */
int guest_process_demote(pid_t pid, char *why, size_t whylen);

#endif
