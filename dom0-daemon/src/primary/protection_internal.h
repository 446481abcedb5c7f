/*
 * Internals of the primary side shared by its files.  struct protection
 * holds what every part reads (the VM, its name, the backup, the state,
 * the checkpoint source, output commit and the disk copy); each feature
 * keeps its own fields in a sub-struct that only its file touches, and
 * the others call its functions:
 *
 *   protection.c            lifecycle: start, recover, stop, destroy
 *   protection_link.c       the connection to the backup: handshake,
 *                           heartbeats, the backup's frames (link)
 *   protection_arbiter.c    etcd: the claim, losing the backup (arbiter)
 *   protection_epochs.c     checkpoints shipped as epochs, acks (epochs)
 *   protection_coding.c     the page encoder and read tracking (coding)
 *   protection_stats.c      measures for status and /metrics (stats)
 *   protection_disk_base.c  the failback's resync and change log (disk_base)
 *   protection_verify.c     hold-checkpoint (hold)
 *   protection_reprotect.c  trying a lost backup again (reprotect)
 *   protection_switchover.c a planned switchover, its rules in switchover.c
 *                           (switchover)
 *   protection_status.c     `status` and `reset-stats`
 */
#ifndef REMUSDB_PROTECTION_INTERNAL_H
#define REMUSDB_PROTECTION_INTERNAL_H

#include "qemu/checkpoint_source.h"
#include "codec/dirty_census.h"
#include "primary/disk_copy.h"
#include "primary/checkpoint_pipeline.h"
#include "nbd/read_index.h"
#include "primary/checkpoint_sequencer.h"
#include "wire/heartbeat.h"
#include "primary/output_commit.h"
#include "primary/checkpoint_resume.h"
#include "primary/pause_boost.h"
#include "primary/protection.h"
#include "primary/reprotect_policy.h"
#include "primary/switchover.h"
#include "wire/repl_conn.h"
#include "wire/repl_handshake.h"
#include "wire/repl_proto.h"
#include "base/metrics.h"
#include "base/sample_ring.h"
#include "vm/vm_config.h"
#include "witness/witness_async.h"

/* Held guest output beyond this is dropped like a full NIC queue. */
#define HELD_OUTPUT_MAX (64u << 20)
/* During the bulk RAM copy QEMU is throttled above this backlog. */
#define BULK_HIGH_WATER (64u << 20)
#define BULK_LOW_WATER (16u << 20)
#define WITNESS_RETRY_MS 1000
/*
 * How long `protect` keeps asking etcd for the VM before it fails, and
 * how long it waits between tries: etcd stalls for seconds in a leader
 * election or behind a slow fsync, and a claim that would succeed a
 * moment later must not fail the operator's command.
 */
#define WITNESS_CLAIM_PATIENCE_MS 10000
#define WITNESS_CLAIM_RETRY_MS 500

enum state {
	ST_CLAIMING,    /* etcd: is this VM ours? */
	ST_CONNECTING,
	ST_AUTHENTICATING,
	ST_SYNCING,     /* disk copy and/or first epochs not yet acknowledged */
	ST_PROTECTED,
	ST_ARBITRATING, /* lost the backup: asking etcd */
	ST_UNPROTECTED, /* won, or unprotected by the operator: runs alone */
	ST_FENCED,      /* lost (or could not ask): VM paused */
	ST_FAILED,
};

extern const char *const protection_state_names[];

/* The connection to the backup (protection_link.c). */
struct protection_link {
	struct repl_conn *conn;
	struct heartbeat_link *hb;   /* the backup's liveness, from authentication to close */
	/*
	 * The longest the TCP stream was quiet, as the loop saw it at its
	 * ticks: the measure liveness used before the heartbeat thread,
	 * kept so that status shows both side by side.
	 */
	int64_t stream_max_silence_ms;
	long long connect_timer;
	long long heartbeat_timer;
	struct repl_handshake handshake;
	/*
	 * The backup's protocol versions as its refusal told them, kept for
	 * the one reconnection that offers the version both speak.
	 */
	struct repl_version_range backup_versions;
	unsigned version_retries;
};

/* etcd, the witness (protection_arbiter.c). */
struct protection_arbiter {
	struct witness_async *witness;
	struct witness_ownership ownership; /* what etcd holds, as we know it */
	long long retry_timer;
	bool paused_for_witness; /* we stopped the VM and may resume it */
	long long resume_look_timer; /* QEMU leaves COLO and resumes the guest itself */
	int64_t claim_deadline_us; /* when `protect` stops asking etcd (0: not yet asked) */
	unsigned claim_tries;
};

