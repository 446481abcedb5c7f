/* A VM fork's frozen disk: copy-before-write into a preserve file (disk_snapshot.h). */
#include "fork/disk_snapshot.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nbd/disk_file.h"
#include "base/log.h"
#include "nbd/nbd_server.h"

#define BS DISK_SNAPSHOT_BLOCK_SIZE
/*
 * Blocks preserved with one read and one write at most: a guest write is
 * at most 32 MiB, so a big one costs a few rounds, and the buffer stays
 * small for every snapshot that exists.
 */
#define PRESERVE_CHUNK_BLOCKS 64u

struct disk_snapshot {
	struct nbd_export *live;   /* NULL once detached */
	const char *detached_why;  /* why reads fail, once detached */
	char name[96];             /* "snapshot #N of 'vm1'": log lines */
	struct disk_file preserve; /* sparse, unlinked; preserve.path is NULL */
	uint64_t *preserved;       /* one bit per block, set once preserved */
	uint8_t *chunk;            /* PRESERVE_CHUNK_BLOCKS blocks */
	struct disk_snapshot_stats stats;
	unsigned holders;          /* read-only exports serving it */
	bool destroyed;
};

static bool is_preserved(const struct disk_snapshot *ds, uint64_t block)
{
	return (ds->preserved[block / 64] >> (block % 64)) & 1;
}

static void mark_preserved(struct disk_snapshot *ds, uint64_t block)
{
	ds->preserved[block / 64] |= 1ULL << (block % 64);
}

static bool all_zero(const uint8_t *p, size_t len)
{
	return len == 0 || (p[0] == 0 && memcmp(p, p + 1, len - 1) == 0);
}

/* Bytes of the block at pos, which may be the image's short last one. */
static size_t block_bytes(size_t pos, size_t total)
{
	return total - pos < BS ? total - pos : BS;
}

/*
 * Copies blocks [first, first+n), none preserved yet, from the live image
 * to the preserve file, then marks them.  Zero blocks are not written:
 * the preserve file reads zeros there already.  0 or a negative errno;
 * on failure no block of the run is marked.
 */
static int preserve_run(struct disk_snapshot *ds, uint64_t first, uint64_t n)
{
	uint64_t start = first * BS;
	size_t total = (size_t)(ds->stats.size - start < n * BS ? ds->stats.size - start
								 : n * BS);
	int err = nbd_export_read_image(ds->live, ds->chunk, total, start);
	size_t pos = 0, written = 0;

	if (err)
		return err;
	while (pos < total) {
		if (all_zero(ds->chunk + pos, block_bytes(pos, total))) {
			pos += block_bytes(pos, total);
			continue;
		}
		size_t end = pos + block_bytes(pos, total);
		while (end < total && !all_zero(ds->chunk + end, block_bytes(end, total)))
			end += block_bytes(end, total);
		err = disk_file_write(&ds->preserve, ds->chunk + pos, end - pos, start + pos);
		if (err)
			return err;
		written += end - pos;
		pos = end;
	}
	for (uint64_t b = first; b < first + n; b++)
		mark_preserved(ds, b);
	ds->stats.blocks_preserved += n;
	ds->stats.bytes_preserved += written;
	return 0;
}

/* The export's before-write hook: preserve every block the change touches. */
static int before_write(void *opaque, uint64_t offset, uint64_t len)
{
	struct disk_snapshot *ds = opaque;
	uint64_t size = ds->stats.size;

	if (len == 0 || offset >= size)
		return 0;
	uint64_t end = len > size - offset ? size : offset + len;
	uint64_t block = offset / BS, last = (end - 1) / BS;
	while (block <= last) {
		if (is_preserved(ds, block)) {
			block++;
			continue;
		}
		uint64_t n = 1;
		while (block + n <= last && n < PRESERVE_CHUNK_BLOCKS &&
		       !is_preserved(ds, block + n))
			n++;
		int err = preserve_run(ds, block, n);
		if (err) {
			ds->stats.preserve_failures++;
			log_error("%s: cannot preserve %llu bytes at offset %llu before the "
				  "parent's write: %s; the write is refused so that the "
				  "snapshot stays intact", ds->name,
				  (unsigned long long)(n * BS), (unsigned long long)(block * BS),
				  strerror(-err));
			/* The client hears "out of space" or a plain I/O error. */
			return err == -ENOSPC || err == -EDQUOT || err == -EFBIG ? -ENOSPC : -EIO;
		}
		block += n;
	}
	return 0;
}

