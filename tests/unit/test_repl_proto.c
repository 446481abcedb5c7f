/*
 * Replication protocol: framing, every message's encoder and decoder
 * (round trips, byte layouts, rejections), page encodings, the epoch
 * checksum on both sides, and the PSK / HMAC authentication.
 */
#include <CUnit/CUnit.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/buffer.h"
#include "wire/repl_auth.h"
#include "wire/cp_flow_msg.h"
#include "wire/repl_proto.h"
#include "suites.h"

/* ---- helpers -------------------------------------------------------- */

/* A payload under construction, big-endian like the wire. */
struct bytes {
	uint8_t *d;
	size_t n;
	size_t cap;
};

static void b_mem(struct bytes *b, const void *src, size_t n)
{
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2 + 64;
		b->d = realloc(b->d, b->cap);
		CU_ASSERT_PTR_NOT_NULL_FATAL(b->d);
	}
	memcpy(b->d + b->n, src, n);
	b->n += n;
}

static void b_u8(struct bytes *b, uint8_t v)
{
	b_mem(b, &v, 1);
}

static void b_u16(struct bytes *b, uint16_t v)
{
	b_u8(b, (uint8_t)(v >> 8));
	b_u8(b, (uint8_t)v);
}

static void b_u32(struct bytes *b, uint32_t v)
{
	b_u16(b, (uint16_t)(v >> 16));
	b_u16(b, (uint16_t)v);
}

static void b_u64(struct bytes *b, uint64_t v)
{
	b_u32(b, (uint32_t)(v >> 32));
	b_u32(b, (uint32_t)v);
}

static void b_str(struct bytes *b, const char *s)
{
	b_u8(b, (uint8_t)strlen(s));
	b_mem(b, s, strlen(s));
}

static void b_free(struct bytes *b)
{
	free(b->d);
	memset(b, 0, sizeof(*b));
}

static struct repl_frame mk(uint16_t type, const struct bytes *b)
{
	struct repl_frame f = { type, 0, (uint32_t)b->n, b->d };
	return f;
}

/* Runs the decoder for `as` on f; the decoded values are thrown away. */
static int decode_as(uint16_t as, const struct repl_frame *f, const char **err)
{
	struct repl_hello h;
	const uint8_t *mac;
	struct repl_error e;
	const char *json;
	size_t len;
	static struct repl_ram_layout l; /* 17 KB: keep it off the stack */
	struct repl_pages p;
	struct repl_device d;
	struct repl_disk_write w;
	struct repl_disk_zero z;
	struct repl_disk_sync s;
	uint64_t v;
	struct repl_epoch_end ee;
	struct repl_heartbeat hb;
	struct repl_bye bye;

	switch (as) {
	case REPL_HELLO: return repl_decode_hello(f, &h, err);
	case REPL_AUTH:
	case REPL_AUTH_OK: return repl_decode_auth(f, &mac, err);
	case REPL_ERROR: return repl_decode_error(f, &e, err);
	case REPL_VM_CONFIG: return repl_decode_vm_config(f, &json, &len, err);
	case REPL_RAM_LAYOUT: return repl_decode_ram_layout(f, &l, err);
	case REPL_PAGES: return repl_decode_pages(f, &p, err);
	case REPL_DEVICE: return repl_decode_device(f, &d, err);
	case REPL_DISK_WRITE: return repl_decode_disk_write(f, &w, err);
	case REPL_DISK_ZERO: return repl_decode_disk_zero(f, &z, err);
	case REPL_DISK_SYNC: return repl_decode_disk_sync(f, &s, err);
	case REPL_DISK_SYNC_DONE: return repl_decode_disk_sync_done(f, &v, err);
	case REPL_EPOCH_END: return repl_decode_epoch_end(f, &ee, err);
	case REPL_EPOCH_ACK: return repl_decode_epoch_ack(f, &v, err);
	case REPL_HEARTBEAT: return repl_decode_heartbeat(f, &hb, err);
	case REPL_BYE: return repl_decode_bye(f, &bye, err);
	case REPL_PAGES_CODED: {
		struct repl_pages_coded pc;
		return repl_decode_pages_coded(f, &pc, err);
	}
	case REPL_PAGE_REQUEST: {
		struct repl_page_request rq;
		return repl_decode_page_request(f, &rq, err);
	}
	case REPL_PAGE_RESEND: {
		struct repl_page_resend rs;
		return repl_decode_page_resend(f, &rs, err);
	}
	case REPL_DEVICE_DELTA: {
		struct repl_device_delta dd;
		return repl_decode_device_delta(f, &dd, err);
	}
	case REPL_FLOW_STATE: {
		struct cp_flow_msg_state fs;
		return cp_flow_msg_decode_state(f, &fs, err);
	}
	case REPL_FLOW_AHEAD: {
		struct cp_flow_msg_ahead fa;
		return cp_flow_msg_decode_ahead(f, &fa, err);
	}
	case REPL_DISK_BASE: {
		struct repl_disk_base db;
		return repl_decode_disk_base(f, &db, err);
	}
	case REPL_DISK_PLAN: {
		struct repl_disk_plan dp;
		return repl_decode_disk_plan(f, &dp, err);
	}
	default: return -2;
	}
}

/* The payload in b must be rejected as `type` with a message containing `what`. */
static void reject(uint16_t type, const struct bytes *b, const char *what)
{
	struct repl_frame f = mk(type, b);
	const char *err = NULL;

	CU_ASSERT_EQUAL(decode_as(type, &f, &err), -1);
	CU_ASSERT_PTR_NOT_NULL_FATAL(err);
	if (!strstr(err, what)) {
		fprintf(stderr, "\n  %s: expected an error with \"%s\", got \"%s\"\n",
			repl_type_name(type), what, err);
		CU_FAIL("unexpected error message");
	}
}

static void accept(uint16_t type, const struct bytes *b)
{
	struct repl_frame f = mk(type, b);
	const char *err = NULL;

	CU_ASSERT_EQUAL(decode_as(type, &f, &err), 0);
	if (err)
		fprintf(stderr, "\n  %s: unexpectedly rejected: %s\n", repl_type_name(type), err);
}

/* Parses the single frame that b holds. */
static struct repl_frame only_frame(const struct buffer *b)
{
	struct repl_frame f;
	const char *err = NULL;
	ssize_t n = repl_frame_parse(buffer_head(b), buffer_len(b), &f, &err);

	CU_ASSERT_EQUAL_FATAL(n, (ssize_t)buffer_len(b));
	return f;
}

static void fill_hello(struct repl_hello *h, uint8_t role, const char *name)
{
	memset(h, 0, sizeof(*h));
	h->version = 1; /* the bytes every version-1 daemon sends and reads */
	h->role = role;
	for (int i = 0; i < 32; i++)
		h->nonce[i] = (uint8_t)(0xa0 + i);
	snprintf(h->name, sizeof(h->name), "%s", name);
}

static void fill_layout(struct repl_ram_layout *l)
{
	memset(l, 0, sizeof(*l));
	l->ram_section_id = 2;
	snprintf(l->machine_type, sizeof(l->machine_type), "pc-i440fx-7.2");
	l->block_count = 3;
	snprintf(l->blocks[0].name, 256, "pc.ram");
	l->blocks[0].length = 512u << 20;
	snprintf(l->blocks[1].name, 256, "vga.vram");
	l->blocks[1].length = 16u << 20;
	snprintf(l->blocks[2].name, 256, "/rom@etc/acpi/tables");
	l->blocks[2].length = 128u << 10;
}

/* ---- framing ------------------------------------------------------ */

static void test_type_names(void)
{
	CU_ASSERT_STRING_EQUAL(repl_type_name(REPL_HELLO), "HELLO");
	CU_ASSERT_STRING_EQUAL(repl_type_name(REPL_PAGES), "PAGES");
	CU_ASSERT_STRING_EQUAL(repl_type_name(REPL_DISK_SYNC_DONE), "DISK_SYNC_DONE");
	CU_ASSERT_STRING_EQUAL(repl_type_name(REPL_BYE), "BYE");
	CU_ASSERT_STRING_EQUAL(repl_type_name(0), "UNKNOWN");
	CU_ASSERT_STRING_EQUAL(repl_type_name(17), "PAGES_CODED");
	CU_ASSERT_STRING_EQUAL(repl_type_name(20), "DEVICE_DELTA");
	CU_ASSERT_STRING_EQUAL(repl_type_name(21), "FLOW_STATE");
	CU_ASSERT_STRING_EQUAL(repl_type_name(22), "FLOW_AHEAD");
	CU_ASSERT_STRING_EQUAL(repl_type_name(23), "DISK_BASE");
	CU_ASSERT_STRING_EQUAL(repl_type_name(24), "DISK_PLAN");
	CU_ASSERT_STRING_EQUAL(repl_type_name(25), "UNKNOWN");
	CU_ASSERT_FALSE(repl_type_is_covered(REPL_DISK_BASE));
	CU_ASSERT_FALSE(repl_type_is_covered(REPL_DISK_PLAN));
	CU_ASSERT_TRUE(repl_type_is_covered(REPL_FLOW_STATE));
	CU_ASSERT_FALSE(repl_type_is_covered(REPL_FLOW_AHEAD));
	CU_ASSERT_TRUE(repl_type_is_covered(REPL_DEVICE_DELTA));
	CU_ASSERT_TRUE(repl_type_is_covered(REPL_PAGES_CODED));
	CU_ASSERT_FALSE(repl_type_is_covered(REPL_PAGE_REQUEST));
	CU_ASSERT_FALSE(repl_type_is_covered(REPL_PAGE_RESEND));
	CU_ASSERT_STRING_EQUAL(repl_error_code_name(REPL_ERR_AUTH), "authentication failed");
	CU_ASSERT_STRING_EQUAL(repl_error_code_name(99), "unknown");
	CU_ASSERT_TRUE(repl_type_is_covered(REPL_PAGES));
	CU_ASSERT_TRUE(repl_type_is_covered(REPL_DISK_SYNC_DONE));
	CU_ASSERT_FALSE(repl_type_is_covered(REPL_EPOCH_END));
	CU_ASSERT_FALSE(repl_type_is_covered(REPL_HEARTBEAT));
	CU_ASSERT_FALSE(repl_type_is_covered(REPL_HELLO));
}

static void test_parse_headers(void)
{
	uint8_t h[REPL_HEADER_SIZE + 4] = { 0, REPL_EPOCH_ACK, 0, 0, 0, 0, 0, 4, 1, 2, 3, 4 };
	struct repl_frame f;
	const char *err = NULL;

	for (size_t len = 0; len < sizeof(h); len++)
		CU_ASSERT_EQUAL(repl_frame_parse(h, len, &f, &err), 0);
	CU_ASSERT_EQUAL_FATAL(repl_frame_parse(h, sizeof(h), &f, &err), 12);
	CU_ASSERT_EQUAL(f.type, REPL_EPOCH_ACK);
	CU_ASSERT_EQUAL(f.length, 4);
	CU_ASSERT_PTR_EQUAL(f.payload, h + 8);

	/* Bad headers fail as soon as the 8 bytes are there. */
	h[1] = 0;
	CU_ASSERT_EQUAL(repl_frame_parse(h, 8, &f, &err), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "unknown frame type 0"));
	h[1] = 25;
	CU_ASSERT_EQUAL(repl_frame_parse(h, 8, &f, &err), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "unknown frame type 25"));
	h[1] = REPL_BYE;
	h[3] = 1;
	CU_ASSERT_EQUAL(repl_frame_parse(h, 8, &f, &err), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "flags"));
	h[3] = 0;
	h[2] = 0x80;
	CU_ASSERT_EQUAL(repl_frame_parse(h, 8, &f, &err), -1);
	h[2] = 0;
	/* 16 MiB is allowed (we wait for it), one byte more is not. */
	h[4] = 0x01; h[5] = 0; h[6] = 0; h[7] = 0;
	CU_ASSERT_EQUAL(repl_frame_parse(h, sizeof(h), &f, &err), 0);
	h[7] = 1;
	err = NULL;
	CU_ASSERT_EQUAL(repl_frame_parse(h, 8, &f, &err), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "exceeds"));
	h[4] = 0xff;
	CU_ASSERT_EQUAL(repl_frame_parse(h, 8, &f, &err), -1);

	uint8_t enc[8];
	repl_encode_header(enc, REPL_PAGES, 0x01020304);
	const uint8_t want[8] = { 0, 7, 0, 0, 1, 2, 3, 4 };
	CU_ASSERT_EQUAL(memcmp(enc, want, 8), 0);
}