/* hold-checkpoint: the VM held paused at a checkpoint (protection_verify.c). */
struct protection_hold {
	enum hold_state { HOLD_IDLE, HOLD_ARMED, HOLD_DUMPING, HOLD_HELD,
			  HOLD_RELEASED, HOLD_FAILED } state;
	char dump_path[256];
	uint64_t dump_bytes;
	uint64_t epoch;
	long long timer;          /* releases the VM if nobody does */
	struct hold_call *call;   /* the pmemsave in flight */
	char error[256];
};

/* A planned switchover (protection_switchover.c). */
struct protection_switchover {
	struct switchover steps;
	long long timer;          /* its deadline: the VM resumes here if nobody took it over */
	double requested_at_unix;
};

/* The stream of epochs and their acknowledgements (protection_epochs.c). */
struct protection_epochs {
	/* Both live with the connection (protection_start_replication .. close). */
	struct checkpoint_sequencer *seq;   /* wire order and the epoch digest */
	struct checkpoint_pipeline *pipeline; /* checkpoint pages coded on a worker thread */
	uint64_t last_epoch;         /* last EPOCH_END sent (0 = bulk) */
	uint64_t checkpointed_epoch; /* last checkpoint taken (VM resumed), sent or not */
	bool bulk_sent;
	uint64_t acked_epoch;
	bool any_ack;
	int64_t last_ack_us;
	uint64_t epoch_pages;
	bool request_held;
	uint64_t sync_done_epoch;    /* protected once this epoch is acked */
};

/* The page encoder the pipeline codes with (protection_coding.c). */
struct protection_coding {
	const struct page_encoder *encoder; /* the pipeline's hook (page_coding.h) */
	struct page_encoder *asc;  /* owned: ASC and RT (asc_encoder.h), the encoder once started */
	bool read_tracking;        /* we turned the VM's disk read index on */
	bool compress;             /* ASC on: pages and the device blob are delta-coded */
	struct read_index *rt_index; /* the index we started: a later protection may replace it */
};

/* The pipeline's measures (status "pipeline"); reset-stats clears them. */
struct protection_pipeline_stats {
	struct sample_ring encode_ms;
	struct sample_ring raw_bytes;  /* per epoch: dirty pages * 4096 */
	struct sample_ring page_bytes; /* per epoch: PAGES_CODED frames sent */
	uint64_t raw_bytes_total, page_bytes_total;
	uint64_t raw_bytes_last, page_bytes_last;
	uint64_t kinds[REPL_KIND_COUNT];
	uint64_t page_requests, page_resends;
	struct sample_ring device_raw;  /* per epoch: the device blob's length */
	struct sample_ring device_sent; /* per epoch: its DEVICE/DEVICE_DELTA frames */
	uint64_t device_raw_total, device_sent_total;
};

/* What status and /metrics show of the checkpoints (protection_stats.c). */
struct protection_stats {
	uint64_t dirty_pages_last;
	uint64_t shipped;            /* checkpoints shipped */
	uint64_t backpressure_events;
	struct sample_ring pause_ms;
	/* the pause's parts (checkpoint_source.h): QEMU stopping the VM, its bitmap sync */
	struct sample_ring stop_ms, sync_ms;
	/* QEMU's CHECKPOINT_REQUEST to our REPLY, the guest running: backpressure. */
	struct sample_ring request_wait_ms;
	/*
	 * Our LOADED to QEMU's RESUME, and REPLY to RESUME: the pause as the
	 * guest has it (checkpoint_resume.h); checkpoints whose RESUME was
	 * held, missed or unmeasurable are not in them.
	 */
	struct sample_ring resume_ms, guest_pause_ms;
	struct pause_histogram guest_pause_hist; /* never reset, as pause_hist */
	/* every pause since the protection began, never reset: /metrics' histogram */
	struct pause_histogram pause_hist;
	struct sample_ring epoch_bytes;
	struct sample_ring dirty_pages;
	uint64_t epochs_at_reset;    /* `shipped` when reset-stats last ran */
	struct protection_pipeline_stats pl;
	struct dirty_census census;  /* where the checkpoints' pages come from */
};

