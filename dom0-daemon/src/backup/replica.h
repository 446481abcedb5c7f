/*
 * Internals of the backup side shared by replication_server.c (receiving
 * and committing epochs) and failover.c (taking over).  One struct
 * replica per protected VM; it outlives its connection, so that status
 * shows what happened and a failover can run after the primary is gone.
 */
#ifndef REMUSDB_REPLICA_H
#define REMUSDB_REPLICA_H

#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/buffer.h"
#include "backup/epoch_stage.h"
#include "relay/flow_reset.h"
#include "codec/page_coding.h"
#include "base/event_loop.h"
#include "image/image_flush.h"
#include "backup/replica_checksums.h"
#include "backup/replica_flows.h"
#include "image/ram_image.h"
#include "wire/repl_proto.h"
#include "wire/repl_settings.h"
#include "fork/postcopy_source.h"
#include "backup/restore_stream.h"
#include "vm/vm.h"
#include "vm/vm_config.h"
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

struct fence;
struct page_fixup; /* replica_stream.c */
struct replication_server;

/*
 * Frames that arrive while an epoch waits for resent pages are kept, raw
 * and in order, up to this much; beyond it the primary is far ahead of
 * what we can commit and the link ends.
 */
#define REPLICA_DEFER_MAX (256u << 20)
struct session;

struct replica {
	struct replication_server *server;
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
	char replaced_owner[WITNESS_OWNER_MAX + 1]; /* whom a takeover replaces */

	struct ram_image *image;
	struct epoch_stage *stage;
	struct repl_digest digest;
	uint64_t committed_epoch;
	bool any_commit;
	bool disk_synced;
	bool bulk_done;            /* EPOCH_END 0 seen: no more unstaged pages */
	char disk_path[PATH_MAX];
	int disk_fd;               /* -1 until DISK_BASE said how to open it */
	uint64_t disk_size;
	/* The disk's base (replica_disk_base.c). */
	struct disk_changes *changes; /* the file's change log, until sealed */
	uint64_t disk_generation;  /* the generation the primary's copy starts */
	bool disk_resync;          /* only changed extents are copied */
	char disk_base_reason[400];
	uint8_t *discarded_bits;   /* extents a takeover's discarded epoch wrote */
	struct image_flush *seal_flush; /* the file's flush on a worker; the seal follows */
	int64_t last_heard_us;
	int64_t max_silence_ms;    /* longest gap between the primary's heartbeats */
	int64_t stream_max_silence_ms; /* longest quiet TCP stream, as the loop saw it */
	uint64_t epochs_committed;
	struct replica_checksums checksums; /* image-checksums */

	/*
	 * Coded pages (PAGES_CODED).  A page that does not reproduce its
	 * checksum, a disk reference that does not verify and a kind we
	 * cannot decode are asked for again (PAGE_REQUEST); the epoch is
	 * committed and acknowledged only once every such page came back
	 * (PAGE_RESEND), and frames of later epochs wait in `deferred`.
	 */
	const struct page_decoder *decoder;
	struct page_fixup *fixups;   /* pages of the open epoch still to fill */
	size_t fixup_count, fixup_cap;
	size_t requests_outstanding; /* pages asked for, not yet resent */
	bool epoch_waiting;          /* EPOCH_END checked; waiting for resends */
	struct repl_epoch_end waiting_end;
	struct buffer deferred;      /* raw frames that came after it */
	struct {
		uint64_t checksum_mismatches, undecodable, disk_refs, disk_ref_fallbacks;
		uint64_t page_requests, page_resends, deferred_frames, epochs_waited;
		uint64_t device_deltas; /* device blobs received as DEVICE_DELTA */
	} coded;

	/*
	 * Commit protection's flow positions, and after a takeover the
	 * resets of the flows whose clients are ahead (takeover_flows.c).
	 */
	struct replica_flows *flows;
	struct flow_reset *resets;
	struct flow_reset_stats reset_stats; /* kept when the engine ends */
	bool resets_done;
	long long reset_timer;
	int reset_ticks;
	int64_t resets_started_us;

