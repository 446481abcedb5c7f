/* The primary's checkpoint pipeline: copy in the pause, code on a worker (checkpoint_pipeline.h). */
#include "primary/checkpoint_pipeline.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <xxhash.h>

#include "codec/device_delta.h"
#include "base/log.h"

/*
 * Pages go into 1 MiB chunks: a large epoch never moves what it already
 * copied (realloc of one arena would, inside the pause), and a pooled job
 * keeps its chunks, so the steady state allocates nothing in the pause.
 */
#define PAGES_PER_CHUNK 256u
#define CHUNK_BYTES ((size_t)PAGES_PER_CHUNK * REPL_PAGE_SIZE)
/* A pooled job keeps at most this many chunks (64 MiB), the pool this many jobs. */
#define KEEP_CHUNKS 64u
#define KEEP_JOBS 2u
#define KEEP_BUFFER (32u << 20)
#define ZERO_SLOT UINT32_MAX
/* A blob sent whole goes out in DEVICE frames of at most this much. */
#define DEVICE_FRAME_DATA (1u << 20)

struct job_page {
	uint64_t index;
	uint32_t block;
	uint32_t slot; /* in the chunks, or ZERO_SLOT */
};

struct checkpoint_job {
	uint64_t epoch;
	struct job_page *pages;
	size_t count, cap;
	uint8_t **chunks;
	size_t chunk_count, chunk_cap;
	uint32_t slots_used;
	struct buffer device;  /* the device blob, copied in the pause */
	uint64_t device_total; /* its announced length */
	struct buffer out;     /* the worker's output */
	struct checkpoint_job_stats stats;
	char error[128];
	uint64_t accounted;    /* its footprint as last added to the pipeline's count */
	struct checkpoint_job *next;
};

struct checkpoint_pipeline {
	event_loop *loop;
	int efd;
	struct page_encoder enc;
	epoch_encoded_fn on_encoded;
	void *opaque;
	bool delta_device; /* set before the first job; read by the worker */
	/* Worker only: the last blob coded (what the backup will have committed) and scratch. */
	struct buffer device_base;
	struct buffer device_records;
	uint64_t device_accounted; /* their footprint as last added to memory_bytes */
	/*
	 * What the pipeline has allocated: every job's chunks, page table,
	 * device copy and coded frames (pooled ones included) and the
	 * worker's device buffers.  Atomic because whichever thread holds a
	 * job accounts for it; status reads it (the primary's share of the
	 * host's memory, which nothing else bounds: an epoch may dirty every
	 * page, and its copy stays until the backup acknowledges it).
	 */
	_Atomic uint64_t memory_bytes, memory_peak;

	pthread_t thread;
	bool started;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	/* Shared with the worker, under lock. */
	bool stop;
	atomic_bool quit; /* read while coding, without the lock: teardown does not wait */
	struct checkpoint_job *todo, *todo_tail;
	struct checkpoint_job *done, *done_tail;

	/* Loop only. */
	struct checkpoint_job *open;
	struct checkpoint_job *held, *held_tail; /* coded, not acknowledged, epoch order */
	struct checkpoint_job *pool;
	unsigned pooled;
	unsigned encoding;
	bool in_notify, destroy_later;
};

/* ---- jobs ------------------------------------------------------------- */

static uint64_t job_footprint(const struct checkpoint_job *j)
{
	return sizeof(*j) + (uint64_t)j->chunk_count * CHUNK_BYTES +
	       (uint64_t)j->chunk_cap * sizeof(*j->chunks) + (uint64_t)j->cap * sizeof(*j->pages) +
	       j->device.capacity + j->out.capacity;
}

/* Moves the pipeline's count from what *accounted said to now. */
static void account(struct checkpoint_pipeline *pl, uint64_t *accounted, uint64_t now)
{
	if (now == *accounted)
		return; /* the common case inside the pause: no atomic operation */
	if (now > *accounted) {
		uint64_t total = atomic_fetch_add(&pl->memory_bytes, now - *accounted) +
				 (now - *accounted);
		uint64_t peak = atomic_load(&pl->memory_peak);
		while (total > peak && !atomic_compare_exchange_weak(&pl->memory_peak, &peak, total))
			;
	} else {
		atomic_fetch_sub(&pl->memory_bytes, *accounted - now);
	}
	*accounted = now;
}

