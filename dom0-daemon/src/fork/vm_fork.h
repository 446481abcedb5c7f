/*
 * Forking a running VM (FlurryDB on QEMU, docs/fork.md): the parent-host
 * half.  One fork per VM at a time, owned by the VM.
 *
 *   fork-start: spawn the page source (remusdbd-pagesrc), turn QEMU's
 *     migration events on and migrate the parent into it (plain precopy).
 *     When QEMU reports the migration completed, the parent is stopped
 *     with its disk flushed: freeze a copy-on-write snapshot of its disk
 *     (disk_snapshot.h), serve it read-only over NBD, then `cont` the
 *     parent.  Its pause is QEMU's downtime plus completed -> cont.
 *   fork-serve: the page source connects to a clone QEMU listening for
 *     an incoming migration and serves it (postcopy_source.h).
 *   fork-release: the page source is killed if it still runs, the disk
 *     snapshot's export and the snapshot go.
 *
 * The page source is a child process, watched on the event loop (its
 * stdout carries JSON lines; its exit is reaped by a timer with WNOHANG),
 * never waited for.  It exits once every clone has every page, which is
 * when the memory snapshot is released; the disk snapshot stays while
 * clones read through it, until fork-release.
 */
#ifndef REMUSDB_VM_FORK_H
#define REMUSDB_VM_FORK_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/event_loop.h"

struct vm;
struct vm_fork;

struct fork_settings {
	char run_dir[1024];     /* forks' sockets: <run_dir>/forks/<vm> */
	char state_dir[1024];   /* disk snapshots' preserve files */
	char lan_addr[64];      /* where clones on other hosts reach the disk snapshot; "" = unix only */
	char pagesrc[1024];     /* the remusdbd-pagesrc binary */
};

/*
 * NULL with a reason in err (no QMP, bad counts...).  push_mbps caps each
 * clone's background push (0: none), see postcopy_fork_set_push_rate.
 */
struct vm_fork *vm_fork_start(event_loop *loop, const struct fork_settings *settings,
			      struct vm *vm, unsigned clones, unsigned push_mbps,
			      char *err, size_t errlen);
/*
 * A fork of a protected VM from its backup: img is the committed image
 * (epoch), disk_path the disk replica at the same commit (NULL: none).
 * The image is frozen by fork()ing remusdbd (pagesrc.h): the child serves
 * it while the backup keeps committing, the kernel copying only the
 * pages the backup overwrites, so the primary is not touched at all.
 * The disk is frozen like a parent's, on an unserved export of the
 * replica file whose writers, the replica's commits, call
 * vm_fork_before_replica_write first for every range they write.  Recently committed pages
 * (ram_image_recent_pages) are pushed first.
 */
struct nbd_export;
struct ram_image;
struct vm_fork *vm_fork_start_from_image(event_loop *loop, const struct fork_settings *settings,
					 const char *name, const struct ram_image *img,
					 uint64_t epoch, const char *disk_path,
					 unsigned clones, unsigned push_mbps,
					 char *err, size_t errlen);
/*
 * Whether the fork keeps a snapshot of the replica's disk, which the
 * backup must then let preserve every range before a commit writes it.
 */
bool vm_fork_preserves_replica_disk(const struct vm_fork *f);
/*
 * Before the backup writes one of an epoch's disk ranges (fork is the
 * struct vm_fork, untyped to serve as epoch_stage_for_each_disk_range's
 * callback): preserves it.  Returns 0, or a negative errno after which
 * the fork has failed and its snapshot is gone, loudly (the preserve
 * directory is full...); the caller stops there, and the commit and the
 * protection go on.
 */
int vm_fork_before_replica_write(void *fork, uint64_t offset, uint64_t length);
/* The backup took the VM over: its export writes the replica file now. */
void vm_fork_disk_taken_over(struct vm_fork *f, struct nbd_export *vm_disk);
/* Hands a clone's incoming address (unix:PATH or tcp:A.B.C.D:PORT) to the page source. */
int vm_fork_serve(struct vm_fork *f, const char *clone_id, const char *address,
		  char *err, size_t errlen);
/* Ends everything of the fork; NULL is a no-op. */
void vm_fork_destroy(struct vm_fork *f);
/* The parent's QEMU events, forwarded by vm_runtime.c. */
void vm_fork_on_qmp_event(struct vm_fork *f, const char *event, json_t *data);
json_t *vm_fork_status_json(const struct vm_fork *f);
/*
 * The VM's fork (vm_fork_attach.c): the VM owns it, as its protection, so
 * one attached in its place, or NULL, destroys it.
 */
struct vm;
struct vm_fork *vm_fork_of(const struct vm *vm);
void vm_fork_attach(struct vm *vm, struct vm_fork *f);

#endif
