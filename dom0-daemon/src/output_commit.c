/* Output commit: the epoch cut and the release rule for held guest frames (output_commit.h). */
#include "output_commit.h"

#include <stdlib.h>
#include <string.h>

struct output_commit {
	struct epoch_queue *held;
	uint64_t open_epoch;
	uint64_t acked;          /* the last epoch acknowledged (0: none) */
	bool dropping;
	bool unsafe_release_early;
	uint64_t sent_unheld;    /* the negative control's frames that skipped the queue */
	epoch_queue_sink sink;
	void *sink_opaque;
};

struct output_commit *output_commit_create(size_t max_bytes, bool unsafe_release_early,
					   epoch_queue_sink sink, void *sink_opaque)
{
	struct output_commit *oc = calloc(1, sizeof(*oc));

	if (!oc)
		return NULL;
	oc->held = epoch_queue_create(max_bytes);
	if (!oc->held) {
		free(oc);
		return NULL;
	}
	oc->unsafe_release_early = unsafe_release_early;
	oc->sink = sink;
	oc->sink_opaque = sink_opaque;
	return oc;
}

void output_commit_destroy(struct output_commit *oc)
{
	if (!oc)
		return;
	epoch_queue_destroy(oc->held);
	free(oc);
}

int output_commit_hold(void *opaque, const uint8_t *frame, uint32_t len)
{
	struct output_commit *oc = opaque;

	if (oc->dropping)
		return 1;
	/*
	 * The negative control: the epoch after the acknowledged one is not
	 * held at all.  Nothing earlier is held either (its ack released
	 * it), so sending at once keeps the frames in order.
	 */
	if (oc->unsafe_release_early && oc->open_epoch <= oc->acked + 1) {
		(void)oc->sink(oc->sink_opaque, frame, len);
		oc->sent_unheld++;
		return 1;
	}
	/* Full (1) or out of memory (-1): dropped, counted by the queue. */
	(void)epoch_queue_push(oc->held, oc->open_epoch, frame, len);
	return 1;
}

void output_commit_cut(struct output_commit *oc, uint64_t epoch)
{
	oc->open_epoch = epoch + 1;
}

uint64_t output_commit_open_epoch(const struct output_commit *oc)
{
	return oc->open_epoch;
}

void output_commit_ack(struct output_commit *oc, uint64_t epoch)
{
	uint64_t upto = epoch;

	if (epoch > oc->acked)
		oc->acked = epoch;
	if (oc->unsafe_release_early && epoch < UINT64_MAX)
		upto = epoch + 1; /* the negative control: one epoch early */
	epoch_queue_release(oc->held, upto, oc->sink, oc->sink_opaque);
}

void output_commit_release_all(struct output_commit *oc)
{
	epoch_queue_release(oc->held, UINT64_MAX, oc->sink, oc->sink_opaque);
}

void output_commit_drop_all(struct output_commit *oc)
{
	epoch_queue_drop_all(oc->held);
	oc->dropping = true;
}

bool output_commit_unsafe(const struct output_commit *oc)
{
	return oc->unsafe_release_early;
}

void output_commit_get_stats(const struct output_commit *oc, struct epoch_queue_stats *out)
{
	epoch_queue_get_stats(oc->held, out);
	/* status counts every frame that left, held first or not */
	out->frames_released += oc->sent_unheld;
}