/* By whichever thread holds j: its allocations changed. */
static void job_account(struct checkpoint_pipeline *pl, struct checkpoint_job *j)
{
	account(pl, &j->accounted, job_footprint(j));
}

static void job_free(struct checkpoint_job *j)
{
	if (!j)
		return;
	for (size_t i = 0; i < j->chunk_count; i++)
		free(j->chunks[i]);
	free(j->chunks);
	free(j->pages);
	buffer_free(&j->device);
	buffer_free(&j->out);
	free(j);
}

static void free_list(struct checkpoint_job *j)
{
	while (j) {
		struct checkpoint_job *next = j->next;
		job_free(j);
		j = next;
	}
}

static void trim_buffer(struct buffer *b)
{
	if (b->capacity > KEEP_BUFFER)
		buffer_free(b);
	else
		buffer_clear(b);
}

/* Back to the pool, emptied, with a bounded amount of memory kept. */
static void job_recycle(struct checkpoint_pipeline *pl, struct checkpoint_job *j)
{
	if (pl->pooled >= KEEP_JOBS) {
		account(pl, &j->accounted, 0);
		job_free(j);
		return;
	}
	while (j->chunk_count > KEEP_CHUNKS)
		free(j->chunks[--j->chunk_count]);
	j->count = 0;
	j->slots_used = 0;
	j->device_total = 0;
	trim_buffer(&j->device);
	trim_buffer(&j->out);
	memset(&j->stats, 0, sizeof(j->stats));
	j->error[0] = '\0';
	job_account(pl, j);
	j->next = pl->pool;
	pl->pool = j;
	pl->pooled++;
}

static int grow(void **array, size_t *cap, size_t count, size_t elem)
{
	if (count < *cap)
		return 0;
	size_t new_cap = *cap ? *cap * 2 : 1024;
	void *grown = new_cap > SIZE_MAX / elem ? NULL : realloc(*array, new_cap * elem);
	if (!grown)
		return -1;
	*array = grown;
	*cap = new_cap;
	return 0;
}

static const uint8_t *slot_data(const struct checkpoint_job *j, uint32_t slot)
{
	return j->chunks[slot / PAGES_PER_CHUNK] + (size_t)(slot % PAGES_PER_CHUNK) * REPL_PAGE_SIZE;
}

/* ---- the worker ------------------------------------------------------- */

static void job_fail(struct checkpoint_job *j, const char *why)
{
	snprintf(j->error, sizeof(j->error), "%s", why);
}

/*
 * The epoch's device blob: a DEVICE_DELTA frame against the previous
 * epoch's blob when that is on and there is one (every job is coded in
 * epoch order and the backup commits epoch N before it reads N+1's
 * frames, so the previous coded blob is the backup's committed one),
 * else DEVICE frames carrying the whole blob.
 */
static int code_device(struct checkpoint_pipeline *pl, struct checkpoint_job *j)
{
	const uint8_t *blob = buffer_head(&j->device);
	size_t len = buffer_len(&j->device);
	struct buffer *base = &pl->device_base;

	if (len == 0)
		return 0;
	if (len != j->device_total) {
		job_fail(j, "the checkpoint's device state is incomplete");
		return -1;
	}
	j->stats.device_raw_bytes = len;
	if (pl->delta_device && buffer_len(base) > 0 && len <= DEVICE_DELTA_MAX_BLOB) {
		buffer_clear(&pl->device_records);
		struct repl_device_delta d = {
			.epoch = j->epoch, .total = len,
			.base_len = buffer_len(base),
			.base_sum = XXH3_64bits(buffer_head(base), buffer_len(base)),
			.sum = XXH3_64bits(blob, len),
		};
		if (device_delta_encode(blob, len, buffer_head(base), buffer_len(base),
					&pl->device_records) < 0)
			goto oom;
		d.records = buffer_head(&pl->device_records);
		d.records_len = buffer_len(&pl->device_records);
		if (repl_put_device_delta(&j->out, &d) < 0)
			goto oom;
		trim_buffer(&pl->device_records);
	} else {
		for (size_t at = 0; at < len; at += DEVICE_FRAME_DATA) {
			size_t n = len - at < DEVICE_FRAME_DATA ? len - at : DEVICE_FRAME_DATA;
			if (repl_put_device(&j->out, j->epoch, len, at, blob + at, n) < 0)
				goto oom;
		}
	}
	buffer_clear(base);
	if (pl->delta_device && buffer_append(base, blob, len) < 0) {
		/* Without a base the next blob goes whole: nothing is wrong, only bigger. */
		buffer_free(base);
	}
	return 0;
oom:
	job_fail(j, "out of memory coding device state");
	return -1;
}

