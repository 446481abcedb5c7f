/*
 * The COLO stream parser and the migration stream encoders.  Streams are
 * built with migration_writer plus hand-written bytes for what QEMU writes
 * and we never do (device sections, VMDESCRIPTION, COLO messages), then
 * parsed whole, byte by byte, split at every offset and cut at every
 * offset.
 */
#include <CUnit/CUnit.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qemu/colo_stream.h"
#include "qemu/migration_writer.h"
#include "suites.h"

#define RAM_ID 2
#define PC_PAGES 16
#define VGA_PAGES 4
#define NCHECKPOINTS 3
#define MAX_EVENTS 256

static const struct migw_ram_block test_blocks[2] = {
	{ "pc.ram", PC_PAGES * MIG_PAGE_SIZE },
	{ "vga.vram", VGA_PAGES * MIG_PAGE_SIZE },
};

static const char vmdesc_json[] =
	"{\"page_size\": 4096, \"devices\": [{\"name\": \"timer\", "
	"\"instance_id\": 0, \"vmsd_name\": \"timer\", \"version\": 2, "
	"\"fields\": [{\"name\": \"a\\\"]}\", \"type\": \"int64\", "
	"\"size\": 8}]}]}";

/* ---- building streams -------------------------------------------------- */

struct image {
	uint8_t pc[PC_PAGES * MIG_PAGE_SIZE];
	uint8_t vga[VGA_PAGES * MIG_PAGE_SIZE];
};

struct built {
	struct buffer b;
	struct image expect;      /* RAM after applying every record */
	size_t bulk_end;          /* offset just past VMDESCRIPTION */
	size_t ckpt_end[NCHECKPOINTS];
	size_t devblob_off, devblob_len;
	size_t ckblob_off[NCHECKPOINTS], ckblob_len[NCHECKPOINTS];
	unsigned pages, zeros;    /* records written */
};

static uint8_t *image_block(struct image *img, int block)
{
	return block == 0 ? img->pc : img->vga;
}

static void put(struct buffer *b, const void *p, size_t n)
{
	CU_ASSERT_EQUAL_FATAL(buffer_append(b, p, n), 0);
}

static void put_be32(struct buffer *b, uint32_t v)
{
	uint8_t x[4];

	store_be32(x, v);
	put(b, x, 4);
}

static void put_be64(struct buffer *b, uint64_t v)
{
	uint8_t x[8];

	store_be64(x, v);
	put(b, x, 8);
}

static void fill_page(uint8_t *page, int block, unsigned index, int version)
{
	for (unsigned i = 0; i < MIG_PAGE_SIZE; i++)
		page[i] = (uint8_t)(i * 31 + index * 7 + (unsigned)version * 13 +
				    (unsigned)block);
}

/* name NULL: CONTINUE. block: which block that is, for the image. */
static void page(struct built *t, const char *name, int block, unsigned index,
		 int version)
{
	uint8_t data[MIG_PAGE_SIZE];

	fill_page(data, block, index, version);
	CU_ASSERT_EQUAL_FATAL(migw_ram_page(&t->b, name, index * MIG_PAGE_SIZE,
					    data), 0);
	memcpy(image_block(&t->expect, block) + index * MIG_PAGE_SIZE, data,
	       MIG_PAGE_SIZE);
	t->pages++;
}

static void zero(struct built *t, const char *name, int block, unsigned index)
{
	CU_ASSERT_EQUAL_FATAL(migw_ram_zero(&t->b, name, index * MIG_PAGE_SIZE,
					    0), 0);
	memset(image_block(&t->expect, block) + index * MIG_PAGE_SIZE, 0,
	       MIG_PAGE_SIZE);
	t->zeros++;
}

static void end_ram_section(struct built *t)
{
	CU_ASSERT_EQUAL_FATAL(migw_ram_eos(&t->b), 0);
	CU_ASSERT_EQUAL_FATAL(migw_section_footer(&t->b, RAM_ID), 0);
}

/*
 * Device sections as QEMU writes them, with bytes that look like the start
 * of the VMDESCRIPTION trailer but are not.
 */
static void device_sections(struct buffer *b, int version)
{
	static const uint8_t decoys[] = {
		0x00, 0x06, 0x00, 0x00, 0x00, 0x05, /* length too small */
		0x00, 0x00, 0x06, 0x00, /* 00 00 06: second 00 is a candidate */
		0x00, 0x06, 0x00, 0x00, 0x00, 0x40, '{', '"', 'p', 'a', 'g',
		'e', '_', 's', 'i', 'z', 'e', '"', ':', ' ', '4',
		0x00, 0x06, 0xff, 0xff, 0xff, 0xff, /* 00 in JSON, then huge */
		0x00, 0x06, 0x00, 0x00, 0x00, 0x11, '{', '"', 'p', 'a', 'g',
		'e', '_', 's', 'i', 'z', 'e', '"', ':', ' ', '1', '}', '}',
		0x00, 0x06, 0x00, 0x00, 0x00, 0x0f, '{', '"', 'n', 'o', 't',
		0x00, 0x06, 0x00, 0x00, 0x00, 0x12, /* valid JSON, wrong key */
		'{', '"', 'a', '"', ':', '"', 'b', 'c', 'd', 'e', 'f', 'g', 'h',
		'i', 'j', 'k', '"', '}',
		0x00,
	};
	uint8_t regs[64];

	CU_ASSERT_EQUAL_FATAL(migw_section_start(b, MIG_SECTION_FULL, 0, "timer",
						 0, 2), 0);
	put(b, decoys, sizeof(decoys));
	CU_ASSERT_EQUAL_FATAL(migw_section_footer(b, 0), 0);
	/*
	 * Section id 6: its footer ends in 00 06, so the footer and the real
	 * EOF + VMDESCRIPTION overlap as 00 06 00 06 00 00 ..., a candidate
	 * that is rejected and must be re-scanned to find the real one.
	 */
	CU_ASSERT_EQUAL_FATAL(migw_section_start(b, MIG_SECTION_FULL, 6, "cpu",
						 0, 20), 0);
	for (size_t i = 0; i < sizeof(regs); i++)
		regs[i] = (uint8_t)(i % 3 ? 0 : i + (size_t)version);
	put(b, regs, sizeof(regs));
	CU_ASSERT_EQUAL_FATAL(migw_section_footer(b, 6), 0);
	CU_ASSERT_EQUAL_FATAL(migw_eof(b), 0);
}

