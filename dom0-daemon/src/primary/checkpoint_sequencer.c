/* The primary's wire order across epochs (checkpoint_sequencer.h). */
#include "primary/checkpoint_sequencer.h"

#include <stdbool.h>
#include <stdlib.h>

#include "base/event_loop.h"

enum span_state {
	SPAN_OPEN,  /* its tag is the open epoch: disk writes and copies arrive */
	SPAN_CUT,   /* the checkpoint began: only its coded pages are still to come */
	SPAN_ENDED, /* everything is in: EPOCH_END when it reaches the head */
};

struct span {
	uint64_t epoch;
	enum span_state state;
	uint64_t pages;
	struct buffer outbox;
	struct span *next;
};

struct checkpoint_sequencer {
	struct checkpoint_sequencer_io io;
	struct repl_digest digest; /* of the head span, in wire order */
	struct span *head, *tail;
	size_t held;
};

static struct span *span_new(struct checkpoint_sequencer *seq, uint64_t epoch)
{
	struct span *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	s->epoch = epoch;
	buffer_init(&s->outbox);
	if (seq->tail)
		seq->tail->next = s;
	else
		seq->head = s;
	seq->tail = s;
	return s;
}

struct checkpoint_sequencer *checkpoint_sequencer_create(const struct checkpoint_sequencer_io *io)
{
	struct checkpoint_sequencer *seq = calloc(1, sizeof(*seq));

	if (!seq)
		return NULL;
	seq->io = *io;
	if (repl_digest_init(&seq->digest) < 0 || !span_new(seq, 0) || !span_new(seq, 1)) {
		checkpoint_sequencer_destroy(seq);
		return NULL;
	}
	return seq;
}

void checkpoint_sequencer_destroy(struct checkpoint_sequencer *seq)
{
	if (!seq)
		return;
	while (seq->head) {
		struct span *s = seq->head;
		seq->head = s->next;
		buffer_free(&s->outbox);
		free(s);
	}
	repl_digest_free(&seq->digest);
	free(seq);
}

static struct span *find(const struct checkpoint_sequencer *seq, uint64_t epoch)
{
	for (struct span *s = seq->head; s; s = s->next)
		if (s->epoch == epoch)
			return s;
	return NULL;
}

/* Frames of s may go straight to the connection. */
static bool direct(const struct checkpoint_sequencer *seq, const struct span *s)
{
	return seq->head == s ||
	       (seq->head->epoch == 0 && seq->head->state != SPAN_ENDED && s->epoch == 1);
}

struct buffer *checkpoint_sequencer_buffer(struct checkpoint_sequencer *seq, uint64_t epoch)
{
	struct span *s = find(seq, epoch);

	if (!s || s->state != SPAN_OPEN)
		return NULL;
	return direct(seq, s) ? seq->io.wire(seq->io.opaque) : &s->outbox;
}

/* Puts bytes on the connection and into the digest. */
static int to_wire(struct checkpoint_sequencer *seq, const uint8_t *frames, size_t len)
{
	struct buffer *w = seq->io.wire(seq->io.opaque);
	size_t before = buffer_len(w);

	if (len == 0)
		return 0;
	if (buffer_append(w, frames, len) < 0)
		return -1;
	if (repl_digest_add_buffered(&seq->digest, w, before) < 0) {
		w->end -= len;
		return -1;
	}
	return 0;
}

int checkpoint_sequencer_appended(struct checkpoint_sequencer *seq, uint64_t epoch, size_t before)
{
	struct span *s = find(seq, epoch);

	if (!s)
		return -1;
	if (direct(seq, s)) {
		if (repl_digest_add_buffered(&seq->digest, seq->io.wire(seq->io.opaque), before) < 0)
			return -1;
		seq->io.flush(seq->io.opaque);
		return 0;
	}
	/* Checked now, digested when the outbox moves to the connection. */
	if (before > buffer_len(&s->outbox))
		return -1;
	seq->held += buffer_len(&s->outbox) - before;
	return 0;
}

int checkpoint_sequencer_cut(struct checkpoint_sequencer *seq, uint64_t epoch)
{
	struct span *s = seq->tail;

	/* No checkpoint before the bulk copy ended (QEMU's CHECKPOINT_READY). */
	if (!s || s->epoch != epoch || s->state != SPAN_OPEN || epoch == 0 ||
	    seq->head->epoch == 0)
		return -1;
	if (!span_new(seq, epoch + 1))
		return -1;
	s->state = SPAN_CUT;
	return 0;
}

/* Ends spans at the head for as long as they are complete. */
static int advance(struct checkpoint_sequencer *seq)
{
	struct buffer *w = seq->io.wire(seq->io.opaque);

	while (seq->head && seq->head->state == SPAN_ENDED) {
		struct span *s = seq->head;
		struct repl_epoch_end e = {
			.epoch = s->epoch,
			.pages = s->pages,
			.bytes = seq->digest.bytes,
			.checksum = repl_digest_value(&seq->digest),
			.timestamp_us = (uint64_t)monotonic_us(),
		};
		if (repl_put_epoch_end(w, &e) < 0)
			return -1;
		repl_digest_reset(&seq->digest);
		seq->head = s->next;
		if (!seq->head)
			seq->tail = NULL;
		buffer_free(&s->outbox);
		free(s);
		if (seq->io.on_epoch_end)
			seq->io.on_epoch_end(seq->io.opaque, &e);
		/* The new head's waiting frames go out first, in the order they came. */
		struct span *h = seq->head;
		if (h && buffer_len(&h->outbox)) {
			size_t n = buffer_len(&h->outbox);
			if (to_wire(seq, buffer_head(&h->outbox), n) < 0)
				return -1;
			seq->held -= n;
			buffer_free(&h->outbox);
		}
	}
	seq->io.flush(seq->io.opaque);
	return 0;
}

int checkpoint_sequencer_end(struct checkpoint_sequencer *seq, uint64_t epoch, const uint8_t *frames,
			     size_t len, uint64_t pages)
{
	struct span *s = find(seq, epoch);

	if (!s || s->state == SPAN_ENDED || (s->state == SPAN_OPEN && epoch != 0))
		return -1;
	if (seq->head == s) {
		if (to_wire(seq, frames, len) < 0)
			return -1;
	} else if (len) {
		size_t before = buffer_len(&s->outbox);
		if (buffer_append(&s->outbox, frames, len) < 0)
			return -1;
		seq->held += buffer_len(&s->outbox) - before;
	}
	s->pages = pages;
	s->state = SPAN_ENDED;
	return advance(seq);
}

size_t checkpoint_sequencer_held(const struct checkpoint_sequencer *seq)
{
	return seq->held;
}

uint64_t checkpoint_sequencer_head(const struct checkpoint_sequencer *seq)
{
	return seq->head ? seq->head->epoch : 0;
}