/* Codes every page of j into PAGES_CODED frames, then its device state. */
static void encode_job(struct checkpoint_pipeline *pl, struct checkpoint_job *j)
{
	const struct page_encoder *enc = &pl->enc;
	int64_t t0 = monotonic_us();
	struct repl_coded_builder cb;
	bool in_frame = false;

	for (size_t i = 0; i < j->count; i++) {
		const struct job_page *pg = &j->pages[i];
		if (i % 256 == 0 && atomic_load(&pl->quit)) {
			job_fail(j, "the pipeline was stopped");
			return;
		}
		/*
		 * A new frame for a new block, an index that does not go up
		 * (QEMU may revisit a block), or a full frame.
		 */
		if (in_frame && (cb.block != pg->block || pg->index <= cb.last_index ||
				 cb.count == REPL_MAX_PAGES_PER_FRAME ||
				 repl_coded_payload_len(&cb) + REPL_CODED_RECORD_HEADER +
				 REPL_CODED_MAX > CHECKPOINT_PIPELINE_FRAME_MAX)) {
			repl_coded_end(&cb);
			in_frame = false;
		}
		if (!in_frame) {
			if (repl_coded_begin(&cb, &j->out, j->epoch, (uint16_t)pg->block) < 0) {
				job_fail(j, "out of memory coding pages");
				return;
			}
			in_frame = true;
		}
		size_t before = buffer_len(&j->out);
		const uint8_t *data = pg->slot == ZERO_SLOT ? NULL : slot_data(j, pg->slot);
		if (enc->encode_page(enc->ctx, j->epoch, pg->block, pg->index, data, &j->out) < 0) {
			job_fail(j, "the page encoder failed (out of memory)");
			return;
		}
		if (repl_coded_note(&cb, before) < 0) {
			job_fail(j, "the page encoder wrote an invalid record");
			return;
		}
		j->stats.kinds[buffer_head(&j->out)[before + 8]]++;
	}
	if (in_frame)
		repl_coded_end(&cb);
	j->stats.page_bytes = buffer_len(&j->out);
	if (code_device(pl, j) < 0)
		return;
	j->stats.device_bytes = buffer_len(&j->out) - j->stats.page_bytes;
	if (enc->epoch_done)
		enc->epoch_done(enc->ctx, j->epoch);
	j->stats.encode_us = monotonic_us() - t0;
}

