/*
 * A protected VM's QEMU gets the CPU first while it pauses for a
 * checkpoint (--pause-boost).
 *
 * Why: the noisy-neighbour bench (docs/bench/README.md, "The neighbour,
 * third part") showed that a quiet VM's pause beside a busy protected VM
 * grows because its QEMU waits for a core: its parts that stop the guest
 * and sync the dirty bitmap doubled or tripled at p99, shorter scheduler
 * slices did nothing, and a larger CPU share for the quiet VM's QEMU
 * brought its pause p99 most of the way back (11 against 17 ms, 9 alone).
 * A guest's vCPUs are stopped for the pause anyway, so what the boost
 * favours is the work of the pause itself; every protected VM gets it
 * during its own pauses, so no VM is favoured for being quiet.
 *
 * How: under autogroup a daemonized QEMU is a session, so a scheduling
 * group of its own (base/sched_group.h), whose nice value weighs it
 * against every other session: the boost lowers that value by N levels
 * from our CHECKPOINT_REPLY (QEMU stops the guest when it reads it) until
 * QEMU's RESUME, when the guest runs again (protection_pause.c; QEMU's
 * own restart after our LOADED is part of the pause, checkpoint_resume.h
 * says how long), and puts it back then, or when the protection stops
 * mid-pause.  Privileges: lowering a group's nice needs CAP_SYS_NICE, and
 * a process without CAP_SYS_ADMIN may change any autogroup only once per
 * 100 ms across the host (kernel/sched/autogroup.c, which calls it a heavy
 * operation: each change walks every CPU's runqueue); the boost changes
 * two per pause, so a daemon without CAP_SYS_ADMIN gets EAGAIN and turns
 * the boost off with the reason.  A QEMU that shares its session, one in a
 * cpu cgroup (as
 * libvirt's machine.slice gives: the cgroup's cpu.weight is what counts
 * there), or a host without autogroup, runs without a boost, and status
 * says why.
 */
#ifndef REMUSDB_PAUSE_BOOST_H
#define REMUSDB_PAUSE_BOOST_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <jansson.h>

struct pause_boost {
	unsigned levels;  /* nice levels; 0: off */
	pid_t pid;        /* QEMU's, once checked */
	int base_nice;    /* its group's value outside pauses */
	bool boosted;
	bool unusable;    /* checked and refused, or a write failed: why says */
	uint64_t boosts;
	char why[192];
};

void pause_boost_init(struct pause_boost *b, unsigned levels);
/*
 * The pause begins: boosts QEMU (qemu_pid, 0 when not known yet) unless
 * off or unusable.  The first call checks it and reads its group's value.
 */
void pause_boost_begin(struct pause_boost *b, pid_t qemu_pid, const char *vm_name);
/* The pause ended, or the protection stops: puts the value back. */
void pause_boost_end(struct pause_boost *b, const char *vm_name);
/* {"levels", "state": "ready"|"off"|"unavailable"|"waiting for QEMU", "why", "boosts"} */
json_t *pause_boost_json(const struct pause_boost *b);

#endif
