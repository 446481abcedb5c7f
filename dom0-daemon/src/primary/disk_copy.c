/* The primary's initial disk copy and write mirroring (disk_copy.h). */
#include "primary/disk_copy.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "base/loop_worker.h"
#include "image/disk_changes.h"
#include "wire/repl_proto.h"

/* The copy adds a chunk only while less than DISK_COPY_BACKLOG is queued. */
#define DISK_COPY_CHUNK (1u << 20)
#define DISK_COPY_BACKLOG (4u << 20)
#define DISK_COPY_TICK_MS 2
/* Guest writes are split so that a frame stays far below the payload limit. */
#define DISK_WRITE_PIECE (4u << 20)

_Static_assert(DISK_WRITE_PIECE + 16 <= REPL_MAX_PAYLOAD,
	       "a DISK_WRITE piece and its header fit in one frame");
_Static_assert(DISK_COPY_CHUNK + 8 <= REPL_MAX_PAYLOAD,
	       "a DISK_SYNC chunk and its header fit in one frame");

struct disk_copy {
	event_loop *loop;
	struct disk_copy_events ev;
	char path[PATH_MAX];
	int fd;
	uint64_t size;
	uint64_t pos;     /* the copy has queued everything before this */
	uint64_t bytes;   /* data queued (holes are not sent) */
	bool done;
	uint8_t *buf;
	long long timer;
	struct nbd_export *export;
	struct disk_copy_sink sink;
	bool started;     /* the sink may be used */
	bool planned;     /* the backup said what to copy: the copy may run */
	uint8_t *plan;    /* extents to send (a resync); NULL: everything */
	uint64_t plan_count;
	/*
	 * The copy's preads run on a worker of their own, one chunk at a
	 * time (a disk copy reads the whole disk; on the loop every other
	 * VM waited for each chunk).  Set while a chunk is being read:
	 */
	struct loop_worker *reader; /* NULL: none could be had, the loop reads */
	bool reading;
	uint64_t read_offset;
	size_t read_len;
	int read_errno;
	/* A mirrored write touched the chunk being read: read it again. */
	bool read_overtaken;
	unsigned overtaken_in_a_row;
};

/*
 * A chunk overtaken this many times in a row is read on the loop, where
 * no mirror can come between its pread and its frame: a region the
 * guest writes without pause must not stall the copy.
 */
#define DISK_COPY_MAX_OVERTAKEN 8

struct disk_copy *disk_copy_open(event_loop *loop, const char *disk_path,
				 const struct disk_copy_events *ev, char *err, size_t errlen)
{
	struct disk_copy *dc = calloc(1, sizeof(*dc));
	struct stat st;

	if (!dc || !(dc->buf = malloc(DISK_COPY_CHUNK))) {
		snprintf(err, errlen, "out of memory");
		free(dc);
		return NULL;
	}
	dc->loop = loop;
	dc->ev = *ev;
	snprintf(dc->path, sizeof(dc->path), "%s", disk_path);
	dc->fd = open(disk_path, O_RDONLY | O_CLOEXEC);
	if (dc->fd < 0 || fstat(dc->fd, &st) < 0) {
		snprintf(err, errlen, "cannot open the disk %s: %s", disk_path, strerror(errno));
		disk_copy_destroy(dc);
		return NULL;
	}
	dc->size = (uint64_t)st.st_size;
	dc->reader = loop_worker_create(loop, "remusdb-copy", err, errlen);
	if (!dc->reader)
		log_warn("disk copy of %s: no reader thread (%s): the copy reads on the loop",
			 disk_path, err);
	return dc;
}

void disk_copy_destroy(struct disk_copy *dc)
{
	if (!dc)
		return;
	disk_copy_stop(dc);
	loop_worker_destroy(dc->reader); /* waits for a chunk being read */
	if (dc->fd >= 0)
		close(dc->fd);
	free(dc->plan);
	free(dc->buf);
	free(dc);
}

uint64_t disk_copy_size(const struct disk_copy *dc)
{
	return dc->size;
}

uint64_t disk_copy_bytes(const struct disk_copy *dc)
{
	return dc->bytes;
}

bool disk_copy_done(const struct disk_copy *dc)
{
	return dc->done;
}

static void failed(struct disk_copy *dc, enum disk_copy_fault fault, const char *why)
{
	disk_copy_stop(dc);
	dc->ev.on_failed(dc->ev.opaque, fault, why);
}

