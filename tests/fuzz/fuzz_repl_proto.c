/*
 * libFuzzer harness for the replication protocol (repl_proto.h).  The
 * input is replayed as the byte stream a backup receives: frames are cut
 * with repl_frame_parse until it needs more bytes or rejects a header,
 * and every decoder runs on every frame, whatever its type.
 *
 * Beyond the sanitizers' checks it aborts when:
 *   - a rejection comes without an error message;
 *   - a frame a decoder accepts does not encode back to the same bytes
 *     (the encoders apply the decoders' rules, so this also catches a
 *     decoder that lets through what the protocol forbids);
 *   - a VM_CONFIG the validating decoder (vm_config.h) accepts does not
 *     survive its encoder and decoder again, or a refusal says nothing;
 *   - a PAGES_CODED record the iterator yields lies outside the payload
 *     or breaks its kind's length rule;
 *   - the two ways of computing the epoch checksum (primary: over encoded
 *     bytes, backup: over parsed frames) disagree;
 *   - a HELLO of a version we speak does not encode back, or one above it
 *     is read beyond its version;
 *   - the version range an ERROR's reason gives does not survive the
 *     backup's own refusal text, or the selection leaves either range.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/buffer.h"
#include "wire/cp_flow_msg.h"
#include "wire/repl_proto.h"
#include "wire/repl_version.h"
#include "vm/vm_config.h"

static void check(int condition)
{
	if (!condition)
		abort();
}

/*
 * The backup's second check of VM_CONFIG (vm_config.h): a refusal says
 * why, and what it accepts encodes and decodes back to the same config.
 */
static void check_vm_config(const char *json, size_t len)
{
	struct vm_config c, again;
	char err[256] = "", err2[256];

	if (vm_config_decode(json, len, &c, err, sizeof(err)) < 0) {
		check(err[0] != '\0');
		vm_config_clear(&c);
		return;
	}
	char *text = vm_config_encode(&c, err2, sizeof(err2));
	check(text != NULL);
	check(vm_config_decode(text, strlen(text), &again, err2, sizeof(err2)) == 0);
	check(again.qemu_argc == c.qemu_argc && again.disk_size == c.disk_size &&
	      again.generation == c.generation && !strcmp(again.vm, c.vm) &&
	      !strcmp(again.run_dir, c.run_dir) && !strcmp(again.mac, c.mac));
	for (size_t i = 0; i < c.qemu_argc; i++)
		check(!strcmp(again.qemu_argv[i], c.qemu_argv[i]));
	free(text);
	vm_config_clear(&c);
	vm_config_clear(&again);
}

/*
 * A refusal's range (repl_version.h), read from the reason's first len
 * bytes only: a range it finds is one, writes back to the same start and
 * reads back the same; the selection stays within both ranges.
 */
static void check_version_refusal(const struct repl_error *e)
{
	for (uint16_t hello = 1; hello <= 2; hello++) {
		struct repl_version_range r =
			repl_version_from_refusal(e->reason, e->reason_len, hello);
		if (!repl_version_known(r)) {
			check(r.lo == 0 && r.hi == 0);
			continue;
		}
		char again[256];
		int n = repl_version_refusal_reason(again, sizeof(again), r, 1);
		check(n > 0 && (size_t)n < sizeof(again));
		struct repl_version_range back = repl_version_from_refusal(again, (size_t)n, 2);
		check(back.lo == r.lo && back.hi == r.hi);
		uint16_t common = repl_version_common(repl_version_ours(), r);
		check(common == 0 || (repl_version_in(r, common) &&
				      repl_version_in(repl_version_ours(), common)));
		uint16_t offer = repl_version_offer(repl_version_ours(), r);
		check(repl_version_in(repl_version_ours(), offer));
	}
}

/* The frame as it was on the wire: header and payload. */
static void expect_same_frame(const struct buffer *b, const uint8_t *wire, size_t len)
{
	check(buffer_len(b) == len);
	check(memcmp(buffer_head(b), wire, len) == 0);
}

static void check_rejection(int rc, const char *err)
{
	check(rc == 0 || rc == -1);
	if (rc < 0)
		check(err != NULL && err[0] != '\0');
}