static void checkpoint(struct built *t, int n)
{
	put_be32(&t->b, COLO_MSG_CHECKPOINT_REQUEST);
	put_be32(&t->b, COLO_MSG_VMSTATE_SEND);
	CU_ASSERT_EQUAL_FATAL(migw_section_part(&t->b, MIG_SECTION_END, RAM_ID), 0);
	if (n == 0) {
		/* The bulk END section's last block (pc.ram) carries over. */
		page(t, NULL, 0, 3, 10);
		page(t, NULL, 0, 4, 10);
		zero(t, "vga.vram", 1, 2);
	} else if (n == 1) {
		page(t, NULL, 1, 3, 11); /* still vga.vram */
		page(t, "pc.ram", 0, 0, 11);
		zero(t, NULL, 0, 15);
	}                                /* n == 2: nothing dirty */
	end_ram_section(t);
	CU_ASSERT_EQUAL_FATAL(migw_eof(&t->b), 0);

	struct buffer dev;
	buffer_init(&dev);
	device_sections(&dev, n + 1);
	put_be32(&t->b, COLO_MSG_VMSTATE_SIZE);
	put_be64(&t->b, buffer_len(&dev));
	t->ckblob_off[n] = buffer_len(&t->b);
	t->ckblob_len[n] = buffer_len(&dev);
	put(&t->b, buffer_head(&dev), buffer_len(&dev));
	buffer_free(&dev);
	t->ckpt_end[n] = buffer_len(&t->b);
}

static void build(struct built *t)
{
	struct buffer *b = &t->b;

	memset(t, 0, sizeof(*t));
	buffer_init(b);
	CU_ASSERT_EQUAL_FATAL(migw_header(b), 0);
	CU_ASSERT_EQUAL_FATAL(migw_configuration(b, "pc-q35-7.2"), 0);
	CU_ASSERT_EQUAL_FATAL(migw_command(b, MIG_CMD_ENABLE_COLO, NULL, 0), 0);

	CU_ASSERT_EQUAL_FATAL(migw_section_start(b, MIG_SECTION_START, RAM_ID,
						 "ram", 0, 4), 0);
	CU_ASSERT_EQUAL_FATAL(migw_ram_mem_size(b, test_blocks, 2), 0);
	end_ram_section(t);

	CU_ASSERT_EQUAL_FATAL(migw_section_part(b, MIG_SECTION_PART, RAM_ID), 0);
	page(t, "pc.ram", 0, 0, 0);
	page(t, NULL, 0, 1, 0);
	zero(t, NULL, 0, 2);
	page(t, "vga.vram", 1, 0, 0);
	end_ram_section(t);

	/* CONTINUE in a new section still means vga.vram. */
	CU_ASSERT_EQUAL_FATAL(migw_section_part(b, MIG_SECTION_PART, RAM_ID), 0);
	page(t, NULL, 1, 3, 0);
	zero(t, NULL, 1, 1);
	end_ram_section(t);

	CU_ASSERT_EQUAL_FATAL(migw_section_part(b, MIG_SECTION_END, RAM_ID), 0);
	page(t, "pc.ram", 0, 15, 0);
	zero(t, NULL, 0, 14);
	end_ram_section(t);

	t->devblob_off = buffer_len(b);
	device_sections(b, 0);
	t->devblob_len = buffer_len(b) - t->devblob_off;
	const uint8_t vmdesc = MIG_VMDESCRIPTION;
	put(b, &vmdesc, 1);
	put_be32(b, (uint32_t)strlen(vmdesc_json));
	put(b, vmdesc_json, strlen(vmdesc_json));
	t->bulk_end = buffer_len(b);

	for (int n = 0; n < NCHECKPOINTS; n++)
		checkpoint(t, n);
}

/* ---- recording what the parser reports -------------------------------- */

enum ev_kind {
	EV_CONFIG = 1, EV_COMMAND, EV_SECTION, EV_BLOCK, EV_PAGE, EV_ZERO,
	EV_DEVBLOB, EV_VMDESC, EV_BULK, EV_MSG, EV_CKPT,
};

struct event {
	int kind;
	uint32_t a;
	uint64_t b, c;
	uint32_t hash;
};

struct recorder {
	struct event ev[MAX_EVENTS];
	size_t n;
	struct image img;
	struct buffer devblob, ckblob;
	uint8_t ckblobs[NCHECKPOINTS][512];
	size_t ckblob_len[NCHECKPOINTS];
	char config[64];
	int fail_kind; /* a callback of this kind returns -1 */
};

static uint32_t fnv(const void *data, size_t len)
{
	const uint8_t *p = data;
	uint32_t h = 2166136261u;

	for (size_t i = 0; i < len; i++)
		h = (h ^ p[i]) * 16777619u;
	return h;
}

static int record(struct recorder *r, int kind, uint32_t a, uint64_t b,
		  uint64_t c, uint32_t hash)
{
	if (r->n < MAX_EVENTS) {
		struct event *e = &r->ev[r->n++];

		memset(e, 0, sizeof(*e));
		e->kind = kind;
		e->a = a;
		e->b = b;
		e->c = c;
		e->hash = hash;
	}
	return kind == r->fail_kind ? -1 : 0;
}

static int on_configuration(void *o, const char *machine)
{
	struct recorder *r = o;

	snprintf(r->config, sizeof(r->config), "%s", machine);
	return record(r, EV_CONFIG, 0, 0, 0, fnv(machine, strlen(machine)));
}

static int on_command(void *o, uint16_t cmd, const uint8_t *data, uint16_t len)
{
	return record(o, EV_COMMAND, cmd, len, 0, fnv(data, len));
}

static int on_section(void *o, const struct colo_section *s)
{
	return record(o, EV_SECTION, s->type, s->id,
		      (uint64_t)s->version << 1 | s->checkpoint,
		      fnv(s->idstr, strlen(s->idstr)));
}

static int on_ram_block(void *o, const struct colo_ram_block *b)
{
	return record(o, EV_BLOCK, b->index, b->length, 0,
		      fnv(b->name, strlen(b->name)));
}

