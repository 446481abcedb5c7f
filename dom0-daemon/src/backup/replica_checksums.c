/* The committed image's page checksums, written a slice at a time (replica_checksums.h). */
#include "backup/replica_checksums.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/be.h"
#include "base/fs_util.h"
#include "base/log.h"
#include "qemu/migration_writer.h"
#include "codec/page_coding.h"
#include "image/ram_image.h"
#include "backup/replica.h"

/* 64 MiB of pages per loop turn: a few ms of hashing. */
#define PAGES_PER_SLICE 16384u

static const char *const state_names[] = {
	[SUMS_IDLE] = "idle", [SUMS_RUNNING] = "running",
	[SUMS_DONE] = "done", [SUMS_FAILED] = "failed",
};

void replica_checksums_init(struct replica_checksums *c)
{
	memset(c, 0, sizeof(*c));
	c->fd = -1;
}

static void finish(struct replica *r, int state, const char *error)
{
	struct replica_checksums *c = &r->checksums;

	if (c->fd >= 0 && close(c->fd) < 0 && state == SUMS_DONE) {
		state = SUMS_FAILED;
		error = strerror(errno);
	}
	c->fd = -1;
	c->timer = 0;
	c->state = state;
	if (error) {
		snprintf(c->error, sizeof(c->error), "%s", error);
		log_error("vm %s: image checksums: %s", r->name, error);
	} else {
		log_info("vm %s: checksums of %llu pages of %s (epoch %llu) written to %s",
			 r->name, (unsigned long long)c->pages, c->block_name,
			 (unsigned long long)c->epoch, c->path);
	}
}

static long slice(event_loop *loop, long long id, void *data)
{
	struct replica *r = data;
	struct replica_checksums *c = &r->checksums;
	uint8_t sums[PAGES_PER_SLICE * 8];
	char why[160];

	if (!r->image || r->committed_epoch != c->epoch) {
		snprintf(why, sizeof(why), "the image moved on from epoch %llu to %llu "
			 "during the dump (was the checkpoint held?)",
			 (unsigned long long)c->epoch, (unsigned long long)r->committed_epoch);
		finish(r, SUMS_FAILED, why);
		return TIMER_DONE;
	}
	const struct ram_image_block *b = ram_image_block(r->image, c->block);
	uint64_t n = c->pages - c->next < PAGES_PER_SLICE ? c->pages - c->next : PAGES_PER_SLICE;
	for (uint64_t i = 0; i < n; i++)
		store_be64(sums + 8 * i, page_checksum(b->mem + (c->next + i) * MIG_PAGE_SIZE));
	if (pwrite_all(c->fd, sums, (size_t)n * 8, c->next * 8) < 0) {
		snprintf(why, sizeof(why), "writing the checksums: %s", strerror(errno));
		finish(r, SUMS_FAILED, why);
		return TIMER_DONE;
	}
	c->next += n;
	if (c->next < c->pages)
		return 0;
	finish(r, SUMS_DONE, NULL);
	return TIMER_DONE;
}

int replica_checksums_start(struct replica *r, const char *block_name, const char *path,
			    char *err, size_t errlen)
{
	struct replica_checksums *c = &r->checksums;
	size_t i, count = r->image ? ram_image_block_count(r->image) : 0;

	if (c->state == SUMS_RUNNING) {
		snprintf(err, errlen, "a checksum dump is running already");
		return -1;
	}
	if (!r->any_commit) {
		snprintf(err, errlen, "the replica has committed no epoch yet");
		return -1;
	}
	for (i = 0; i < count; i++)
		if (strcmp(ram_image_block(r->image, i)->name, block_name) == 0)
			break;
	if (i == count) {
		snprintf(err, errlen, "the image has no RAM block named '%.60s'", block_name);
		return -1;
	}
	if (path[0] != '/' || strlen(path) >= sizeof(c->path)) {
		snprintf(err, errlen, "path must be absolute and shorter than %zu bytes",
			 sizeof(c->path));
		return -1;
	}
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		snprintf(err, errlen, "cannot create %s: %s", path, strerror(errno));
		return -1;
	}
	replica_checksums_init(c);
	c->fd = fd;
	c->block = (unsigned)i;
	snprintf(c->block_name, sizeof(c->block_name), "%s", block_name);
	snprintf(c->path, sizeof(c->path), "%s", path);
	c->epoch = r->committed_epoch;
	c->pages = ram_image_block(r->image, i)->length / MIG_PAGE_SIZE;
	c->timer = event_loop_add_timer(r->loop, 0, slice, r);
	if (c->timer < 0) {
		finish(r, SUMS_FAILED, "cannot start the dump (out of memory)");
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	c->state = SUMS_RUNNING;
	return 0;
}

void replica_checksums_stop(struct replica *r)
{
	struct replica_checksums *c = &r->checksums;

	if (c->timer > 0)
		event_loop_del_timer(r->loop, c->timer);
	c->timer = 0;
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	if (c->state == SUMS_RUNNING)
		c->state = SUMS_FAILED;
}

json_t *replica_checksums_json(const struct replica *r)
{
	const struct replica_checksums *c = &r->checksums;

	return json_pack("{s:s, s:s, s:I, s:I, s:I, s:s, s:o}", "state", state_names[c->state],
			 "block", c->block_name, "epoch", (json_int_t)c->epoch,
			 "pages", (json_int_t)c->pages, "done_pages", (json_int_t)c->next,
			 "path", c->path,
			 "error", c->error[0] ? json_string(c->error) : json_null());
}
