/*
 * The primary's checkpoint pipeline: an epoch's dirty pages are only
 * copied while the VM is paused, and coded into PAGES_CODED frames on one
 * worker thread after it resumed.
 *
 * Why: the pause is what the guest pays for every checkpoint, so nothing
 * in it may cost more than a memcpy.  Coding (XOR+RLE, LZ4, disk
 * references: page_coding.h) can take milliseconds per epoch and runs
 * afterwards, on its own thread, while the event loop carries on.
 *
 * Life of a job, all calls on the event loop:
 *   open (at the checkpoint's start) -> add_page/add_device (during the
 *   pause: copies into a chunked arena kept between epochs) -> submit
 *   (the VM resumed) -> the worker codes it, jobs strictly in submission
 *   order, and wakes the loop through an eventfd -> on_encoded(job) on the
 *   loop -> the job stays, with its raw pages, until its epoch is
 *   acknowledged (checkpoint_pipeline_acked), so that a PAGE_REQUEST can be
 *   answered from it.  Nothing on the loop ever waits for the worker.
 */
#ifndef REMUSDB_CHECKPOINT_PIPELINE_H
#define REMUSDB_CHECKPOINT_PIPELINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buffer.h"
#include "base/event_loop.h"
#include "codec/page_coding.h"
#include "wire/repl_proto.h"

/* PAGES_CODED frames are cut at this payload (a heartbeat never waits long behind one). */
#define CHECKPOINT_PIPELINE_FRAME_MAX (1u << 20)

struct checkpoint_job_stats {
	uint64_t pages;          /* page records, zero pages included */
	uint64_t raw_bytes;      /* pages * 4096: what plain Remus would send */
	uint64_t page_bytes;     /* PAGES_CODED frames, headers included */
	uint64_t device_raw_bytes; /* the device blob's length */
	uint64_t device_bytes;   /* DEVICE or DEVICE_DELTA frames, headers included */
	uint64_t kinds[REPL_KIND_COUNT];
	int64_t encode_us;       /* the worker's time on this job */
};

struct checkpoint_job;
struct checkpoint_pipeline;

/* On the loop, in submission order.  The job belongs to the pipeline. */
typedef void (*epoch_encoded_fn)(void *opaque, struct checkpoint_job *job);

/*
 * Starts the worker thread.  enc is copied (its ctx is borrowed).  NULL
 * with err filled when the thread or eventfd cannot be created.
 */
struct checkpoint_pipeline *checkpoint_pipeline_create(event_loop *loop,
						       const struct page_encoder *enc,
						       epoch_encoded_fn on_encoded, void *opaque,
						       char *err, size_t errlen);
/*
 * Stops the worker (it gives up the epoch it codes within 256 pages),
 * joins it and frees every job, delivered or not.  Safe from inside
 * on_encoded.  NULL: no-op.
 */
void checkpoint_pipeline_destroy(struct checkpoint_pipeline *pl);
/* "code:VM" (15 characters at most) in ps -L and top -H: whose coding takes the CPU. */
void checkpoint_pipeline_name_thread(struct checkpoint_pipeline *pl, const char *vm_name);

/* Opens epoch's job (the previous open one must have been submitted). 0 or -1. */
int checkpoint_pipeline_open(struct checkpoint_pipeline *pl, uint64_t epoch);
/* A page of the open job: data NULL for a zero page.  0 or -1 (ENOMEM, no open job). */
int checkpoint_pipeline_add_page(struct checkpoint_pipeline *pl, unsigned block, uint64_t page_index,
				 const uint8_t *data);
/*
 * The next chunk of the open job's device state (chunks come in order,
 * offset is where the last one ended); 0, or -1 (none open, a chunk out
 * of order, out of memory).
 */
int checkpoint_pipeline_add_device(struct checkpoint_pipeline *pl, uint64_t total, uint64_t offset,
				   const uint8_t *d, size_t n);
/*
 * Device state as a DEVICE_DELTA against the previous epoch's blob (the
 * first epoch's goes whole).  Call before the first job is submitted.
 */
void checkpoint_pipeline_delta_device(struct checkpoint_pipeline *pl, bool on);
/* Hands the open job to the worker. 0 or -1 (none open). */
int checkpoint_pipeline_submit(struct checkpoint_pipeline *pl);
/* Jobs submitted whose on_encoded has not run yet. */
unsigned checkpoint_pipeline_encoding(const struct checkpoint_pipeline *pl);
/*
 * The bytes the pipeline has allocated now (raw pages held until their
 * epoch is acknowledged, coded frames, pooled jobs, the device blobs),
 * and in *peak (unless NULL) the most it ever had.  Read on the loop
 * while the worker codes: the worker's last job is counted once coded.
 */
uint64_t checkpoint_pipeline_memory(const struct checkpoint_pipeline *pl, uint64_t *peak);

uint64_t checkpoint_job_epoch(const struct checkpoint_job *job);
/* NULL when the job coded fine, else why not. */
const char *checkpoint_job_error(const struct checkpoint_job *job);
/* The job's frames, valid until it is released: PAGES_CODED, then DEVICE. */
const uint8_t *checkpoint_job_frames(const struct checkpoint_job *job, size_t *len);
const struct checkpoint_job_stats *checkpoint_job_stats(const struct checkpoint_job *job);

/*
 * The raw page as the epoch left it (the last copy when it came twice):
 * 1 with *page (NULL for a zero page), or 0 when the epoch is not held
 * (unknown or acknowledged) or did not carry that page.
 */
int checkpoint_pipeline_find_page(const struct checkpoint_pipeline *pl, uint64_t epoch,
				  unsigned block, uint64_t page_index, const uint8_t **page);
/* Frees the raw pages of every coded epoch <= epoch. */
void checkpoint_pipeline_acked(struct checkpoint_pipeline *pl, uint64_t epoch);

#endif