static int on_page(void *o, const struct colo_ram_block *b, uint64_t off,
		   const uint8_t *data)
{
	struct recorder *r = o;

	memcpy(image_block(&r->img, (int)b->index) + off, data, MIG_PAGE_SIZE);
	return record(r, EV_PAGE, b->index, off, 0, fnv(data, MIG_PAGE_SIZE));
}

static int on_zero_page(void *o, const struct colo_ram_block *b, uint64_t off,
			uint8_t fill)
{
	struct recorder *r = o;

	memset(image_block(&r->img, (int)b->index) + off, fill, MIG_PAGE_SIZE);
	return record(r, EV_ZERO, b->index, off, fill, 0);
}

static int on_device_blob_chunk(void *o, const uint8_t *data, size_t len)
{
	struct recorder *r = o;

	CU_ASSERT(len > 0);
	return buffer_append(&r->devblob, data, len);
}

static int on_device_blob_complete(void *o, uint64_t total)
{
	struct recorder *r = o;

	CU_ASSERT_EQUAL(total, buffer_len(&r->devblob));
	return record(r, EV_DEVBLOB, 0, total, 0,
		      fnv(buffer_head(&r->devblob), buffer_len(&r->devblob)));
}

static int on_vmdescription(void *o, const char *json, size_t len)
{
	return record(o, EV_VMDESC, 0, len, 0, fnv(json, len));
}

static int on_bulk_complete(void *o)
{
	return record(o, EV_BULK, 0, 0, 0, 0);
}

static int on_colo_message(void *o, enum colo_message msg, uint64_t value)
{
	return record(o, EV_MSG, msg, value, 0, 0);
}

static int on_checkpoint_device_blob(void *o, const uint8_t *data, size_t len)
{
	struct recorder *r = o;

	CU_ASSERT(len > 0);
	return buffer_append(&r->ckblob, data, len);
}

static int on_checkpoint_complete(void *o, uint64_t seq, uint64_t len)
{
	struct recorder *r = o;
	size_t have = buffer_len(&r->ckblob);

	CU_ASSERT_EQUAL(len, have);
	if (seq >= 1 && seq <= NCHECKPOINTS && have <= sizeof(r->ckblobs[0])) {
		memcpy(r->ckblobs[seq - 1], buffer_head(&r->ckblob), have);
		r->ckblob_len[seq - 1] = have;
	}
	uint32_t h = fnv(buffer_head(&r->ckblob), have);
	buffer_clear(&r->ckblob);
	return record(r, EV_CKPT, 0, seq, len, h);
}

static const struct colo_stream_callbacks recorder_callbacks = {
	.on_configuration = on_configuration,
	.on_command = on_command,
	.on_section = on_section,
	.on_ram_block = on_ram_block,
	.on_page = on_page,
	.on_zero_page = on_zero_page,
	.on_device_blob_chunk = on_device_blob_chunk,
	.on_device_blob_complete = on_device_blob_complete,
	.on_vmdescription = on_vmdescription,
	.on_bulk_complete = on_bulk_complete,
	.on_colo_message = on_colo_message,
	.on_checkpoint_device_blob = on_checkpoint_device_blob,
	.on_checkpoint_complete = on_checkpoint_complete,
};

static struct recorder *recorder_new(void)
{
	struct recorder *r = calloc(1, sizeof(*r));

	CU_ASSERT_PTR_NOT_NULL_FATAL(r);
	buffer_init(&r->devblob);
	buffer_init(&r->ckblob);
	return r;
}

static void recorder_free(struct recorder *r)
{
	buffer_free(&r->devblob);
	buffer_free(&r->ckblob);
	free(r);
}

static struct colo_stream *parser_for(struct recorder *r,
				      const struct colo_stream_limits *lim)
{
	struct colo_stream_callbacks cb = recorder_callbacks;

	cb.opaque = r;
	struct colo_stream *s = colo_stream_new(r ? &cb : NULL, lim);
	CU_ASSERT_PTR_NOT_NULL_FATAL(s);
	return s;
}

/* Feeds data in pieces of `chunk` bytes (0: all at once). */
static int feed_in_chunks(struct colo_stream *s, const uint8_t *data,
			  size_t len, size_t chunk, const char **err)
{
	if (chunk == 0)
		return colo_stream_feed(s, data, len, err);
	for (size_t at = 0; at < len; at += chunk) {
		size_t n = len - at < chunk ? len - at : chunk;
		int rc = colo_stream_feed(s, data + at, n, err);
		if (rc != COLO_STREAM_NEED_MORE)
			return rc;
	}
	return COLO_STREAM_NEED_MORE;
}

static size_t count(const struct recorder *r, int kind)
{
	size_t n = 0;

	for (size_t i = 0; i < r->n; i++)
		n += r->ev[i].kind == kind;
	return n;
}

static const struct event *nth(const struct recorder *r, int kind, size_t k)
{
	for (size_t i = 0; i < r->n; i++)
		if (r->ev[i].kind == kind && k-- == 0)
			return &r->ev[i];
	return NULL;
}

/* ---- tests ------------------------------------------------------------- */

static void check_full_parse(const struct built *t, const struct recorder *r,
			     struct colo_stream *s)
{
	CU_ASSERT_EQUAL(colo_stream_phase(s), COLO_PHASE_IDLE);
	CU_ASSERT_TRUE(colo_stream_at_boundary(s));
	CU_ASSERT_EQUAL(colo_stream_checkpoints(s), NCHECKPOINTS);
	CU_ASSERT_EQUAL(colo_stream_offset(s), buffer_len(&t->b));
	CU_ASSERT_PTR_NULL(colo_stream_error(s));
	uint32_t id = 0;
	CU_ASSERT_TRUE(colo_stream_ram_section_id(s, &id));
	CU_ASSERT_EQUAL(id, RAM_ID);

	CU_ASSERT_STRING_EQUAL(r->config, "pc-q35-7.2");
	CU_ASSERT_EQUAL(count(r, EV_COMMAND), 1);
	CU_ASSERT_EQUAL(nth(r, EV_COMMAND, 0)->a, MIG_CMD_ENABLE_COLO);
	CU_ASSERT_EQUAL(nth(r, EV_COMMAND, 0)->b, 0);