static void detach(struct disk_snapshot *ds, const char *why)
{
	ds->live = NULL;
	ds->detached_why = why;
	ds->stats.detached = true;
}

/* The live export is being destroyed. */
static void on_live_gone(void *opaque)
{
	struct disk_snapshot *ds = opaque;

	log_warn("%s: the live export is going away; reads of the snapshot fail "
		 "from now on", ds->name);
	detach(ds, "its live export was destroyed");
}

static int open_preserve_file(const char *dir, char *err, size_t errlen)
{
	char path[4096];
	int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);

	if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)) {
		if (fd < 0)
			snprintf(err, errlen, "cannot create a preserve file in %s: %s",
				 dir, strerror(errno));
		return fd;
	}
	/* No O_TMPFILE on this filesystem: a named file, unlinked at once. */
	if (snprintf(path, sizeof(path), "%s/.snapshot-XXXXXX", dir) >= (int)sizeof(path)) {
		snprintf(err, errlen, "preserve directory path too long: %.80s", dir);
		return -1;
	}
	fd = mkostemp(path, O_CLOEXEC);
	if (fd < 0) {
		snprintf(err, errlen, "cannot create a preserve file in %s: %s", dir,
			 strerror(errno));
		return -1;
	}
	unlink(path);
	return fd;
}

static void snapshot_free(struct disk_snapshot *ds)
{
	disk_file_close(&ds->preserve);
	free(ds->preserved);
	free(ds->chunk);
	free(ds);
}

struct disk_snapshot *disk_snapshot_create(struct nbd_export *live,
					   const char *preserve_dir,
					   char *err, size_t errlen)
{
	static unsigned next_id;
	struct disk_snapshot *ds = calloc(1, sizeof(*ds));

	if (!ds) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	ds->preserve.fd = -1;
	ds->stats.size = nbd_export_size(live);
	ds->stats.blocks = (ds->stats.size + BS - 1) / BS;
	snprintf(ds->name, sizeof(ds->name), "snapshot #%u of '%s'", ++next_id,
		 nbd_export_name(live));
	ds->preserved = calloc(ds->stats.blocks / 64 + 1, sizeof(uint64_t));
	ds->chunk = malloc((size_t)PRESERVE_CHUNK_BLOCKS * BS);
	if (!ds->preserved || !ds->chunk) {
		snprintf(err, errlen, "out of memory for the block bitmap");
		goto fail;
	}
	ds->preserve.fd = open_preserve_file(preserve_dir, err, errlen);
	if (ds->preserve.fd < 0)
		goto fail;
	/* Sparse at the image's size: never-written blocks read as zeros. */
	if (ftruncate(ds->preserve.fd, (off_t)ds->stats.size) < 0) {
		snprintf(err, errlen, "cannot size the preserve file in %s: %s",
			 preserve_dir, strerror(errno));
		goto fail;
	}
	ds->preserve.size = ds->stats.size;
	if (nbd_export_add_before_write(live, before_write, on_live_gone, ds) < 0) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	ds->live = live;
	log_info("%s: frozen at %llu bytes, preserving into %s", ds->name,
		 (unsigned long long)ds->stats.size, preserve_dir);
	return ds;
fail:
	snapshot_free(ds);
	return NULL;
}

