/*
 * One struct replica per protected VM on the backup, and its lifetime
 * (replica.c): created at VM_CONFIG, found by name, moved through its
 * states, freed.  It outlives its connection, so that status shows what
 * happened and a failover can run after the primary is gone.
 *
 * The struct holds what every feature reads (the VM, its committed image
 * and staged epoch, the disk replica, the state); each feature keeps its
 * own fields in a sub-struct that only its file touches, and the others
 * call its functions.
 */
#ifndef REMUSDB_REPLICA_H
#define REMUSDB_REPLICA_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include "backup/coded_pages.h"
#include "backup/eager_restore.h"
#include "backup/epoch_stage.h"
#include "backup/failover.h"
#include "backup/lazy_restore.h"
#include "backup/replica_checksums.h"
#include "backup/replica_disk_base.h"
#include "backup/cp_flow_positions.h"
#include "backup/replica_fork.h"
#include "backup/replica_memory.h"
#include "backup/replica_retire.h"
#include "backup/replica_stream.h"
#include "backup/cp_flow_takeover.h"
#include "base/event_loop.h"
#include "image/ram_image.h"
#include "vm/vm.h"
#include "vm/vm_config.h"
#include "wire/repl_settings.h"
#include "witness/witness_async.h"

enum replica_state {
	REPLICA_RECEIVING,   /* initial copy and first epochs */
	REPLICA_READY,       /* a committed epoch after the disk copy: can take over */
	REPLICA_ARBITRATING, /* primary lost: asking etcd */
	REPLICA_FAILING_OVER,
	REPLICA_ACTIVE,      /* took over: the VM runs here */
	REPLICA_PASSIVE,     /* lost arbitration, or the primary said goodbye */
	REPLICA_FAILED,
};

struct session;
struct page_decoder;

struct replica {
	event_loop *loop;
	const struct repl_settings *settings;
	struct vm_registry *vms;
	char name[VM_NAME_MAX + 1];
	struct vm_config config;   /* VM_CONFIG from the primary, checked */
	char peer[64];
	enum replica_state state;
	char error[512];
	struct session *session;   /* NULL once the primary is gone */
	struct witness_ownership ownership;

	struct ram_image *image;
	struct replica_memory memory; /* admitted with the image (replica_memory.h) */
	struct epoch_stage *stage;
	struct cp_flow_positions *flows; /* commit protection's flow positions */
	uint64_t committed_epoch;
	bool any_commit;
	uint64_t epochs_committed;
	bool disk_synced;
	char disk_path[PATH_MAX];
	int disk_fd;               /* -1 until DISK_BASE said how to open it */
	uint64_t disk_size;

	/* The primary's liveness, kept when its session goes. */
	int64_t last_heard_us;
	int64_t max_silence_ms;    /* longest gap between the primary's heartbeats */
	int64_t stream_max_silence_ms; /* longest quiet TCP stream, as the loop saw it */

	/* Each owned by the file named. */
	struct replica_stream_state stream;       /* replica_stream.c */
	struct replica_coded_pages coded;         /* coded_pages.c */
	struct replica_disk_base disk_base;       /* replica_disk_base.c */
	struct replica_checksums checksums;       /* replica_checksums.c */
	struct cp_flow_takeover resets;           /* cp_flow_takeover.c */
	struct replica_failover failover;         /* failover.c */
	struct replica_eager_restore eager;       /* eager_restore.c */
	struct replica_lazy_restore lazy;         /* lazy_restore.c */
	struct replica_fork_link fork;            /* replica_fork.c */
	struct replica_retirement retirement;     /* replica_retire.c */
	struct replica *next;
};

/* The replicas one server holds (replica.c keeps the list). */
struct replica_set {
	struct replica *first;
};

/*
 * A new replica of config's VM (taken: its qemu_argv moves in, config is
 * cleared) for the primary at peer, RECEIVING.  base_path: a disk already
 * here (absorbed from a stopped VM), or "" for the default file.  Not yet
 * in any set.  NULL with err.
 */
struct replica *replica_create(event_loop *loop, const struct repl_settings *settings,
			       struct vm_registry *vms, const struct page_decoder *decoder,
			       const char *peer, struct vm_config *config, const char *base_path,
			       char *err, size_t errlen);
/* Every feature's teardown, in order, then the replica itself. */
void replica_free(struct replica *r);
/* The committed image and the staged epoch go (the replica can no longer take over). */
void replica_drop_image(struct replica *r);
const char *replica_state_name(enum replica_state st);
void replica_set_state(struct replica *r, enum replica_state st);

void replica_set_add(struct replica_set *set, struct replica *r);
void replica_set_remove(struct replica_set *set, struct replica *r);
struct replica *replica_set_find(const struct replica_set *set, const char *name);
/* Frees every replica of the set (daemon shutdown). */
void replica_set_free_all(struct replica_set *set);

#endif
