/*
 * The primary's wire order: every covered frame of epoch N (its disk
 * writes, pages and device state) reaches the connection before
 * EPOCH_END N, and N's before N+1's, although N's pages are still being
 * coded (checkpoint_pipeline.h) while the guest already writes to its disk in
 * epoch N+1.
 *
 * Each epoch not yet ended on the wire has an outbox.  Frames of the
 * epoch at the head (nothing older pending) go straight to the
 * connection, as they did before the pipeline; frames of a younger epoch
 * wait in its outbox and follow the head's EPOCH_END.  The epoch digest
 * (repl_digest) is fed the frames in exactly the order they reach the
 * connection, and EPOCH_END is built when its epoch's turn comes.
 *
 * Epoch 0 is the bulk copy, streamed at the head.  While it is at the
 * head, frames tagged 1 go straight to the connection too: the backup
 * stages epoch 1 from the start, so they are valid before EPOCH_END 0 and
 * the disk copy is not held back behind the RAM copy.
 *
 * Everything runs on the event loop.
 */
#ifndef REMUSDB_CHECKPOINT_SEQUENCER_H
#define REMUSDB_CHECKPOINT_SEQUENCER_H

#include <stddef.h>
#include <stdint.h>

#include "base/buffer.h"
#include "wire/repl_proto.h"

struct checkpoint_sequencer_io {
	void *opaque;
	/* The connection's outgoing queue. */
	struct buffer *(*wire)(void *opaque);
	/* Something was appended to it. */
	void (*flush)(void *opaque);
	/* EPOCH_END e was just appended (optional: statistics, last epoch). */
	void (*on_epoch_end)(void *opaque, const struct repl_epoch_end *e);
};

struct checkpoint_sequencer;

/* Starts with epoch 0 (the bulk copy) at the head and epoch 1 open. NULL: out of memory. */
struct checkpoint_sequencer *checkpoint_sequencer_create(const struct checkpoint_sequencer_io *io);
void checkpoint_sequencer_destroy(struct checkpoint_sequencer *seq); /* NULL: no-op */

/*
 * Where whole frames of `epoch` (the open epoch, or 0 during the bulk
 * copy) go now: the connection or the epoch's outbox.  Append, then call
 * checkpoint_sequencer_appended with the buffer_len() taken before.  NULL for
 * an epoch that takes no frames now.
 */
struct buffer *checkpoint_sequencer_buffer(struct checkpoint_sequencer *seq, uint64_t epoch);
/* 0, or -1 when the appended bytes are not whole frames. */
int checkpoint_sequencer_appended(struct checkpoint_sequencer *seq, uint64_t epoch, size_t before);

/* Checkpoint `epoch` began (the open epoch): epoch + 1 opens.  0 or -1. */
int checkpoint_sequencer_cut(struct checkpoint_sequencer *seq, uint64_t epoch);
/*
 * The rest of `epoch` (its coded pages and device state, whole frames;
 * len 0 for none) and its page count: EPOCH_END follows as soon as every
 * older epoch's is out.  Epoch 0 ends without a cut.  0 or -1 (not an
 * epoch waiting to end, bad frames, out of memory).
 */
int checkpoint_sequencer_end(struct checkpoint_sequencer *seq, uint64_t epoch, const uint8_t *frames,
			     size_t len, uint64_t pages);

/* Bytes waiting in outboxes (not yet on the connection). */
size_t checkpoint_sequencer_held(const struct checkpoint_sequencer *seq);
/* The epoch whose frames go to the connection now. */
uint64_t checkpoint_sequencer_head(const struct checkpoint_sequencer *seq);

#endif
