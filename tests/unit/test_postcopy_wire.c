/*
 * postcopy_wire: the preamble parsed back byte by byte against the format
 * of QEMU 7.2's savevm.c (docs in postcopy_wire.h), PART sections of
 * pages, the END + EOF, and the return-path parser fed whole, byte by
 * byte and split at every offset.
 */
#include <CUnit/CUnit.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/be.h"
#include "qemu/migration_writer.h"
#include "pc_reader.h"
#include "fork/postcopy_wire.h"
#include "suites.h"

#define PC_PAGES 10
#define VGA_PAGES 4

static void expect_command(struct cur *c, uint16_t cmd, uint16_t len)
{
	CU_ASSERT_EQUAL(cur_u8(c), MIG_COMMAND);
	CU_ASSERT_EQUAL(cur_be16(c), cmd);
	CU_ASSERT_EQUAL(cur_be16(c), len);
}

static void expect_footer(struct cur *c, uint32_t id)
{
	CU_ASSERT_EQUAL(cur_u8(c), MIG_SECTION_FOOTER);
	CU_ASSERT_EQUAL(cur_be32(c), id);
}

static void test_preamble_layout(void)
{
	struct ram_image *img = pc_test_image(PC_PAGES, VGA_PAGES, true);
	struct buffer b;
	char err[256] = "", name[256];

	CU_ASSERT_PTR_NOT_NULL_FATAL(img);
	buffer_init(&b);
	CU_ASSERT_EQUAL_FATAL(pcw_preamble(&b, img, err, sizeof(err)), 0);
	struct cur c = { buffer_head(&b), buffer_len(&b), 0, false };

	CU_ASSERT_EQUAL(cur_be32(&c), MIG_FILE_MAGIC);
	CU_ASSERT_EQUAL(cur_be32(&c), MIG_FILE_VERSION);
	CU_ASSERT_EQUAL(cur_u8(&c), MIG_CONFIGURATION);
	CU_ASSERT_EQUAL(cur_be32(&c), strlen("pc-i440fx-7.2"));
	const uint8_t *m = cur_bytes(&c, strlen("pc-i440fx-7.2"));
	CU_ASSERT(m && !memcmp(m, "pc-i440fx-7.2", strlen("pc-i440fx-7.2")));

	expect_command(&c, MIG_CMD_OPEN_RETURN_PATH, 0);
	expect_command(&c, MIG_CMD_POSTCOPY_ADVISE, 16);
	CU_ASSERT_EQUAL(cur_be64(&c), 4096); /* page-size summary */
	CU_ASSERT_EQUAL(cur_be64(&c), 4096); /* target page size */

	/* ram START: MEM_SIZE + block list, EOS, footer. */
	CU_ASSERT_EQUAL(cur_u8(&c), MIG_SECTION_START);
	CU_ASSERT_EQUAL(cur_be32(&c), 3);
	cur_name(&c, name);
	CU_ASSERT_STRING_EQUAL(name, "ram");
	CU_ASSERT_EQUAL(cur_be32(&c), 0); /* instance */
	CU_ASSERT_EQUAL(cur_be32(&c), 4); /* version */
	CU_ASSERT_EQUAL(cur_be64(&c), (PC_PAGES + VGA_PAGES) * 4096ull | RAM_FLAG_MEM_SIZE);
	cur_name(&c, name);
	CU_ASSERT_STRING_EQUAL(name, "pc.ram");
	CU_ASSERT_EQUAL(cur_be64(&c), PC_PAGES * 4096ull);
	cur_name(&c, name);
	CU_ASSERT_STRING_EQUAL(name, "vga.vram");
	CU_ASSERT_EQUAL(cur_be64(&c), VGA_PAGES * 4096ull);
	CU_ASSERT_EQUAL(cur_be64(&c), RAM_FLAG_EOS);
	expect_footer(&c, 3);

	/* One RAM_DISCARD per block: version 0, name, nil, (0, length). */
	static const char *const blocks[] = { "pc.ram", "vga.vram" };
	static const uint64_t pages[] = { PC_PAGES, VGA_PAGES };
	for (int i = 0; i < 2; i++) {
		expect_command(&c, MIG_CMD_POSTCOPY_RAM_DISCARD,
			       (uint16_t)(3 + strlen(blocks[i]) + 16));
		CU_ASSERT_EQUAL(cur_u8(&c), 0);
		cur_name(&c, name);
		CU_ASSERT_STRING_EQUAL(name, blocks[i]);
		CU_ASSERT_EQUAL(cur_u8(&c), 0);
		CU_ASSERT_EQUAL(cur_be64(&c), 0);
		CU_ASSERT_EQUAL(cur_be64(&c), pages[i] * 4096);
	}

	/* PACKAGED: the length is exactly what is left. */
	expect_command(&c, MIG_CMD_PACKAGED, 4);
	uint32_t pkg = cur_be32(&c);
	CU_ASSERT_EQUAL(pkg, c.len - c.pos);
	CU_ASSERT_EQUAL(pkg, 5 + (pc_test_blob_len - 1) + 5);
	expect_command(&c, MIG_CMD_POSTCOPY_LISTEN, 0);
	const uint8_t *blob = cur_bytes(&c, pc_test_blob_len - 1);
	CU_ASSERT(blob && !memcmp(blob, pc_test_blob, pc_test_blob_len - 1));
	expect_command(&c, MIG_CMD_POSTCOPY_RUN, 0);
	CU_ASSERT_FALSE(c.short_read);
	CU_ASSERT_EQUAL(c.pos, c.len);

	buffer_free(&b);
	ram_image_destroy(img);
}