int disk_snapshot_rebind(struct disk_snapshot *ds, struct nbd_export *live)
{
	if (!ds->live)
		return -1;
	if (nbd_export_size(live) != ds->stats.size ||
	    nbd_export_add_before_write(live, before_write, on_live_gone, ds) < 0)
		return -1;
	nbd_export_remove_before_write(ds->live, ds);
	ds->live = live;
	log_info("%s: now guarding '%s'", ds->name, nbd_export_name(live));
	return 0;
}

void disk_snapshot_destroy(struct disk_snapshot *ds)
{
	if (!ds)
		return;
	if (ds->live)
		nbd_export_remove_before_write(ds->live, ds);
	detach(ds, "the snapshot was destroyed");
	ds->destroyed = true;
	log_info("%s: destroyed after preserving %llu blocks; clones read %llu bytes",
		 ds->name, (unsigned long long)ds->stats.blocks_preserved,
		 (unsigned long long)ds->stats.bytes_read);
	if (ds->holders == 0)
		snapshot_free(ds);
}

int disk_snapshot_read(struct disk_snapshot *ds, uint64_t offset, void *buf,
		       size_t len, char *err, size_t errlen)
{
	uint8_t *out = buf;
	uint64_t end = offset + len;

	if (!ds->live) {
		snprintf(err, errlen, "%s is detached: %s", ds->name, ds->detached_why);
		return -EIO;
	}
	if (offset > ds->stats.size || len > ds->stats.size - offset) {
		snprintf(err, errlen, "read of %zu bytes at offset %llu is beyond the "
			 "%llu-byte snapshot", len, (unsigned long long)offset,
			 (unsigned long long)ds->stats.size);
		return -EINVAL;
	}
	/* Runs of blocks alike: preserved ones from the file, others live. */
	for (uint64_t pos = offset; pos < end;) {
		bool preserved = is_preserved(ds, pos / BS);
		uint64_t stop = (pos / BS + 1) * BS;
		while (stop < end && is_preserved(ds, stop / BS) == preserved)
			stop += BS;
		if (stop > end)
			stop = end;
		int rc = preserved ?
			disk_file_read(&ds->preserve, out, stop - pos, pos) :
			nbd_export_read_image(ds->live, out, stop - pos, pos);
		if (rc) {
			snprintf(err, errlen, "%s: reading %llu bytes at offset %llu from %s "
				 "failed: %s", ds->name, (unsigned long long)(stop - pos),
				 (unsigned long long)pos,
				 preserved ? "the preserve file" : "the live image",
				 strerror(-rc));
			return rc;
		}
		out += stop - pos;
		pos = stop;
	}
	ds->stats.reads++;
	ds->stats.bytes_read += len;
	return 0;
}

/*
 * The first block in [block, last] whose preserved bit is not want, or
 * last + 1: a word at a time, so a long run costs its length / 64.
 */
static uint64_t run_end(const struct disk_snapshot *ds, uint64_t block, uint64_t last,
			bool want)
{
	while (block <= last) {
		unsigned shift = block % 64;
		uint64_t word = ds->preserved[block / 64];
		/* Set where the block differs, from block to the word's end. */
		uint64_t differ = ((want ? ~word : word) >> shift);
		if (differ == 0) {
			block += 64 - shift;
			continue;
		}
		block += (uint64_t)__builtin_ctzll(differ);
		break;
	}
	return block <= last ? block : last + 1;
}

/* Appends an extent, merged with the last one of its kind.  -1: out is full. */
static int add_extent(struct disk_extent *out, size_t max, size_t *count,
		      uint64_t length, int hole)
{
	if (*count > 0 && out[*count - 1].hole == hole) {
		out[*count - 1].length += length;
		return 0;
	}
	if (*count == max)
		return -1;
	out[*count].length = length;
	out[*count].hole = hole;
	(*count)++;
	return 0;
}

/*
 * Runs of preserved and live blocks looked at per call: each costs an
 * lseek() or two, and alternating runs of data merge into one extent,
 * so the extent limit alone would not bound a 4 GiB request's work.
 */