static void reencode_pages(struct buffer *b, const struct repl_pages *p)
{
	uint64_t *indexes = malloc(p->count * sizeof(*indexes));
	uint8_t page[REPL_PAGE_SIZE];

	check(indexes != NULL);
	for (uint32_t i = 0; i < p->count; i++) {
		indexes[i] = repl_pages_index(p, i);
		check(i == 0 || indexes[i] > indexes[i - 1]);
		check(repl_pages_decode_page(p, i, page) == 0);
	}
	check(repl_pages_decode_page(p, p->count, page) == -1);
	check(repl_put_pages(b, p->epoch, p->block, p->encoding, p->count, indexes, p->data,
			     p->data_len) == 0);
	free(indexes);
}

/* Runs every decoder on f; re-encodes what the decoder of f's own type accepts. */
static void decode_everything(const struct repl_frame *f, const uint8_t *wire, size_t len)
{
	static struct repl_ram_layout layout; /* 17 KB: keep it off the stack */
	struct buffer b;
	const char *err;
	int rc;

	buffer_init(&b);

	struct repl_hello h;
	err = NULL;
	rc = repl_decode_hello(f, &h, &err);
	check_rejection(rc, err);
	if (rc == 0) {
		check(f->type == REPL_HELLO && h.version >= 1);
		/* Every version we speak is read whole; a later one only so far. */
		if (h.version <= REPL_PROTOCOL_MAX) {
			check(repl_put_hello(&b, &h) == 0);
			expect_same_frame(&b, wire, len);
		} else {
			check(h.role == 0 && h.name[0] == '\0');
		}
	}
	buffer_clear(&b);

	const uint8_t *mac;
	err = NULL;
	rc = repl_decode_auth(f, &mac, &err);
	check_rejection(rc, err);
	if (rc == 0) {
		check(repl_put_auth(&b, f->type, mac) == 0);
		expect_same_frame(&b, wire, len);
	}
	buffer_clear(&b);

	struct repl_error e;
	err = NULL;
	rc = repl_decode_error(f, &e, &err);
	check_rejection(rc, err);
	if (rc == 0) {
		char *reason = strndup(e.reason, e.reason_len);
		check(reason != NULL && strlen(reason) == e.reason_len);
		check(repl_put_error(&b, e.code, reason) == 0);
		expect_same_frame(&b, wire, len);
		free(reason);
		check_version_refusal(&e);
	}
	buffer_clear(&b);

	const char *json;
	size_t json_len;
	err = NULL;
	rc = repl_decode_vm_config(f, &json, &json_len, &err);
	check_rejection(rc, err);
	if (rc == 0) {
		check(repl_put_vm_config(&b, json, json_len) == 0);
		expect_same_frame(&b, wire, len);
		check_vm_config(json, json_len);
	}
	buffer_clear(&b);

	err = NULL;
	rc = repl_decode_ram_layout(f, &layout, &err);
	check_rejection(rc, err);
	if (rc == 0) {
		check(repl_put_ram_layout(&b, &layout) == 0);
		expect_same_frame(&b, wire, len);
	}
	buffer_clear(&b);

	struct repl_pages pages;
	err = NULL;
	rc = repl_decode_pages(f, &pages, &err);
	check_rejection(rc, err);
	if (rc == 0) {
		reencode_pages(&b, &pages);
		expect_same_frame(&b, wire, len);
	}
	buffer_clear(&b);

	struct repl_device d;
	err = NULL;
	rc = repl_decode_device(f, &d, &err);
	check_rejection(rc, err);
	if (rc == 0) {
		check(repl_put_device(&b, d.epoch, d.total, d.offset, d.data, d.len) == 0);
		expect_same_frame(&b, wire, len);
	}
	buffer_clear(&b);

	struct repl_disk_write w;
	err = NULL;
	rc = repl_decode_disk_write(f, &w, &err);
	check_rejection(rc, err);
	if (rc == 0) {
		check(repl_put_disk_write(&b, w.epoch, w.offset, w.data, w.len) == 0);
		expect_same_frame(&b, wire, len);
	}
	buffer_clear(&b);

	struct repl_disk_zero z;
	err = NULL;
	rc = repl_decode_disk_zero(f, &z, &err);
	check_rejection(rc, err);
	if (rc == 0) {
		check(repl_put_disk_zero(&b, z.epoch, z.offset, z.length) == 0);
		expect_same_frame(&b, wire, len);
	}
	buffer_clear(&b);

	struct repl_disk_sync s;
	err = NULL;
	rc = repl_decode_disk_sync(f, &s, &err);
	check_rejection(rc, err);
	if (rc == 0) {
		check(repl_put_disk_sync(&b, s.offset, s.data, s.len) == 0);
		expect_same_frame(&b, wire, len);
	}
	buffer_clear(&b);

	uint64_t v;
	err = NULL;
	rc = repl_decode_disk_sync_done(f, &v, &err);
	check_rejection(rc, err);
	if (rc == 0) {
		check(repl_put_disk_sync_done(&b, v) == 0);
		expect_same_frame(&b, wire, len);
	}
	buffer_clear(&b);

	struct repl_epoch_end ee;
	err = NULL;
	rc = repl_decode_epoch_end(f, &ee, &err);
	check_rejection(rc, err);
	if (rc == 0) {
		check(repl_put_epoch_end(&b, &ee) == 0);
		expect_same_frame(&b, wire, len);
	}
	buffer_clear(&b);

	err = NULL;
	rc = repl_decode_epoch_ack(f, &v, &err);
	check_rejection(rc, err);
	if (rc == 0) {
		check(repl_put_epoch_ack(&b, v) == 0);
		expect_same_frame(&b, wire, len);
	}
	buffer_clear(&b);

	struct repl_heartbeat hb;
	err = NULL;
	rc = repl_decode_heartbeat(f, &hb, &err);
	check_rejection(rc, err);
	if (rc == 0) {
		check(repl_put_heartbeat(&b, hb.now_us, hb.epoch) == 0);
		expect_same_frame(&b, wire, len);
	}
	buffer_clear(&b);

	/*
	 * PAGES_CODED: the iterator must yield exactly count records within
	 * the payload, each obeying its kind's length rule, and the builder
	 * must rebuild the same bytes from them.
	 */
	struct repl_pages_coded pc;
	err = NULL;
	rc = repl_decode_pages_coded(f, &pc, &err);
	check_rejection(rc, err);
	if (rc == 0) {
		struct repl_coded_builder cb;
		struct repl_coded_iter it;
		struct repl_coded_page cp;
		uint32_t n = 0;

		check(repl_coded_begin(&cb, &b, pc.epoch, pc.block) == 0);
		repl_coded_iter_init(&it, &pc);
		while (repl_coded_iter_next(&it, &cp)) {
			check(cp.data >= pc.records &&
			      cp.data + cp.len <= pc.records + pc.records_len);
			check(repl_coded_kind_length_ok(cp.kind, cp.len));
			size_t before = buffer_len(&b);
			check(repl_put_coded_page(&b, cp.index, cp.kind, cp.checksum, cp.data,
						  cp.len) == 0);
			check(repl_coded_note(&cb, before) == 0);
			n++;
		}
		check(n == pc.count);
		repl_coded_end(&cb);
		expect_same_frame(&b, wire, len);
	}
	buffer_clear(&b);

	struct repl_page_request rq;
	err = NULL;
	rc = repl_decode_page_request(f, &rq, &err);
	check_rejection(rc, err);
	if (rc == 0) {
		check(repl_put_page_request(&b, &rq) == 0);
		expect_same_frame(&b, wire, len);
	}
	buffer_clear(&b);

	struct repl_page_resend rs;
	err = NULL;
	rc = repl_decode_page_resend(f, &rs, &err);
	check_rejection(rc, err);
	if (rc == 0) {
		check(repl_put_page_resend(&b, rs.epoch, rs.block, rs.index, rs.data) == 0);
		expect_same_frame(&b, wire, len);
	}
	buffer_clear(&b);

	struct repl_device_delta dd;
	err = NULL;
	rc = repl_decode_device_delta(f, &dd, &err);
	check_rejection(rc, err);
	if (rc == 0) {
		check(repl_put_device_delta(&b, &dd) == 0);
		expect_same_frame(&b, wire, len);
	}
	buffer_clear(&b);

	/* FLOW_STATE and FLOW_AHEAD: decode, re-encode, the same bytes. */
	struct cp_flow_msg_state fs;
	err = NULL;
	rc = cp_flow_msg_decode_state(f, &fs, &err);
	check_rejection(rc, err);
	if (rc == 0) {
		struct cp_flow_msg_record *recs = calloc(fs.count, sizeof(*recs));
		check(recs != NULL);
		for (uint32_t i = 0; i < fs.count; i++)
			cp_flow_msg_state_record(&fs, i, &recs[i]);
		check(cp_flow_msg_put_state(&b, fs.epoch, recs, fs.count) == 0);
		expect_same_frame(&b, wire, len);
		free(recs);
	}
	buffer_clear(&b);

	struct cp_flow_msg_ahead fa;
	err = NULL;
	rc = cp_flow_msg_decode_ahead(f, &fa, &err);
	check_rejection(rc, err);
	if (rc == 0) {
		check(cp_flow_msg_put_ahead(&b, &fa) == 0);
		expect_same_frame(&b, wire, len);
	}
	buffer_clear(&b);

	/* DISK_BASE and DISK_PLAN: decode, re-encode, the same bytes. */
	struct repl_disk_base dbase;
	err = NULL;
	rc = repl_decode_disk_base(f, &dbase, &err);
	check_rejection(rc, err);
	if (rc == 0) {
		check(repl_put_disk_base(&b, &dbase) == 0);
		expect_same_frame(&b, wire, len);
	}
	buffer_clear(&b);

	struct repl_disk_plan dplan;
	err = NULL;
	rc = repl_decode_disk_plan(f, &dplan, &err);
	check_rejection(rc, err);
	if (rc == 0) {
		char *reason = strndup(dplan.reason, dplan.reason_len);
		check(reason != NULL && strlen(reason) == dplan.reason_len);
		dplan.reason = reason;
		check(repl_put_disk_plan(&b, &dplan) == 0);
		expect_same_frame(&b, wire, len);
		free(reason);
	}
	buffer_clear(&b);

	struct repl_bye bye;
	err = NULL;
	rc = repl_decode_bye(f, &bye, &err);
	check_rejection(rc, err);
	if (rc == 0) {
		char *text = strndup(bye.text, bye.text_len);
		check(text != NULL && strlen(text) == bye.text_len);
		check(repl_put_bye(&b, bye.reason, text) == 0);
		expect_same_frame(&b, wire, len);
		free(text);
	}
	buffer_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct repl_digest sender, receiver;
	struct buffer frames;
	size_t pos = 0;

	if (repl_digest_init(&sender) < 0 || repl_digest_init(&receiver) < 0)
		abort();
	buffer_init(&frames);
	while (pos < size) {
		struct repl_frame f;
		const char *err = NULL;
		ssize_t n = repl_frame_parse(data + pos, size - pos, &f, &err);

		if (n < 0)
			check(err != NULL && err[0] != '\0');
		if (n <= 0)
			break;
		check((size_t)n == REPL_HEADER_SIZE + (size_t)f.length);
		check(f.length <= REPL_MAX_PAYLOAD && f.flags == 0);
		check(strcmp(repl_type_name(f.type), "UNKNOWN") != 0);
		decode_everything(&f, data + pos, (size_t)n);
		repl_digest_add_frame(&receiver, &f);
		check(buffer_append(&frames, data + pos, (size_t)n) == 0);
		pos += (size_t)n;
	}
	/* The sender's way: straight over the bytes of the whole frames. */
	check(repl_digest_add_buffered(&sender, &frames, 0) == 0);
	check(repl_digest_value(&sender) == repl_digest_value(&receiver));
	check(sender.bytes == receiver.bytes && sender.frames == receiver.frames);
	buffer_free(&frames);
	repl_digest_free(&sender);
	repl_digest_free(&receiver);
	return 0;
}