static void on_write(void *opaque, enum nbd_write_kind kind, uint64_t offset,
		     const uint8_t *data, uint64_t len)
{
	struct disk_copy *dc = opaque;
	uint64_t epoch;
	int rc = 0;

	if (!dc->started)
		return;
	/*
	 * A chunk being read that this write touches may hold the old data
	 * or a mix, and its frame would go behind this write's and undo it
	 * at the backup: it is read again.  (A write whose mirror comes after
	 * the chunk's frame is applied after it, whatever the chunk held.)
	 */
	if (dc->reading && offset < dc->read_offset + dc->read_len &&
	    dc->read_offset < offset + len)
		dc->read_overtaken = true;
	epoch = dc->ev.open_epoch(dc->ev.opaque);
	while (len > 0 && rc == 0) {
		size_t n = len < DISK_WRITE_PIECE ? (size_t)len : DISK_WRITE_PIECE;
		struct buffer *out = dc->sink.buffer_for(dc->sink.opaque, epoch);
		if (!out) {
			rc = -1;
			break;
		}
		size_t before = buffer_len(out);
		if (kind == NBD_WRITE_DATA)
			rc = repl_put_disk_write(out, epoch, offset, data, n);
		else
			rc = repl_put_disk_zero(out, epoch, offset, n);
		if (rc == 0)
			rc = dc->sink.appended(dc->sink.opaque, epoch, before);
		offset += n;
		len -= n;
		if (data)
			data += n;
	}
	if (rc < 0)
		failed(dc, DISK_COPY_QUEUE_FAILED, "cannot queue a disk write (out of memory)");
}

/* Appends one copy frame (DISK_SYNC or its end) to the open epoch's place. */
static int put_copy_frame(struct disk_copy *dc, uint64_t offset, const uint8_t *d, size_t n,
			  bool end)
{
	uint64_t epoch = dc->ev.open_epoch(dc->ev.opaque);
	struct buffer *out = dc->sink.buffer_for(dc->sink.opaque, epoch);

	if (!out)
		return -1;
	size_t before = buffer_len(out);
	if ((end ? repl_put_disk_sync_done(out, dc->size)
		 : repl_put_disk_sync(out, offset, d, n)) < 0)
		return -1;
	return dc->sink.appended(dc->sink.opaque, epoch, before);
}

static bool planned_extent(const struct disk_copy *dc, uint64_t i)
{
	return extent_bit(dc->plan, i);
}

/*
 * Moves pos to the first planned extent at or after it; false when none
 * is left.  *limit: where that extent ends (the disk's end without a plan).
 */
static bool seek_planned(struct disk_copy *dc, uint64_t *limit)
{
	*limit = dc->size;
	if (!dc->plan)
		return dc->pos < dc->size;
	uint64_t i = dc->pos >> DISK_COPY_EXTENT_SHIFT;
	while (i < dc->plan_count && !planned_extent(dc, i))
		i++;
	if (i >= dc->plan_count)
		return false;
	if (dc->pos < i << DISK_COPY_EXTENT_SHIFT)
		dc->pos = i << DISK_COPY_EXTENT_SHIFT;
	uint64_t end = (i + 1) << DISK_COPY_EXTENT_SHIFT;
	*limit = end < dc->size ? end : dc->size;
	return true;
}

/*
 * Next chunk of allocated data at or after pos, inside the plan; false at
 * the end.  Holes are never sent: the backup starts from holes (a fresh
 * file, or planned extents punched out).
 */
static bool next_extent(struct disk_copy *dc, uint64_t *offset, size_t *len)
{
	uint64_t limit;

	while (seek_planned(dc, &limit)) {
		off_t data = lseek(dc->fd, (off_t)dc->pos, SEEK_DATA);
		if (data < 0 && !dc->plan)
			return false; /* ENXIO: no more data */
		if (data < 0 || (uint64_t)data >= limit) {
			dc->pos = limit; /* this extent is a hole from here on */
			continue;
		}
		off_t hole = lseek(dc->fd, data, SEEK_HOLE);
		if (hole < 0 || (uint64_t)hole > limit)
			hole = (off_t)limit;
		uint64_t n = (uint64_t)(hole - data);
		*offset = (uint64_t)data;
		*len = n < DISK_COPY_CHUNK ? (size_t)n : DISK_COPY_CHUNK;
		if (*len > 0)
			return true;
		dc->pos = limit;
	}
	return false;
}

/* The end of the copy: DISK_SYNC_DONE, counted in the open epoch. */
static int queue_done(struct disk_copy *dc)
{
	if (put_copy_frame(dc, 0, NULL, 0, true) < 0) {
		failed(dc, DISK_COPY_QUEUE_FAILED, "cannot queue the end of the disk copy");
		return -1;
	}
	dc->done = true;
	if (dc->timer)
		event_loop_del_timer(dc->loop, dc->timer);
	dc->timer = 0;
	dc->ev.on_copied(dc->ev.opaque);
	return 0;
}

