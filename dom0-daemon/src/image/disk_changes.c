/* A disk image's change log beside it (disk_changes.h). */
#include "image/disk_changes.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/be.h"
#include "base/fs_util.h"
#include "base/log.h"

/*
 * Version 2 added the flags' meaning and the boot id (an unflushed
 * claim's); a version 1 file (48-byte header, flags 0) is still read.
 */
#define MAGIC "RDBCHG2\n"
#define MAGIC_V1 "RDBCHG1\n"
#define HEADER_SIZE 64
#define HEADER_SIZE_V1 48
#define TRAILER_SIZE 8
#define FLAG_UNFLUSHED 1u /* the generation holds only while the boot id is this kernel's */
#define BOOT_ID_BYTES 16
/* A log bigger than this is not ours: 64 MiB of bits is a 512 TiB disk. */
#define MAX_BITMAP_BYTES (64u << 20)

struct disk_changes {
	char image_path[PATH_MAX];
	char path[PATH_MAX];
	int fd;
	int image_fd;            /* for its inode */
	uint64_t image_size;
	uint64_t generation;
	uint64_t count;          /* extents */
	uint8_t *bits;
	uint64_t *last_epoch;    /* per extent; meaningful where marked */
	bool generation_live;    /* begin_generation ran in this session */
	uint64_t last_written;   /* the extent the latest write marked; count: none yet */
	bool broken;             /* a write of the log failed: unproven */
	bool unflushed;          /* the generation is claimed for the page cache's contents */
	uint8_t boot_id[BOOT_ID_BYTES]; /* the kernel whose page cache that is */
	char trouble[256];
};

static char boot_id_path[PATH_MAX] = "/proc/sys/kernel/random/boot_id";

void disk_changes_set_boot_id_file(const char *path)
{
	snprintf(boot_id_path, sizeof(boot_id_path), "%s",
		 path ? path : "/proc/sys/kernel/random/boot_id");
}

/* The running kernel's boot id (a UUID, read as its 16 bytes); -1 if unreadable. */
static int read_boot_id(uint8_t out[BOOT_ID_BYTES])
{
	char text[64];
	unsigned n = 0;
	FILE *f = fopen(boot_id_path, "re");

	if (!f)
		return -1;
	bool ok = fgets(text, sizeof(text), f) != NULL;
	fclose(f);
	for (const char *c = text; ok && *c && *c != '\n' && n < 2 * BOOT_ID_BYTES; c++) {
		int v = *c >= '0' && *c <= '9' ? *c - '0' : *c >= 'a' && *c <= 'f' ? *c - 'a' + 10
			: *c >= 'A' && *c <= 'F' ? *c - 'A' + 10 : *c == '-' ? -2 : -1;
		if (v == -2)
			continue;
		if (v < 0)
			return -1;
		out[n / 2] = (uint8_t)(n % 2 ? out[n / 2] | v : v << 4);
		n++;
	}
	return ok && n == 2 * BOOT_ID_BYTES ? 0 : -1;
}

size_t disk_changes_bitmap_bytes(uint64_t extent_count)
{
	return (size_t)((extent_count + 7) / 8);
}

static bool marked(const struct disk_changes *dc, uint64_t i)
{
	return extent_bit(dc->bits, i);
}

static void set_mark(struct disk_changes *dc, uint64_t i, uint64_t epoch)
{
	extent_bit_set(dc->bits, i, true);
	dc->last_epoch[i] = epoch;
}

static void mark_everything(struct disk_changes *dc)
{
	for (uint64_t i = 0; i < dc->count; i++)
		set_mark(dc, i, DISK_CHANGES_NO_EPOCH);
}

static size_t file_size_of(const struct disk_changes *dc, size_t header)
{
	return header + disk_changes_bitmap_bytes(dc->count) + TRAILER_SIZE;
}

static size_t file_size(const struct disk_changes *dc)
{
	return file_size_of(dc, HEADER_SIZE);
}

/*
 * The image's inode, kept in the log: a disk file replaced by another
 * (copied over by rename) must not inherit the old one's log.  0 when
 * the image cannot be opened (yet).
 */