/* A mixed stream with every message type, in protocol order. */
static void put_every_type(struct buffer *b)
{
	struct repl_hello h;
	struct repl_ram_layout *l = calloc(1, sizeof(*l));
	uint8_t mac[32], page[2 * REPL_PAGE_SIZE], blob[100];
	const uint64_t idx[2] = { 7, 0x123456789ULL };
	struct repl_epoch_end e = { 5, 2, 1234, 0xfeedfacecafebeefULL, 987654321 };

	CU_ASSERT_PTR_NOT_NULL_FATAL(l);
	memset(mac, 0x5a, sizeof(mac));
	for (size_t i = 0; i < sizeof(page); i++)
		page[i] = (uint8_t)(i * 7 + i / 4096);
	memset(blob, 0xb1, sizeof(blob));
	fill_hello(&h, REPL_ROLE_BACKUP, "backup-1.example");
	fill_layout(l);
	CU_ASSERT_EQUAL(repl_put_hello(b, &h), 0);
	CU_ASSERT_EQUAL(repl_put_auth(b, REPL_AUTH, mac), 0);
	CU_ASSERT_EQUAL(repl_put_auth(b, REPL_AUTH_OK, mac), 0);
	CU_ASSERT_EQUAL(repl_put_error(b, REPL_ERR_BUSY, "VM db1 is already protected \xe2\x82\xac"), 0);
	CU_ASSERT_EQUAL(repl_put_vm_config(b, "{\"vm\":\"db1\"}", 12), 0);
	CU_ASSERT_EQUAL(repl_put_ram_layout(b, l), 0);
	CU_ASSERT_EQUAL(repl_put_pages(b, 5, 1, REPL_ENCODING_RAW, 2, idx, page, sizeof(page)), 0);
	CU_ASSERT_EQUAL(repl_put_pages(b, 5, 2, REPL_ENCODING_ZERO, 2, idx, NULL, 0), 0);
	CU_ASSERT_EQUAL(repl_put_device(b, 5, 300, 100, blob, sizeof(blob)), 0);
	CU_ASSERT_EQUAL(repl_put_disk_write(b, 5, 1ULL << 40, blob, 10), 0);
	CU_ASSERT_EQUAL(repl_put_disk_zero(b, 5, 4096, 1 << 20), 0);
	CU_ASSERT_EQUAL(repl_put_disk_sync(b, 8192, blob, 50), 0);
	CU_ASSERT_EQUAL(repl_put_disk_sync_done(b, 10ULL << 30), 0);
	CU_ASSERT_EQUAL(repl_put_epoch_end(b, &e), 0);
	CU_ASSERT_EQUAL(repl_put_epoch_ack(b, 5), 0);
	CU_ASSERT_EQUAL(repl_put_heartbeat(b, 111222333, 5), 0);
	CU_ASSERT_EQUAL(repl_put_bye(b, REPL_BYE_TAKEOVER, "qemu died"), 0);
	free(l);
}

/* Decodes every frame of put_every_type and checks each field. */
static void check_every_type(const struct repl_frame *frames, size_t count)
{
	const char *err = NULL;
	const uint16_t types[] = { REPL_HELLO, REPL_AUTH, REPL_AUTH_OK, REPL_ERROR,
				   REPL_VM_CONFIG, REPL_RAM_LAYOUT, REPL_PAGES, REPL_PAGES,
				   REPL_DEVICE, REPL_DISK_WRITE, REPL_DISK_ZERO,
				   REPL_DISK_SYNC, REPL_DISK_SYNC_DONE, REPL_EPOCH_END,
				   REPL_EPOCH_ACK, REPL_HEARTBEAT, REPL_BYE };

	CU_ASSERT_EQUAL_FATAL(count, sizeof(types) / sizeof(types[0]));
	for (size_t i = 0; i < count; i++)
		CU_ASSERT_EQUAL(frames[i].type, types[i]);

	struct repl_hello h;
	CU_ASSERT_EQUAL_FATAL(repl_decode_hello(&frames[0], &h, &err), 0);
	CU_ASSERT_EQUAL(h.version, 1);
	CU_ASSERT_EQUAL(h.role, REPL_ROLE_BACKUP);
	CU_ASSERT_EQUAL(h.nonce[0], 0xa0);
	CU_ASSERT_EQUAL(h.nonce[31], 0xa0 + 31);
	CU_ASSERT_STRING_EQUAL(h.name, "backup-1.example");

	const uint8_t *mac;
	CU_ASSERT_EQUAL_FATAL(repl_decode_auth(&frames[1], &mac, &err), 0);
	CU_ASSERT_EQUAL(mac[0], 0x5a);
	CU_ASSERT_EQUAL_FATAL(repl_decode_auth(&frames[2], &mac, &err), 0);
	CU_ASSERT_EQUAL(mac[31], 0x5a);

	struct repl_error e;
	CU_ASSERT_EQUAL_FATAL(repl_decode_error(&frames[3], &e, &err), 0);
	CU_ASSERT_EQUAL(e.code, REPL_ERR_BUSY);
	CU_ASSERT_EQUAL(e.reason_len, strlen("VM db1 is already protected \xe2\x82\xac"));
	CU_ASSERT_EQUAL(memcmp(e.reason, "VM db1 is already protected \xe2\x82\xac", e.reason_len), 0);

	const char *json;
	size_t json_len;
	CU_ASSERT_EQUAL_FATAL(repl_decode_vm_config(&frames[4], &json, &json_len, &err), 0);
	CU_ASSERT_EQUAL(json_len, 12);
	CU_ASSERT_EQUAL(memcmp(json, "{\"vm\":\"db1\"}", 12), 0);

	struct repl_ram_layout *l = calloc(1, sizeof(*l)), *want = calloc(1, sizeof(*want));
	CU_ASSERT_PTR_NOT_NULL_FATAL(l);
	CU_ASSERT_PTR_NOT_NULL_FATAL(want);
	fill_layout(want);
	CU_ASSERT_EQUAL(repl_decode_ram_layout(&frames[5], l, &err), 0);
	CU_ASSERT_EQUAL(l->ram_section_id, 2);
	CU_ASSERT_STRING_EQUAL(l->machine_type, "pc-i440fx-7.2");
	CU_ASSERT_EQUAL(l->block_count, 3);
	for (int i = 0; i < 3; i++) {
		CU_ASSERT_STRING_EQUAL(l->blocks[i].name, want->blocks[i].name);
		CU_ASSERT_EQUAL(l->blocks[i].length, want->blocks[i].length);
	}
	free(l);
	free(want);

	struct repl_pages p;
	uint8_t page[REPL_PAGE_SIZE];
	CU_ASSERT_EQUAL_FATAL(repl_decode_pages(&frames[6], &p, &err), 0);
	CU_ASSERT_EQUAL(p.epoch, 5);
	CU_ASSERT_EQUAL(p.block, 1);
	CU_ASSERT_EQUAL(p.encoding, REPL_ENCODING_RAW);
	CU_ASSERT_EQUAL(p.count, 2);
	CU_ASSERT_EQUAL(repl_pages_index(&p, 0), 7);
	CU_ASSERT_EQUAL(repl_pages_index(&p, 1), 0x123456789ULL);
	CU_ASSERT_EQUAL(p.data_len, 2 * REPL_PAGE_SIZE);
	CU_ASSERT_EQUAL(repl_pages_decode_page(&p, 1, page), 0);
	for (size_t i = 0; i < REPL_PAGE_SIZE; i++) {
		size_t at = REPL_PAGE_SIZE + i;
		if (page[i] != (uint8_t)(at * 7 + at / 4096)) {
			CU_FAIL("RAW page 1 content");
			break;
		}
	}
	CU_ASSERT_EQUAL(repl_pages_decode_page(&p, 2, page), -1);
	CU_ASSERT_EQUAL_FATAL(repl_decode_pages(&frames[7], &p, &err), 0);
	CU_ASSERT_EQUAL(p.encoding, REPL_ENCODING_ZERO);
	CU_ASSERT_EQUAL(p.block, 2);
	CU_ASSERT_EQUAL(p.data_len, 0);
	memset(page, 0xee, sizeof(page));
	CU_ASSERT_EQUAL(repl_pages_decode_page(&p, 0, page), 0);
	CU_ASSERT_EQUAL(page[0], 0);
	CU_ASSERT_EQUAL(page[4095], 0);

	struct repl_device d;
	CU_ASSERT_EQUAL_FATAL(repl_decode_device(&frames[8], &d, &err), 0);
	CU_ASSERT_EQUAL(d.epoch, 5);
	CU_ASSERT_EQUAL(d.total, 300);
	CU_ASSERT_EQUAL(d.offset, 100);
	CU_ASSERT_EQUAL(d.len, 100);
	CU_ASSERT_EQUAL(d.data[99], 0xb1);

	struct repl_disk_write w;
	CU_ASSERT_EQUAL_FATAL(repl_decode_disk_write(&frames[9], &w, &err), 0);
	CU_ASSERT_EQUAL(w.epoch, 5);
	CU_ASSERT_EQUAL(w.offset, 1ULL << 40);
	CU_ASSERT_EQUAL(w.len, 10);
	CU_ASSERT_EQUAL(w.data[0], 0xb1);

	struct repl_disk_zero z;
	CU_ASSERT_EQUAL_FATAL(repl_decode_disk_zero(&frames[10], &z, &err), 0);
	CU_ASSERT_EQUAL(z.epoch, 5);
	CU_ASSERT_EQUAL(z.offset, 4096);
	CU_ASSERT_EQUAL(z.length, 1 << 20);

	struct repl_disk_sync s;
	CU_ASSERT_EQUAL_FATAL(repl_decode_disk_sync(&frames[11], &s, &err), 0);
	CU_ASSERT_EQUAL(s.offset, 8192);
	CU_ASSERT_EQUAL(s.len, 50);

	uint64_t v;
	CU_ASSERT_EQUAL_FATAL(repl_decode_disk_sync_done(&frames[12], &v, &err), 0);
	CU_ASSERT_EQUAL(v, 10ULL << 30);

	struct repl_epoch_end ee;
	CU_ASSERT_EQUAL_FATAL(repl_decode_epoch_end(&frames[13], &ee, &err), 0);
	CU_ASSERT_EQUAL(ee.epoch, 5);
	CU_ASSERT_EQUAL(ee.pages, 2);
	CU_ASSERT_EQUAL(ee.bytes, 1234);
	CU_ASSERT_EQUAL(ee.checksum, 0xfeedfacecafebeefULL);
	CU_ASSERT_EQUAL(ee.timestamp_us, 987654321);

	CU_ASSERT_EQUAL_FATAL(repl_decode_epoch_ack(&frames[14], &v, &err), 0);
	CU_ASSERT_EQUAL(v, 5);

	struct repl_heartbeat hb;
	CU_ASSERT_EQUAL_FATAL(repl_decode_heartbeat(&frames[15], &hb, &err), 0);
	CU_ASSERT_EQUAL(hb.now_us, 111222333);
	CU_ASSERT_EQUAL(hb.epoch, 5);

	struct repl_bye bye;
	CU_ASSERT_EQUAL_FATAL(repl_decode_bye(&frames[16], &bye, &err), 0);
	CU_ASSERT_EQUAL(bye.reason, REPL_BYE_TAKEOVER);
	CU_ASSERT_EQUAL(bye.text_len, 9);
	CU_ASSERT_EQUAL(memcmp(bye.text, "qemu died", 9), 0);
}

