/*
 * The primary's checkpoint source: where the VM's RAM pages and device
 * state come from, epoch by epoch.  The rest of remusdbd sees only this
 * interface (open, a stream of events per epoch, backpressure, abandon),
 * because the source behind it may change: today it is QEMU 7.2's COLO
 * migration (colo_capture.c), and QEMU's maintainers have discussed
 * deprecating COLO, so a checkpoint mode of our own may replace it.
 *
 * Epochs: the bulk copy is epoch 0; checkpoint k (1-based) is epoch k.
 * Everything runs on the daemon's event loop, and every event is called
 * from it.  The owner may call checkpoint_source_abandon() and
 * checkpoint_source_destroy() from inside any event callback; the source
 * then stops at once and calls nothing more.
 *
 * Pages are handed over as they are parsed and are only valid during the
 * call: the source stores nothing, so the VM's pause (REPLY -> LOADED) is
 * just the time to read the socket and run the callbacks.
 */
#ifndef REMUSDB_CHECKPOINT_SOURCE_H
#define REMUSDB_CHECKPOINT_SOURCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qemu/colo_stream.h"
#include "base/event_loop.h"

struct qmp_client;
struct checkpoint_source;

/* x-checkpoint-delay bounds we accept (ms). */
#define CHECKPOINT_SOURCE_MIN_INTERVAL_MS 25
#define CHECKPOINT_SOURCE_MAX_INTERVAL_MS 500

struct checkpoint_stats {
	uint64_t epoch;
	uint64_t pages;        /* full pages in this checkpoint */
	uint64_t zero_pages;
	uint64_t device_bytes; /* VMSTATE_SIZE */
	uint64_t stream_bytes; /* CHECKPOINT_REQUEST through the device state */
	/* REPLY sent -> LOADED sent: QEMU's stop, the transfer to us, and our answer. */
	int64_t pause_us;
	/* Two parts of the pause (migration/colo.c, colo_do_checkpoint_transaction),
	 * each ending when our event loop reads QEMU's message, so each holds
	 * the wait for the loop's turn in progress too (loop_turns.h):
	 * REPLY sent -> VMSTATE_SEND read, QEMU stopping the VM; */
	int64_t stop_us;
	/*
	 * VMSTATE_SEND read -> the first page read (VMSTATE_SIZE when the
	 * checkpoint has none): QEMU saving the device state into its buffer,
	 * then ram_save_complete's dirty-bitmap sync, the part that walks all
	 * of guest RAM.  The device state is written after the pages, so
	 * nothing of the checkpoint reaches us in between.
	 */
	int64_t sync_us;
	/* REQUEST received -> REPLY sent (backpressure). */
	int64_t request_wait_us;
	/*
	 * CLOCK_REALTIME (wall_clock_us) just before LOADED was sent, to compare
	 * with QEMU's RESUME (primary/checkpoint_resume.h); 0 when LOADED
	 * was held (checkpoint_source_hold_next) and the VM stays paused.
	 */
	int64_t loaded_wall_us;
};

/* Every callback is optional (may_checkpoint NULL always allows). */
struct checkpoint_source_events {
	void *opaque;
	/*
	 * Once, in the bulk stream, before its first page: the block list of
	 * the MEM_SIZE record (a block's index is its position) and the ram
	 * section id (a restore stream must reuse it).
	 */
	void (*on_ram_layout)(void *opaque, const char *machine_type,
			      uint32_t ram_section_id,
			      const struct colo_ram_block *blocks, size_t count);
	/*
	 * A page of `epoch` (0 = bulk).  data NULL = zero page, else 4096
	 * bytes.  block = index in the layout; page_index = offset / 4096.
	 * In the bulk a page may come more than once: the last one wins.
	 */
	void (*on_page)(void *opaque, uint64_t epoch, unsigned block,
			uint64_t page_index, const uint8_t *data);
	/* Bulk complete: CHECKPOINT_READY was sent. */
	void (*on_bulk_done)(void *opaque);
	/*
	 * VMSTATE_SEND of checkpoint `epoch` (1, 2, ...) arrived: the VM is
	 * stopped.  The network queue is cut here: frames read after this
	 * call belong to epoch + 1.
	 */
	void (*on_checkpoint_begin)(void *opaque, uint64_t epoch);
	/* The checkpoint's device state, in order: bytes [offset, offset + n) of total. */
	void (*on_device_chunk)(void *opaque, uint64_t epoch, uint64_t total,
				uint64_t offset, const uint8_t *d, size_t n);
	/* All of the checkpoint is in: RECEIVED and LOADED were queued to QEMU, the VM resumes. */
	void (*on_checkpoint_end)(void *opaque, const struct checkpoint_stats *st);
	/*
	 * The stream failed or QEMU went away (why says so).  The source is
	 * dead; the owner calls checkpoint_source_abandon/destroy.
	 */
	void (*on_failed)(void *opaque, const char *why);
	/*
	 * Asked at each CHECKPOINT_REQUEST: false holds the checkpoint back
	 * (the VM keeps running and QEMU waits for our REPLY) until the owner
	 * calls checkpoint_source_kick() and this returns true.
	 */
	bool (*may_checkpoint)(void *opaque);
};