	size_t nblocks;
	const struct colo_ram_block *blocks = colo_stream_blocks(s, &nblocks);
	CU_ASSERT_EQUAL_FATAL(nblocks, 2);
	CU_ASSERT_STRING_EQUAL(blocks[0].name, "pc.ram");
	CU_ASSERT_EQUAL(blocks[0].length, 0x10000);
	CU_ASSERT_STRING_EQUAL(blocks[1].name, "vga.vram");
	CU_ASSERT_EQUAL(blocks[1].length, 0x4000);
	CU_ASSERT_EQUAL(count(r, EV_BLOCK), 2);

	/* START, PART, PART, END in bulk; one END per checkpoint. */
	CU_ASSERT_EQUAL_FATAL(count(r, EV_SECTION), 4 + NCHECKPOINTS);
	CU_ASSERT_EQUAL(nth(r, EV_SECTION, 0)->a, MIG_SECTION_START);
	CU_ASSERT_EQUAL(nth(r, EV_SECTION, 1)->a, MIG_SECTION_PART);
	CU_ASSERT_EQUAL(nth(r, EV_SECTION, 3)->a, MIG_SECTION_END);
	CU_ASSERT_EQUAL(nth(r, EV_SECTION, 3)->c & 1, 0);
	CU_ASSERT_EQUAL(nth(r, EV_SECTION, 4)->a, MIG_SECTION_END);
	CU_ASSERT_EQUAL(nth(r, EV_SECTION, 4)->b, RAM_ID);
	CU_ASSERT_EQUAL(nth(r, EV_SECTION, 4)->c & 1, 1);

	CU_ASSERT_EQUAL(count(r, EV_PAGE), t->pages);
	CU_ASSERT_EQUAL(count(r, EV_ZERO), t->zeros);
	CU_ASSERT_EQUAL(t->pages, 9);
	CU_ASSERT_EQUAL(t->zeros, 5);
	/* The page that continued into the second PART section. */
	const struct event *e = nth(r, EV_PAGE, 3);
	CU_ASSERT_EQUAL(e->a, 1);
	CU_ASSERT_EQUAL(e->b, 3 * MIG_PAGE_SIZE);
	/* The first checkpoint page continued from the bulk END section. */
	e = nth(r, EV_PAGE, 5);
	CU_ASSERT_EQUAL(e->a, 0);
	CU_ASSERT_EQUAL(e->b, 3 * MIG_PAGE_SIZE);
	CU_ASSERT_EQUAL(memcmp(&r->img, &t->expect, sizeof(r->img)), 0);

	/* The bulk blob: FULL sections through the EOF, nothing else. */
	CU_ASSERT_EQUAL(count(r, EV_DEVBLOB), 1);
	CU_ASSERT_EQUAL_FATAL(buffer_len(&r->devblob), t->devblob_len);
	CU_ASSERT_EQUAL(memcmp(buffer_head(&r->devblob),
			       t->b.data + t->devblob_off, t->devblob_len), 0);
	CU_ASSERT_EQUAL(buffer_head(&r->devblob)[0], MIG_SECTION_FULL);
	CU_ASSERT_EQUAL(buffer_head(&r->devblob)[t->devblob_len - 1], MIG_EOF);
	e = nth(r, EV_VMDESC, 0);
	CU_ASSERT_PTR_NOT_NULL_FATAL(e);
	CU_ASSERT_EQUAL(e->b, strlen(vmdesc_json));
	CU_ASSERT_EQUAL(e->hash, fnv(vmdesc_json, strlen(vmdesc_json)));
	CU_ASSERT_EQUAL(count(r, EV_BULK), 1);

	/* Messages: REQUEST, SEND, SIZE per checkpoint, in order. */
	CU_ASSERT_EQUAL_FATAL(count(r, EV_MSG), 3 * NCHECKPOINTS);
	for (int n = 0; n < NCHECKPOINTS; n++) {
		CU_ASSERT_EQUAL(nth(r, EV_MSG, 3 * n)->a,
				COLO_MSG_CHECKPOINT_REQUEST);
		CU_ASSERT_EQUAL(nth(r, EV_MSG, 3 * n + 1)->a,
				COLO_MSG_VMSTATE_SEND);
		CU_ASSERT_EQUAL(nth(r, EV_MSG, 3 * n + 2)->a,
				COLO_MSG_VMSTATE_SIZE);
		CU_ASSERT_EQUAL(nth(r, EV_MSG, 3 * n + 2)->b, t->ckblob_len[n]);
		e = nth(r, EV_CKPT, (size_t)n);
		CU_ASSERT_PTR_NOT_NULL_FATAL(e);
		CU_ASSERT_EQUAL(e->b, (uint64_t)n + 1);
		CU_ASSERT_EQUAL(r->ckblob_len[n], t->ckblob_len[n]);
		CU_ASSERT_EQUAL(memcmp(r->ckblobs[n], t->b.data + t->ckblob_off[n],
				       t->ckblob_len[n]), 0);
	}
	/* The checkpoints' device state differs (the version byte). */
	CU_ASSERT_NOT_EQUAL(nth(r, EV_CKPT, 0)->hash, nth(r, EV_CKPT, 1)->hash);
}

static void test_full_stream_whole_buffer(void)
{
	struct built t;
	struct recorder *r = recorder_new();
	const char *err = NULL;

	build(&t);
	struct colo_stream *s = parser_for(r, NULL);
	CU_ASSERT_EQUAL(colo_stream_phase(s), COLO_PHASE_BULK);
	CU_ASSERT_EQUAL(colo_stream_feed(s, t.b.data, buffer_len(&t.b), &err),
			COLO_STREAM_NEED_MORE);
	CU_ASSERT_PTR_NULL(err);
	check_full_parse(&t, r, s);
	colo_stream_free(s);
	recorder_free(r);
	buffer_free(&t.b);
}

static void compare_recorders(const struct recorder *a,
			      const struct recorder *b)
{
	CU_ASSERT_EQUAL_FATAL(a->n, b->n);
	CU_ASSERT_EQUAL(memcmp(a->ev, b->ev, a->n * sizeof(a->ev[0])), 0);
	CU_ASSERT_EQUAL(memcmp(&a->img, &b->img, sizeof(a->img)), 0);
	CU_ASSERT_EQUAL(buffer_len(&a->devblob), buffer_len(&b->devblob));
}