/* The disk's base and plan (protection_disk_base.c). */
struct protection_disk_base {
	uint64_t generation;         /* the generation this copy starts */
	bool full_copy_asked;
	bool debug_omit_extent;
	bool planned;                /* DISK_PLAN came: the copy runs */
	bool resync;                 /* only changed extents are sent */
	char plan_reason[REPL_TEXT_MAX + 1];
	int64_t copy_started_us;     /* replication started: the copy with it */
	int64_t protected_us;
	struct file_flush *image_flush; /* the disk flushed before marks clear */
	uint64_t flushed_epoch;      /* acknowledged when the running flush started */
	bool generation_begun;       /* the log names the generation */
	int64_t changes_forgotten_us;
};

/*
 * The time a VM ran unprotected after its backup was lost, carried from
 * the protection that lost it to each re-protection tried after it.
 */
struct reprotect_gap {
	bool open;                /* lost, and not protected again yet */
	int64_t since_us;         /* monotonic */
	double since_unix;        /* the same instant, for people */
	unsigned attempts;        /* tries in this gap */
	char last_error[1024];     /* as long as the protection's own error */
	uint64_t reprotections;   /* gaps a re-protection closed */
	double last_gap_s;        /* the last gap a re-protection closed (reprotections > 0) */
};

/* Trying a lost backup again (protection_reprotect.c). */
struct protection_reprotect {
	struct protect_request req; /* what `protect` asked; req.qemu_argv is referenced */
	bool have_req;              /* false for one recovered after a restart without settings */
	bool restored;              /* its settings came from disk after a restart (this gap's) */
	bool reached_protected;
	bool is_attempt;            /* started by a retry, not by `protect` */
	struct reprotect_notes notes; /* what the connection saw before the ending */
	struct reprotect_gap gap;
	char verdict[256];          /* why nothing retries; "" when something does */
	long long timer;            /* the next try */
	int64_t next_at_us;
	bool probing;               /* a non-blocking connect to the backup is out */
	int probe_fd;
	long long probe_timer;
};

struct protection {
	event_loop *loop;
	const struct repl_settings *settings;
	struct vm *vm;
	char name[VM_NAME_MAX + 1];
	char backup[64];
	unsigned interval_ms;
	bool output_commit;
	struct vm_config config;  /* shipped to the backup once etcd said we own the VM */
	enum state state;
	char error[1024];
	bool unprotect_requested;
	bool stale_colo;          /* recovered after our restart: QEMU may sit in COLO */
	struct checkpoint_source *source;
	struct output_commit *oc;    /* the guest's held output */
	struct disk_copy *disk;      /* NULL after a restart (recovery) */

	struct protection_link link;
	struct protection_arbiter arbiter;
	struct protection_hold hold;
	struct protection_switchover switchover;
	struct protection_epochs epochs;
	struct pause_boost pause_boost;
	struct checkpoint_resume resume; /* the pause's end as the guest sees it */
	struct protection_coding coding;
	struct protection_stats stats;
	struct protection_disk_base disk_base;
	struct protection_reprotect reprotect;
};

/* protection.c */
void protection_set_state(struct protection *p, enum state s);
/* Stops the connect, heartbeat and disk timers and the disk write hook. */
void protection_stop_io(struct protection *p);
/* Sends a QMP command whose reply is only logged. */
void protection_qmp(struct protection *p, const char *cmd);

/* protection_link.c */
/*
 * The handshake's nonce and what it knows of the backup's versions: -1
 * without randomness.
 */
int protection_link_init(struct protection *p);
/* The session's replication protocol version, 0 before the handshake ends. */
uint16_t protection_link_version(const struct protection *p);
/* Connects to the backup; the handshake and the epochs follow from its frames. */
void protection_link_connect(struct protection *p);
/* The connection to the backup, NULL when there is none. */
struct repl_conn *protection_conn(const struct protection *p);
void protection_close_conn(struct protection *p);
/* The connect and heartbeat timers. */
void protection_link_stop_timers(struct protection *p);
/*
 * `unprotect`: BYE queued on the connection, which is taken from p (so
 * that going unprotected does not close it before the BYE is out) and
 * handed back to protection_link_goodbye() to be seen delivered.
 */
struct protection_goodbye {
	struct repl_conn *conn;
	struct heartbeat_link *hb;
};
struct protection_goodbye protection_link_leave(struct protection *p);
void protection_link_goodbye(struct protection_goodbye *bye);
/* The heartbeat link's status, NULL without one; the stream's longest silence. */
json_t *protection_link_heartbeat_json(const struct protection *p);
int64_t protection_link_stream_max_silence_ms(const struct protection *p);
void protection_link_reset_stats(struct protection *p);