static void test_round_trip_every_type(void)
{
	struct buffer b;
	struct repl_frame frames[32];
	size_t count = 0, pos = 0;
	const char *err = NULL;

	buffer_init(&b);
	put_every_type(&b);
	while (pos < buffer_len(&b) && count < 32) {
		ssize_t n = repl_frame_parse(buffer_head(&b) + pos, buffer_len(&b) - pos,
					     &frames[count], &err);
		CU_ASSERT_FATAL(n > 0);
		pos += (size_t)n;
		count++;
	}
	CU_ASSERT_EQUAL(pos, buffer_len(&b));
	check_every_type(frames, count);
	buffer_free(&b);
}

/* DEVICE_DELTA: its header round-trips; a short or empty one is refused. */
static void test_device_delta_frame(void)
{
	struct buffer b;
	const uint8_t records[5] = { 2, 0, 0, 0, 7 };
	struct repl_device_delta in = {
		.epoch = 9, .total = 300000, .base_len = 299000,
		.base_sum = 0x0123456789abcdefULL, .sum = 0xfedcba9876543210ULL,
		.records = records, .records_len = sizeof(records),
	}, out;
	struct repl_frame f;
	const char *err = NULL;

	buffer_init(&b);
	CU_ASSERT_EQUAL_FATAL(repl_put_device_delta(&b, &in), 0);
	CU_ASSERT_EQUAL_FATAL(repl_frame_parse(buffer_head(&b), buffer_len(&b), &f, &err),
			      (ssize_t)(REPL_HEADER_SIZE + 40 + sizeof(records)));
	CU_ASSERT_EQUAL(f.type, REPL_DEVICE_DELTA);
	CU_ASSERT_EQUAL_FATAL(repl_decode_device_delta(&f, &out, &err), 0);
	CU_ASSERT_EQUAL(out.epoch, 9);
	CU_ASSERT_EQUAL(out.total, 300000);
	CU_ASSERT_EQUAL(out.base_len, 299000);
	CU_ASSERT_EQUAL(out.base_sum, in.base_sum);
	CU_ASSERT_EQUAL(out.sum, in.sum);
	CU_ASSERT_EQUAL(out.records_len, sizeof(records));
	CU_ASSERT_EQUAL(memcmp(out.records, records, sizeof(records)), 0);

	/* Without records (the 40-byte header alone) or for an empty blob. */
	f.length = 40;
	CU_ASSERT_EQUAL(repl_decode_device_delta(&f, &out, &err), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "shorter than"));
	f.length = 45;
	uint8_t copy[45];
	memcpy(copy, f.payload, sizeof(copy));
	memset(copy + 8, 0, 8);
	f.payload = copy;
	CU_ASSERT_EQUAL(repl_decode_device_delta(&f, &out, &err), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "empty blob"));

	/* The sender refuses to build either. */
	buffer_clear(&b);
	in.total = 0;
	CU_ASSERT_EQUAL(repl_put_device_delta(&b, &in), -1);
	in.total = 1;
	in.records_len = 0;
	CU_ASSERT_EQUAL(repl_put_device_delta(&b, &in), -1);
	CU_ASSERT_EQUAL(buffer_len(&b), 0);
	buffer_free(&b);
}

/* The receiver sees the stream one byte at a time, as a slow socket gives it. */
static void test_parse_byte_by_byte(void)
{
	struct buffer sent, recv;
	struct repl_frame frames[32];
	uint8_t *copies[32];
	size_t count = 0;
	const char *err = NULL;

	buffer_init(&sent);
	buffer_init(&recv);
	put_every_type(&sent);
	for (size_t i = 0; i < buffer_len(&sent); i++) {
		CU_ASSERT_EQUAL_FATAL(buffer_append(&recv, buffer_head(&sent) + i, 1), 0);
		struct repl_frame f;
		ssize_t n = repl_frame_parse(buffer_head(&recv), buffer_len(&recv), &f, &err);
		CU_ASSERT_FATAL(n >= 0);
		if (n == 0)
			continue;
		/* Whole frames only, the moment their last byte arrives. */
		CU_ASSERT_EQUAL(n, (ssize_t)buffer_len(&recv));
		CU_ASSERT_FATAL(count < 32);
		copies[count] = malloc((size_t)n);
		CU_ASSERT_PTR_NOT_NULL_FATAL(copies[count]);
		memcpy(copies[count], buffer_head(&recv), (size_t)n);
		frames[count] = f;
		frames[count].payload = copies[count] + REPL_HEADER_SIZE;
		count++;
		buffer_consume(&recv, (size_t)n);
	}
	CU_ASSERT_EQUAL(buffer_len(&recv), 0);
	check_every_type(frames, count);
	for (size_t i = 0; i < count; i++)
		free(copies[i]);
	buffer_free(&sent);
	buffer_free(&recv);
}

/* Byte layouts written out by hand, so encoder and decoder cannot agree on a mistake. */
static void test_byte_layouts(void)
{
	struct buffer b;
	struct repl_hello h;

	buffer_init(&b);
	fill_hello(&h, REPL_ROLE_PRIMARY, "pa");
	CU_ASSERT_EQUAL_FATAL(repl_put_hello(&b, &h), 0);
	/* A version-1 HELLO, every byte: what version-1 daemons send and accept. */
	uint8_t hello_v1[] = { 0, 1, 0, 0, 0, 0, 0, 46,
			       'R', 'D', 'B', 'R', 'E', 'P', 'L', 0, 0, 1, 1,
			       0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7,
			       0xa8, 0xa9, 0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf,
			       0xb0, 0xb1, 0xb2, 0xb3, 0xb4, 0xb5, 0xb6, 0xb7,
			       0xb8, 0xb9, 0xba, 0xbb, 0xbc, 0xbd, 0xbe, 0xbf,
			       2, 'p', 'a' };
	CU_ASSERT_EQUAL_FATAL(buffer_len(&b), sizeof(hello_v1));
	CU_ASSERT_EQUAL(memcmp(buffer_head(&b), hello_v1, sizeof(hello_v1)), 0);
	buffer_clear(&b);
	/* Version 2's is the same but for the version. */
	h.version = 2;
	CU_ASSERT_EQUAL_FATAL(repl_put_hello(&b, &h), 0);
	hello_v1[17] = 2;
	CU_ASSERT_EQUAL_FATAL(buffer_len(&b), sizeof(hello_v1));
	CU_ASSERT_EQUAL(memcmp(buffer_head(&b), hello_v1, sizeof(hello_v1)), 0);
	buffer_clear(&b);

	const uint64_t idx[2] = { 1, 0x0102030405ULL };
	CU_ASSERT_EQUAL_FATAL(repl_put_pages(&b, 0x1122334455667788ULL, 0x0021,
					     REPL_ENCODING_ZERO, 2, idx, NULL, 0), 0);
	const uint8_t pages[] = { 0, 7, 0, 0, 0, 0, 0, 31,
				  0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0, 0x21, 1,
				  0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1,
				  0, 0, 0, 1, 2, 3, 4, 5 };
	CU_ASSERT_EQUAL_FATAL(buffer_len(&b), sizeof(pages));
	CU_ASSERT_EQUAL(memcmp(buffer_head(&b), pages, sizeof(pages)), 0);
	buffer_clear(&b);

	CU_ASSERT_EQUAL_FATAL(repl_put_error(&b, REPL_ERR_AUTH, "no"), 0);
	const uint8_t error[] = { 0, 4, 0, 0, 0, 0, 0, 4, 0, 2, 'n', 'o' };
	CU_ASSERT_EQUAL_FATAL(buffer_len(&b), sizeof(error));
	CU_ASSERT_EQUAL(memcmp(buffer_head(&b), error, sizeof(error)), 0);
	buffer_clear(&b);

	struct repl_ram_layout *l = calloc(1, sizeof(*l));
	CU_ASSERT_PTR_NOT_NULL_FATAL(l);
	l->ram_section_id = 0x01020304;
	strcpy(l->machine_type, "q");
	l->block_count = 1;
	strcpy(l->blocks[0].name, "r");
	l->blocks[0].length = 0x2000;
	CU_ASSERT_EQUAL_FATAL(repl_put_ram_layout(&b, l), 0);
	const uint8_t layout[] = { 0, 6, 0, 0, 0, 0, 0, 18, 1, 2, 3, 4, 1, 'q', 0, 1,
				   1, 'r', 0, 0, 0, 0, 0, 0, 0x20, 0 };
	CU_ASSERT_EQUAL_FATAL(buffer_len(&b), sizeof(layout));
	CU_ASSERT_EQUAL(memcmp(buffer_head(&b), layout, sizeof(layout)), 0);
	free(l);
	buffer_clear(&b);

	CU_ASSERT_EQUAL_FATAL(repl_put_bye(&b, REPL_BYE_SHUTDOWN, NULL), 0);
	const uint8_t bye[] = { 0, 16, 0, 0, 0, 0, 0, 1, 2 };
	CU_ASSERT_EQUAL_FATAL(buffer_len(&b), sizeof(bye));
	CU_ASSERT_EQUAL(memcmp(buffer_head(&b), bye, sizeof(bye)), 0);
	buffer_free(&b);
}

/* ---- decoder rejections ---------------------------------------------- */

/* ---- DISK_BASE and DISK_PLAN ------------------------------------------- */

static struct repl_frame frame_of(struct buffer *b)
{
	struct repl_frame f;
	const char *err = NULL;

	CU_ASSERT_EQUAL_FATAL(repl_frame_parse(buffer_head(b), buffer_len(b), &f, &err),
			      (ssize_t)buffer_len(b));
	return f;
}

