/*
 * Taking over a VM on the backup host (failover.c): arbitration in etcd,
 * the fence and the disk replica's flush, serving the VM here, QEMU with
 * -incoming, the restore (eager_restore.c or lazy_restore.c), the resume
 * and the announce.
 */
#ifndef REMUSDB_FAILOVER_H
#define REMUSDB_FAILOVER_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "vm/vm.h"
#include "witness/witness_async.h"

struct replica;

struct replica_failover {
	struct witness_async *witness;
	struct fence *fence;       /* the fencing command while it runs */
	bool fence_done;           /* the takeover's fence ended (or there is none) */
	int flush_err;             /* the takeover's flush: -1 while it runs, else an errno or 0 */
	long long timer;           /* every step waits on it */
	int connect_attempts;
	char replaced_owner[WITNESS_OWNER_MAX + 1]; /* whom a takeover replaces */
	char closed_why[256];      /* the primary's connection closed: why, for the takeover */
	double lost_at_unix;
	int64_t lost_at_us;
	int64_t detected_after_ms; /* silence before we declared the primary dead */
	int64_t started_us;
	int64_t qemu_spawned_us;
	int64_t restore_done_us;
	int64_t resumed_us;
	double resumed_at_unix;
	pid_t qemu_pid;            /* the takeover's QEMU */
	bool ram_shared;           /* it maps the image's main RAM (failover_qemu.h) */
	char ram_not_shared[200];  /* why not, under --restore shared */
	uint64_t stream_bytes;     /* what the restore wrote into -incoming */
	/* -incoming answered; held until QEMU took the NIC's stream (failover.c) */
	int incoming_fd;
	bool incoming_held;
	int nic_polls;
	int64_t nic_wait_us;       /* from -incoming answering to the restore's start */
	/* Sockets live here: sun_path (108) minus "/qmp-daemon.sock". */
	char run_dir[90];
};

/* The takeover's sockets (the longest: "/qmp-daemon.sock") fit in sun_path. */
_Static_assert(sizeof(((struct replica_failover *)0)->run_dir) + sizeof("/qmp-daemon.sock") - 1 <=
	       VM_SOCKET_PATH_MAX, "run_dir leaves room for the socket names");

/*
 * The primary is gone (why), or the operator asked for a takeover while
 * it is still connected: arbitrate, then take over if we win.  The
 * connection, if any, is dropped only after winning, so that the primary
 * cannot win a race it started by noticing the close.
 */
void failover_primary_lost(struct replica *r, const char *why);
/*
 * The primary's connection closed without a BYE while the replica is
 * READY.  A closed connection proves that the primary's remusdbd is gone,
 * not that its VM is: a restarted daemon finds the VM paused in COLO and
 * asks etcd for it (protection_recover).  So the failure detector
 * decides, as for silence: the takeover's arbitration starts once
 * timeout_ms have passed since the primary's last heartbeat, which a
 * restart quicker than that beats (its compare-and-swap wins, ours then
 * loses and the replica goes passive, for the re-protection that
 * follows to replace).  A new session for the VM before then replaces
 * the replica and with it this wait.
 */
void failover_primary_closed(struct replica *r, const char *why, unsigned timeout_ms);
/* The primary was silent this long when we declared it dead (status). */
void failover_note_silence(struct replica *r, int64_t silent_ms);
/* Stops any failover in progress (daemon shutdown). */
void failover_cleanup(struct replica *r);
/* Status: failover. */
json_t *failover_json(const struct replica *r);

/* For the restores (eager_restore.c, lazy_restore.c). */
void failover_failed(struct replica *r, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* The image is in QEMU (at restore_done_us): wait for the VM to run. */
void failover_wait_for_resume(struct replica *r, int64_t restore_done_us);
/* A new QEMU, then its -incoming again.  0, or -1 with err. */
int failover_restart_qemu(struct replica *r, char *err, size_t errlen);
pid_t failover_qemu_pid(const struct replica *r);
int64_t failover_qemu_spawned_us(const struct replica *r);
bool failover_resumed(const struct replica *r);
const char *failover_run_dir(const struct replica *r);

#endif