/* protection_verify.c */
/* A checkpoint ended: if a hold was armed for it, dump the guest's memory. */
void protection_hold_checkpoint_ended(struct protection *p, uint64_t epoch);
/* Protection ends: a held VM resumes (resume) or stays paused (a fence). */
void protection_hold_end(struct protection *p, bool resume);
json_t *protection_hold_json(const struct protection *p);

/* protection_switchover.c */
/* A checkpoint ended: the switchover's hold?  true: do not ship it (the negative control). */
bool protection_switchover_checkpoint_ended(struct protection *p, uint64_t epoch);
void protection_switchover_acked(struct protection *p, uint64_t epoch);
/* etcd named another host when this one asked (it fenced itself just before). */
void protection_switchover_owner_moved(struct protection *p, const struct witness_ownership *now);
/* The protection ended another way (why): a switchover in progress failed. */
void protection_switchover_ended(struct protection *p, const char *why);
/* Before the protection is freed. */
void protection_switchover_end(struct protection *p);
json_t *protection_switchover_json(const struct protection *p);

/* protection_arbiter.c */
/* Opens the witness; ownership: what etcd held for a recovered protection, or NULL. */
int protection_arbiter_open(struct protection *p, const struct witness_ownership *ownership,
			    char *err, size_t errlen);