static void test_disk_base_and_plan(void)
{
	struct buffer b;
	const uint8_t bits[2] = { 0x81, 0x02 }; /* extents 0, 7, 9 of 10 */
	struct repl_disk_base base = { .generation = 7, .base_generation = 5,
				       .flags = REPL_DISK_BASE_FULL_ASKED,
				       .extent_count = 10, .bits = bits };
	struct repl_disk_base db;
	struct repl_disk_plan dp;
	const char *err = NULL;

	buffer_init(&b);
	CU_ASSERT_EQUAL_FATAL(repl_put_disk_base(&b, &base), 0);
	struct repl_frame f = frame_of(&b);
	CU_ASSERT_EQUAL_FATAL(repl_decode_disk_base(&f, &db, &err), 0);
	CU_ASSERT_EQUAL(db.generation, 7);
	CU_ASSERT_EQUAL(db.base_generation, 5);
	CU_ASSERT_EQUAL(db.flags, REPL_DISK_BASE_FULL_ASKED);
	CU_ASSERT_EQUAL(db.extent_count, 10);
	CU_ASSERT_EQUAL(memcmp(db.bits, bits, 2), 0);
	buffer_clear(&b);
	/* Generation 0 and no extents are refused before anything is queued. */
	base.generation = 0;
	CU_ASSERT_EQUAL(repl_put_disk_base(&b, &base), -1);
	base.generation = 7;
	base.extent_count = 0;
	CU_ASSERT_EQUAL(repl_put_disk_base(&b, &base), -1);
	CU_ASSERT_EQUAL(buffer_len(&b), 0);

	struct repl_disk_plan plan = { .resync = true, .extent_count = 10,
				       .reason = "both of generation 5", .bits = bits };
	CU_ASSERT_EQUAL_FATAL(repl_put_disk_plan(&b, &plan), 0);
	f = frame_of(&b);
	CU_ASSERT_EQUAL_FATAL(repl_decode_disk_plan(&f, &dp, &err), 0);
	CU_ASSERT_TRUE(dp.resync);
	CU_ASSERT_EQUAL(dp.extent_count, 10);
	CU_ASSERT_EQUAL(dp.reason_len, strlen("both of generation 5"));
	CU_ASSERT_EQUAL(memcmp(dp.reason, "both of generation 5", dp.reason_len), 0);
	CU_ASSERT_EQUAL(memcmp(dp.bits, bits, 2), 0);
	buffer_clear(&b);
	plan.resync = false;
	plan.bits = NULL;
	plan.reason = "the primary asked for a full copy";
	CU_ASSERT_EQUAL_FATAL(repl_put_disk_plan(&b, &plan), 0);
	f = frame_of(&b);
	CU_ASSERT_EQUAL_FATAL(repl_decode_disk_plan(&f, &dp, &err), 0);
	CU_ASSERT_FALSE(dp.resync);
	CU_ASSERT_PTR_NULL(dp.bits);
	buffer_clear(&b);
	plan.resync = true; /* a resync without its bitmap */
	CU_ASSERT_EQUAL(repl_put_disk_plan(&b, &plan), -1);
	buffer_free(&b);
}

static void test_reject_disk_base_and_plan(void)
{
	struct bytes b = { 0 };

	b_u64(&b, 1); b_u64(&b, 0); b_u32(&b, 20); b_u32(&b, 0); b_u64(&b, 9);
	b_u8(&b, 0xff);
	reject(REPL_DISK_BASE, &b, "do not match"); /* 9 extents need 2 bytes */
	b_u8(&b, 0x01);
	accept(REPL_DISK_BASE, &b);
	b_free(&b);
	b_u64(&b, 0); b_u64(&b, 0); b_u32(&b, 20); b_u32(&b, 0); b_u64(&b, 1); b_u8(&b, 1);
	reject(REPL_DISK_BASE, &b, "generation 0");
	b_free(&b);
	b_u64(&b, 1); b_u64(&b, 0); b_u32(&b, 12); b_u32(&b, 0); b_u64(&b, 1); b_u8(&b, 1);
	reject(REPL_DISK_BASE, &b, "2^12");
	b_free(&b);
	b_u64(&b, 1); b_u64(&b, 0); b_u32(&b, 20); b_u32(&b, 2); b_u64(&b, 1); b_u8(&b, 1);
	reject(REPL_DISK_BASE, &b, "flags");
	b_free(&b);
	b_u64(&b, 1); b_u64(&b, 0); b_u32(&b, 20); b_u32(&b, 0); b_u64(&b, 0);
	reject(REPL_DISK_BASE, &b, "0 extents");
	b_free(&b);
	b_u64(&b, 1);
	reject(REPL_DISK_BASE, &b, "shorter");
	b_free(&b);

	/* DISK_PLAN: mode, pad, reason length, shift, count, reason, bits. */
	b_u8(&b, 1); b_u8(&b, 0); b_u16(&b, 2); b_u32(&b, 20); b_u64(&b, 8);
	b_mem(&b, "ok", 2);
	reject(REPL_DISK_PLAN, &b, "does not hold"); /* a resync without its byte of bits */
	b_u8(&b, 0x10);
	accept(REPL_DISK_PLAN, &b);
	b_free(&b);
	b_u8(&b, 2); b_u8(&b, 0); b_u16(&b, 0); b_u32(&b, 20); b_u64(&b, 8);
	reject(REPL_DISK_PLAN, &b, "unknown mode");
	b_free(&b);
	b_u8(&b, 0); b_u8(&b, 0); b_u16(&b, 0); b_u32(&b, 21); b_u64(&b, 8);
	reject(REPL_DISK_PLAN, &b, "2^21");
	b_free(&b);
	b_u8(&b, 0); b_u8(&b, 0); b_u16(&b, 3); b_u32(&b, 20); b_u64(&b, 8);
	b_mem(&b, "a\0b", 3);
	reject(REPL_DISK_PLAN, &b, "UTF-8");
	b_free(&b);
	b_u8(&b, 0); b_u8(&b, 0); b_u16(&b, 9); b_u32(&b, 20); b_u64(&b, 8);
	b_mem(&b, "cut", 3);
	reject(REPL_DISK_PLAN, &b, "does not hold");
	b_free(&b);
}

static void test_decoders_check_the_type(void)
{
	struct bytes b = { 0 };
	const char *err = NULL;

	b_u64(&b, 1);
	for (uint16_t frame_type = REPL_TYPE_MIN; frame_type <= REPL_TYPE_MAX; frame_type++) {
		struct repl_frame f = mk(frame_type, &b);
		for (uint16_t as = REPL_TYPE_MIN; as <= REPL_TYPE_MAX; as++) {
			bool auth_pair = (as == REPL_AUTH || as == REPL_AUTH_OK) &&
					 (frame_type == REPL_AUTH || frame_type == REPL_AUTH_OK);
			if (as == frame_type || auth_pair)
				continue;
			err = NULL;
			CU_ASSERT_EQUAL(decode_as(as, &f, &err), -1);
			CU_ASSERT_PTR_NOT_NULL(err);
		}
	}
	/* A frame that did not come from repl_frame_parse: flags set. */
	struct repl_frame f = mk(REPL_EPOCH_ACK, &b);
	f.flags = 1;
	CU_ASSERT_EQUAL(decode_as(REPL_EPOCH_ACK, &f, &err), -1);
	b_free(&b);
}

static void hello_v1(struct bytes *b, uint8_t role, uint8_t name_len, const char *name)
{
	uint8_t nonce[32] = { 0 };

	b->n = 0;
	b_mem(b, "RDBREPL", 8);
	b_u16(b, 1);
	b_u8(b, role);
	b_mem(b, nonce, 32);
	b_u8(b, name_len);
	b_mem(b, name, strlen(name));
}

static void test_reject_hello(void)
{
	struct bytes b = { 0 };

	hello_v1(&b, 1, 4, "host");
	accept(REPL_HELLO, &b);
	b.d[0] = 'X';
	reject(REPL_HELLO, &b, "magic");
	b.n = 9;
	reject(REPL_HELLO, &b, "shorter");
	hello_v1(&b, 1, 4, "host");
	b.n = 40;
	reject(REPL_HELLO, &b, "shorter");
	hello_v1(&b, 0, 4, "host");
	reject(REPL_HELLO, &b, "role 0");
	hello_v1(&b, 3, 4, "host");
	reject(REPL_HELLO, &b, "role 3");
	hello_v1(&b, 2, 0, "");
	reject(REPL_HELLO, &b, "length 0");
	char longname[66];
	memset(longname, 'h', 65);
	longname[65] = '\0';
	hello_v1(&b, 2, 65, longname);
	reject(REPL_HELLO, &b, "length 65");
	longname[64] = '\0';
	hello_v1(&b, 2, 64, longname);
	accept(REPL_HELLO, &b);
	hello_v1(&b, 2, 5, "host");
	reject(REPL_HELLO, &b, "5-byte host name");
	hello_v1(&b, 2, 4, "hostX");
	reject(REPL_HELLO, &b, "4-byte host name");
	hello_v1(&b, 2, 4, "ho\nt");
	reject(REPL_HELLO, &b, "printable");
	hello_v1(&b, 2, 4, "h\xc3\xa9t");
	reject(REPL_HELLO, &b, "printable");

	/* A version above ours: decoded far enough for the caller to answer ERROR(1). */
	struct repl_hello h;
	const char *err = NULL;
	b.n = 0;
	b_mem(&b, "RDBREPL", 8);
	b_u16(&b, REPL_PROTOCOL_MAX + 1);
	b_u8(&b, 0xff);
	struct repl_frame f = mk(REPL_HELLO, &b);
	CU_ASSERT_EQUAL(repl_decode_hello(&f, &h, &err), 0);
	CU_ASSERT_EQUAL(h.version, REPL_PROTOCOL_MAX + 1);
	CU_ASSERT_EQUAL(h.role, 0);
	CU_ASSERT_EQUAL(h.name[0], '\0');
	/* Our highest is read whole, with every rule: the same truncation fails. */
	b.d[9] = REPL_PROTOCOL_MAX;
	reject(REPL_HELLO, &b, "shorter");
	/* Version 0 never existed. */
	hello_v1(&b, 1, 4, "host");
	b.d[9] = 0;
	reject(REPL_HELLO, &b, "protocol version 0 is not 1..");
	/* Every version we speak has version 1's layout. */
	for (unsigned v = 1; v <= REPL_PROTOCOL_MAX; v++) {
		hello_v1(&b, 2, 4, "host");
		b.d[8] = (uint8_t)(v >> 8);
		b.d[9] = (uint8_t)v;
		f = mk(REPL_HELLO, &b);
		err = NULL;
		CU_ASSERT_EQUAL(repl_decode_hello(&f, &h, &err), 0);
		CU_ASSERT_EQUAL(h.version, v);
		CU_ASSERT_STRING_EQUAL(h.name, "host");
		CU_ASSERT_EQUAL(h.role, 2);
	}
	b_free(&b);
}

static void test_reject_auth_error_config(void)
{
	struct bytes b = { 0 };
	uint8_t mac[33] = { 0 };

	b_mem(&b, mac, 31);
	reject(REPL_AUTH, &b, "31 bytes");
	b_mem(&b, mac, 2);
	reject(REPL_AUTH_OK, &b, "33 bytes");

	b.n = 0;
	b_u8(&b, 0);
	reject(REPL_ERROR, &b, "shorter");
	b.n = 0;
	b_u16(&b, 0);
	reject(REPL_ERROR, &b, "code 0");
	b.n = 0;
	b_u16(&b, 7);
	reject(REPL_ERROR, &b, "code 7");
	const char *bad_utf8[] = { "\xff", "\xc0\x80", "\xed\xa0\x80", "\xe2\x82",
				   "\xf4\x90\x80\x80", "a\x80" };
	for (size_t i = 0; i < sizeof(bad_utf8) / sizeof(bad_utf8[0]); i++) {
		b.n = 0;
		b_u16(&b, 3);
		b_mem(&b, bad_utf8[i], strlen(bad_utf8[i]));
		reject(REPL_ERROR, &b, "UTF-8");
	}
	b.n = 0;
	b_u16(&b, 3);
	b_mem(&b, "a\0b", 3);
	reject(REPL_ERROR, &b, "UTF-8");
	b.n = 0;
	b_u16(&b, 6);
	b_mem(&b, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 9);
	accept(REPL_ERROR, &b);
	b.n = 0;
	b_u16(&b, 6);
	accept(REPL_ERROR, &b); /* empty reason */
	char text[REPL_TEXT_MAX + 1];
	memset(text, 'x', sizeof(text));
	b_mem(&b, text, REPL_TEXT_MAX);
	accept(REPL_ERROR, &b);
	b_u8(&b, 'x');
	reject(REPL_ERROR, &b, "exceeds");

	b.n = 0;
	reject(REPL_VM_CONFIG, &b, "empty");
	b_mem(&b, "{\"a\":\"\xff\"}", 9);
	reject(REPL_VM_CONFIG, &b, "UTF-8");
	b_free(&b);
	b.d = calloc(1, REPL_VM_CONFIG_MAX + 1);
	CU_ASSERT_PTR_NOT_NULL_FATAL(b.d);
	memset(b.d, ' ', REPL_VM_CONFIG_MAX + 1);
	b.n = b.cap = REPL_VM_CONFIG_MAX;
	accept(REPL_VM_CONFIG, &b);
	b.n = REPL_VM_CONFIG_MAX + 1;
	reject(REPL_VM_CONFIG, &b, "exceed");
	b_free(&b);
}

