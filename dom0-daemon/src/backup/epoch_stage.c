/* The backup's staged epoch, committed in one call (epoch_stage.h). */
#include "backup/epoch_stage.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/buffer.h"
#include "base/fs_util.h"
#include "qemu/migration_writer.h"

/*
 * Page data goes into 1 MiB chunks rather than one growing array, so a
 * large epoch never copies what it already holds; a few chunks stay
 * allocated between epochs so the steady state allocates nothing.
 */
#define PAGES_PER_CHUNK 256u
#define KEEP_CHUNKS 16u
/* Disk payloads above this are given back after each epoch. */
#define KEEP_DISK_BYTES (16u << 20)
#define ZERO_SLOT UINT32_MAX
#define ZERO_RANGE SIZE_MAX

struct staged_page {
	uint64_t index;
	uint32_t block;
	uint32_t slot; /* page number in the chunks, or ZERO_SLOT */
};

struct staged_disk_op {
	uint64_t offset;
	uint64_t length;
	size_t data_at; /* offset of the payload in disk_data, or ZERO_RANGE */
};

struct epoch_stage {
	uint64_t epoch;

	struct staged_page *pages;
	size_t page_count, page_cap;
	uint8_t **chunks;
	size_t chunk_count, chunk_cap; /* chunks allocated / slots for them */
	uint32_t slots_used;

	struct staged_disk_op *disk_ops;
	size_t disk_count, disk_cap;
	struct buffer disk_data;

	struct buffer device;
	uint64_t device_total;
	bool device_started;

	size_t bytes;
	char err[256];
};

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static int stage_fail(struct epoch_stage *s, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(s->err, sizeof(s->err), fmt, ap);
	va_end(ap);
	return -1;
}

/* Makes room for one more element of an array that doubles. */
static int grow(void **array, size_t *cap, size_t count, size_t elem)
{
	if (count < *cap)
		return 0;
	size_t new_cap = *cap ? *cap * 2 : 64;
	if (new_cap > SIZE_MAX / elem)
		return -1;
	void *grown = realloc(*array, new_cap * elem);
	if (!grown)
		return -1;
	*array = grown;
	*cap = new_cap;
	return 0;
}

struct epoch_stage *epoch_stage_create(void)
{
	struct epoch_stage *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	buffer_init(&s->disk_data);
	buffer_init(&s->device);
	return s;
}

static void free_chunks_from(struct epoch_stage *s, size_t keep)
{
	while (s->chunk_count > keep)
		free(s->chunks[--s->chunk_count]);
}

void epoch_stage_destroy(struct epoch_stage *s)
{
	if (!s)
		return;
	free_chunks_from(s, 0);
	free(s->chunks);
	free(s->pages);
	free(s->disk_ops);
	buffer_free(&s->disk_data);
	buffer_free(&s->device);
	free(s);
}

/* Empties the stage, keeping a bounded amount of memory for the next epoch. */
static void reset(struct epoch_stage *s)
{
	s->page_count = 0;
	s->slots_used = 0;
	free_chunks_from(s, KEEP_CHUNKS);
	s->disk_count = 0;
	if (s->disk_data.capacity > KEEP_DISK_BYTES)
		buffer_free(&s->disk_data);
	else
		buffer_clear(&s->disk_data);
	if (s->device.capacity > KEEP_DISK_BYTES)
		buffer_free(&s->device);
	else
		buffer_clear(&s->device);
	s->device_total = 0;
	s->device_started = false;
	s->bytes = 0;
}

void epoch_stage_begin(struct epoch_stage *s, uint64_t epoch)
{
	reset(s);
	s->epoch = epoch;
	s->err[0] = '\0';
}

uint64_t epoch_stage_epoch(const struct epoch_stage *s)
{
	return s->epoch;
}

/* Where the next page's data goes, allocating a chunk when needed. */
static uint8_t *next_slot(struct epoch_stage *s, uint32_t *slot)
{
	if (s->slots_used == ZERO_SLOT)
		return NULL;
	size_t chunk = s->slots_used / PAGES_PER_CHUNK;
	if (chunk == s->chunk_count) {
		if (grow((void **)&s->chunks, &s->chunk_cap, s->chunk_count,
			 sizeof(*s->chunks)) < 0)
			return NULL;
		uint8_t *mem = malloc((size_t)PAGES_PER_CHUNK * MIG_PAGE_SIZE);
		if (!mem)
			return NULL;
		s->chunks[s->chunk_count++] = mem;
	}
	*slot = s->slots_used;
	return s->chunks[chunk] + (size_t)(*slot % PAGES_PER_CHUNK) * MIG_PAGE_SIZE;
}

/*
 * Appends a page record; with_data gives it a slot (returned in *dst)
 * that the caller fills.  0, or -1 when out of memory.
 */