static void test_chunk_sizes_give_identical_results(void)
{
	static const size_t chunks[] = { 1, 2, 3, 7, 4095, 4097, 65536 };
	struct built t;
	struct recorder *whole = recorder_new();

	build(&t);
	struct colo_stream *s = parser_for(whole, NULL);
	CU_ASSERT_EQUAL(colo_stream_feed(s, t.b.data, buffer_len(&t.b), NULL), 0);
	colo_stream_free(s);

	for (size_t i = 0; i < sizeof(chunks) / sizeof(chunks[0]); i++) {
		struct recorder *r = recorder_new();
		const char *err = NULL;

		s = parser_for(r, NULL);
		CU_ASSERT_EQUAL(feed_in_chunks(s, t.b.data, buffer_len(&t.b),
					       chunks[i], &err), 0);
		CU_ASSERT_PTR_NULL(err);
		check_full_parse(&t, r, s);
		compare_recorders(whole, r);
		colo_stream_free(s);
		recorder_free(r);
	}
	recorder_free(whole);
	buffer_free(&t.b);
}

static bool is_boundary(const struct built *t, size_t at, unsigned *done)
{
	*done = 0;
	for (int n = 0; n < NCHECKPOINTS; n++)
		*done += at >= t->ckpt_end[n];
	if (at == t->bulk_end)
		return true;
	for (int n = 0; n < NCHECKPOINTS; n++)
		if (at == t->ckpt_end[n])
			return true;
	return false;
}

/*
 * Every prefix is "need more", never an error, and says it is at a
 * boundary exactly where QEMU would pause; feeding the rest afterwards
 * gives the complete result.
 */
static void test_every_truncation_point(void)
{
	struct built t;

	build(&t);
	size_t len = buffer_len(&t.b);
	for (size_t k = 0; k <= len; k++) {
		struct colo_stream *s = parser_for(NULL, NULL);
		const char *err = NULL;
		unsigned done;

		int rc = colo_stream_feed(s, t.b.data, k, &err);
		if (rc != COLO_STREAM_NEED_MORE) {
			CU_FAIL("truncated stream gave an error");
			fprintf(stderr, "at %zu: %s\n", k, err);
			colo_stream_free(s);
			break;
		}
		bool boundary = is_boundary(&t, k, &done);
		CU_ASSERT_EQUAL(colo_stream_at_boundary(s), boundary);
		CU_ASSERT_EQUAL(colo_stream_checkpoints(s), done);
		CU_ASSERT_EQUAL(colo_stream_phase(s),
				k < t.bulk_end ? COLO_PHASE_BULK :
				boundary       ? COLO_PHASE_IDLE :
						 COLO_PHASE_CHECKPOINT);
		CU_ASSERT_EQUAL(colo_stream_offset(s), k);
		if (boundary || k % 17 == 0) {
			/* The peer hangs up here: only boundaries are clean. */
			struct colo_stream *cut = parser_for(NULL, NULL);
			char want[128];

			CU_ASSERT_EQUAL(colo_stream_feed(cut, t.b.data, k, NULL), 0);
			if (k < t.bulk_end)
				snprintf(want, sizeof(want), "truncated: stream ended "
					 "at offset %zu in the bulk migration", k);
			else
				snprintf(want, sizeof(want), "truncated: stream ended "
					 "at offset %zu inside checkpoint %u", k,
					 done + 1);
			err = NULL;
			int fin = colo_stream_finish(cut, &err);
			CU_ASSERT_EQUAL(fin, boundary ? 0 : COLO_STREAM_ERROR);
			if (!boundary)
				CU_ASSERT_STRING_EQUAL(err ? err : "", want);
			colo_stream_free(cut);
		}
		CU_ASSERT_EQUAL(colo_stream_feed(s, t.b.data + k, len - k, &err),
				COLO_STREAM_NEED_MORE);
		CU_ASSERT_EQUAL(colo_stream_checkpoints(s), NCHECKPOINTS);
		CU_ASSERT_TRUE(colo_stream_at_boundary(s));
		colo_stream_free(s);
	}
	buffer_free(&t.b);
}

/* Split at a sample of offsets with full recording: same events. */
static void test_two_chunk_splits_record_the_same(void)
{
	struct built t;
	struct recorder *whole = recorder_new();

	build(&t);
	size_t len = buffer_len(&t.b);
	struct colo_stream *s = parser_for(whole, NULL);
	CU_ASSERT_EQUAL(colo_stream_feed(s, t.b.data, len, NULL), 0);
	colo_stream_free(s);
	for (size_t k = 0; k <= len; k += (k % 2 ? 389 : 1)) {
		struct recorder *r = recorder_new();

		s = parser_for(r, NULL);
		CU_ASSERT_EQUAL(colo_stream_feed(s, t.b.data, k, NULL), 0);
		CU_ASSERT_EQUAL(colo_stream_feed(s, t.b.data + k, len - k, NULL), 0);
		compare_recorders(whole, r);
		colo_stream_free(s);
		recorder_free(r);
	}
	recorder_free(whole);
	buffer_free(&t.b);
}

/* ---- malformed streams ------------------------------------------------- */

/* Parses `b` whole and returns the error (copied), or "" if none. */
static const char *parse_error(const struct buffer *b,
			       const struct colo_stream_limits *lim)
{
	static char msg[256];
	struct recorder *r = recorder_new();
	struct colo_stream *s = parser_for(r, lim);
	const char *err = NULL;

	msg[0] = '\0';
	int rc = colo_stream_feed(s, buffer_head(b), buffer_len(b), &err);
	if (rc == COLO_STREAM_ERROR) {
		CU_ASSERT_PTR_NOT_NULL(err);
		CU_ASSERT_EQUAL(colo_stream_phase(s), COLO_PHASE_FAILED);
		snprintf(msg, sizeof(msg), "%s", err ? err : "?");
		/* Errors are sticky. */
		CU_ASSERT_EQUAL(colo_stream_feed(s, (const uint8_t *)"x", 1, NULL),
				COLO_STREAM_ERROR);
	}
	colo_stream_free(s);
	recorder_free(r);
	return msg;
}

/* header, configuration, ram START with the block list. */
static void prologue(struct buffer *b)
{
	buffer_init(b);
	CU_ASSERT_EQUAL_FATAL(migw_header(b), 0);
	CU_ASSERT_EQUAL_FATAL(migw_configuration(b, "pc"), 0);
	CU_ASSERT_EQUAL_FATAL(migw_section_start(b, MIG_SECTION_START, RAM_ID,
						 "ram", 0, 4), 0);
	CU_ASSERT_EQUAL_FATAL(migw_ram_mem_size(b, test_blocks, 2), 0);
}