static void *worker(void *arg)
{
	struct checkpoint_pipeline *pl = arg;

	pthread_mutex_lock(&pl->lock);
	for (;;) {
		while (!pl->stop && !pl->todo)
			pthread_cond_wait(&pl->cond, &pl->lock);
		if (pl->stop)
			break;
		struct checkpoint_job *j = pl->todo;
		pl->todo = j->next;
		if (!pl->todo)
			pl->todo_tail = NULL;
		j->next = NULL;
		pthread_mutex_unlock(&pl->lock);

		encode_job(pl, j);
		job_account(pl, j);
		account(pl, &pl->device_accounted,
			(uint64_t)pl->device_base.capacity + pl->device_records.capacity);

		pthread_mutex_lock(&pl->lock);
		if (pl->done_tail)
			pl->done_tail->next = j;
		else
			pl->done = j;
		pl->done_tail = j;
		uint64_t one = 1;
		/* A full counter already says "look": nothing is lost. */
		if (write(pl->efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
			break;
	}
	pthread_mutex_unlock(&pl->lock);
	return NULL;
}

/* ---- the loop side ---------------------------------------------------- */

static void destroy_now(struct checkpoint_pipeline *pl)
{
	if (pl->started) {
		atomic_store(&pl->quit, true);
		pthread_mutex_lock(&pl->lock);
		pl->stop = true;
		pthread_cond_signal(&pl->cond);
		pthread_mutex_unlock(&pl->lock);
		pthread_join(pl->thread, NULL);
	}
	if (pl->efd >= 0) {
		event_loop_unwatch(pl->loop, pl->efd);
		close(pl->efd);
	}
	job_free(pl->open);
	free_list(pl->todo);
	free_list(pl->done);
	free_list(pl->held);
	free_list(pl->pool);
	buffer_free(&pl->device_base);
	buffer_free(&pl->device_records);
	pthread_mutex_destroy(&pl->lock);
	pthread_cond_destroy(&pl->cond);
	free(pl);
}

static void on_notify(event_loop *loop, int fd, void *data, int ready)
{
	struct checkpoint_pipeline *pl = data;
	uint64_t count;

	if (read(fd, &count, sizeof(count)) < 0 && errno != EAGAIN)
		log_warn("epoch pipeline: reading the eventfd: %s", strerror(errno));
	pl->in_notify = true;
	while (!pl->destroy_later) {
		pthread_mutex_lock(&pl->lock);
		struct checkpoint_job *j = pl->done;
		if (j) {
			pl->done = j->next;
			if (!pl->done)
				pl->done_tail = NULL;
			j->next = NULL;
		}
		pthread_mutex_unlock(&pl->lock);
		if (!j)
			break;
		pl->encoding--;
		if (pl->held_tail)
			pl->held_tail->next = j;
		else
			pl->held = j;
		pl->held_tail = j;
		pl->on_encoded(pl->opaque, j);
	}
	pl->in_notify = false;
	if (pl->destroy_later)
		destroy_now(pl);
}

struct checkpoint_pipeline *checkpoint_pipeline_create(event_loop *loop,
						       const struct page_encoder *enc,
						       epoch_encoded_fn on_encoded, void *opaque,
						       char *err, size_t errlen)
{
	struct checkpoint_pipeline *pl = calloc(1, sizeof(*pl));

	if (!pl) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	atomic_init(&pl->quit, false);
	atomic_init(&pl->memory_bytes, 0);
	atomic_init(&pl->memory_peak, 0);
	pl->loop = loop;
	pl->enc = *enc;
	pl->on_encoded = on_encoded;
	pl->opaque = opaque;
	buffer_init(&pl->device_base);
	buffer_init(&pl->device_records);
	pthread_mutex_init(&pl->lock, NULL);
	pthread_cond_init(&pl->cond, NULL);
	pl->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (pl->efd < 0 || event_loop_watch(loop, pl->efd, EV_READABLE, on_notify, pl) < 0) {
		snprintf(err, errlen, "epoch pipeline eventfd: %s", strerror(errno));
		if (pl->efd >= 0)
			close(pl->efd);
		pl->efd = -1;
		destroy_now(pl);
		return NULL;
	}
	int rc = pthread_create(&pl->thread, NULL, worker, pl);
	if (rc != 0) {
		snprintf(err, errlen, "cannot start the page coding thread: %s", strerror(rc));
		destroy_now(pl);
		return NULL;
	}
	pl->started = true;
	return pl;
}

void checkpoint_pipeline_name_thread(struct checkpoint_pipeline *pl, const char *vm_name)
{
	char name[16]; /* the kernel's limit, the NUL included */

	snprintf(name, sizeof(name), "code:%s", vm_name);
	pthread_setname_np(pl->thread, name);
}

void checkpoint_pipeline_destroy(struct checkpoint_pipeline *pl)
{
	if (!pl)
		return;
	if (pl->in_notify) {
		pl->destroy_later = true; /* on_notify finishes it when on_encoded returns */
		return;
	}
	destroy_now(pl);
}

int checkpoint_pipeline_open(struct checkpoint_pipeline *pl, uint64_t epoch)
{
	struct checkpoint_job *j = pl->pool;

	if (pl->open)
		return -1;
	if (j) {
		pl->pool = j->next;
		pl->pooled--;
	} else if (!(j = calloc(1, sizeof(*j)))) {
		return -1;
	}
	j->next = NULL;
	j->epoch = epoch;
	job_account(pl, j);
	pl->open = j;
	return 0;
}

int checkpoint_pipeline_add_page(struct checkpoint_pipeline *pl, unsigned block, uint64_t page_index,
				 const uint8_t *data)
{
	struct checkpoint_job *j = pl->open;
	uint32_t slot = ZERO_SLOT;

	if (!j || grow((void **)&j->pages, &j->cap, j->count, sizeof(*j->pages)) < 0)
		return -1;
	if (data) {
		if (j->slots_used == ZERO_SLOT)
			return -1;
		size_t chunk = j->slots_used / PAGES_PER_CHUNK;
		if (chunk == j->chunk_count) {
			if (grow((void **)&j->chunks, &j->chunk_cap, j->chunk_count,
				 sizeof(*j->chunks)) < 0)
				return -1;
			uint8_t *mem = malloc(CHUNK_BYTES);
			if (!mem)
				return -1;
			j->chunks[j->chunk_count++] = mem;
		}
		slot = j->slots_used++;
		memcpy(j->chunks[chunk] + (size_t)(slot % PAGES_PER_CHUNK) * REPL_PAGE_SIZE, data,
		       REPL_PAGE_SIZE);
	}
	j->pages[j->count++] = (struct job_page){ .index = page_index, .block = block, .slot = slot };
	j->stats.pages++;
	j->stats.raw_bytes += REPL_PAGE_SIZE;
	job_account(pl, j);
	return 0;
}

int checkpoint_pipeline_add_device(struct checkpoint_pipeline *pl, uint64_t total, uint64_t offset,
				   const uint8_t *d, size_t n)
{
	struct checkpoint_job *j = pl->open;

	if (!j || n == 0 || total == 0 || offset != buffer_len(&j->device) ||
	    (j->device_total && total != j->device_total) || n > total - offset)
		return -1;
	j->device_total = total;
	int rc = buffer_append(&j->device, d, n);
	job_account(pl, j);
	return rc;
}

void checkpoint_pipeline_delta_device(struct checkpoint_pipeline *pl, bool on)
{
	pl->delta_device = on;
}

int checkpoint_pipeline_submit(struct checkpoint_pipeline *pl)
{
	struct checkpoint_job *j = pl->open;

	if (!j)
		return -1;
	pl->open = NULL;
	pl->encoding++;
	pthread_mutex_lock(&pl->lock);
	if (pl->todo_tail)
		pl->todo_tail->next = j;
	else
		pl->todo = j;
	pl->todo_tail = j;
	pthread_cond_signal(&pl->cond);
	pthread_mutex_unlock(&pl->lock);
	return 0;
}

unsigned checkpoint_pipeline_encoding(const struct checkpoint_pipeline *pl)
{
	return pl->encoding;
}

uint64_t checkpoint_pipeline_memory(const struct checkpoint_pipeline *pl, uint64_t *peak)
{
	if (peak)
		*peak = atomic_load(&pl->memory_peak);
	return atomic_load(&pl->memory_bytes);
}

uint64_t checkpoint_job_epoch(const struct checkpoint_job *job)
{
	return job->epoch;
}

const char *checkpoint_job_error(const struct checkpoint_job *job)
{
	return job->error[0] ? job->error : NULL;
}

const uint8_t *checkpoint_job_frames(const struct checkpoint_job *job, size_t *len)
{
	*len = buffer_len(&job->out);
	return buffer_head(&job->out);
}

const struct checkpoint_job_stats *checkpoint_job_stats(const struct checkpoint_job *job)
{
	return &job->stats;
}

int checkpoint_pipeline_find_page(const struct checkpoint_pipeline *pl, uint64_t epoch,
				  unsigned block, uint64_t page_index, const uint8_t **page)
{
	for (const struct checkpoint_job *j = pl->held; j; j = j->next) {
		if (j->epoch != epoch)
			continue;
		/* From the end: the epoch's last copy of the page is what it leaves behind. */
		for (size_t i = j->count; i-- > 0;) {
			const struct job_page *pg = &j->pages[i];
			if (pg->block == block && pg->index == page_index) {
				*page = pg->slot == ZERO_SLOT ? NULL : slot_data(j, pg->slot);
				return 1;
			}
		}
		return 0;
	}
	return 0;
}

void checkpoint_pipeline_acked(struct checkpoint_pipeline *pl, uint64_t epoch)
{
	while (pl->held && pl->held->epoch <= epoch) {
		struct checkpoint_job *j = pl->held;
		pl->held = j->next;
		if (!pl->held)
			pl->held_tail = NULL;
		job_recycle(pl, j);
	}
}