static int stage_record(struct epoch_stage *s, unsigned block, uint64_t page_index,
			bool with_data, uint8_t **dst)
{
	uint32_t slot = ZERO_SLOT;

	if (grow((void **)&s->pages, &s->page_cap, s->page_count,
		 sizeof(*s->pages)) < 0)
		return -1;
	if (with_data) {
		*dst = next_slot(s, &slot);
		if (!*dst)
			return -1;
		s->slots_used++;
		s->bytes += MIG_PAGE_SIZE;
	}
	s->pages[s->page_count++] = (struct staged_page){
		.index = page_index,
		.block = block,
		.slot = slot,
	};
	return 0;
}

int epoch_stage_add_page(struct epoch_stage *s, unsigned block,
			 uint64_t page_index, const uint8_t *data)
{
	uint8_t *dst = NULL;

	if (stage_record(s, block, page_index, data != NULL, &dst) < 0)
		return stage_fail(s, "out of memory staging page %llu",
				  (unsigned long long)page_index);
	if (data)
		memcpy(dst, data, MIG_PAGE_SIZE);
	return 0;
}

uint8_t *epoch_stage_reserve_page(struct epoch_stage *s, unsigned block,
				  uint64_t page_index)
{
	uint8_t *dst = NULL;

	if (stage_record(s, block, page_index, true, &dst) < 0)
		return NULL;
	memset(dst, 0, MIG_PAGE_SIZE);
	return dst;
}

int epoch_stage_read_disk(const struct epoch_stage *s, int disk_fd, uint64_t offset,
			  uint8_t *buf, size_t len)
{
	if (len > UINT64_MAX - offset || offset + len > (uint64_t)INT64_MAX) {
		errno = EINVAL;
		return -1;
	}
	ssize_t got = pread_full(disk_fd, buf, len, offset);
	if (got < 0)
		return -1;
	memset(buf + got, 0, len - (size_t)got);
	/* Later operations win, as at commit. */
	for (size_t i = 0; i < s->disk_count; i++) {
		const struct staged_disk_op *op = &s->disk_ops[i];
		uint64_t lo = op->offset > offset ? op->offset : offset;
		uint64_t hi_op = op->offset + op->length, hi_buf = offset + len;
		uint64_t hi = hi_op < hi_buf ? hi_op : hi_buf;

		if (lo >= hi)
			continue;
		if (op->data_at == ZERO_RANGE)
			memset(buf + (lo - offset), 0, hi - lo);
		else
			memcpy(buf + (lo - offset),
			       buffer_head(&s->disk_data) + op->data_at + (lo - op->offset), hi - lo);
	}
	return 0;
}

int epoch_stage_add_device_chunk(struct epoch_stage *s, uint64_t total,
				 uint64_t offset, const uint8_t *d, size_t n)
{
	uint64_t have = buffer_len(&s->device);

	if (total == 0)
		return stage_fail(s, "device state chunk announces an empty blob");
	if (total > SIZE_MAX)
		return stage_fail(s, "device state of %llu bytes is too large",
				  (unsigned long long)total);
	if (s->device_started && total != s->device_total)
		return stage_fail(s, "device state chunk announces %llu bytes, "
				     "earlier chunks %llu",
				  (unsigned long long)total,
				  (unsigned long long)s->device_total);
	if (offset != have)
		return stage_fail(s, "device state chunk at offset %llu, expected "
				     "%llu", (unsigned long long)offset,
				  (unsigned long long)have);
	if (n > total - offset)
		return stage_fail(s, "device state chunk of %zu bytes at %llu "
				     "overruns the %llu-byte blob", n,
				  (unsigned long long)offset,
				  (unsigned long long)total);
	if (n && buffer_append(&s->device, d, n) < 0)
		return stage_fail(s, "out of memory staging device state");
	s->device_started = true;
	s->device_total = total;
	s->bytes += n;
	return 0;
}

static int add_disk_op(struct epoch_stage *s, uint64_t offset, uint64_t length,
		       size_t data_at)
{
	if (length > UINT64_MAX - offset || offset + length > (uint64_t)INT64_MAX)
		return stage_fail(s, "disk range %llu+%llu overflows",
				  (unsigned long long)offset,
				  (unsigned long long)length);
	if (grow((void **)&s->disk_ops, &s->disk_cap, s->disk_count,
		 sizeof(*s->disk_ops)) < 0)
		return stage_fail(s, "out of memory staging a disk write");
	s->disk_ops[s->disk_count++] = (struct staged_disk_op){
		.offset = offset,
		.length = length,
		.data_at = data_at,
	};
	return 0;
}

int epoch_stage_add_disk_write(struct epoch_stage *s, uint64_t offset,
			       const uint8_t *d, size_t n)
{
	size_t at = buffer_len(&s->disk_data);

	if (n == 0)
		return 0;
	if (add_disk_op(s, offset, n, at) < 0)
		return -1;
	if (buffer_append(&s->disk_data, d, n) < 0) {
		s->disk_count--;
		return stage_fail(s, "out of memory staging a %zu-byte disk write",
				  n);
	}
	s->bytes += n;
	return 0;
}

