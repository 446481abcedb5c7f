/* A fork's memory snapshot from a precopy migration; see snapshot_capture.h. */
#include "fork/snapshot_capture.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qemu/colo_stream.h"
#include "qemu/migration_writer.h"

struct block_track {
	uint32_t *last_seen;   /* per page: sequence number of the last record, 0 = never */
	uint64_t *resent;      /* bitmap: sent more than once */
};

struct snapshot_capture {
	struct colo_stream *stream;
	struct ram_image *img;
	char machine_type[256];
	struct block_track track[RAM_IMAGE_MAX_BLOCKS];
	uint32_t seq;
	struct page_ref *redirtied;
	size_t redirtied_count;
	struct buffer blob;
	bool blob_done;
	bool complete;
	char error[256];
	struct snapshot_capture_stats stats;
};

static int set_error(struct snapshot_capture *sc, const char *what)
{
	snprintf(sc->error, sizeof(sc->error), "%s", what);
	return -1;
}

static int on_configuration(void *opaque, const char *machine_type)
{
	struct snapshot_capture *sc = opaque;

	snprintf(sc->machine_type, sizeof(sc->machine_type), "%s", machine_type);
	return 0;
}

/* The image is made at the first page: by then the MEM_SIZE record named every block. */
static int make_image(struct snapshot_capture *sc)
{
	size_t count;
	const struct colo_ram_block *blocks = colo_stream_blocks(sc->stream, &count);
	const char *names[RAM_IMAGE_MAX_BLOCKS];
	uint64_t lengths[RAM_IMAGE_MAX_BLOCKS];
	uint32_t id;
	char err[200];

	if (!colo_stream_ram_section_id(sc->stream, &id) || count == 0)
		return set_error(sc, "a page arrived before the ram layout");
	for (size_t i = 0; i < count; i++) {
		names[i] = blocks[i].name;
		lengths[i] = blocks[i].length;
	}
	sc->img = ram_image_create(sc->machine_type[0] ? sc->machine_type : "pc", id,
				   names, lengths, count, err, sizeof(err));
	if (!sc->img)
		return set_error(sc, err);
	for (size_t i = 0; i < count; i++) {
		uint64_t pages = lengths[i] / MIG_PAGE_SIZE;

		sc->track[i].last_seen = calloc(pages ? pages : 1, sizeof(uint32_t));
		sc->track[i].resent = calloc(pages / 64 + 1, sizeof(uint64_t));
		if (!sc->track[i].last_seen || !sc->track[i].resent)
			return set_error(sc, "out of memory tracking pages");
	}
	return 0;
}

static int record_page(struct snapshot_capture *sc, unsigned block, uint64_t offset,
		       const uint8_t *data)
{
	if (!sc->img && make_image(sc) < 0)
		return -1;
	uint64_t page = offset / MIG_PAGE_SIZE;
	if (ram_image_store_page(sc->img, block, page, data) < 0)
		return set_error(sc, "a page beyond its block");
	struct block_track *t = &sc->track[block];
	if (t->last_seen[page] && !(t->resent[page / 64] & (1ull << (page % 64)))) {
		t->resent[page / 64] |= 1ull << (page % 64);
		sc->stats.redirtied++;
	}
	t->last_seen[page] = ++sc->seq;
	return 0;
}

static int on_page(void *opaque, const struct colo_ram_block *block,
		   uint64_t offset, const uint8_t *data)
{
	struct snapshot_capture *sc = opaque;

	sc->stats.pages++;
	return record_page(sc, block->index, offset, data);
}

static int on_zero_page(void *opaque, const struct colo_ram_block *block,
			uint64_t offset, uint8_t fill)
{
	struct snapshot_capture *sc = opaque;
	uint8_t page[MIG_PAGE_SIZE];

	sc->stats.zero_pages++;
	if (fill == 0)
		return record_page(sc, block->index, offset, NULL);
	memset(page, fill, sizeof(page));
	return record_page(sc, block->index, offset, page);
}

static int on_blob_chunk(void *opaque, const uint8_t *data, size_t len)
{
	struct snapshot_capture *sc = opaque;

	if (buffer_append(&sc->blob, data, len) < 0)
		return set_error(sc, "out of memory for the device state");
	return 0;
}

static int on_blob_complete(void *opaque, uint64_t total_len)
{
	struct snapshot_capture *sc = opaque;

	sc->blob_done = true;
	sc->stats.device_bytes = total_len;
	return 0;
}

static int by_last_seen(const void *a, const void *b, void *arg)
{
	const struct snapshot_capture *sc = arg;
	const struct page_ref *x = a, *y = b;
	uint32_t sx = sc->track[x->block].last_seen[x->page];
	uint32_t sy = sc->track[y->block].last_seen[y->page];

	return sx < sy ? -1 : sx > sy;
}