static uint64_t image_inode(struct disk_changes *dc)
{
	struct stat st;

	if (dc->image_fd < 0)
		dc->image_fd = open(dc->image_path, O_RDONLY | O_CLOEXEC);
	return dc->image_fd >= 0 && fstat(dc->image_fd, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* The whole file in one pwrite: it is small, and a torn one fails its checksum. */
static int write_log(struct disk_changes *dc, bool durable)
{
	size_t n = file_size(dc), nb = disk_changes_bitmap_bytes(dc->count);
	uint8_t *buf = malloc(n);
	int rc = -1;

	if (!buf) {
		errno = ENOMEM;
		return -1;
	}
	memcpy(buf, MAGIC, 8);
	store_be64(buf + 8, dc->generation);
	store_be64(buf + 16, dc->image_size);
	store_be32(buf + 24, DISK_CHANGES_EXTENT_SHIFT);
	store_be32(buf + 28, dc->unflushed ? FLAG_UNFLUSHED : 0);
	store_be64(buf + 32, dc->count);
	store_be64(buf + 40, image_inode(dc));
	memset(buf + 48, 0, BOOT_ID_BYTES);
	if (dc->unflushed)
		memcpy(buf + 48, dc->boot_id, BOOT_ID_BYTES);
	memcpy(buf + HEADER_SIZE, dc->bits, nb);
	store_be64(buf + HEADER_SIZE + nb, XXH64(buf, HEADER_SIZE + nb, 0));
	if (dc->fd < 0)
		dc->fd = open(dc->path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (dc->fd >= 0 && pwrite_all(dc->fd, buf, n, 0) == 0 &&
	    (!durable || fdatasync(dc->fd) == 0))
		rc = 0;
	free(buf);
	return rc;
}

/* A failed write leaves nothing we can vouch for: say so once, and from then on. */
static int persist(struct disk_changes *dc, bool durable)
{
	if (dc->broken)
		return -1;
	if (write_log(dc, durable) == 0)
		return 0;
	snprintf(dc->trouble, sizeof(dc->trouble), "the change log %.150s could not be "
		 "written: %s", dc->path, strerror(errno));
	log_error("%s: a failback from this disk will copy it whole", dc->trouble);
	dc->broken = true;
	dc->generation = DISK_CHANGES_NO_GENERATION;
	dc->unflushed = false;
	mark_everything(dc);
	return -1;
}

static int unproven(struct disk_changes *dc, const char *why)
{
	snprintf(dc->trouble, sizeof(dc->trouble), "%s", why);
	dc->generation = DISK_CHANGES_NO_GENERATION;
	dc->unflushed = false;
	mark_everything(dc);
	return 0;
}

/* Reads an existing log; any doubt makes it unproven, never an error. */
static int load(struct disk_changes *dc)
{
	char why[256];
	struct stat st;
	size_t want = file_size(dc), nb = disk_changes_bitmap_bytes(dc->count);
	size_t header = HEADER_SIZE;

	dc->fd = open(dc->path, O_RDWR | O_CLOEXEC);
	if (dc->fd < 0) {
		if (errno == ENOENT)
			return unproven(dc, "no change log was ever recorded for this disk");
		snprintf(why, sizeof(why), "the change log %.150s cannot be opened: %s",
			 dc->path, strerror(errno));
		return unproven(dc, why);
	}
	if (fstat(dc->fd, &st) == 0 && (size_t)st.st_size == file_size_of(dc, HEADER_SIZE_V1)) {
		header = HEADER_SIZE_V1;
		want = file_size_of(dc, header);
	}
	if (fstat(dc->fd, &st) < 0 || (size_t)st.st_size != want) {
		snprintf(why, sizeof(why), "the change log %.150s is %lld bytes, not the %zu "
			 "of a %llu-byte disk", dc->path, (long long)st.st_size, want,
			 (unsigned long long)dc->image_size);
		return unproven(dc, why);
	}
	uint8_t *buf = malloc(want);
	if (!buf || pread(dc->fd, buf, want, 0) != (ssize_t)want) {
		free(buf);
		snprintf(why, sizeof(why), "the change log %.150s cannot be read", dc->path);
		return unproven(dc, why);
	}
	uint32_t flags = load_be32(buf + 28);
	if (memcmp(buf, header == HEADER_SIZE ? MAGIC : MAGIC_V1, 8) != 0 ||
	    load_be64(buf + 16) != dc->image_size ||
	    load_be32(buf + 24) != DISK_CHANGES_EXTENT_SHIFT || load_be64(buf + 32) != dc->count ||
	    (flags & ~FLAG_UNFLUSHED) || (header == HEADER_SIZE_V1 && flags) ||
	    load_be64(buf + header + nb) != XXH64(buf, header + nb, 0)) {
		free(buf);
		snprintf(why, sizeof(why), "the change log %.150s is torn or of another disk "
			 "(its header or checksum does not match)", dc->path);
		return unproven(dc, why);
	}
	uint64_t inode = load_be64(buf + 40), now = image_inode(dc);
	if (inode != now) {
		free(buf);
		snprintf(why, sizeof(why), "the change log %.150s was kept for another file at "
			 "that path (inode %llu, now %llu): the disk was replaced", dc->path,
			 (unsigned long long)inode, (unsigned long long)now);
		return unproven(dc, why);
	}
	uint8_t now_boot[BOOT_ID_BYTES];
	if ((flags & FLAG_UNFLUSHED) && load_be64(buf + 8) != DISK_CHANGES_NO_GENERATION &&
	    (read_boot_id(now_boot) < 0 || memcmp(now_boot, buf + 48, BOOT_ID_BYTES) != 0)) {
		free(buf);
		snprintf(why, sizeof(why), "the copy's last writes were only in the page cache "
			 "of a kernel that has since stopped (the host rebooted or lost power): "
			 "some may never have reached %.100s", dc->image_path);
		return unproven(dc, why);
	}
	dc->generation = load_be64(buf + 8);
	dc->unflushed = flags & FLAG_UNFLUSHED;
	if (dc->unflushed)
		memcpy(dc->boot_id, buf + 48, BOOT_ID_BYTES);
	memcpy(dc->bits, buf + header, nb);
	free(buf);
	/* The epochs of the marks died with the last process: keep them all. */
	for (uint64_t i = 0; i < dc->count; i++)
		dc->last_epoch[i] = DISK_CHANGES_NO_EPOCH;
	if (dc->generation == DISK_CHANGES_NO_GENERATION)
		snprintf(dc->trouble, sizeof(dc->trouble), "the disk was being rewritten (a "
			 "copy to it did not finish) and belongs to no generation");
	return 0;
}

bool disk_changes_exist(const char *image_path)
{
	char path[PATH_MAX];

	if (snprintf(path, sizeof(path), "%s.changes", image_path) >= (int)sizeof(path))
		return false;
	return access(path, F_OK) == 0;
}

struct disk_changes *disk_changes_open(const char *image_path, uint64_t image_size,
				       char *err, size_t errlen)
{
	struct disk_changes *dc = calloc(1, sizeof(*dc));
	uint64_t count = disk_changes_extents_of(image_size);

	if (!dc) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	dc->fd = -1;
	dc->image_fd = -1;
	snprintf(dc->image_path, sizeof(dc->image_path), "%s", image_path);
	if (snprintf(dc->path, sizeof(dc->path), "%s.changes", image_path) >=
	    (int)sizeof(dc->path)) {
		snprintf(err, errlen, "the disk's path is too long for its change log");
		free(dc);
		return NULL;
	}
	if (disk_changes_bitmap_bytes(count) > MAX_BITMAP_BYTES) {
		snprintf(err, errlen, "a %llu-byte disk is too big for a change log",
			 (unsigned long long)image_size);
		free(dc);
		return NULL;
	}
	dc->image_size = image_size;
	dc->count = count;
	dc->last_written = count;
	dc->bits = calloc(1, disk_changes_bitmap_bytes(count) + 1);
	dc->last_epoch = calloc(count + 1, sizeof(*dc->last_epoch));
	if (!dc->bits || !dc->last_epoch) {
		snprintf(err, errlen, "out of memory");
		disk_changes_close(dc);
		return NULL;
	}
	load(dc);
	return dc;
}

void disk_changes_close(struct disk_changes *dc)
{
	if (!dc)
		return;
	if (dc->fd >= 0)
		close(dc->fd);
	if (dc->image_fd >= 0)
		close(dc->image_fd);
	free(dc->bits);
	free(dc->last_epoch);
	free(dc);
}

uint64_t disk_changes_generation(const struct disk_changes *dc)
{
	return dc->generation;
}

const char *disk_changes_trouble(const struct disk_changes *dc)
{
	return dc->generation == DISK_CHANGES_NO_GENERATION ?
	       (dc->trouble[0] ? dc->trouble : "no generation recorded") : NULL;
}

uint64_t disk_changes_extent_count(const struct disk_changes *dc)
{
	return dc->count;
}

const uint8_t *disk_changes_bitmap(const struct disk_changes *dc)
{
	return dc->bits;
}

uint64_t disk_changes_last_written(const struct disk_changes *dc)
{
	return dc->last_written < dc->count ? dc->last_written : UINT64_MAX;
}

uint64_t disk_changes_marked(const struct disk_changes *dc)
{
	uint64_t n = 0;

	for (uint64_t i = 0; i < dc->count; i++)
		n += marked(dc, i);
	return n;
}

int disk_changes_mark(struct disk_changes *dc, uint64_t offset, uint64_t len, uint64_t epoch)
{
	bool fresh = false;

	if (len == 0 || offset >= dc->image_size)
		return 0;
	uint64_t last = offset + len - 1 < dc->image_size ? offset + len - 1 : dc->image_size - 1;
	for (uint64_t i = offset >> DISK_CHANGES_EXTENT_SHIFT;
	     i <= last >> DISK_CHANGES_EXTENT_SHIFT; i++) {
		fresh |= !marked(dc, i);
		set_mark(dc, i, epoch);
	}
	dc->last_written = last >> DISK_CHANGES_EXTENT_SHIFT;
	/* Only a new mark must reach the disk before the write does. */
	return fresh ? persist(dc, true) : 0;
}

int disk_changes_mark_bitmap(struct disk_changes *dc, const uint8_t *bits, uint64_t count)
{
	for (uint64_t i = 0; i < count && i < dc->count; i++)
		if (extent_bit(bits, i))
			set_mark(dc, i, DISK_CHANGES_NO_EPOCH);
	return persist(dc, true);
}

void disk_changes_new_session(struct disk_changes *dc)
{
	/* Epoch 0 precedes every epoch of the new session; not cleared by its acks. */
	for (uint64_t i = 0; i < dc->count; i++)
		if (marked(dc, i))
			dc->last_epoch[i] = 0;
	dc->generation_live = false;
}

int disk_changes_begin_generation(struct disk_changes *dc, uint64_t generation,
				  uint64_t acked_epoch)
{
	if (dc->broken)
		return -1;
	for (uint64_t i = 0; i < dc->count; i++)
		if (marked(dc, i) && dc->last_epoch[i] <= acked_epoch)
			extent_bit_set(dc->bits, i, false);
	dc->generation = generation;
	dc->trouble[0] = '\0';
	dc->generation_live = true;
	dc->unflushed = false;
	return persist(dc, true);
}

int disk_changes_claim_unflushed(struct disk_changes *dc, uint64_t generation)
{
	if (dc->broken)
		return -1;
	if (read_boot_id(dc->boot_id) < 0) {
		snprintf(dc->trouble, sizeof(dc->trouble), "the kernel's boot id (%.150s) cannot be "
			 "read: an unflushed copy cannot be vouched for", boot_id_path);
		return -1;
	}
	/* As a seal does: the whole copy is in the file, later epochs are the primary's marks. */
	memset(dc->bits, 0, disk_changes_bitmap_bytes(dc->count));
	dc->generation = generation;
	dc->trouble[0] = '\0';
	dc->unflushed = true;
	return persist(dc, true);
}

bool disk_changes_unflushed(const struct disk_changes *dc)
{
	return dc->unflushed;
}

void disk_changes_forget_acked(struct disk_changes *dc, uint64_t acked_epoch)
{
	bool any = false;

	if (!dc->generation_live || dc->broken)
		return;
	for (uint64_t i = 0; i < dc->count && !any; i++)
		any = marked(dc, i) && dc->last_epoch[i] <= acked_epoch;
	if (!any)
		return;
	for (uint64_t i = 0; i < dc->count; i++)
		if (marked(dc, i) && dc->last_epoch[i] <= acked_epoch)
			extent_bit_set(dc->bits, i, false);
	/*
	 * Not durable: a lost clear only leaves an extent marked, and the
	 * next new mark's fdatasync carries it anyway.
	 */
	persist(dc, false);
}

int disk_changes_invalidate(struct disk_changes *dc, const char *why)
{
	if (dc->broken)
		return -1;
	dc->generation = DISK_CHANGES_NO_GENERATION;
	dc->generation_live = false;
	dc->unflushed = false;
	snprintf(dc->trouble, sizeof(dc->trouble), "%s", why);
	return persist(dc, true);
}