struct checkpoint_source_config {
	const char *vm_name;     /* for log lines */
	const char *listen_path; /* unix socket we serve; QEMU migrates to unix:<listen_path> */
	unsigned interval_ms;    /* x-checkpoint-delay, 25..500 */
	/*
	 * The daemon's QMP client for this VM, already created (it may still
	 * be connecting); borrowed.  NULL skips every QMP command: the source
	 * only listens, and whoever connects is taken for QEMU (tests, or a
	 * migration started by hand).
	 */
	struct qmp_client *qmp;
	/*
	 * The owner's backlog limit in the bulk phase.  The owner pauses the
	 * source (checkpoint_source_set_bulk_paused) when its backlog exceeds
	 * this; the source reads at most a quarter of it (64..256 KiB) per
	 * wakeup in the bulk so that the overshoot stays small.  0: 256 KiB.
	 */
	size_t bulk_high_water;
	/*
	 * How long to wait for QEMU's previous migration to end (its yank
	 * instance to go) before migrating: colo_capture_qmp.c says why.
	 * 0: CHECKPOINT_SOURCE_PREVIOUS_MIGRATION_WAIT_MS.
	 */
	unsigned previous_migration_wait_ms;
};

#define CHECKPOINT_SOURCE_PREVIOUS_MIGRATION_WAIT_MS 10000u

/*
 * Listens on listen_path, then over QMP (unless qmp is NULL), one command
 * after the other: query-yank until QEMU's previous migration has ended,
 * migrate-set-capabilities x-colo on (return-path off:
 * COLO reads our replies from the same socket), migrate-set-parameters
 * x-checkpoint-delay, migrate uri unix:<listen_path>.  A refused command
 * fails the source (on_failed, later, with QEMU's error text).  Returns
 * NULL with a message in err for a bad config or when it cannot listen.
 */
struct checkpoint_source *checkpoint_source_open(event_loop *loop,
						 const struct checkpoint_source_config *cfg,
						 const struct checkpoint_source_events *ev,
						 char *err, size_t errlen);

/*
 * Holds the VM paused at the end of the next checkpoint: QEMU gets
 * VMSTATE_RECEIVED but not VMSTATE_LOADED, so it keeps the VM stopped,
 * until checkpoint_source_release().  on_checkpoint_end fires as usual.
 * For a consistency check that must read the guest's memory exactly as
 * that checkpoint left it (QMP still works: QEMU waits for LOADED without
 * its big lock).  0, or -1 when a hold is armed or held already or the
 * source is dead.
 */
int checkpoint_source_hold_next(struct checkpoint_source *src);
/* Sends the held LOADED (the VM resumes), or disarms an armed hold. */
void checkpoint_source_release(struct checkpoint_source *src);
/* The checkpoint whose LOADED is held, or 0. */
uint64_t checkpoint_source_held_epoch(const struct checkpoint_source *src);

/* Asks may_checkpoint again for a held CHECKPOINT_REQUEST; no-op otherwise. */
void checkpoint_source_kick(struct checkpoint_source *src);

/*
 * Bulk-phase flow control: while paused the source stops reading the
 * socket (QEMU blocks, the VM runs on).  A chunk being parsed when the
 * pause comes is finished first.  Ignored outside the bulk phase: inside
 * a checkpoint the VM is stopped, so everything is read at once.
 */
void checkpoint_source_set_bulk_paused(struct checkpoint_source *src, bool paused);

/*
 * Ends protection: closes the stream and, if the migration was started,
 * issues QMP x-colo-lost-heartbeat so that QEMU leaves COLO and the VM
 * runs on (otherwise QEMU waits forever, paused if mid-checkpoint).  Safe
 * in any state, also after on_failed; no event is called afterwards.
 */
void checkpoint_source_abandon(struct checkpoint_source *src);

/* Closes everything without the QMP command (fencing: the VM must not run on). */
void checkpoint_source_destroy(struct checkpoint_source *src);

/*
 * "waiting-for-qemu", "bulk", "running" (between checkpoints),
 * "checkpoint", "held" (a REQUEST held by may_checkpoint), "failed",
 * "abandoned".
 */
const char *checkpoint_source_state(const struct checkpoint_source *src);
/* The last completed checkpoint (0 before the first). */
uint64_t checkpoint_source_epoch(const struct checkpoint_source *src);
/*
 * QEMU finished the bulk copy and went into COLO.  Leaving COLO
 * (x-colo-lost-heartbeat) then restarts the guest by itself, once its
 * COLO thread is out (migration/migration.c, migration_iteration_finish).
 * True from then on, also after the source failed or was abandoned.
 */
bool checkpoint_source_colo_entered(const struct checkpoint_source *src);
/* Why it failed, or NULL. */
const char *checkpoint_source_error(const struct checkpoint_source *src);
/* Bytes of QEMU's stream parsed so far. */
uint64_t checkpoint_source_stream_offset(const struct checkpoint_source *src);

#endif