static int collect_redirtied(struct snapshot_capture *sc)
{
	size_t n = 0;

	sc->redirtied = calloc(sc->stats.redirtied ? sc->stats.redirtied : 1,
			       sizeof(*sc->redirtied));
	if (!sc->redirtied)
		return set_error(sc, "out of memory ordering redirtied pages");
	for (size_t b = 0; b < ram_image_block_count(sc->img); b++) {
		uint64_t pages = ram_image_block(sc->img, b)->length / MIG_PAGE_SIZE;

		for (uint64_t p = 0; p < pages; p++)
			if (sc->track[b].resent[p / 64] & (1ull << (p % 64)))
				sc->redirtied[n++] = (struct page_ref){ (uint32_t)b, p };
	}
	sc->redirtied_count = n;
	qsort_r(sc->redirtied, n, sizeof(*sc->redirtied), by_last_seen, sc);
	return 0;
}

static int on_bulk_complete(void *opaque)
{
	struct snapshot_capture *sc = opaque;

	if (!sc->img && make_image(sc) < 0)
		return -1;
	if (!sc->blob_done || buffer_len(&sc->blob) == 0)
		return set_error(sc, "the migration ended without device state");
	ram_image_swap_device_blob(sc->img, &sc->blob);
	buffer_clear(&sc->blob);
	if (collect_redirtied(sc) < 0)
		return -1;
	sc->complete = true;
	return 0;
}

struct snapshot_capture *snapshot_capture_new(void)
{
	struct snapshot_capture *sc = calloc(1, sizeof(*sc));
	const struct colo_stream_callbacks cb = {
		.opaque = sc,
		.on_configuration = on_configuration,
		.on_page = on_page,
		.on_zero_page = on_zero_page,
		.on_device_blob_chunk = on_blob_chunk,
		.on_device_blob_complete = on_blob_complete,
		.on_bulk_complete = on_bulk_complete,
	};
	const struct colo_stream_limits lim = {
		.max_vmdesc = COLO_STREAM_DEFAULT_MAX_VMDESC,
		.max_device_blob = COLO_STREAM_DEFAULT_MAX_DEVICE_BLOB,
		/* QEMU closes the stream after VMDESCRIPTION: nothing follows. */
		.strict_bulk_pause = true,
	};

	if (!sc)
		return NULL;
	buffer_init(&sc->blob);
	sc->stream = colo_stream_new(&cb, &lim);
	if (!sc->stream) {
		free(sc);
		return NULL;
	}
	return sc;
}

void snapshot_capture_free(struct snapshot_capture *sc)
{
	if (!sc)
		return;
	colo_stream_free(sc->stream);
	for (size_t i = 0; i < RAM_IMAGE_MAX_BLOCKS; i++) {
		free(sc->track[i].last_seen);
		free(sc->track[i].resent);
	}
	free(sc->redirtied);
	ram_image_destroy(sc->img);
	buffer_free(&sc->blob);
	free(sc);
}

int snapshot_capture_feed(struct snapshot_capture *sc, const uint8_t *data,
			  size_t len, const char **err)
{
	const char *perr = NULL;

	if (sc->error[0]) {
		*err = sc->error;
		return -1;
	}
	if (sc->complete && len) {
		set_error(sc, "bytes after the end of the migration");
		sc->complete = false;
		*err = sc->error;
		return -1;
	}
	if (colo_stream_feed(sc->stream, data, len, &perr) < 0) {
		if (!sc->error[0])
			snprintf(sc->error, sizeof(sc->error), "%s", perr ? perr : "parse error");
		/*
		 * The bulk may have completed inside this very chunk (the
		 * strict-pause check fails after on_bulk_complete ran): data
		 * after VMDESCRIPTION means the end was a false match, so the
		 * device state is not trustworthy.  Errors are sticky.
		 */
		sc->complete = false;
		*err = sc->error;
		return -1;
	}
	sc->stats.stream_bytes += len;
	return 0;
}

int snapshot_capture_finish(struct snapshot_capture *sc, const char **err)
{
	if (sc->complete)
		return 0;
	if (!sc->error[0])
		snprintf(sc->error, sizeof(sc->error),
			 "the migration stream ended after %llu bytes, before the "
			 "device state was complete",
			 (unsigned long long)sc->stats.stream_bytes);
	*err = sc->error;
	return -1;
}

bool snapshot_capture_complete(const struct snapshot_capture *sc)
{
	return sc->complete;
}

struct ram_image *snapshot_capture_image(struct snapshot_capture *sc)
{
	return sc->img;
}

const struct page_ref *snapshot_capture_redirtied(const struct snapshot_capture *sc,
						  size_t *count)
{
	*count = sc->redirtied_count;
	return sc->redirtied;
}

void snapshot_capture_get_stats(const struct snapshot_capture *sc,
				struct snapshot_capture_stats *out)
{
	*out = sc->stats;
}