static void layout_head(struct bytes *b, uint32_t section, const char *mt, uint16_t count)
{
	b->n = 0;
	b_u32(b, section);
	b_str(b, mt);
	b_u16(b, count);
}

static void test_reject_ram_layout(void)
{
	struct bytes b = { 0 };

	layout_head(&b, 1, "pc", 1);
	b_str(&b, "pc.ram");
	b_u64(&b, 1 << 20);
	accept(REPL_RAM_LAYOUT, &b);
	b_u8(&b, 0);
	reject(REPL_RAM_LAYOUT, &b, "1 bytes after the last block");

	layout_head(&b, 0, "pc", 1);
	b_str(&b, "pc.ram");
	b_u64(&b, 1 << 20);
	reject(REPL_RAM_LAYOUT, &b, "section id 0");

	b.n = 3;
	reject(REPL_RAM_LAYOUT, &b, "shorter");
	layout_head(&b, 1, "", 1);
	reject(REPL_RAM_LAYOUT, &b, "machine type is empty");
	b.n = 0;
	b_u32(&b, 1);
	reject(REPL_RAM_LAYOUT, &b, "before the machine type");
	b_u8(&b, 10);
	b_mem(&b, "pc", 2);
	reject(REPL_RAM_LAYOUT, &b, "runs past");
	b.n = 0;
	b_u32(&b, 1);
	b_str(&b, "pc");
	reject(REPL_RAM_LAYOUT, &b, "block count");
	layout_head(&b, 1, "p\x01", 1);
	reject(REPL_RAM_LAYOUT, &b, "machine type is not printable");

	layout_head(&b, 1, "pc", 0);
	reject(REPL_RAM_LAYOUT, &b, "block count 0");
	layout_head(&b, 1, "pc", 65);
	for (int i = 0; i < 65; i++) {
		char name[16];
		snprintf(name, sizeof(name), "b%d", i);
		b_str(&b, name);
		b_u64(&b, 4096);
	}
	reject(REPL_RAM_LAYOUT, &b, "block count 65");
	/* The same 64 blocks are fine. */
	b.d[8] = 64;
	b.n -= 4 + 8; /* "b64" and its length */
	accept(REPL_RAM_LAYOUT, &b);

	layout_head(&b, 1, "pc", 2);
	b_str(&b, "a");
	b_u64(&b, 4096);
	b_str(&b, "b");
	b_u64(&b, 4097);
	reject(REPL_RAM_LAYOUT, &b, "block 1 length 4097 is not a positive multiple of 4096");
	layout_head(&b, 1, "pc", 1);
	b_str(&b, "a");
	b_u64(&b, 0);
	reject(REPL_RAM_LAYOUT, &b, "block 0 length 0");
	layout_head(&b, 1, "pc", 2);
	b_str(&b, "a");
	b_u64(&b, 4096);
	b_str(&b, "a");
	b_u64(&b, 8192);
	reject(REPL_RAM_LAYOUT, &b, "repeats the name a");
	layout_head(&b, 1, "pc", 1);
	b_str(&b, "");
	b_u64(&b, 4096);
	reject(REPL_RAM_LAYOUT, &b, "name of block 0 is empty");
	layout_head(&b, 1, "pc", 2);
	b_str(&b, "a");
	b_u64(&b, 4096);
	reject(REPL_RAM_LAYOUT, &b, "before the name of block 1");
	layout_head(&b, 1, "pc", 1);
	b_str(&b, "a");
	b_u32(&b, 0);
	reject(REPL_RAM_LAYOUT, &b, "before the length of block 0");
	layout_head(&b, 1, "pc", 1);
	b_u8(&b, 200);
	b_mem(&b, "abc", 3);
	reject(REPL_RAM_LAYOUT, &b, "runs past");
	b_free(&b);
}

static void pages_head(struct bytes *b, uint16_t block, uint8_t enc, uint32_t count)
{
	b->n = 0;
	b_u64(b, 9);
	b_u16(b, block);
	b_u8(b, enc);
	b_u32(b, count);
}

static void test_reject_pages(void)
{
	struct bytes b = { 0 };
	uint8_t page[REPL_PAGE_SIZE] = { 0 };

	pages_head(&b, 0, REPL_ENCODING_RAW, 1);
	b_u64(&b, 3);
	b_mem(&b, page, sizeof(page));
	accept(REPL_PAGES, &b);
	b.n--;
	reject(REPL_PAGES, &b, "4095 bytes of RAW data for 1 pages");
	b_u8(&b, 0);
	b_u8(&b, 0);
	reject(REPL_PAGES, &b, "4097 bytes of RAW data");

	b.n = 14;
	reject(REPL_PAGES, &b, "shorter");
	pages_head(&b, 0, REPL_ENCODING_ZERO, 0);
	reject(REPL_PAGES, &b, "count 0");
	pages_head(&b, 0, REPL_ENCODING_ZERO, 4097);
	reject(REPL_PAGES, &b, "count 4097");
	pages_head(&b, 64, REPL_ENCODING_ZERO, 1);
	b_u64(&b, 1);
	reject(REPL_PAGES, &b, "block index 64");
	pages_head(&b, 63, REPL_ENCODING_ZERO, 1);
	b_u64(&b, 1);
	accept(REPL_PAGES, &b);
	b_u8(&b, 0);
	reject(REPL_PAGES, &b, "1 bytes of data after ZERO pages");

	pages_head(&b, 0, REPL_ENCODING_ZERO, 3);
	b_u64(&b, 1);
	b_u64(&b, 2);
	reject(REPL_PAGES, &b, "cannot hold 3 page indexes");
	b_u64(&b, 2);
	reject(REPL_PAGES, &b, "page index 2 follows 2");
	pages_head(&b, 0, REPL_ENCODING_ZERO, 2);
	b_u64(&b, 9);
	b_u64(&b, 4);
	reject(REPL_PAGES, &b, "page index 4 follows 9");
	pages_head(&b, 0, REPL_ENCODING_ZERO, 1);
	b_u64(&b, REPL_MAX_PAGE_INDEX + 1);
	reject(REPL_PAGES, &b, "out of range");
	pages_head(&b, 0, REPL_ENCODING_ZERO, 1);
	b_u64(&b, REPL_MAX_PAGE_INDEX);
	accept(REPL_PAGES, &b);

	pages_head(&b, 0, 2, 1);
	b_u64(&b, 1);
	reject(REPL_PAGES, &b, "unknown page encoding 2");
	pages_head(&b, 0, 0xff, 1);
	b_u64(&b, 1);
	b_mem(&b, page, sizeof(page));
	reject(REPL_PAGES, &b, "unknown page encoding 255");

	/* decode_page itself refuses what it does not know. */
	struct repl_pages p = { .encoding = 7, .count = 1 };
	CU_ASSERT_EQUAL(repl_pages_decode_page(&p, 0, page), -1);
	b_free(&b);
}


/* ---- coded pages, requests, resends ------------------------------- */

static void coded_head(struct bytes *b, uint16_t block, uint32_t count)
{
	b->n = 0;
	b_u64(b, 7);
	b_u16(b, block);
	b_u32(b, count);
}

static void coded_rec(struct bytes *b, uint64_t index, uint8_t kind, uint32_t len)
{
	b_u64(b, index);
	b_u8(b, kind);
	b_u64(b, 0x1122334455667788ull);
	b_u32(b, len);
	for (uint32_t i = 0; i < len; i++)
		b_u8(b, (uint8_t)i);
}

/* Built with the incremental builder, read back with the iterator. */
static void test_pages_coded_round_trip(void)
{
	struct buffer b;
	struct repl_coded_builder cb;
	uint8_t page[REPL_PAGE_SIZE], delta[100], ref[REPL_DISK_REF_SIZE];
	const char *err = NULL;

	memset(page, 0x5a, sizeof(page));
	memset(delta, 0x33, sizeof(delta));
	memset(ref, 0x44, sizeof(ref));
	buffer_init(&b);
	CU_ASSERT_EQUAL_FATAL(repl_coded_begin(&cb, &b, 12, 3), 0);
	size_t before = buffer_len(&b);
	CU_ASSERT_EQUAL(repl_put_coded_page(&b, 4, REPL_KIND_RAW, 111, page, REPL_PAGE_SIZE), 0);
	CU_ASSERT_EQUAL(repl_coded_note(&cb, before), 0);
	before = buffer_len(&b);
	CU_ASSERT_EQUAL(repl_put_coded_page(&b, 5, REPL_KIND_ZERO, 222, NULL, 0), 0);
	CU_ASSERT_EQUAL(repl_coded_note(&cb, before), 0);
	before = buffer_len(&b);
	CU_ASSERT_EQUAL(repl_put_coded_page(&b, 9, REPL_KIND_XOR_RLE, 333, delta, sizeof(delta)), 0);
	CU_ASSERT_EQUAL(repl_coded_note(&cb, before), 0);
	before = buffer_len(&b);
	CU_ASSERT_EQUAL(repl_put_coded_page(&b, 10, REPL_KIND_DISK_REF, 444, ref, sizeof(ref)), 0);
	CU_ASSERT_EQUAL(repl_coded_note(&cb, before), 0);
	/* A record that does not follow in order is taken back out. */
	before = buffer_len(&b);
	CU_ASSERT_EQUAL(repl_put_coded_page(&b, 10, REPL_KIND_ZERO, 0, NULL, 0), 0);
	CU_ASSERT_EQUAL(repl_coded_note(&cb, before), -1);
	CU_ASSERT_EQUAL(buffer_len(&b), before);
	repl_coded_end(&cb);

	struct repl_frame f = only_frame(&b);
	struct repl_pages_coded pc;
	CU_ASSERT_EQUAL(f.type, REPL_PAGES_CODED);
	CU_ASSERT_TRUE(repl_type_is_covered(f.type));
	CU_ASSERT_EQUAL_FATAL(repl_decode_pages_coded(&f, &pc, &err), 0);
	CU_ASSERT_EQUAL(pc.epoch, 12);
	CU_ASSERT_EQUAL(pc.block, 3);
	CU_ASSERT_EQUAL(pc.count, 4);
	struct repl_coded_iter it;
	struct repl_coded_page cp;
	const uint64_t want_index[] = { 4, 5, 9, 10 };
	const uint8_t want_kind[] = { REPL_KIND_RAW, REPL_KIND_ZERO, REPL_KIND_XOR_RLE,
				      REPL_KIND_DISK_REF };
	const uint32_t want_len[] = { REPL_PAGE_SIZE, 0, sizeof(delta), REPL_DISK_REF_SIZE };
	unsigned n = 0;
	repl_coded_iter_init(&it, &pc);
	while (repl_coded_iter_next(&it, &cp) && n < 4) {
		CU_ASSERT_EQUAL(cp.index, want_index[n]);
		CU_ASSERT_EQUAL(cp.kind, want_kind[n]);
		CU_ASSERT_EQUAL(cp.checksum, 111u * (n + 1));
		CU_ASSERT_EQUAL(cp.len, want_len[n]);
		n++;
	}
	CU_ASSERT_EQUAL(n, 4);
	CU_ASSERT_EQUAL(memcmp(pc.records + REPL_CODED_RECORD_HEADER, page, REPL_PAGE_SIZE), 0);

	/* A builder without records leaves nothing behind. */
	buffer_clear(&b);
	CU_ASSERT_EQUAL(repl_coded_begin(&cb, &b, 1, 0), 0);
	repl_coded_end(&cb);
	CU_ASSERT_EQUAL(buffer_len(&b), 0);
	CU_ASSERT_EQUAL(repl_coded_begin(&cb, &b, 1, REPL_MAX_BLOCKS), -1);

	/* The per-kind rules, on the encoder side too. */
	CU_ASSERT_EQUAL(repl_put_coded_page(&b, 1, REPL_KIND_RAW, 0, page, 4095), -1);
	CU_ASSERT_EQUAL(repl_put_coded_page(&b, 1, REPL_KIND_ZERO, 0, page, 1), -1);
	CU_ASSERT_EQUAL(repl_put_coded_page(&b, 1, REPL_KIND_LZ4, 0, page, 0), -1);
	CU_ASSERT_EQUAL(repl_put_coded_page(&b, 1, REPL_KIND_DISK_REF, 0, page, 16), -1);
	CU_ASSERT_EQUAL(repl_put_coded_page(&b, 1, 5, 0, NULL, 0), -1);
	CU_ASSERT_EQUAL(buffer_len(&b), 0);
	buffer_free(&b);
}