/* Asks etcd whether the VM is ours; the connection follows. -1: cannot ask. */
int protection_claim(struct protection *p);
/* Stops the VM until etcd answers (once). */
void protection_pause_for_witness(struct protection *p);
uint64_t protection_arbiter_generation(const struct protection *p);
/* Stops asking etcd and closes the witness. */
void protection_arbiter_end(struct protection *p);
/* The VM leaves COLO and runs on; its held output goes out. */
void protection_go_unprotected(struct protection *p, const char *why);
/* Before the backup had anything: nothing to arbitrate, just stop. */
void protection_fail(struct protection *p, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* The backup is gone (closed, silent, or refused): ask etcd who runs the VM. */
void protection_backup_lost(struct protection *p, const char *why);
void protection_arbitrate(struct protection *p);

/* protection_pause.c: each checkpoint's pause, from our REPLY to QEMU's RESUME */
/* Our REPLY is going: QEMU stops the guest on reading it. */
void protection_pause_begins(struct protection *p);
/* The checkpoint's stream ended, LOADED sent or held (st->loaded_wall_us 0). */
void protection_pause_loaded(struct protection *p, const struct checkpoint_stats *st);
/* The checkpoints stop: the boost ends, no RESUME is waited for. */
void protection_pause_stop(struct protection *p);
/* QEMU's events, through the VM (protection_attach.c). */
void protection_on_qmp_event(struct protection *p, const char *event, int64_t qemu_time_us);

/* protection_epochs.c */
/* Starts the disk copy and checkpointing once the backup took VM_CONFIG. */
void protection_start_replication(struct protection *p);
void protection_on_ack(struct protection *p, uint64_t epoch);
/* Un-throttles the bulk RAM copy once the backlog is low again. */
void protection_resume_bulk(struct protection *p);
/* What the disk copy tells p (the write tag, its end, its failures). */
struct disk_copy_events protection_disk_events(struct protection *p);
/* PAGE_REQUEST from the backup: PAGE_RESEND, or -1 after ending the link. */
int protection_on_page_request(struct protection *p, const struct repl_frame *f);
/* Stops the pipeline (joins its thread) and drops the sequencer. */
void protection_stop_pipeline(struct protection *p);
/* The last EPOCH_END sent (0: the bulk's, or none yet). */
uint64_t protection_last_epoch(const struct protection *p);
/* Where the epochs stand, for status. */
struct protection_epoch_progress {
	uint64_t sent;          /* last EPOCH_END */
	uint64_t acked;
	uint64_t in_flight;     /* checkpointed or sent, not acknowledged */
	bool any_ack;
	int64_t last_ack_us;
	unsigned encoding;      /* epochs on the pipeline's worker */
	size_t held_for_order;  /* bytes in the sequencer's outboxes */
	uint64_t pipeline_bytes, pipeline_peak_bytes; /* checkpoint_pipeline_memory() */
};
struct protection_epoch_progress protection_epoch_progress(const struct protection *p);

/* protection_coding.c */
/* The default encoder until protection_coding_start(). */
void protection_coding_init(struct protection *p);
/* The RemusDB optimizations the request asked for: ASC and RT. */
int protection_coding_start(struct protection *p, const struct protect_request *req,
			    char *err, size_t errlen);
/* After the pipeline's worker is joined: frees the encoder, stops our read index. */
void protection_coding_end(struct protection *p);
const struct page_encoder *protection_coding_encoder(const struct protection *p);
bool protection_coding_compress(const struct protection *p);
/* Sizes the compression cache to the guest's RAM; -1 out of memory. */
int protection_coding_set_guest_ram(struct protection *p, uint64_t guest_ram);
/* From epoch on, pages may go as references to the backup's disk. */
void protection_coding_allow_disk_refs_from(struct protection *p, uint64_t epoch);
void protection_coding_reset_stats(struct protection *p);
/* The encoder's own members of status "pipeline". */
void protection_coding_status(const struct protection *p, json_t *o);

/* protection_stats.c */
void protection_stats_backpressure(struct protection *p);
void protection_stats_epoch_sent(struct protection *p, uint64_t bytes);
void protection_stats_layout(struct protection *p, const char *const *names,
			     const uint64_t *lengths, size_t count);
void protection_stats_page(struct protection *p, unsigned block, uint64_t page_index, bool zero);
void protection_stats_checkpoint(struct protection *p, const struct checkpoint_stats *st);
/* A checkpoint's RESUME: LOADED -> RESUME, and REPLY -> RESUME (the guest's pause). */
void protection_stats_resume(struct protection *p, int64_t resume_us, int64_t guest_pause_us);
/* The guest's pauses since the protection began (/metrics' histogram). */
json_t *protection_stats_guest_histogram_json(const struct protection *p);
void protection_stats_encoded(struct protection *p, const struct checkpoint_job_stats *st);
void protection_stats_page_request(struct protection *p);
void protection_stats_page_resent(struct protection *p);
void protection_stats_reset(struct protection *p);
void protection_stats_end(struct protection *p);
/* The measures status shows among its first members. */
struct protection_stats_summary {
	double pause_ms_p50, pause_ms_p99;
	double bytes_per_epoch_mean;
	uint64_t dirty_pages_last;
	uint64_t epochs;
	uint64_t backpressure_events;
};
struct protection_stats_summary protection_stats_summary(const struct protection *p);
/* dirty_pages_per_epoch_*, dirty_census and epochs_since_reset, added to o. */
void protection_stats_dirty_json(const struct protection *p, json_t *o);
json_t *protection_stats_pipeline_json(const struct protection *p);
json_t *protection_stats_histogram_json(const struct protection *p);
/* The pause's parts, p50 and p99 of each: status' "pause_parts". */
json_t *protection_stats_pause_parts_json(const struct protection *p);

/* protection_reprotect.c: trying a lost backup again, see there. */
/* The settings `protect` gave, for a later re-protection.  -1: out of memory. */
int protection_reprotect_keep(struct protection *p, const struct protect_request *req);
/* The settings kept were read back after a restart: a gap opens now. */
void protection_reprotect_restored(struct protection *p);
/* The protection reached PROTECTED: a gap closes. */
void protection_reprotect_protected(struct protection *p);
/* What a connection-phase failure was, noted before protection_fail. */
void protection_reprotect_note_unreachable(struct protection *p);
/* The backup refused: its ERROR code, or 0 when the handshake failed. */
void protection_reprotect_note_refused(struct protection *p, uint16_t code);
/* The protection ended (after its state changed): retry later, or say why not. */
void protection_reprotect_ended(struct protection *p, enum protection_end end);
/* Timers, the probe and the kept settings go (protection_destroy). */
void protection_reprotect_end(struct protection *p);
json_t *protection_reprotect_json(const struct protection *p);

/* protection_disk_base.c: the failback's resync, see there. */
int protection_disk_base_start(struct protection *p, const struct protect_request *req,
			       char *err, size_t errlen);
void protection_disk_base_end(struct protection *p);
int protection_send_disk_base(struct protection *p, struct buffer *out);
/* 0, or -1 with why: the backup broke the protocol. */
int protection_on_disk_plan(struct protection *p, const struct repl_frame *f, char *why,
			    size_t whylen);
/* Replication starts now: the disk copy's time counts from here. */
void protection_disk_base_copy_starts(struct protection *p);
void protection_disk_base_acked(struct protection *p, uint64_t epoch, bool now_protected);
json_t *protection_disk_copy_json(const struct protection *p);

#endif