/* Reads a chunk; 0, or -1 with read_errno set (0 for an unexpected end). */
static int read_chunk(struct disk_copy *dc)
{
	ssize_t n = pread(dc->fd, dc->buf, dc->read_len, (off_t)dc->read_offset);

	dc->read_errno = n < 0 ? errno : 0;
	if (n <= 0)
		return -1;
	dc->read_len = (size_t)n;
	return 0;
}

static int read_job(void *arg)
{
	return read_chunk(arg);
}

/* The chunk read (result: read_chunk's): queued, or read again if overtaken. */
static int chunk_read(struct disk_copy *dc, int result)
{
	char why[PATH_MAX + 64];

	dc->reading = false;
	if (!dc->started)
		return -1; /* stopped meanwhile: nothing more to send */
	if (result < 0) {
		snprintf(why, sizeof(why), "reading the disk %s for the initial copy: %s",
			 dc->path, dc->read_errno ? strerror(dc->read_errno) : "unexpected end");
		failed(dc, DISK_COPY_READ_FAILED, why);
		return -1;
	}
	if (dc->read_overtaken) {
		dc->overtaken_in_a_row++;
		return 0; /* pos stays: the same chunk is read next */
	}
	dc->overtaken_in_a_row = 0;
	if (put_copy_frame(dc, dc->read_offset, dc->buf, dc->read_len, false) < 0) {
		failed(dc, DISK_COPY_QUEUE_FAILED, "cannot queue the disk copy "
		       "(out of memory)");
		return -1;
	}
	dc->pos = dc->read_offset + dc->read_len;
	dc->bytes += dc->read_len;
	return 0;
}

static void on_chunk_read(void *opaque, int result)
{
	struct disk_copy *dc = opaque;

	if (chunk_read(dc, result) == 0)
		disk_copy_pump(dc);
}

void disk_copy_pump(struct disk_copy *dc)
{
	while (dc->started && dc->planned && !dc->done && !dc->reading &&
	       dc->sink.backlog(dc->sink.opaque) < DISK_COPY_BACKLOG) {
		if (!next_extent(dc, &dc->read_offset, &dc->read_len)) {
			if (queue_done(dc) < 0)
				return;
			break;
		}
		dc->reading = true;
		dc->read_overtaken = false;
		if (dc->reader && dc->overtaken_in_a_row < DISK_COPY_MAX_OVERTAKEN &&
		    loop_worker_post(dc->reader, read_job, dc, on_chunk_read, dc) == 0)
			return; /* on_chunk_read goes on */
		if (chunk_read(dc, read_chunk(dc)) < 0)
			return;
	}
}

static long on_tick(event_loop *loop, long long id, void *data)
{
	struct disk_copy *dc = data;

	disk_copy_pump(dc);
	/* The copy may have ended (or been stopped) inside the pump. */
	if (dc->timer != id)
		return TIMER_DONE;
	if (dc->done || !dc->started) {
		dc->timer = 0;
		return TIMER_DONE;
	}
	return DISK_COPY_TICK_MS;
}

int disk_copy_start(struct disk_copy *dc, struct nbd_export *export,
		    const struct disk_copy_sink *sink, char *err, size_t errlen)
{
	dc->export = export;
	dc->sink = *sink;
	dc->started = true;
	nbd_export_set_write_hook(export, on_write, dc);
	dc->timer = event_loop_add_timer(dc->loop, DISK_COPY_TICK_MS, on_tick, dc);
	if (dc->timer <= 0) {
		dc->timer = 0;
		disk_copy_stop(dc);
		snprintf(err, errlen, "cannot add the disk copy's timer");
		return -1;
	}
	disk_copy_pump(dc);
	return 0;
}

int disk_copy_set_plan(struct disk_copy *dc, const uint8_t *bits, uint64_t extent_count)
{
	if (bits) {
		size_t nb = (size_t)((extent_count + 7) / 8);
		dc->plan = malloc(nb ? nb : 1);
		if (!dc->plan)
			return -1;
		memcpy(dc->plan, bits, nb);
		dc->plan_count = extent_count;
	}
	dc->planned = true;
	disk_copy_pump(dc);
	return 0;
}

uint64_t disk_copy_planned_extents(const struct disk_copy *dc)
{
	uint64_t n = 0;

	if (!dc->plan)
		return disk_changes_extents_of(dc->size);
	for (uint64_t i = 0; i < dc->plan_count; i++)
		n += planned_extent(dc, i);
	return n;
}

void disk_copy_stop(struct disk_copy *dc)
{
	if (dc->export)
		nbd_export_set_write_hook(dc->export, NULL, NULL);
	dc->export = NULL;
	if (dc->timer)
		event_loop_del_timer(dc->loop, dc->timer);
	dc->timer = 0;
	dc->started = false;
	/* Writes are not watched from here on: a chunk being read is not to be trusted. */
	dc->read_overtaken = true;
}