static void test_bad_magic(void)
{
	struct buffer b;

	buffer_init(&b);
	put_be32(&b, 0x5145564e);
	put_be32(&b, 3);
	CU_ASSERT_STRING_EQUAL(parse_error(&b, NULL),
			       "bad magic 0x5145564e at offset 0 (expected "
			       "0x5145564d)");
	buffer_clear(&b);
	CU_ASSERT_EQUAL(migw_header(&b), 0);
	b.data[7] = 2;
	CU_ASSERT_STRING_EQUAL(parse_error(&b, NULL),
			       "unsupported stream version 2");
	buffer_free(&b);
}

static void test_unknown_section_type(void)
{
	struct buffer b;

	buffer_init(&b);
	CU_ASSERT_EQUAL(migw_header(&b), 0);
	CU_ASSERT_EQUAL(migw_configuration(&b, "pc-i440fx-7.2"), 0);
	const uint8_t bogus = 0x09;
	put(&b, &bogus, 1);
	CU_ASSERT_STRING_EQUAL(parse_error(&b, NULL),
			       "unknown section type 0x09 at offset 26");
	buffer_free(&b);
}

static void test_xbzrle_and_compressed_pages_rejected(void)
{
	struct buffer b;

	prologue(&b);
	size_t at = buffer_len(&b);
	put_be64(&b, 0x2000 | RAM_FLAG_XBZRLE | RAM_FLAG_CONTINUE);
	char want[128];
	snprintf(want, sizeof(want), "XBZRLE page at offset %zu: the xbzrle "
		 "capability is not supported", at);
	CU_ASSERT_STRING_EQUAL(parse_error(&b, NULL), want);
	buffer_free(&b);

	prologue(&b);
	at = buffer_len(&b);
	put_be64(&b, RAM_FLAG_COMPRESS_PAGE);
	snprintf(want, sizeof(want), "compressed page at offset %zu: the "
		 "compress capability is not supported", at);
	CU_ASSERT_STRING_EQUAL(parse_error(&b, NULL), want);
	buffer_free(&b);
}

static void test_page_beyond_block(void)
{
	uint8_t data[MIG_PAGE_SIZE] = { 0 };
	struct buffer b;
	char want[128];

	prologue(&b);
	CU_ASSERT_EQUAL(migw_ram_page(&b, "vga.vram", 0x3000, data), 0);
	size_t at = buffer_len(&b);
	CU_ASSERT_EQUAL(migw_ram_page(&b, "pc.ram", PC_PAGES * MIG_PAGE_SIZE,
				      data), 0);
	snprintf(want, sizeof(want), "page offset 0x10000 beyond block pc.ram "
		 "(length 0x10000) at offset %zu", at);
	CU_ASSERT_STRING_EQUAL(parse_error(&b, NULL), want);
	buffer_free(&b);

	/* The same through CONTINUE, as a zero page. */
	prologue(&b);
	CU_ASSERT_EQUAL(migw_ram_page(&b, "vga.vram", 0x3000, data), 0);
	at = buffer_len(&b);
	CU_ASSERT_EQUAL(migw_ram_zero(&b, NULL, 0x4000, 0), 0);
	snprintf(want, sizeof(want), "page offset 0x4000 beyond block vga.vram "
		 "(length 0x4000) at offset %zu", at);
	CU_ASSERT_STRING_EQUAL(parse_error(&b, NULL), want);
	buffer_free(&b);
}

static void test_unknown_blocks(void)
{
	uint8_t data[MIG_PAGE_SIZE] = { 0 };
	struct buffer b;
	char want[128];

	prologue(&b);
	size_t at = buffer_len(&b);
	CU_ASSERT_EQUAL(migw_ram_page(&b, NULL, 0, data), 0);
	snprintf(want, sizeof(want), "unknown RAM block: CONTINUE record at "
		 "offset %zu before any block name", at);
	CU_ASSERT_STRING_EQUAL(parse_error(&b, NULL), want);
	buffer_free(&b);

	prologue(&b);
	at = buffer_len(&b);
	CU_ASSERT_EQUAL(migw_ram_zero(&b, "pc.rom", 0, 0), 0);
	snprintf(want, sizeof(want), "unknown RAM block 'pc.rom' at offset %zu",
		 at);
	CU_ASSERT_STRING_EQUAL(parse_error(&b, NULL), want);
	buffer_free(&b);
}

static void test_too_many_blocks(void)
{
	struct migw_ram_block many[COLO_STREAM_MAX_BLOCKS + 1];
	char names[COLO_STREAM_MAX_BLOCKS + 1][16];
	struct buffer b;

	for (int i = 0; i <= COLO_STREAM_MAX_BLOCKS; i++) {
		snprintf(names[i], sizeof(names[i]), "b%u", (unsigned)i);
		many[i].name = names[i];
		many[i].length = MIG_PAGE_SIZE;
	}
	buffer_init(&b);
	CU_ASSERT_EQUAL(migw_header(&b), 0);
	CU_ASSERT_EQUAL(migw_section_start(&b, MIG_SECTION_START, 1, "ram", 0, 4),
			0);
	CU_ASSERT_EQUAL(migw_ram_mem_size(&b, many, COLO_STREAM_MAX_BLOCKS + 1),
			0);
	CU_ASSERT_STRING_EQUAL(parse_error(&b, NULL), "more than 64 RAM blocks");
	buffer_free(&b);
}

/* The built stream up to the first checkpoint's VMSTATE_SIZE value. */
static void test_vmstate_size_too_large(void)
{
	struct colo_stream_limits lim = { .max_vmdesc = 4096,
					  .max_device_blob = 1 << 20 };
	struct built t;
	char want[160];

	build(&t);
	struct buffer *b = &t.b;
	b->end = t.ckblob_off[0] - 8;
	size_t at = buffer_len(b);
	put_be64(b, (1 << 20) + 1);
	snprintf(want, sizeof(want), "vmstate size too large: 1048577 bytes at "
		 "offset %zu (max 1048576, configurable)", at);
	CU_ASSERT_STRING_EQUAL(parse_error(b, &lim), want);

	/* Exactly the limit is fine (and then waits for the blob). */
	b->end = at;
	put_be64(b, 1 << 20);
	CU_ASSERT_STRING_EQUAL(parse_error(b, &lim), "");
	buffer_free(b);
}

