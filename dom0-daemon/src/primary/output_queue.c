/* The output commit buffer: guest frames held per epoch (output_queue.h). */
#include "primary/output_queue.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Large enough for a 64 KiB tap frame to share a chunk with others. */
#define CHUNK_SIZE (128u * 1024)
#define RECORD_ALIGN 8u

/* Precedes each frame; records are 8-byte aligned inside a chunk. */
struct record_header {
	uint64_t epoch;
	uint32_t len;
	uint32_t reserved;
};

struct queue_chunk {
	struct queue_chunk *next;
	size_t size; /* bytes of data[] */
	size_t head; /* first record not yet released */
	size_t tail; /* end of the last record */
	uint8_t data[];
};

struct output_queue {
	struct queue_chunk *first, *last;
	struct queue_chunk *spare; /* one emptied CHUNK_SIZE chunk for reuse */
	size_t max_bytes;
	uint64_t last_epoch;
	bool any_pushed;
	struct output_queue_stats stats;
};

static size_t record_size(size_t len)
{
	return sizeof(struct record_header) +
	       ((len + RECORD_ALIGN - 1) & ~(size_t)(RECORD_ALIGN - 1));
}

struct output_queue *output_queue_create(size_t max_bytes)
{
	struct output_queue *q = calloc(1, sizeof(*q));

	if (q)
		q->max_bytes = max_bytes;
	return q;
}

/* Keeps one standard-size chunk for the next push, frees anything else. */
static void retire_chunk(struct output_queue *q, struct queue_chunk *c)
{
	if (!q->spare && c->size == CHUNK_SIZE) {
		c->next = NULL;
		c->head = c->tail = 0;
		q->spare = c;
	} else {
		free(c);
	}
}

static void free_list(struct queue_chunk *c)
{
	while (c) {
		struct queue_chunk *next = c->next;

		free(c);
		c = next;
	}
}

void output_queue_destroy(struct output_queue *q)
{
	if (!q)
		return;
	free_list(q->first);
	free(q->spare);
	free(q);
}

/* A chunk with room for `need` more bytes at the tail of the list. */
static struct queue_chunk *tail_room(struct output_queue *q, size_t need)
{
	struct queue_chunk *c = q->last;

	if (c && c->size - c->tail >= need)
		return c;
	if (need <= CHUNK_SIZE && q->spare) {
		c = q->spare;
		q->spare = NULL;
	} else {
		/* An oversized frame gets a chunk of its own. */
		size_t size = need > CHUNK_SIZE ? need : CHUNK_SIZE;

		c = malloc(sizeof(*c) + size);
		if (!c)
			return NULL;
		c->size = size;
	}
	c->next = NULL;
	c->head = c->tail = 0;
	if (q->last)
		q->last->next = c;
	else
		q->first = c;
	q->last = c;
	return c;
}

int output_queue_push(struct output_queue *q, uint64_t epoch,
		      const uint8_t *frame, size_t len)
{
	if (len == 0 || len > UINT32_MAX ||
	    (q->any_pushed && epoch < q->last_epoch)) {
		errno = EINVAL;
		return -1;
	}
	q->any_pushed = true;
	q->last_epoch = epoch;
	if (len > q->max_bytes - q->stats.bytes_held) {
		q->stats.frames_dropped_overflow++;
		return 1;
	}
	struct queue_chunk *c = tail_room(q, record_size(len));
	if (!c) {
		errno = ENOMEM;
		return -1;
	}
	struct record_header h = { .epoch = epoch, .len = (uint32_t)len };
	memcpy(c->data + c->tail, &h, sizeof(h));
	memcpy(c->data + c->tail + sizeof(h), frame, len);
	c->tail += record_size(len);
	q->stats.frames_held++;
	q->stats.bytes_held += len;
	if (q->stats.bytes_held > q->stats.max_bytes_held)
		q->stats.max_bytes_held = q->stats.bytes_held;
	return 0;
}

size_t output_queue_release(struct output_queue *q, uint64_t upto_epoch,
			    output_queue_sink sink, void *opaque)
{
	size_t released = 0;
	struct queue_chunk *c;

	while ((c = q->first) && c->head < c->tail) {
		struct record_header h;

		memcpy(&h, c->data + c->head, sizeof(h));
		if (h.epoch > upto_epoch)
			break;
		if (sink(opaque, c->data + c->head + sizeof(h), h.len) != 0)
			break;
		c->head += record_size(h.len);
		released++;
		q->stats.frames_held--;
		q->stats.bytes_held -= h.len;
		q->stats.frames_released++;
		if (c->head < c->tail)
			continue;
		if (c == q->last) {
			c->head = c->tail = 0; /* empty: reuse it in place */
			break;
		}
		q->first = c->next;
		retire_chunk(q, c);
	}
	return released;
}

size_t output_queue_drop_all(struct output_queue *q)
{
	size_t dropped = (size_t)q->stats.frames_held;
	struct queue_chunk *c = q->first;

	while (c) {
		struct queue_chunk *next = c->next;

		retire_chunk(q, c);
		c = next;
	}
	q->first = q->last = NULL;
	q->stats.frames_discarded += dropped;
	q->stats.frames_held = 0;
	q->stats.bytes_held = 0;
	q->any_pushed = false;
	return dropped;
}

void output_queue_get_stats(const struct output_queue *q,
			    struct output_queue_stats *out)
{
	*out = q->stats;
}