static void test_reject_pages_coded(void)
{
	struct bytes b = { 0 };

	coded_head(&b, 0, 2);
	coded_rec(&b, 1, REPL_KIND_ZERO, 0);
	coded_rec(&b, 2, REPL_KIND_LZ4, REPL_CODED_MAX);
	accept(REPL_PAGES_CODED, &b);
	b.n--;
	reject(REPL_PAGES_CODED, &b, "run past the payload");
	b_u8(&b, 0);
	b_u8(&b, 0);
	reject(REPL_PAGES_CODED, &b, "1 bytes after the last of 2 records");

	b.n = 13;
	reject(REPL_PAGES_CODED, &b, "shorter");
	coded_head(&b, 0, 0);
	reject(REPL_PAGES_CODED, &b, "count 0");
	coded_head(&b, 0, 4097);
	reject(REPL_PAGES_CODED, &b, "count 4097");
	coded_head(&b, 64, 1);
	coded_rec(&b, 1, REPL_KIND_ZERO, 0);
	reject(REPL_PAGES_CODED, &b, "block index 64");
	coded_head(&b, 0, 2);
	coded_rec(&b, 1, REPL_KIND_ZERO, 0);
	reject(REPL_PAGES_CODED, &b, "record 1: 0 bytes left");
	coded_rec(&b, 1, REPL_KIND_ZERO, 0);
	reject(REPL_PAGES_CODED, &b, "page index 1 follows 1");
	coded_head(&b, 0, 1);
	coded_rec(&b, REPL_MAX_PAGE_INDEX + 1, REPL_KIND_ZERO, 0);
	reject(REPL_PAGES_CODED, &b, "out of range");

	/* Each kind's length rule. */
	static const struct { uint8_t kind; uint32_t len; const char *what; } bad[] = {
		{ REPL_KIND_RAW, 4095, "4095 bytes of raw data" },
		{ REPL_KIND_RAW, 0, "0 bytes of raw data" },
		{ REPL_KIND_ZERO, 1, "1 bytes of zero data" },
		{ REPL_KIND_XOR_RLE, REPL_CODED_MAX + 1, "of xor_rle data" },
		{ REPL_KIND_LZ4, 0, "0 bytes of lz4 data" },
		{ REPL_KIND_DISK_REF, 23, "23 bytes of disk_ref data" },
		{ REPL_KIND_DISK_REF, 25, "25 bytes of disk_ref data" },
		{ 5, 0, "unknown kind 5" },
		{ 0xff, 4096, "unknown kind 255" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		coded_head(&b, 0, 1);
		coded_rec(&b, 3, bad[i].kind, bad[i].len);
		reject(REPL_PAGES_CODED, &b, bad[i].what);
	}
	/* A length field larger than what is left, without trusting it. */
	coded_head(&b, 0, 1);
	b_u64(&b, 3);
	b_u8(&b, REPL_KIND_LZ4);
	b_u64(&b, 0);
	b_u32(&b, 0xffffffffu);
	reject(REPL_PAGES_CODED, &b, "4294967295 bytes of lz4 data");
	coded_head(&b, 0, 1);
	coded_rec(&b, 3, REPL_KIND_DISK_REF, REPL_DISK_REF_SIZE);
	accept(REPL_PAGES_CODED, &b);
	b_free(&b);
}

static void test_page_request_and_resend(void)
{
	struct buffer b;
	struct repl_page_request rq = { .epoch = 8, .block = 2, .index = 77,
					.reason = REPL_REQ_DISK_REF }, rq2;
	struct repl_page_resend rs;
	uint8_t page[REPL_PAGE_SIZE];
	const char *err = NULL;
	struct bytes x = { 0 };

	buffer_init(&b);
	memset(page, 0xc3, sizeof(page));
	CU_ASSERT_EQUAL_FATAL(repl_put_page_request(&b, &rq), 0);
	struct repl_frame f = only_frame(&b);
	CU_ASSERT_EQUAL(f.length, 19);
	CU_ASSERT_EQUAL_FATAL(repl_decode_page_request(&f, &rq2, &err), 0);
	CU_ASSERT_EQUAL(rq2.epoch, 8);
	CU_ASSERT_EQUAL(rq2.block, 2);
	CU_ASSERT_EQUAL(rq2.index, 77);
	CU_ASSERT_EQUAL(rq2.reason, REPL_REQ_DISK_REF);
	buffer_clear(&b);
	CU_ASSERT_EQUAL_FATAL(repl_put_page_resend(&b, 8, 2, 77, page), 0);
	f = only_frame(&b);
	CU_ASSERT_FALSE(repl_type_is_covered(f.type));
	CU_ASSERT_EQUAL_FATAL(repl_decode_page_resend(&f, &rs, &err), 0);
	CU_ASSERT_EQUAL(rs.epoch, 8);
	CU_ASSERT_EQUAL(rs.block, 2);
	CU_ASSERT_EQUAL(rs.index, 77);
	CU_ASSERT_EQUAL(memcmp(rs.data, page, sizeof(page)), 0);
	buffer_clear(&b);

	rq.reason = 0;
	CU_ASSERT_EQUAL(repl_put_page_request(&b, &rq), -1);
	rq.reason = 4;
	CU_ASSERT_EQUAL(repl_put_page_request(&b, &rq), -1);
	rq.reason = 1;
	rq.block = 64;
	CU_ASSERT_EQUAL(repl_put_page_request(&b, &rq), -1);
	CU_ASSERT_EQUAL(repl_put_page_resend(&b, 1, 64, 0, page), -1);
	CU_ASSERT_EQUAL(repl_put_page_resend(&b, 1, 0, REPL_MAX_PAGE_INDEX + 1, page), -1);
	CU_ASSERT_EQUAL(buffer_len(&b), 0);

	b_u64(&x, 1);
	b_u16(&x, 0);
	b_u64(&x, 5);
	reject(REPL_PAGE_REQUEST, &x, "payload of 18 bytes, expected 19");
	b_u8(&x, 4);
	reject(REPL_PAGE_REQUEST, &x, "unknown reason 4");
	x.n = 8;
	b_u16(&x, 64);
	b_u64(&x, 5);
	b_u8(&x, 1);
	reject(REPL_PAGE_REQUEST, &x, "block index 64");
	x.n = 0;
	b_u64(&x, 1);
	b_u16(&x, 0);
	b_u64(&x, 5);
	b_mem(&x, page, 4095);
	reject(REPL_PAGE_RESEND, &x, "payload of 4113 bytes, expected 4114");
	b_u8(&x, 0);
	accept(REPL_PAGE_RESEND, &x);
	b_u8(&x, 0);
	reject(REPL_PAGE_RESEND, &x, "expected 4114");
	b_free(&x);
	buffer_free(&b);
}

static void test_reject_device_and_disk(void)
{
	struct bytes b = { 0 };

	b_u64(&b, 1);
	b_u64(&b, 10);
	b_u64(&b, 8);
	b_mem(&b, "ab", 2);
	accept(REPL_DEVICE, &b);
	b_u8(&b, 'c');
	reject(REPL_DEVICE, &b, "beyond the blob's 10 bytes");
	b.n = 23;
	reject(REPL_DEVICE, &b, "shorter");
	b.n = 24;
	reject(REPL_DEVICE, &b, "empty chunk");
	b.n = 0;
	b_u64(&b, 1);
	b_u64(&b, 10);
	b_u64(&b, 11);
	b_u8(&b, 'a');
	reject(REPL_DEVICE, &b, "beyond");
	b.n = 0;
	b_u64(&b, 1);
	b_u64(&b, 10);
	b_u64(&b, UINT64_MAX);
	b_mem(&b, "ab", 2);
	reject(REPL_DEVICE, &b, "beyond");

	b.n = 0;
	b_u64(&b, 1);
	b_u64(&b, 0);
	reject(REPL_DISK_WRITE, &b, "no data");
	b.n = 15;
	reject(REPL_DISK_WRITE, &b, "shorter");
	b.n = 0;
	b_u64(&b, 1);
	b_u64(&b, UINT64_MAX - 1);
	b_mem(&b, "ab", 2);
	reject(REPL_DISK_WRITE, &b, "overflows");
	b.n--;
	accept(REPL_DISK_WRITE, &b);

	b.n = 0;
	b_u64(&b, 1);
	b_u64(&b, 0);
	b_u64(&b, 0);
	reject(REPL_DISK_ZERO, &b, "length 0");
	b.n = 8;
	b_u64(&b, 2);
	b_u64(&b, UINT64_MAX - 1);
	reject(REPL_DISK_ZERO, &b, "overflows");
	b.n = 8;
	b_u64(&b, 0);
	b_u64(&b, 4096);
	accept(REPL_DISK_ZERO, &b);
	b_u8(&b, 0);
	reject(REPL_DISK_ZERO, &b, "25 bytes, expected 24");

	b.n = 0;
	b_u64(&b, 0);
	reject(REPL_DISK_SYNC, &b, "no data");
	b.n = 7;
	reject(REPL_DISK_SYNC, &b, "shorter");
	b.n = 0;
	b_u64(&b, UINT64_MAX);
	b_u8(&b, 1);
	reject(REPL_DISK_SYNC, &b, "overflows");

	b.n = 0;
	b_u32(&b, 1);
	reject(REPL_DISK_SYNC_DONE, &b, "4 bytes, expected 8");
	b_free(&b);
}

static void test_reject_epochs_and_bye(void)
{
	struct bytes b = { 0 };
	uint8_t zeros[48] = { 0 };

	b_mem(&b, zeros, 39);
	reject(REPL_EPOCH_END, &b, "39 bytes, expected 40");
	b_mem(&b, zeros, 2);
	reject(REPL_EPOCH_END, &b, "41 bytes");
	b.n = 7;
	reject(REPL_EPOCH_ACK, &b, "7 bytes, expected 8");
	b.n = 9;
	reject(REPL_EPOCH_ACK, &b, "9 bytes");
	b.n = 15;
	reject(REPL_HEARTBEAT, &b, "15 bytes, expected 16");
	b.n = 16;
	accept(REPL_HEARTBEAT, &b);

	b.n = 0;
	reject(REPL_BYE, &b, "shorter");
	b_u8(&b, 0);
	reject(REPL_BYE, &b, "reason 0");
	b.d[0] = 4;
	reject(REPL_BYE, &b, "reason 4");
	b.d[0] = REPL_BYE_UNPROTECT;
	accept(REPL_BYE, &b);
	b_mem(&b, "\xfe", 1);
	reject(REPL_BYE, &b, "UTF-8");
	b_free(&b);
}

/* ---- encoder rejections --------------------------------------------- */

/* Every refused encoder call: -1, EINVAL, and the buffer as it was. */
#define REFUSED(call)                                                  \
	do {                                                           \
		size_t before_ = buffer_len(&b);                       \
		errno = 0;                                             \
		CU_ASSERT_EQUAL(call, -1);                             \
		CU_ASSERT_EQUAL(errno, EINVAL);                        \
		CU_ASSERT_EQUAL(buffer_len(&b), before_);              \
	} while (0)

static void test_encoders_refuse(void)
{
	struct buffer b;
	struct repl_hello h;
	struct repl_ram_layout *l = calloc(1, sizeof(*l));
	uint8_t mac[32] = { 0 };
	uint64_t idx[3] = { 1, 2, 3 };
	uint8_t *big = calloc(1, REPL_MAX_PAYLOAD);

	CU_ASSERT_PTR_NOT_NULL_FATAL(l);
	CU_ASSERT_PTR_NOT_NULL_FATAL(big);
	buffer_init(&b);
	CU_ASSERT_EQUAL(repl_put_epoch_ack(&b, 1), 0); /* something to keep intact */

	fill_hello(&h, 3, "x");
	REFUSED(repl_put_hello(&b, &h));
	fill_hello(&h, REPL_ROLE_PRIMARY, "");
	REFUSED(repl_put_hello(&b, &h));
	fill_hello(&h, REPL_ROLE_PRIMARY, "a\tb");
	REFUSED(repl_put_hello(&b, &h));
	memset(h.name, 'n', sizeof(h.name)); /* 65 bytes, no NUL */
	REFUSED(repl_put_hello(&b, &h));
	fill_hello(&h, REPL_ROLE_PRIMARY, "x");
	h.version = 0;
	REFUSED(repl_put_hello(&b, &h));
	h.version = REPL_PROTOCOL_MAX + 1; /* a layout we do not know */
	REFUSED(repl_put_hello(&b, &h));
	REFUSED(repl_put_auth(&b, REPL_HELLO, mac));
	REFUSED(repl_put_error(&b, 0, "x"));
	REFUSED(repl_put_error(&b, 7, "x"));
	REFUSED(repl_put_error(&b, REPL_ERR_AUTH, "bad \xff"));
	REFUSED(repl_put_vm_config(&b, "", 0));
	REFUSED(repl_put_vm_config(&b, "\xc3", 1));
	REFUSED(repl_put_vm_config(&b, (const char *)big, REPL_VM_CONFIG_MAX + 1));

	fill_layout(l);
	l->ram_section_id = 0;
	REFUSED(repl_put_ram_layout(&b, l));
	fill_layout(l);
	l->block_count = 0;
	REFUSED(repl_put_ram_layout(&b, l));
	l->block_count = 65;
	REFUSED(repl_put_ram_layout(&b, l));
	fill_layout(l);
	l->blocks[1].length = 4095;
	REFUSED(repl_put_ram_layout(&b, l));
	fill_layout(l);
	strcpy(l->blocks[2].name, l->blocks[0].name);
	REFUSED(repl_put_ram_layout(&b, l));
	fill_layout(l);
	l->machine_type[0] = '\0';
	REFUSED(repl_put_ram_layout(&b, l));

	REFUSED(repl_put_pages(&b, 1, 0, REPL_ENCODING_ZERO, 0, idx, NULL, 0));
	REFUSED(repl_put_pages(&b, 1, 64, REPL_ENCODING_ZERO, 1, idx, NULL, 0));
	REFUSED(repl_put_pages(&b, 1, 0, 2, 1, idx, NULL, 0));
	REFUSED(repl_put_pages(&b, 1, 0, REPL_ENCODING_RAW, 1, idx, big, 4095));
	REFUSED(repl_put_pages(&b, 1, 0, REPL_ENCODING_ZERO, 1, idx, big, 1));
	idx[1] = 1;
	REFUSED(repl_put_pages(&b, 1, 0, REPL_ENCODING_ZERO, 3, idx, NULL, 0));
	idx[1] = 2;
	/* 4096 RAW pages do not fit in 16 MiB with their indexes. */
	uint64_t *many = calloc(REPL_MAX_PAGES_PER_FRAME, sizeof(*many));
	CU_ASSERT_PTR_NOT_NULL_FATAL(many);
	for (uint32_t i = 0; i < REPL_MAX_PAGES_PER_FRAME; i++)
		many[i] = i;
	REFUSED(repl_put_pages(&b, 1, 0, REPL_ENCODING_RAW, 4096, many, big,
			       (size_t)4096 * REPL_PAGE_SIZE));
	CU_ASSERT_EQUAL(repl_put_pages(&b, 1, 0, REPL_ENCODING_ZERO, 4096, many, NULL, 0), 0);
	free(many);
	buffer_clear(&b);

	REFUSED(repl_put_device(&b, 1, 10, 0, big, 0));
	REFUSED(repl_put_device(&b, 1, 10, 8, big, 3));
	REFUSED(repl_put_device(&b, 1, 10, 11, big, 1));
	REFUSED(repl_put_disk_write(&b, 1, 0, big, 0));
	REFUSED(repl_put_disk_write(&b, 1, UINT64_MAX, big, 1));
	REFUSED(repl_put_disk_write(&b, 1, 0, big, REPL_MAX_PAYLOAD - 15));
	CU_ASSERT_EQUAL(repl_put_disk_write(&b, 1, 0, big, REPL_MAX_PAYLOAD - 16), 0);
	buffer_clear(&b);
	REFUSED(repl_put_disk_zero(&b, 1, 0, 0));
	REFUSED(repl_put_disk_zero(&b, 1, 2, UINT64_MAX - 1));
	REFUSED(repl_put_disk_sync(&b, 0, big, 0));
	REFUSED(repl_put_disk_sync(&b, 0, big, REPL_MAX_PAYLOAD - 7));
	REFUSED(repl_put_bye(&b, 0, NULL));
	REFUSED(repl_put_bye(&b, 4, "x"));
	REFUSED(repl_put_bye(&b, 1, "\xe2\x82"));
	buffer_free(&b);
	free(big);
	free(l);
}

/* Long texts are cut at a character boundary, not refused. */
static void test_long_text_is_cut(void)
{
	struct buffer b;
	struct repl_error e;
	struct repl_bye bye;
	const char *err = NULL;
	char text[3 * 400 + 1];

	for (int i = 0; i < 400; i++)
		memcpy(text + 3 * i, "\xe2\x82\xac", 3); /* the euro sign */
	text[sizeof(text) - 1] = '\0';
	buffer_init(&b);
	CU_ASSERT_EQUAL_FATAL(repl_put_error(&b, REPL_ERR_INTERNAL, text), 0);
	struct repl_frame f = only_frame(&b);
	CU_ASSERT_EQUAL_FATAL(repl_decode_error(&f, &e, &err), 0);
	CU_ASSERT_EQUAL(e.reason_len, 1023);
	CU_ASSERT_EQUAL(memcmp(e.reason, text, 1023), 0);
	buffer_clear(&b);
	CU_ASSERT_EQUAL_FATAL(repl_put_bye(&b, REPL_BYE_SHUTDOWN, text), 0);
	f = only_frame(&b);
	CU_ASSERT_EQUAL_FATAL(repl_decode_bye(&f, &bye, &err), 0);
	CU_ASSERT_EQUAL(bye.text_len, 1023);
	buffer_free(&b);
}

/* ---- epoch checksum ------------------------------------------------------ */

/*
 * The primary digests what it encodes (repl_digest_add_buffered), the
 * backup what it parses (repl_digest_add_frame); an independent XXH3 over
 * the covered bytes says what both must get.
 */
static void test_digest_both_sides(void)
{
	struct buffer wire;
	struct repl_digest primary, backup;
	struct bytes covered = { 0 };
	uint64_t covered_frames = 0;

	buffer_init(&wire);
	CU_ASSERT_EQUAL_FATAL(repl_digest_init(&primary), 0);
	CU_ASSERT_EQUAL_FATAL(repl_digest_init(&backup), 0);
	CU_ASSERT_EQUAL(repl_digest_value(&primary), XXH3_64bits(NULL, 0));

	/* The primary side: one frame at a time, as protection.c does. */
	struct buffer one;
	buffer_init(&one);
	put_every_type(&one);
	size_t pos = 0;
	while (pos < buffer_len(&one)) {
		struct repl_frame f;
		const char *err;
		ssize_t n = repl_frame_parse(buffer_head(&one) + pos, buffer_len(&one) - pos,
					     &f, &err);
		CU_ASSERT_FATAL(n > 0);
		size_t before = buffer_len(&wire);
		CU_ASSERT_EQUAL_FATAL(buffer_append(&wire, buffer_head(&one) + pos, (size_t)n), 0);
		CU_ASSERT_EQUAL(repl_digest_add_buffered(&primary, &wire, before), 0);
		if (repl_type_is_covered(f.type)) {
			b_mem(&covered, buffer_head(&one) + pos, (size_t)n);
			covered_frames++;
		}
		pos += (size_t)n;
	}
	buffer_free(&one);
	CU_ASSERT_EQUAL(covered_frames, 8);

	/* The backup side: parse the wire bytes. */
	pos = 0;
	while (pos < buffer_len(&wire)) {
		struct repl_frame f;
		const char *err;
		ssize_t n = repl_frame_parse(buffer_head(&wire) + pos, buffer_len(&wire) - pos,
					     &f, &err);
		CU_ASSERT_FATAL(n > 0);
		CU_ASSERT_EQUAL(repl_digest_add_frame(&backup, &f), repl_type_is_covered(f.type));
		pos += (size_t)n;
	}
	uint64_t expected = XXH3_64bits(covered.d, covered.n);
	CU_ASSERT_EQUAL(repl_digest_value(&primary), expected);
	CU_ASSERT_EQUAL(repl_digest_value(&backup), expected);
	CU_ASSERT_EQUAL(primary.bytes, covered.n);
	CU_ASSERT_EQUAL(backup.bytes, covered.n);
	CU_ASSERT_EQUAL(primary.frames, covered_frames);
	CU_ASSERT_EQUAL(backup.frames, covered_frames);

	/* A byte changed in any covered frame changes the checksum. */
	for (size_t i = 0; i < covered.n; i += 997) {
		covered.d[i] ^= 0x01;
		CU_ASSERT_NOT_EQUAL(XXH3_64bits(covered.d, covered.n), expected);
		covered.d[i] ^= 0x01;
	}
	/* On the wire: flip one payload byte of the last PAGES frame and re-digest. */
	struct repl_digest again;
	CU_ASSERT_EQUAL_FATAL(repl_digest_init(&again), 0);
	uint8_t *w = buffer_head(&wire);
	size_t at = 0, pages_at = 0;
	while (at < buffer_len(&wire)) {
		struct repl_frame f;
		ssize_t n = repl_frame_parse(w + at, buffer_len(&wire) - at, &f, NULL);
		CU_ASSERT_FATAL(n > 0);
		if (f.type == REPL_PAGES)
			pages_at = at;
		at += (size_t)n;
	}
	w[pages_at + REPL_HEADER_SIZE + 20] ^= 0x40;
	CU_ASSERT_EQUAL(repl_digest_add_buffered(&again, &wire, 0), 0);
	CU_ASSERT_NOT_EQUAL(repl_digest_value(&again), expected);
	CU_ASSERT_EQUAL(again.bytes, covered.n);

	/* Reset starts the next epoch. */
	repl_digest_reset(&again);
	CU_ASSERT_EQUAL(repl_digest_value(&again), XXH3_64bits(NULL, 0));
	CU_ASSERT_EQUAL(again.bytes, 0);
	CU_ASSERT_EQUAL(again.frames, 0);

	/* Bytes that are not whole frames add nothing. */
	CU_ASSERT_EQUAL(repl_digest_add_buffered(&again, &wire, buffer_len(&wire) + 1), -1);
	CU_ASSERT_EQUAL(repl_digest_add_buffered(&again, &wire, 3), -1);
	struct buffer partial;
	buffer_init(&partial);
	CU_ASSERT_EQUAL(repl_digest_add_buffered(&again, &partial, 0), 0); /* empty */
	CU_ASSERT_EQUAL(repl_put_disk_sync_done(&partial, 1), 0);
	CU_ASSERT_EQUAL(buffer_append(&partial, "\0\x0b\0\0", 4), 0);
	CU_ASSERT_EQUAL(repl_digest_add_buffered(&again, &partial, 0), -1);
	CU_ASSERT_EQUAL(again.frames, 0);
	CU_ASSERT_EQUAL(repl_digest_value(&again), XXH3_64bits(NULL, 0));
	buffer_free(&partial);

	repl_digest_free(&again);
	repl_digest_free(&again); /* twice is fine */
	repl_digest_free(&primary);
	repl_digest_free(&backup);
	b_free(&covered);
	buffer_free(&wire);
}

/* ---- authentication --------------------------------------------------- */

static void test_hmac_known_answer(void)
{
	/* RFC 4231, test case 2. */
	const uint8_t want[32] = {
		0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e, 0x6a, 0x04, 0x24,
		0x26, 0x08, 0x95, 0x75, 0xc7, 0x5a, 0x00, 0x3f, 0x08, 0x9d, 0x27,
		0x39, 0x83, 0x9d, 0xec, 0x58, 0xb9, 0x64, 0xec, 0x38, 0x43,
	};
	const char *msg = "what do ya want for nothing?";
	uint8_t out[32];

	CU_ASSERT_EQUAL_FATAL(repl_hmac_sha256((const uint8_t *)"Jefe", 4, (const uint8_t *)msg,
					       strlen(msg), out), 0);
	CU_ASSERT_EQUAL(memcmp(out, want, 32), 0);
	CU_ASSERT_TRUE(repl_auth_check(want, out));
}

static void test_auth_mac(void)
{
	const uint8_t *key = (const uint8_t *)"0123456789abcdef0123456789abcdef";
	const uint8_t *other = (const uint8_t *)"0123456789abcdef0123456789abcdeF";
	uint8_t nb[32], np[32], mac[32], expected[32], msg[23 + 64];

	CU_ASSERT_EQUAL_FATAL(repl_nonce_fill(nb), 0);
	CU_ASSERT_EQUAL_FATAL(repl_nonce_fill(np), 0);
	CU_ASSERT_NOT_EQUAL(memcmp(nb, np, 32), 0);

	/* The primary's AUTH, checked by a backup with the same key. */
	CU_ASSERT_EQUAL(repl_auth_mac(key, 32, REPL_AUTH_LABEL_PRIMARY, nb, np, mac), 0);
	CU_ASSERT_EQUAL(repl_auth_mac(key, 32, REPL_AUTH_LABEL_PRIMARY, nb, np, expected), 0);
	CU_ASSERT_TRUE(repl_auth_check(expected, mac));
	/* It is HMAC(key, label || nonce_b || nonce_p). */
	CU_ASSERT_EQUAL_FATAL(strlen(REPL_AUTH_LABEL_PRIMARY), 23);
	memcpy(msg, REPL_AUTH_LABEL_PRIMARY, 23);
	memcpy(msg + 23, nb, 32);
	memcpy(msg + 55, np, 32);
	CU_ASSERT_EQUAL(repl_hmac_sha256(key, 32, msg, sizeof(msg), expected), 0);
	CU_ASSERT_TRUE(repl_auth_check(expected, mac));

	/* A different key, swapped nonces or the other label all fail. */
	CU_ASSERT_EQUAL(repl_auth_mac(other, 32, REPL_AUTH_LABEL_PRIMARY, nb, np, expected), 0);
	CU_ASSERT_FALSE(repl_auth_check(expected, mac));
	CU_ASSERT_EQUAL(repl_auth_mac(key, 31, REPL_AUTH_LABEL_PRIMARY, nb, np, expected), 0);
	CU_ASSERT_FALSE(repl_auth_check(expected, mac));
	CU_ASSERT_EQUAL(repl_auth_mac(key, 32, REPL_AUTH_LABEL_PRIMARY, np, nb, expected), 0);
	CU_ASSERT_FALSE(repl_auth_check(expected, mac));
	CU_ASSERT_EQUAL(repl_auth_mac(key, 32, REPL_AUTH_LABEL_BACKUP, nb, np, expected), 0);
	CU_ASSERT_FALSE(repl_auth_check(expected, mac));
	/* One bit off anywhere is refused. */
	memcpy(expected, mac, 32);
	expected[31] ^= 0x80;
	CU_ASSERT_FALSE(repl_auth_check(expected, mac));
}

/* Writes content to a fresh file in /tmp with the given mode; returns its path. */
static void make_key_file(char *path, const void *content, size_t len, mode_t mode)
{
	strcpy(path, "/tmp/remusdb-psk-XXXXXX");
	int fd = mkstemp(path);
	CU_ASSERT_FATAL(fd >= 0);
	CU_ASSERT_EQUAL_FATAL(write(fd, content, len), (ssize_t)len);
	CU_ASSERT_EQUAL(fchmod(fd, mode), 0);
	close(fd);
}

/* Loads content as a key file; returns the result, with the key and err. */
static int load(const void *content, size_t len, mode_t mode, uint8_t *key, size_t *key_len,
		char *err, size_t errlen)
{
	char path[64];

	make_key_file(path, content, len, mode);
	err[0] = '\0';
	int rc = repl_psk_load(path, key, key_len, err, errlen);
	unlink(path);
	return rc;
}

static void test_psk_load(void)
{
	uint8_t key[REPL_PSK_MAX];
	size_t key_len = 0;
	char err[512];
	char content[REPL_PSK_MAX + 8];

	memset(content, 'k', sizeof(content));
	CU_ASSERT_EQUAL(load("0123456789abcdef0123\n", 21, 0600, key, &key_len, err,
			     sizeof(err)), 0);
	CU_ASSERT_EQUAL(key_len, 20);
	CU_ASSERT_EQUAL(memcmp(key, "0123456789abcdef0123", 20), 0);
	CU_ASSERT_EQUAL(load("0123456789abcdef\r\n", 18, 0400, key, &key_len, err,
			     sizeof(err)), 0);
	CU_ASSERT_EQUAL(key_len, 16);
	/* Only one newline goes; inner ones are part of the key. */
	CU_ASSERT_EQUAL(load("0123456789\nabcdef\n\n", 19, 0600, key, &key_len, err,
			     sizeof(err)), 0);
	CU_ASSERT_EQUAL(key_len, 18);
	CU_ASSERT_EQUAL(key[17], '\n');

	CU_ASSERT_EQUAL(load("0123456789abcde\n", 16, 0600, key, &key_len, err,
			     sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "15 bytes"));
	CU_ASSERT_EQUAL(load("", 0, 0600, key, &key_len, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "at least 16"));
	CU_ASSERT_EQUAL(load(content, REPL_PSK_MAX, 0600, key, &key_len, err, sizeof(err)), 0);
	CU_ASSERT_EQUAL(key_len, REPL_PSK_MAX);
	content[REPL_PSK_MAX] = '\n';
	CU_ASSERT_EQUAL(load(content, REPL_PSK_MAX + 1, 0600, key, &key_len, err,
			     sizeof(err)), 0);
	CU_ASSERT_EQUAL(key_len, REPL_PSK_MAX);
	content[REPL_PSK_MAX] = 'k';
	CU_ASSERT_EQUAL(load(content, REPL_PSK_MAX + 1, 0600, key, &key_len, err,
			     sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "longer than 1024"));
	CU_ASSERT_EQUAL(load(content, sizeof(content), 0600, key, &key_len, err,
			     sizeof(err)), -1);

	/* Readable by others or the group: refused, with the fix in the message. */
	CU_ASSERT_EQUAL(load(content, 32, 0644, key, &key_len, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "chmod 600"));
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "0644"));
	CU_ASSERT_EQUAL(load(content, 32, 0640, key, &key_len, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "chmod 600"));
	CU_ASSERT_EQUAL(load(content, 32, 0601, key, &key_len, err, sizeof(err)), -1);
	CU_ASSERT_EQUAL(load(content, 32, 0610, key, &key_len, err, sizeof(err)), -1);

	CU_ASSERT_EQUAL(repl_psk_load("/nonexistent/remusdb.psk", key, &key_len, err,
				      sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "cannot open /nonexistent/remusdb.psk"));
	char dir[] = "/tmp/remusdb-pskdir-XXXXXX";
	CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
	CU_ASSERT_EQUAL(chmod(dir, 0700), 0);
	CU_ASSERT_EQUAL(repl_psk_load(dir, key, &key_len, err, sizeof(err)), -1);
	CU_ASSERT_PTR_NOT_NULL(strstr(err, "not a regular file"));
	rmdir(dir);
}

