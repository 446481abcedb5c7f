/*
 * The primary's network output commit buffer (Remus): every frame the
 * guest sends while protected is held here, tagged with the epoch it
 * belongs to, and released in order once the backup acknowledged that
 * epoch.  No frame may reach the LAN before the checkpoint that produced
 * it is safe, or a failover could resume a guest that "forgets" what the
 * world already saw.
 *
 * Why a FIFO of variable-size records in a list of chunks: frames arrive
 * and leave strictly in order, so appending at the tail and consuming at
 * the head of 128 KiB chunks makes push and release O(1) per frame with
 * about one allocation per 128 KiB of traffic instead of one per frame;
 * a spare chunk is kept so a steady stream allocates nothing.
 *
 * Why drop on overflow: holding is bounded by max_bytes (frame bytes).  A
 * frame that does not fit is dropped and counted, like a full NIC queue;
 * TCP retransmits it and other protocols tolerate loss anyway.
 */
#ifndef REMUSDB_OUTPUT_QUEUE_H
#define REMUSDB_OUTPUT_QUEUE_H

#include <stddef.h>
#include <stdint.h>

struct output_queue;

struct output_queue_stats {
	uint64_t frames_held;             /* now */
	uint64_t bytes_held;              /* now, frame bytes */
	uint64_t frames_released;         /* handed to a sink, ever */
	uint64_t frames_dropped_overflow; /* refused by push: over max_bytes */
	uint64_t frames_discarded;        /* thrown away by drop_all */
	uint64_t max_bytes_held;          /* high-water mark of bytes_held */
};

/* max_bytes bounds the frame bytes held at once.  NULL when out of memory. */
struct output_queue *output_queue_create(size_t max_bytes);
void output_queue_destroy(struct output_queue *q); /* NULL is a no-op */

/*
 * Holds a copy of frame (1..UINT32_MAX bytes) as part of `epoch`.  Epochs
 * must not decrease between pushes (drop_all starts over).  Returns 0
 * when held, 1 when dropped because max_bytes would be exceeded, -1 for a
 * decreasing epoch or an empty frame (a caller bug; nothing is held) or
 * when out of memory (errno ENOMEM).
 */
int output_queue_push(struct output_queue *q, uint64_t epoch,
		      const uint8_t *frame, size_t len);

/*
 * Receives one released frame (valid only during the call).  Returns 0 to
 * go on; nonzero stops the release with this frame still held at the head
 * (for a sink that cannot take more now), to be retried by the next
 * release.
 */
typedef int (*output_queue_sink)(void *opaque, const uint8_t *frame, size_t len);

/*
 * Hands every held frame with epoch <= upto_epoch to sink, oldest first,
 * and forgets it.  Returns how many were released.
 */
size_t output_queue_release(struct output_queue *q, uint64_t upto_epoch,
			    output_queue_sink sink, void *opaque);

/*
 * Fencing: discards everything held and returns how many frames that
 * was.  The epoch order starts over: a new protection run may count from
 * 1 again.
 */
size_t output_queue_drop_all(struct output_queue *q);

void output_queue_get_stats(const struct output_queue *q,
			    struct output_queue_stats *out);

#endif
