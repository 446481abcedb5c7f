/*
 * libFuzzer harness for the COLO stream parser: the bytes QEMU's COLO
 * source writes to remusdbd.  The input is fed in two chunks split at
 * data[0] (mod the size), so a record straddling two reads is exercised
 * as often as a whole one; then once more whole, and both runs must agree.
 * Callbacks touch every byte range they are given, so ASan checks bounds.
 *
 * Build: `make -C dom0-daemon fuzz` (links every daemon source but main.c).
 * Seeds: any stream from tests/unit/test_colo_stream.c's build() helps;
 * without seeds the fuzzer finds the magic on its own within seconds.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qemu/colo_stream.h"

struct tally {
	uint64_t events, bytes;
	uint32_t sum;
};

static void touch(struct tally *t, const uint8_t *data, size_t len)
{
	if (len == 0)
		abort(); /* the parser never passes empty ranges */
	t->sum += data[0] + data[len - 1];
	t->bytes += len;
	t->events++;
}

static int on_configuration(void *o, const char *machine)
{
	touch(o, (const uint8_t *)machine, strlen(machine) + 1);
	return 0;
}

static int on_command(void *o, uint16_t cmd, const uint8_t *data, uint16_t len)
{
	if (len)
		touch(o, data, len);
	return 0;
}

static int on_section(void *o, const struct colo_section *s)
{
	touch(o, (const uint8_t *)s->idstr, strlen(s->idstr) + 1);
	return 0;
}

static int on_ram_block(void *o, const struct colo_ram_block *b)
{
	if (b->length == 0 || b->length % MIG_PAGE_SIZE)
		abort();
	touch(o, (const uint8_t *)b->name, strlen(b->name) + 1);
	return 0;
}

static int on_page(void *o, const struct colo_ram_block *b, uint64_t off,
		   const uint8_t *data)
{
	if (off >= b->length || off % MIG_PAGE_SIZE)
		abort();
	touch(o, data, MIG_PAGE_SIZE);
	return 0;
}

static int on_zero_page(void *o, const struct colo_ram_block *b, uint64_t off,
			uint8_t fill)
{
	if (off >= b->length || off % MIG_PAGE_SIZE)
		abort();
	((struct tally *)o)->sum += fill;
	((struct tally *)o)->events++;
	return 0;
}

/* Chunk boundaries depend on the reads: sum every byte so they do not. */
static int on_chunk(void *o, const uint8_t *data, size_t len)
{
	struct tally *t = o;

	if (len == 0)
		abort();
	for (size_t i = 0; i < len; i++)
		t->sum += data[i];
	t->bytes += len;
	return 0;
}

static int on_blob_complete(void *o, uint64_t len)
{
	((struct tally *)o)->sum += (uint32_t)len;
	return 0;
}

static int on_vmdescription(void *o, const char *json, size_t len)
{
	if (len < 14 || json[0] != '{' || json[len - 1] != '}')
		abort();
	touch(o, (const uint8_t *)json, len);
	return 0;
}

static int on_bulk_complete(void *o)
{
	((struct tally *)o)->events++;
	return 0;
}

static int on_colo_message(void *o, enum colo_message msg, uint64_t value)
{
	((struct tally *)o)->sum += (uint32_t)msg + (uint32_t)value;
	return 0;
}

static int on_checkpoint_complete(void *o, uint64_t seq, uint64_t len)
{
	((struct tally *)o)->sum += (uint32_t)(seq + len);
	return 0;
}

static const struct colo_stream_callbacks callbacks = {
	.on_configuration = on_configuration,
	.on_command = on_command,
	.on_section = on_section,
	.on_ram_block = on_ram_block,
	.on_page = on_page,
	.on_zero_page = on_zero_page,
	.on_device_blob_chunk = on_chunk,
	.on_device_blob_complete = on_blob_complete,
	.on_vmdescription = on_vmdescription,
	.on_bulk_complete = on_bulk_complete,
	.on_colo_message = on_colo_message,
	.on_checkpoint_device_blob = on_chunk,
	.on_checkpoint_complete = on_checkpoint_complete,
};

/*
 * Limits just above what the recorded seeds in tests/fixtures/colo need
 * (VMDESCRIPTION up to ~98 KB, device state ~33 KB), so the seeds reach
 * the checkpoints, yet low enough that a mutated length field still hits
 * them.
 */
static const struct colo_stream_limits limits = {
	.max_vmdesc = 128 * 1024,
	.max_device_blob = 128 * 1024,
};

static int run(const uint8_t *data, size_t size, size_t split,
	       struct tally *t, uint64_t *offset)
{
	struct colo_stream_callbacks cb = callbacks;
	const char *err = NULL;

	memset(t, 0, sizeof(*t));
	cb.opaque = t;
	struct colo_stream *s = colo_stream_new(&cb, &limits);
	if (!s)
		abort();
	int rc = colo_stream_feed(s, data, split, &err);
	if (rc == COLO_STREAM_NEED_MORE)
		rc = colo_stream_feed(s, data + split, size - split, &err);
	if (rc == COLO_STREAM_ERROR && (!err || !*err))
		abort(); /* every error has a message */
	*offset = colo_stream_offset(s);
	if (rc == COLO_STREAM_NEED_MORE && *offset != size)
		abort(); /* need more means all of it was consumed */
	colo_stream_free(s);
	return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct tally split_tally, whole_tally;
	uint64_t split_off, whole_off;

	if (size == 0)
		return 0;
	size_t split = data[0] % size;
	int a = run(data, size, split, &split_tally, &split_off);
	int b = run(data, size, size, &whole_tally, &whole_off);
	/*
	 * Chunking must not change the outcome.  (Device blob chunk counts
	 * may differ; byte totals and sums may not.)
	 */
	if (a != b || (a == COLO_STREAM_NEED_MORE &&
		       (split_tally.bytes != whole_tally.bytes ||
			split_tally.sum != whole_tally.sum)))
		abort();
	return 0;
}