int register_repl_proto_tests(void)
{
	CU_pSuite suite = CU_add_suite("repl_proto", NULL, NULL);

	if (!suite ||
	    !CU_add_test(suite, "type names and coverage", test_type_names) ||
	    !CU_add_test(suite, "frame headers", test_parse_headers) ||
	    !CU_add_test(suite, "round trip of every type", test_round_trip_every_type) ||
	    !CU_add_test(suite, "DEVICE_DELTA frame", test_device_delta_frame) ||
	    !CU_add_test(suite, "parse byte by byte", test_parse_byte_by_byte) ||
	    !CU_add_test(suite, "byte layouts", test_byte_layouts) ||
	    !CU_add_test(suite, "decoders check the type", test_decoders_check_the_type) ||
	    !CU_add_test(suite, "DISK_BASE and DISK_PLAN", test_disk_base_and_plan) ||
	    !CU_add_test(suite, "reject DISK_BASE and DISK_PLAN", test_reject_disk_base_and_plan) ||
	    !CU_add_test(suite, "reject HELLO", test_reject_hello) ||
	    !CU_add_test(suite, "reject AUTH, ERROR, VM_CONFIG", test_reject_auth_error_config) ||
	    !CU_add_test(suite, "reject RAM_LAYOUT", test_reject_ram_layout) ||
	    !CU_add_test(suite, "reject PAGES", test_reject_pages) ||
	    !CU_add_test(suite, "reject DEVICE and disk", test_reject_device_and_disk) ||
	    !CU_add_test(suite, "PAGES_CODED round trip", test_pages_coded_round_trip) ||
	    !CU_add_test(suite, "reject PAGES_CODED", test_reject_pages_coded) ||
	    !CU_add_test(suite, "PAGE_REQUEST and PAGE_RESEND", test_page_request_and_resend) ||
	    !CU_add_test(suite, "reject epochs and BYE", test_reject_epochs_and_bye) ||
	    !CU_add_test(suite, "encoders refuse", test_encoders_refuse) ||
	    !CU_add_test(suite, "long text is cut", test_long_text_is_cut) ||
	    !CU_add_test(suite, "digest on both sides", test_digest_both_sides) ||
	    !CU_add_test(suite, "HMAC-SHA256 known answer", test_hmac_known_answer) ||
	    !CU_add_test(suite, "auth MAC", test_auth_mac) ||
	    !CU_add_test(suite, "PSK file", test_psk_load))
		return -1;
	return 0;
}