#define EXTENT_RUNS_MAX 1024u
/* Extents asked of one file per step. */
#define EXTENT_PART 64u

int disk_snapshot_extents(struct disk_snapshot *ds, uint64_t offset, uint64_t len,
			  struct disk_extent *out, size_t max, size_t *count,
			  char *err, size_t errlen)
{
	uint64_t pos = offset, end = offset + len;
	unsigned runs = 0;

	*count = 0;
	if (!ds->live) {
		snprintf(err, errlen, "%s is detached: %s", ds->name, ds->detached_why);
		return -EIO;
	}
	if (len == 0 || max == 0 || offset > ds->stats.size || len > ds->stats.size - offset) {
		snprintf(err, errlen, "block status of %llu bytes at offset %llu: empty or "
			 "beyond the %llu-byte snapshot", (unsigned long long)len,
			 (unsigned long long)offset, (unsigned long long)ds->stats.size);
		return -EINVAL;
	}
	while (pos < end && runs++ < EXTENT_RUNS_MAX) {
		bool preserved = is_preserved(ds, pos / BS);
		uint64_t stop = run_end(ds, pos / BS, (end - 1) / BS, preserved) * BS;
		if (stop > end)
			stop = end;
		/* Each file's own holes are the frozen view's in this run. */
		while (pos < stop) {
			struct disk_extent part[EXTENT_PART];
			size_t n = 0;

			if (preserved) {
				disk_file_extents(&ds->preserve, pos, stop - pos, part,
						  EXTENT_PART, &n);
			} else {
				int rc = nbd_export_extents(ds->live, pos, stop - pos, part,
							    EXTENT_PART, &n);
				if (rc) {
					snprintf(err, errlen, "%s: block status of the live "
						 "image at offset %llu failed: %s", ds->name,
						 (unsigned long long)pos, strerror(-rc));
					return rc;
				}
			}
			for (size_t i = 0; i < n; i++) {
				if (add_extent(out, max, count, part[i].length, part[i].hole))
					goto full;
				pos += part[i].length;
			}
		}
	}
full:
	ds->stats.extent_queries++;
	return 0;
}

uint64_t disk_snapshot_size(const struct disk_snapshot *ds)
{
	return ds->stats.size;
}

void disk_snapshot_get_stats(const struct disk_snapshot *ds,
			     struct disk_snapshot_stats *out)
{
	*out = ds->stats;
}

/* ---- serving it read-only --------------------------------------- */

static int backend_read(void *opaque, void *buf, size_t len, uint64_t offset)
{
	struct disk_snapshot *ds = opaque;
	char err[256];
	int rc = disk_snapshot_read(ds, offset, buf, len, err, sizeof(err));

	if (rc)
		log_warn("%s", err);
	return rc;
}

static int backend_extents(void *opaque, uint64_t offset, uint64_t len,
			   struct disk_extent *out, size_t max, size_t *count)
{
	struct disk_snapshot *ds = opaque;
	char err[256];
	int rc = disk_snapshot_extents(ds, offset, len, out, max, count, err, sizeof(err));

	if (rc)
		log_warn("%s", err);
	return rc;
}

static void backend_release(void *opaque)
{
	struct disk_snapshot *ds = opaque;

	if (--ds->holders == 0 && ds->destroyed)
		snapshot_free(ds);
}

struct nbd_export *nbd_export_create_snapshot(event_loop *loop, const char *name,
					      const char *socket_path,
					      const char *tcp_listen,
					      struct disk_snapshot *ds)
{
	struct nbd_read_backend backend = {
		.size = ds->stats.size,
		.what = ds->name,
		.read = backend_read,
		.extents = backend_extents,
		.release = backend_release,
		.opaque = ds,
	};

	struct nbd_export *export = nbd_export_create_read_only(loop, name, socket_path,
								 tcp_listen, &backend);
	if (export)
		ds->holders++;
	return export;
}