static void test_preamble_refuses(void)
{
	struct ram_image *img = pc_test_image(2, 1, false);
	static const uint8_t no_eof[] = { MIG_SECTION_FULL, 1, 2, 3 };
	struct buffer b;
	char err[256] = "";

	CU_ASSERT_PTR_NOT_NULL_FATAL(img);
	buffer_init(&b);
	CU_ASSERT_EQUAL(pcw_preamble(&b, img, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "no device state"));
	CU_ASSERT_EQUAL(buffer_len(&b), 0);

	CU_ASSERT_EQUAL_FATAL(ram_image_set_device_blob(img, no_eof, sizeof(no_eof)), 0);
	err[0] = 0;
	CU_ASSERT_EQUAL(pcw_preamble(&b, img, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "EOF"));
	CU_ASSERT_EQUAL(buffer_len(&b), 0);

	CU_ASSERT_EQUAL_FATAL(ram_image_set_device_blob(img, no_eof, 0), 0);
	CU_ASSERT_EQUAL(pcw_preamble(&b, img, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "no device state"));
	CU_ASSERT_EQUAL(buffer_len(&b), 0);

	/* A lone EOF byte is the smallest blob that works: LISTEN + RUN. */
	const uint8_t eof = MIG_EOF;
	CU_ASSERT_EQUAL_FATAL(ram_image_set_device_blob(img, &eof, 1), 0);
	CU_ASSERT_EQUAL(pcw_preamble(&b, img, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(load_be32(buffer_head(&b) + buffer_len(&b) - 14), 10);
	buffer_free(&b);
	ram_image_destroy(img);
}

/* One record header: be64 offset|flags, and the name unless CONTINUE. */
static void expect_record(struct cur *c, uint64_t offset, uint64_t flags,
			  const char *name)
{
	char got[256];

	CU_ASSERT_EQUAL(cur_be64(c), offset | flags | (name ? 0 : RAM_FLAG_CONTINUE));
	if (name) {
		cur_name(c, got);
		CU_ASSERT_STRING_EQUAL(got, name);
	}
}

static void test_pages_records(void)
{
	struct ram_image *img = pc_test_image(PC_PAGES, VGA_PAGES, true);
	struct buffer b;
	uint8_t want[MIG_PAGE_SIZE];

	CU_ASSERT_PTR_NOT_NULL_FATAL(img);
	buffer_init(&b);
	/* pc.ram pages 2..8: never written, data, zero bytes, never, ... */
	CU_ASSERT_EQUAL_FATAL(pcw_pages(&b, img, 0, 2, 7), 0);
	struct cur c = { buffer_head(&b), buffer_len(&b), 0, false };
	CU_ASSERT_EQUAL(cur_u8(&c), MIG_SECTION_PART);
	CU_ASSERT_EQUAL(cur_be32(&c), 3);
	for (uint64_t p = 2; p < 9; p++) {
		const char *name = p == 2 ? "pc.ram" : NULL;

		if (p % 3 == 0) {
			expect_record(&c, p * 4096, RAM_FLAG_PAGE, name);
			pc_test_fill(want, 0, p);
			const uint8_t *data = cur_bytes(&c, MIG_PAGE_SIZE);
			CU_ASSERT(data && !memcmp(data, want, MIG_PAGE_SIZE));
		} else {
			/* Written zero bytes and never-written pages alike. */
			expect_record(&c, p * 4096, RAM_FLAG_ZERO, name);
			CU_ASSERT_EQUAL(cur_u8(&c), 0);
		}
	}
	CU_ASSERT_EQUAL(cur_be64(&c), RAM_FLAG_EOS);
	expect_footer(&c, 3);
	CU_ASSERT_FALSE(c.short_read);
	CU_ASSERT_EQUAL(c.pos, c.len);

	/* The last page of the second block; then an empty range at its end. */
	buffer_clear(&b);
	CU_ASSERT_EQUAL_FATAL(pcw_pages(&b, img, 1, VGA_PAGES - 1, 1), 0);
	CU_ASSERT_EQUAL_FATAL(pcw_pages(&b, img, 1, VGA_PAGES, 0), 0);
	c = (struct cur){ buffer_head(&b), buffer_len(&b), 0, false };
	CU_ASSERT_EQUAL(cur_u8(&c), MIG_SECTION_PART);
	CU_ASSERT_EQUAL(cur_be32(&c), 3);
	expect_record(&c, (VGA_PAGES - 1) * 4096ull, RAM_FLAG_PAGE, "vga.vram");
	pc_test_fill(want, 1, VGA_PAGES - 1);
	const uint8_t *data = cur_bytes(&c, MIG_PAGE_SIZE);
	CU_ASSERT(data && !memcmp(data, want, MIG_PAGE_SIZE));
	CU_ASSERT_EQUAL(cur_be64(&c), RAM_FLAG_EOS);
	expect_footer(&c, 3);
	CU_ASSERT_EQUAL(cur_u8(&c), MIG_SECTION_PART);
	CU_ASSERT_EQUAL(cur_be32(&c), 3);
	CU_ASSERT_EQUAL(cur_be64(&c), RAM_FLAG_EOS);
	expect_footer(&c, 3);
	CU_ASSERT_EQUAL(c.pos, c.len);

	/* Out of range: nothing appended. */
	size_t len = buffer_len(&b);
	CU_ASSERT_EQUAL(pcw_pages(&b, img, 2, 0, 1), -1);
	CU_ASSERT_EQUAL(pcw_pages(&b, img, 0, PC_PAGES, 1), -1);
	CU_ASSERT_EQUAL(pcw_pages(&b, img, 0, PC_PAGES + 1, 0), -1);
	CU_ASSERT_EQUAL(pcw_pages(&b, img, 0, 1, PC_PAGES), -1);
	CU_ASSERT_EQUAL(pcw_pages(&b, img, 0, 1, UINT64_MAX), -1);
	CU_ASSERT_EQUAL(pcw_pages(&b, img, 1, UINT64_MAX, 2), -1);
	CU_ASSERT_EQUAL(buffer_len(&b), len);

	buffer_clear(&b);
	CU_ASSERT_EQUAL_FATAL(pcw_finish(&b, img), 0);
	c = (struct cur){ buffer_head(&b), buffer_len(&b), 0, false };
	CU_ASSERT_EQUAL(cur_u8(&c), MIG_SECTION_END);
	CU_ASSERT_EQUAL(cur_be32(&c), 3);
	CU_ASSERT_EQUAL(cur_be64(&c), RAM_FLAG_EOS);
	expect_footer(&c, 3);
	CU_ASSERT_EQUAL(cur_u8(&c), MIG_EOF);
	CU_ASSERT_EQUAL(c.pos, c.len);
	CU_ASSERT_FALSE(c.short_read);
	buffer_free(&b);
	ram_image_destroy(img);
}

/* The whole stream a clone gets, read back by the test's clone reader. */
static void test_stream_round_trip(void)
{
	struct ram_image *img = pc_test_image(70, 5, true);
	struct pc_reader r;
	char err[256];

	CU_ASSERT_PTR_NOT_NULL_FATAL(img);
	pc_reader_init(&r, img);
	CU_ASSERT_EQUAL_FATAL(pcw_preamble(&r.in, img, err, sizeof(err)), 0);
	/* Out of order, in uneven runs. */
	CU_ASSERT_EQUAL(pcw_pages(&r.in, img, 1, 2, 3), 0);
	CU_ASSERT_EQUAL(pcw_pages(&r.in, img, 0, 40, 30), 0);
	CU_ASSERT_EQUAL(pcw_pages(&r.in, img, 0, 0, 1), 0);
	CU_ASSERT_EQUAL(pcw_pages(&r.in, img, 1, 0, 2), 0);
	CU_ASSERT_EQUAL(pcw_pages(&r.in, img, 0, 1, 39), 0);
	CU_ASSERT_EQUAL(pcw_finish(&r.in, img), 0);
	CU_ASSERT(pc_reader_parse(&r));
	CU_ASSERT_STRING_EQUAL(r.error, "");
	CU_ASSERT(r.preamble_done && r.end_section && r.eof);
	CU_ASSERT_EQUAL(r.received, 75);
	CU_ASSERT_EQUAL(pc_reader_arrival(&r, 1, 2), 1);
	CU_ASSERT_EQUAL(pc_reader_arrival(&r, 0, 40), 4);
	CU_ASSERT_EQUAL(pc_reader_arrival(&r, 0, 0), 34);
	CU_ASSERT_EQUAL(buffer_len(&r.in), 0);
	pc_reader_free(&r);
	ram_image_destroy(img);
}

/* ---- return path ------------------------------------------------------------ */

#define MAX_CALLS 32

struct rp_call {
	char block[256];
	uint64_t start;
	uint32_t len;
	int shut;       /* SHUT: error + 1, 0 = a request */
};

struct rp_log {
	struct rp_call calls[MAX_CALLS];
	size_t n;
	int refuse_at;  /* the request with this index (1-based) returns 1 */
};

static int log_request(void *o, const char *block, uint64_t start, uint32_t len)
{
	struct rp_log *l = o;

	CU_ASSERT_FATAL(l->n < MAX_CALLS);
	snprintf(l->calls[l->n].block, sizeof(l->calls[l->n].block), "%s", block);
	l->calls[l->n].start = start;
	l->calls[l->n].len = len;
	l->calls[l->n].shut = 0;
	return ++l->n == (size_t)l->refuse_at;
}

static int log_shut(void *o, uint32_t error)
{
	struct rp_log *l = o;

	CU_ASSERT_FATAL(l->n < MAX_CALLS);
	memset(&l->calls[l->n], 0, sizeof(l->calls[0]));
	l->calls[l->n++].shut = (int)error + 1;
	return 0;
}

static void rp_init(struct pcw_rp_parser *p, struct rp_log *l)
{
	const struct pcw_rp_callbacks cb = { l, log_request, log_shut };

	memset(l, 0, sizeof(*l));
	pcw_rp_init(p, &cb);
}

static void put_msg(struct buffer *b, uint16_t type, const void *payload, uint16_t len)
{
	uint8_t h[4];

	store_be16(h, type);
	store_be16(h + 2, len);
	CU_ASSERT_EQUAL_FATAL(buffer_append(b, h, 4), 0);
	CU_ASSERT_EQUAL_FATAL(buffer_append(b, payload, len), 0);
}

/* REQ_PAGES_ID when name is set, else REQ_PAGES; name_len overrides its length byte. */
static void put_request(struct buffer *b, const char *name, int name_len,
			uint64_t start, uint32_t len)
{
	uint8_t m[13 + 255];
	size_t n = name ? strlen(name) : 0;

	store_be64(m, start);
	store_be32(m + 8, len);
	if (!name) {
		put_msg(b, PCW_RP_REQ_PAGES, m, 12);
		return;
	}
	m[12] = (uint8_t)(name_len >= 0 ? (size_t)name_len : n);
	memcpy(m + 13, name, n);
	put_msg(b, PCW_RP_REQ_PAGES_ID, m, (uint16_t)(13 + n));
}

static void put_be32_msg(struct buffer *b, uint16_t type, uint32_t v)
{
	uint8_t x[4];

	store_be32(x, v);
	put_msg(b, type, x, 4);
}

static void build_session(struct buffer *b)
{
	char long_name[256];

	memset(long_name, 'x', 255);
	long_name[255] = 0;
	put_request(b, "pc.ram", -1, 0x5000, 4096);
	put_request(b, NULL, 0, 0x9000, 8192);
	put_be32_msg(b, PCW_RP_PONG, 7);
	put_request(b, "vga.vram", -1, 0, 4096);
	put_request(b, NULL, 0, 0x1000, 1);
	put_request(b, long_name, -1, 0xfffffffffffff000ull, 0xffffffffu);
	put_be32_msg(b, PCW_RP_SHUT, 0);
}

static void check_session(const struct rp_log *l)
{
	CU_ASSERT_EQUAL_FATAL(l->n, 6);
	CU_ASSERT_STRING_EQUAL(l->calls[0].block, "pc.ram");
	CU_ASSERT_EQUAL(l->calls[0].start, 0x5000);
	CU_ASSERT_EQUAL(l->calls[0].len, 4096);
	CU_ASSERT_STRING_EQUAL(l->calls[1].block, "pc.ram");
	CU_ASSERT_EQUAL(l->calls[1].start, 0x9000);
	CU_ASSERT_EQUAL(l->calls[1].len, 8192);
	CU_ASSERT_STRING_EQUAL(l->calls[2].block, "vga.vram");
	CU_ASSERT_STRING_EQUAL(l->calls[3].block, "vga.vram");
	CU_ASSERT_EQUAL(l->calls[3].start, 0x1000);
	CU_ASSERT_EQUAL(l->calls[3].len, 1);
	CU_ASSERT_EQUAL(strlen(l->calls[4].block), 255);
	CU_ASSERT_EQUAL(l->calls[4].start, 0xfffffffffffff000ull);
	CU_ASSERT_EQUAL(l->calls[4].len, 0xffffffffu);
	CU_ASSERT_EQUAL(l->calls[5].shut, 1);
}

static void test_rp_any_split(void)
{
	struct buffer b;
	struct pcw_rp_parser *p = malloc(sizeof(*p));
	struct rp_log l;

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	buffer_init(&b);
	build_session(&b);
	const uint8_t *d = buffer_head(&b);
	size_t n = buffer_len(&b);

	rp_init(p, &l);
	CU_ASSERT_EQUAL(pcw_rp_feed(p, d, n), 0);
	check_session(&l);

	rp_init(p, &l);
	for (size_t i = 0; i < n; i++)
		CU_ASSERT_EQUAL(pcw_rp_feed(p, d + i, 1), 0);
	CU_ASSERT_EQUAL(pcw_rp_feed(p, d, 0), 0);
	check_session(&l);

	for (size_t at = 0; at <= n; at++) {
		rp_init(p, &l);
		CU_ASSERT_EQUAL(pcw_rp_feed(p, d, at), 0);
		CU_ASSERT_EQUAL(pcw_rp_feed(p, d + at, n - at), 0);
		if (l.n != 6) {
			CU_FAIL("a split changed the callbacks");
			break;
		}
		check_session(&l);
	}
	buffer_free(&b);
	free(p);
}

/* Feeds b (byte by byte when slow): -1 expected, with `why` in the error. */
static void expect_rp_error(struct buffer *b, const char *why, size_t calls, bool slow)
{
	struct pcw_rp_parser *p = malloc(sizeof(*p));
	struct rp_log l;
	int rc = 0;

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	rp_init(p, &l);
	if (slow) {
		for (size_t i = 0; i < buffer_len(b) && rc == 0; i++)
			rc = pcw_rp_feed(p, buffer_head(b) + i, 1);
	} else {
		rc = pcw_rp_feed(p, buffer_head(b), buffer_len(b));
	}
	CU_ASSERT_EQUAL(rc, -1);
	if (!strstr(p->error, why))
		fprintf(stderr, "\nerror \"%s\" lacks \"%s\"\n", p->error, why);
	CU_ASSERT_PTR_NOT_NULL(strstr(p->error, why));
	CU_ASSERT_EQUAL(l.n, calls);
	/* Sticky: a good request afterwards is not parsed. */
	struct buffer good;
	buffer_init(&good);
	put_request(&good, "pc.ram", -1, 0, 4096);
	CU_ASSERT_EQUAL(pcw_rp_feed(p, buffer_head(&good), buffer_len(&good)), -1);
	CU_ASSERT_EQUAL(l.n, calls);
	buffer_free(&good);
	buffer_clear(b);
	free(p);
}

static void test_rp_errors(void)
{
	struct buffer b;
	uint8_t junk[16] = { 0 };
	/* One message alone: wrong lengths, types we never expect. */
	static const struct {
		uint16_t type, len;
		const char *why;
	} single[] = {
		{ PCW_RP_REQ_PAGES_ID, 12, "REQ_PAGES_ID with length 12" },
		{ PCW_RP_SHUT, 3, "SHUT with length 3" },
		{ PCW_RP_PONG, 0, "PONG with length 0" },
		{ 0, 0, "type 0" },
		{ PCW_RP_RECV_BITMAP, 5, "type 5" },
		{ PCW_RP_RESUME_ACK, 4, "type 6" },
		{ 0xffff, 16, "type 65535" },
	};

	buffer_init(&b);
	for (int slow = 0; slow < 2; slow++) {
		put_request(&b, NULL, 0, 0, 4096);
		expect_rp_error(&b, "before any block", 0, slow);

		put_request(&b, "pc.ram", 0, 0, 4096); /* length byte 0, 6 bytes follow */
		expect_rp_error(&b, "REQ_PAGES_ID with length 19", 0, slow);
		put_request(&b, "", -1, 0, 4096);
		expect_rp_error(&b, "empty block name", 0, slow);
		/* A NUL inside the name: not the name on the wire (found by fuzzing). */
		put_request(&b, "pc.ram", -1, 0, 4096);
		put_msg(&b, PCW_RP_REQ_PAGES_ID,
			"\0\0\0\0\0\0\0\0\0\0\x10\0\3\0vg", 16);
		put_request(&b, NULL, 0, 0, 4096);
		expect_rp_error(&b, "containing a NUL", 1, slow);
		put_request(&b, "pc.ram", -1, 0, 4096);
		put_msg(&b, PCW_RP_REQ_PAGES_ID,
			"\0\0\0\0\0\0\0\0\0\0\x10\0\3vg\0", 16);
		expect_rp_error(&b, "containing a NUL", 1, slow);
		put_request(&b, "pc.ram", 7, 0, 4096); /* one byte short */
		expect_rp_error(&b, "REQ_PAGES_ID with length 19", 0, slow);

		put_request(&b, "pc.ram", -1, 0, 4096);
		put_msg(&b, PCW_RP_REQ_PAGES, junk, 11);
		expect_rp_error(&b, "REQ_PAGES with length 11", 1, slow);
		put_request(&b, "pc.ram", -1, 0, 4096);
		put_msg(&b, PCW_RP_REQ_PAGES, junk, 13);
		expect_rp_error(&b, "REQ_PAGES with length 13", 1, slow);

		for (size_t i = 0; i < sizeof(single) / sizeof(single[0]); i++) {
			put_msg(&b, single[i].type, junk, single[i].len);
			expect_rp_error(&b, single[i].why, 0, slow);
		}
	}
	buffer_free(&b);
}

static void test_rp_shut_and_refusal(void)
{
	struct pcw_rp_parser *p = malloc(sizeof(*p));
	struct rp_log l;
	struct buffer b;

	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	buffer_init(&b);
	/* SHUT with an error is reported as such; the parser goes on. */
	rp_init(p, &l);
	put_be32_msg(&b, PCW_RP_SHUT, 0xdeadbeef);
	put_request(&b, "pc.ram", -1, 0x2000, 4096);
	CU_ASSERT_EQUAL(pcw_rp_feed(p, buffer_head(&b), buffer_len(&b)), 0);
	CU_ASSERT_EQUAL_FATAL(l.n, 2);
	CU_ASSERT_EQUAL(l.calls[0].shut, (int)(0xdeadbeefu + 1));
	CU_ASSERT_EQUAL(l.calls[1].start, 0x2000);

	/* A refusing callback stops the parser at that message, for good. */
	buffer_clear(&b);
	rp_init(p, &l);
	l.refuse_at = 2;
	put_request(&b, "pc.ram", -1, 0x1000, 4096);
	put_request(&b, NULL, 0, 0x3000, 4096);
	put_request(&b, NULL, 0, 0x4000, 4096);
	CU_ASSERT_EQUAL(pcw_rp_feed(p, buffer_head(&b), buffer_len(&b)), -1);
	CU_ASSERT_EQUAL(l.n, 2);
	CU_ASSERT_PTR_NOT_NULL(strstr(p->error, "refused"));
	CU_ASSERT_PTR_NOT_NULL(strstr(p->error, "0x3000"));
	CU_ASSERT_EQUAL(pcw_rp_feed(p, buffer_head(&b), buffer_len(&b)), -1);
	CU_ASSERT_EQUAL(pcw_rp_feed(p, NULL, 0), -1);
	CU_ASSERT_EQUAL(l.n, 2);

	/* No callbacks at all: parsed and dropped. */
	pcw_rp_init(p, NULL);
	CU_ASSERT_EQUAL(pcw_rp_feed(p, buffer_head(&b), buffer_len(&b)), 0);
	CU_ASSERT_STRING_EQUAL(p->block, "pc.ram");
	buffer_free(&b);
	free(p);
}

int register_postcopy_wire_tests(void)
{
	CU_pSuite suite = CU_add_suite("postcopy_wire", NULL, NULL);

	if (!suite)
		return -1;
	if (!CU_add_test(suite, "preamble byte by byte", test_preamble_layout) ||
	    !CU_add_test(suite, "preamble refuses unusable device state",
			 test_preamble_refuses) ||
	    !CU_add_test(suite, "page sections and the end", test_pages_records) ||
	    !CU_add_test(suite, "whole stream read back as a clone",
			 test_stream_round_trip) ||
	    !CU_add_test(suite, "return path split anywhere", test_rp_any_split) ||
	    !CU_add_test(suite, "return path errors are sticky", test_rp_errors) ||
	    !CU_add_test(suite, "return path SHUT and refusals",
			 test_rp_shut_and_refusal))
		return -1;
	return 0;
}