static void test_device_blob_limits(void)
{
	struct built t;

	build(&t);
	struct colo_stream_limits lim = {
		.max_vmdesc = 4096,
		.max_device_blob = t.devblob_len - 1,
	};
	CU_ASSERT_STRING_EQUAL(parse_error(&t.b, &lim),
			       "device state too large: more than 206 bytes "
			       "(max configurable)");
	CU_ASSERT_EQUAL(t.devblob_len, 207);
	/* A VMDESCRIPTION over the limit is not a terminator: no end found. */
	lim.max_device_blob = 1 << 20;
	lim.max_vmdesc = strlen(vmdesc_json) - 1;
	struct recorder *r = recorder_new();
	struct colo_stream *s = parser_for(r, &lim);
	CU_ASSERT_EQUAL(colo_stream_feed(s, t.b.data, t.bulk_end, NULL),
			COLO_STREAM_NEED_MORE);
	CU_ASSERT_EQUAL(colo_stream_phase(s), COLO_PHASE_BULK);
	CU_ASSERT_EQUAL(count(r, EV_BULK), 0);
	colo_stream_free(s);
	recorder_free(r);
	buffer_free(&t.b);
}

static void test_colo_message_order(void)
{
	struct built t;
	char want[160];

	build(&t);
	t.b.end = t.bulk_end;
	put_be32(&t.b, COLO_MSG_VMSTATE_SIZE);
	snprintf(want, sizeof(want), "unexpected COLO message vmstate-size at "
		 "offset %zu (expected checkpoint-request)", t.bulk_end);
	CU_ASSERT_STRING_EQUAL(parse_error(&t.b, NULL), want);

	t.b.end = t.bulk_end;
	put_be32(&t.b, 9);
	snprintf(want, sizeof(want), "unknown COLO message 9 at offset %zu",
		 t.bulk_end);
	CU_ASSERT_STRING_EQUAL(parse_error(&t.b, NULL), want);

	/* A checkpoint whose device state does not end with EOF. */
	buffer_free(&t.b);
	build(&t);
	t.b.end = t.ckpt_end[0];
	t.b.data[t.ckpt_end[0] - 1] = 0x7e;
	snprintf(want, sizeof(want), "checkpoint device state does not end with "
		 "EOF (offset %zu)", t.ckpt_end[0] - 1);
	CU_ASSERT_STRING_EQUAL(parse_error(&t.b, NULL), want);
	buffer_free(&t.b);
}

static void test_strict_pause(void)
{
	struct colo_stream_limits lim = {
		.max_vmdesc = 4096, .max_device_blob = 1 << 20,
		.strict_bulk_pause = true,
	};
	struct built t;
	char want[200];

	build(&t);
	snprintf(want, sizeof(want), "data after VMDESCRIPTION at offset %zu: "
		 "QEMU waits for CHECKPOINT_READY there (false "
		 "end-of-device-state match?)", t.bulk_end);
	CU_ASSERT_STRING_EQUAL(parse_error(&t.b, &lim), want);

	/* Fed the way QEMU sends it, it passes. */
	struct colo_stream *s = parser_for(NULL, &lim);
	CU_ASSERT_EQUAL(colo_stream_feed(s, t.b.data, t.bulk_end, NULL), 0);
	CU_ASSERT_TRUE(colo_stream_at_boundary(s));
	CU_ASSERT_EQUAL(colo_stream_feed(s, t.b.data + t.bulk_end,
					 buffer_len(&t.b) - t.bulk_end, NULL), 0);
	CU_ASSERT_EQUAL(colo_stream_checkpoints(s), NCHECKPOINTS);
	colo_stream_free(s);
	buffer_free(&t.b);
}

static void test_callback_failure_stops_the_stream(void)
{
	struct built t;
	struct recorder *r = recorder_new();
	const char *err = NULL;

	build(&t);
	r->fail_kind = EV_PAGE;
	struct colo_stream *s = parser_for(r, NULL);
	CU_ASSERT_EQUAL(colo_stream_feed(s, t.b.data, buffer_len(&t.b), &err),
			COLO_STREAM_ERROR);
	CU_ASSERT_STRING_EQUAL(err, "callback failed: on_page");
	CU_ASSERT_EQUAL(count(r, EV_PAGE), 1);
	colo_stream_free(s);
	recorder_free(r);
	buffer_free(&t.b);
}

/* Section footers are optional in the format (old machine types). */
static void test_stream_without_footers(void)
{
	uint8_t data[MIG_PAGE_SIZE];
	struct buffer b;
	struct recorder *r = recorder_new();

	memset(data, 0xab, sizeof(data));
	prologue(&b);
	CU_ASSERT_EQUAL(migw_ram_eos(&b), 0);
	CU_ASSERT_EQUAL(migw_section_part(&b, MIG_SECTION_END, RAM_ID), 0);
	CU_ASSERT_EQUAL(migw_ram_page(&b, "pc.ram", 0x1000, data), 0);
	CU_ASSERT_EQUAL(migw_ram_eos(&b), 0);
	CU_ASSERT_EQUAL(migw_eof(&b), 0); /* no device sections at all */
	const uint8_t desc[] = { MIG_VMDESCRIPTION, 0, 0, 0, 15 };
	put(&b, desc, sizeof(desc));
	put(&b, "{\"page_size\":1}", 15);
	struct colo_stream *s = parser_for(r, NULL);
	CU_ASSERT_EQUAL(colo_stream_feed(s, b.data, buffer_len(&b), NULL), 0);
	CU_ASSERT_TRUE(colo_stream_at_boundary(s));
	CU_ASSERT_EQUAL(count(r, EV_PAGE), 1);
	CU_ASSERT_EQUAL(buffer_len(&r->devblob), 1); /* just the EOF */
	CU_ASSERT_EQUAL(r->img.pc[0x1000], 0xab);
	colo_stream_free(s);
	recorder_free(r);
	buffer_free(&b);
}

/* ---- encoders ---------------------------------------------------------- */

