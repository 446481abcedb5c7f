/*
 * libFuzzer harness for snapshot_capture: a precopy migration stream from
 * the parent QEMU, parsed into a fork's snapshot.  The input is fed split
 * at a point taken from data[0] and again whole; both must agree on the
 * outcome, the stats and the redirtied list.  A complete capture is then
 * served the way a clone gets it (postcopy_wire preamble, every page,
 * END + EOF), so the writers run over fuzzed layouts and images too.
 *
 * Build: `make -C dom0-daemon build/fuzz_snapshot_capture` (or `make fuzz`;
 * the recorded COLO streams seed it: their bulk part is a precopy stream).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qemu/migration_writer.h"
#include "fork/postcopy_wire.h"
#include "fork/snapshot_capture.h"

struct outcome {
	int feed_rc, finish_rc;
	struct snapshot_capture_stats st;
	uint64_t redirtied_hash;
	size_t redirtied;
};

static void serve(struct ram_image *img)
{
	struct buffer b;
	char err[256];

	buffer_init(&b);
	if (pcw_preamble(&b, img, err, sizeof(err)) < 0)
		abort(); /* a complete capture has a device blob ending in EOF */
	for (size_t i = 0; i < ram_image_block_count(img); i++) {
		uint64_t pages = ram_image_block(img, i)->length / MIG_PAGE_SIZE;

		/* Bounded work per input: the first and last run of each block. */
		uint64_t n = pages < 64 ? pages : 64;
		if (pcw_pages(&b, img, (unsigned)i, 0, n) < 0 ||
		    pcw_pages(&b, img, (unsigned)i, pages - n, n) < 0 ||
		    pcw_pages(&b, img, (unsigned)i, pages, 1) == 0)
			abort();
		buffer_clear(&b);
	}
	if (pcw_finish(&b, img) < 0)
		abort();
	buffer_free(&b);
}

static void run(const uint8_t *data, size_t size, size_t split, bool check,
		struct outcome *out)
{
	struct snapshot_capture *sc = snapshot_capture_new();
	const char *err = NULL;

	memset(out, 0, sizeof(*out));
	if (!sc)
		abort();
	out->feed_rc = snapshot_capture_feed(sc, data, split, &err);
	if (out->feed_rc == 0)
		out->feed_rc = snapshot_capture_feed(sc, data + split, size - split, &err);
	if (out->feed_rc < 0 && (!err || !*err))
		abort();
	out->finish_rc = snapshot_capture_finish(sc, &err);
	if (out->finish_rc < 0 && (!err || !*err))
		abort();
	if ((out->finish_rc == 0) != snapshot_capture_complete(sc) ||
	    (out->finish_rc == 0 && out->feed_rc < 0))
		abort();
	snapshot_capture_get_stats(sc, &out->st);
	if (out->finish_rc == 0) {
		struct ram_image *img = snapshot_capture_image(sc);
		const struct page_ref *r = snapshot_capture_redirtied(sc, &out->redirtied);

		if (!img || out->redirtied != out->st.redirtied)
			abort();
		for (size_t i = 0; i < out->redirtied; i++) {
			const struct ram_image_block *b = ram_image_block(img, r[i].block);

			if (!b || r[i].page >= b->length / MIG_PAGE_SIZE)
				abort();
			out->redirtied_hash = out->redirtied_hash * 31 + r[i].block * 7 + r[i].page;
		}
		if (check)
			serve(img);
	}
	snapshot_capture_free(sc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct outcome split, whole;

	if (size == 0)
		return 0;
	run(data, size, data[0] % (size + 1), true, &split);
	run(data, size, size, false, &whole);
	/*
	 * The strict pause makes one outcome depend on the reads: bytes after
	 * VMDESCRIPTION in the same read fail at once, in a later read they
	 * fail as bytes after the end.  Both fail; the rest must be equal.
	 */
	if (split.feed_rc != whole.feed_rc || split.finish_rc != whole.finish_rc)
		abort();
	if (whole.finish_rc == 0 &&
	    (memcmp(&split.st, &whole.st, sizeof(whole.st)) ||
	     split.redirtied_hash != whole.redirtied_hash))
		abort();
	return 0;
}