int epoch_stage_add_disk_zero(struct epoch_stage *s, uint64_t offset,
			      uint64_t length)
{
	if (length == 0)
		return 0;
	return add_disk_op(s, offset, length, ZERO_RANGE);
}

uint64_t epoch_stage_pages(const struct epoch_stage *s)
{
	return s->page_count;
}

size_t epoch_stage_bytes(const struct epoch_stage *s)
{
	return s->bytes;
}

bool epoch_stage_device_complete(const struct epoch_stage *s)
{
	return !s->device_started || buffer_len(&s->device) == s->device_total;
}

const char *epoch_stage_error(const struct epoch_stage *s)
{
	return s->err;
}

/* ---- commit -------------------------------------------------------- */

/* Everything that could refuse the epoch, checked before anything changes. */
static int validate(const struct epoch_stage *s, const struct ram_image *img,
		    int disk_fd, char *err, size_t errlen)
{
	for (size_t i = 0; i < s->page_count; i++) {
		const struct staged_page *p = &s->pages[i];
		const struct ram_image_block *b = ram_image_block(img, p->block);

		if (!b) {
			snprintf(err, errlen, "epoch %llu: page for RAM block %u, "
					      "but the image has %zu blocks",
				 (unsigned long long)s->epoch, p->block,
				 ram_image_block_count(img));
			return -1;
		}
		if (p->index >= b->length / MIG_PAGE_SIZE) {
			snprintf(err, errlen, "epoch %llu: page %llu is outside RAM "
					      "block %s (%llu pages)",
				 (unsigned long long)s->epoch,
				 (unsigned long long)p->index, b->name,
				 (unsigned long long)(b->length / MIG_PAGE_SIZE));
			return -1;
		}
	}
	if (!epoch_stage_device_complete(s)) {
		snprintf(err, errlen, "epoch %llu: device state incomplete (%zu of "
				      "%llu bytes)", (unsigned long long)s->epoch,
			 buffer_len(&s->device),
			 (unsigned long long)s->device_total);
		return -1;
	}
	if (s->disk_count > 0 && disk_fd < 0) {
		snprintf(err, errlen, "epoch %llu: %zu disk writes but the replica "
				      "has no disk", (unsigned long long)s->epoch,
			 s->disk_count);
		return -1;
	}
	return 0;
}

static int apply_disk(const struct epoch_stage *s, int disk_fd, char *err,
		      size_t errlen)
{
	for (size_t i = 0; i < s->disk_count; i++) {
		const struct staged_disk_op *op = &s->disk_ops[i];
		bool zero = op->data_at == ZERO_RANGE;
		int rc = zero ? punch_or_zero(disk_fd, op->offset, op->length)
			      : pwrite_all(disk_fd,
					   buffer_head(&s->disk_data) + op->data_at,
					   op->length, op->offset);

		if (rc < 0) {
			snprintf(err, errlen, "epoch %llu: disk %s of %llu bytes at "
					      "offset %llu failed: %s",
				 (unsigned long long)s->epoch,
				 zero ? "zeroing" : "write",
				 (unsigned long long)op->length,
				 (unsigned long long)op->offset, strerror(errno));
			return -1;
		}
	}
	return 0;
}

int epoch_stage_for_each_disk_range(const struct epoch_stage *s,
				    int (*fn)(void *opaque, uint64_t offset, uint64_t length),
				    void *opaque)
{
	for (size_t i = 0; i < s->disk_count; i++) {
		int rc = fn(opaque, s->disk_ops[i].offset, s->disk_ops[i].length);

		if (rc)
			return rc;
	}
	return 0;
}

int epoch_stage_commit(struct epoch_stage *s, struct ram_image *img,
		       int disk_fd, char *err, size_t errlen)
{
	int rc = -1;

	if (validate(s, img, disk_fd, err, errlen) < 0 ||
	    apply_disk(s, disk_fd, err, errlen) < 0)
		goto out;
	/* From here on nothing can fail: the RAM side is all or nothing. */
	for (size_t i = 0; i < s->page_count; i++) {
		const struct staged_page *p = &s->pages[i];
		const uint8_t *data = NULL;

		if (p->slot != ZERO_SLOT)
			data = s->chunks[p->slot / PAGES_PER_CHUNK] +
			       (size_t)(p->slot % PAGES_PER_CHUNK) * MIG_PAGE_SIZE;
		ram_image_store_page(img, p->block, p->index, data);
	}
	/* The old blob comes back into s->device, and reset() clears it. */
	if (s->device_started)
		ram_image_swap_device_blob(img, &s->device);
	rc = 0;
out:
	reset(s);
	return rc;
}

void epoch_stage_discard(struct epoch_stage *s)
{
	reset(s);
}