static void test_writer_bytes(void)
{
	struct buffer b;
	uint8_t page_data[MIG_PAGE_SIZE];

	buffer_init(&b);
	CU_ASSERT_EQUAL(migw_header(&b), 0);
	CU_ASSERT_EQUAL(migw_section_start(&b, MIG_SECTION_START, 0x0102, "ram",
					   0, 4), 0);
	const uint8_t head[] = { 0x51, 0x45, 0x56, 0x4d, 0, 0, 0, 3,
				 0x01, 0, 0, 0x01, 0x02, 3, 'r', 'a', 'm',
				 0, 0, 0, 0, 0, 0, 0, 4 };
	CU_ASSERT_EQUAL_FATAL(buffer_len(&b), sizeof(head));
	CU_ASSERT_EQUAL(memcmp(b.data, head, sizeof(head)), 0);

	buffer_clear(&b);
	memset(page_data, 0x5a, sizeof(page_data));
	CU_ASSERT_EQUAL(migw_ram_page(&b, "pc.ram", 0x12345000, page_data), 0);
	const uint8_t named[] = { 0, 0, 0, 0, 0x12, 0x34, 0x50, 0x08,
				  6, 'p', 'c', '.', 'r', 'a', 'm' };
	CU_ASSERT_EQUAL_FATAL(buffer_len(&b), sizeof(named) + MIG_PAGE_SIZE);
	CU_ASSERT_EQUAL(memcmp(b.data, named, sizeof(named)), 0);
	CU_ASSERT_EQUAL(b.data[sizeof(named) + MIG_PAGE_SIZE - 1], 0x5a);

	buffer_clear(&b);
	CU_ASSERT_EQUAL(migw_ram_zero(&b, NULL, 0x3000, 7), 0);
	const uint8_t cont[] = { 0, 0, 0, 0, 0, 0, 0x30, 0x22, 7 };
	CU_ASSERT_EQUAL_FATAL(buffer_len(&b), sizeof(cont));
	CU_ASSERT_EQUAL(memcmp(b.data, cont, sizeof(cont)), 0);

	buffer_clear(&b);
	CU_ASSERT_EQUAL(migw_ram_mem_size(&b, test_blocks, 2), 0);
	const uint8_t memsz[] = { 0, 0, 0, 0, 0, 0x01, 0x40, 0x04,
				  6, 'p', 'c', '.', 'r', 'a', 'm',
				  0, 0, 0, 0, 0, 0x01, 0, 0,
				  8, 'v', 'g', 'a', '.', 'v', 'r', 'a', 'm',
				  0, 0, 0, 0, 0, 0, 0x40, 0 };
	CU_ASSERT_EQUAL_FATAL(buffer_len(&b), sizeof(memsz));
	CU_ASSERT_EQUAL(memcmp(b.data, memsz, sizeof(memsz)), 0);

	buffer_clear(&b);
	CU_ASSERT_EQUAL(migw_configuration(&b, "pc"), 0);
	CU_ASSERT_EQUAL(migw_command(&b, 2, "\0\0\0\1", 4), 0);
	CU_ASSERT_EQUAL(migw_section_footer(&b, 7), 0);
	CU_ASSERT_EQUAL(migw_ram_eos(&b), 0);
	CU_ASSERT_EQUAL(migw_eof(&b), 0);
	const uint8_t misc[] = { 0x07, 0, 0, 0, 2, 'p', 'c',
				 0x08, 0, 2, 0, 4, 0, 0, 0, 1,
				 0x7e, 0, 0, 0, 7,
				 0, 0, 0, 0, 0, 0, 0, 0x10, 0 };
	CU_ASSERT_EQUAL_FATAL(buffer_len(&b), sizeof(misc));
	CU_ASSERT_EQUAL(memcmp(b.data, misc, sizeof(misc)), 0);

	/* Bad input leaves the buffer alone. */
	char long_name[300];
	memset(long_name, 'x', sizeof(long_name) - 1);
	long_name[sizeof(long_name) - 1] = '\0';
	size_t before = buffer_len(&b);
	errno = 0;
	CU_ASSERT_EQUAL(migw_ram_page(&b, long_name, 0, page_data), -1);
	CU_ASSERT_EQUAL(errno, EINVAL);
	CU_ASSERT_EQUAL(migw_ram_page(&b, "pc.ram", 0x1001, page_data), -1);
	CU_ASSERT_EQUAL(migw_section_part(&b, MIG_SECTION_FULL, 1), -1);
	CU_ASSERT_EQUAL(buffer_len(&b), before);
	CU_ASSERT_STRING_EQUAL(colo_message_name(COLO_MSG_VMSTATE_LOADED),
			       "vmstate-loaded");
	buffer_free(&b);
}

int register_colo_stream_tests(void)
{
	CU_pSuite suite = CU_add_suite("colo_stream", NULL, NULL);

	if (!suite)
		return -1;
	if (!CU_add_test(suite, "full stream, whole buffer",
			 test_full_stream_whole_buffer) ||
	    !CU_add_test(suite, "chunk sizes give identical results",
			 test_chunk_sizes_give_identical_results) ||
	    !CU_add_test(suite, "every truncation point",
			 test_every_truncation_point) ||
	    !CU_add_test(suite, "two-chunk splits record the same",
			 test_two_chunk_splits_record_the_same) ||
	    !CU_add_test(suite, "bad magic", test_bad_magic) ||
	    !CU_add_test(suite, "unknown section type",
			 test_unknown_section_type) ||
	    !CU_add_test(suite, "xbzrle and compressed pages rejected",
			 test_xbzrle_and_compressed_pages_rejected) ||
	    !CU_add_test(suite, "page beyond block", test_page_beyond_block) ||
	    !CU_add_test(suite, "unknown blocks", test_unknown_blocks) ||
	    !CU_add_test(suite, "too many blocks", test_too_many_blocks) ||
	    !CU_add_test(suite, "vmstate size too large",
			 test_vmstate_size_too_large) ||
	    !CU_add_test(suite, "device blob limits", test_device_blob_limits) ||
	    !CU_add_test(suite, "colo message order", test_colo_message_order) ||
	    !CU_add_test(suite, "strict pause", test_strict_pause) ||
	    !CU_add_test(suite, "callback failure stops the stream",
			 test_callback_failure_stops_the_stream) ||
	    !CU_add_test(suite, "stream without footers",
			 test_stream_without_footers) ||
	    !CU_add_test(suite, "writer bytes", test_writer_bytes))
		return -1;
	return 0;
}