	/* failover */
	struct witness_async *witness;
	struct fence *fence;       /* the fencing command while it runs */
	bool fence_done;           /* the takeover's fence ended (or there is none) */
	int takeover_flush_err;    /* the takeover's flush: -1 while it runs, else an errno or 0 */
	long long timer;
	double lost_at_unix;
	int64_t lost_at_us;
	int64_t detected_after_ms; /* silence before we declared the primary dead */
	int64_t takeover_started_us;
	int64_t qemu_spawned_us;
	int64_t restore_done_us;
	int64_t resumed_us;
	double resumed_at_unix;
	int incoming_fd;
	int connect_attempts;
	struct restore_stream *restore;
	struct buffer restore_out;
	bool restore_produced;
	/* --restore lazy: the image served by postcopy while the VM runs. */
	struct postcopy_fork *lazy_fork;
	struct postcopy_session *lazy;
	long long lazy_end_timer;
	int64_t lazy_done_us;
	bool lazy_ok;
	bool lazy_fell_back;       /* QEMU failed it before the guest did anything: eager */
	pid_t qemu_pid;            /* the takeover's QEMU */
	struct postcopy_session_stats lazy_stats;
	/* A fork from the committed image (replica_fork.c), and when the
	 * recently-committed pages it pushes first last rotated. */
	struct vm_fork *fork;
	int64_t recent_rotated_us;
	int64_t idle_since_us;     /* replica_retire.c; 0 while in use */
	/* Sockets live here: sun_path (108) minus "/qmp-daemon.sock". */
	char run_dir[90];
	struct replica *next;
};

/* The takeover's sockets (the longest: "/qmp-daemon.sock") fit in sun_path. */
_Static_assert(sizeof(((struct replica *)0)->run_dir) + sizeof("/qmp-daemon.sock") - 1 <=
	       VM_SOCKET_PATH_MAX, "run_dir leaves room for the socket names");

/* replication_server.c: drops the primary's connection, if any. */
void replica_detach_session(struct replica *r, const char *why);

/* failover.c */
/*
 * The primary is gone (why), or the operator asked for a takeover while
 * it is still connected: arbitrate, then take over if we win.  The
 * connection, if any, is dropped only after winning, so that the primary
 * cannot win a race it started by noticing the close.
 */
void replica_primary_lost(struct replica *r, const char *why);
/* Stops any failover in progress (daemon shutdown). */
void replica_failover_cleanup(struct replica *r);

/* replica_disk_base.c: the disk replica's file and its generation. */
int replica_default_disk_path(const struct replica *r, char *path, size_t len, char *err,
			      size_t errlen);
/*
 * A VM defined here whose QEMU is gone, that the primary now protects
 * back to us: its definition is removed and its disk (path) becomes the
 * replica's file.  0, or -1 with err.
 */
int replica_absorb_stopped_vm(struct vm_registry *vms, struct vm *vm, char *path, size_t len,
			      char *err, size_t errlen);
/* Records the staged disk ranges of the epoch a takeover is about to discard. */
void replica_note_discarded(struct replica *r);
/*
 * Starts flushing the replica file on a worker (r->seal_flush); done runs
 * on the loop.  0, or -1 with err.
 */
int replica_start_disk_flush(struct replica *r, image_flush_done done, char *err,
			     size_t errlen);
/*
 * A takeover, once that flush succeeded: the file becomes the generation
 * the copy started, with the discarded extents marked, and the log is
 * closed.  0, or -1 (logged; the file then vouches for nothing).
 */
int replica_seal_disk_at_takeover(struct replica *r);
/*
 * An orderly goodbye while READY leaves a whole copy: the file is flushed
 * on a worker and then sealed the same way, without the discarded marks.
 */
void replica_seal_disk_after_goodbye(struct replica *r);
/*
 * For replica_free: a goodbye's flush still running is waited for and
 * its seal made; an abandoned takeover's is waited for without one.
 */
void replica_seal_disk_finish(struct replica *r);
json_t *replica_disk_base_json(const struct replica *r);
json_t *replica_failover_json(const struct replica *r);

/* takeover_flows.c */
/* The VM's relay exists here: reset the flows that must be, client side first. */
void replica_flows_takeover_begin(struct replica *r);
/* Ends a lazy restore still serving pages (failover.c); no-op otherwise. */
void replica_lazy_restore_stop(struct replica *r);
/* The restored guest runs: its side of the resets. */
void replica_flows_guest_running(struct replica *r);
/* The relay back to pass-through (also at shutdown). */
void replica_flows_takeover_end(struct replica *r);
json_t *replica_flows_json(const struct replica *r);

/* replica_retire.c: when it goes by itself ({idle_s, retired_in_s}) or null. */
json_t *replica_retire_json(const struct replica *r);

/* replica_fork.c */
/* Before and after each commit: the fork's disk snapshot, the recent pages. */
void replica_fork_before_commit(struct replica *r);
void replica_fork_after_commit(struct replica *r);
/* The taken-over VM's export writes the disk replica from now on. */
void replica_fork_taken_over(struct replica *r);
/* The replica goes (freed): its fork with it. */
void replica_fork_end(struct replica *r);

#endif
