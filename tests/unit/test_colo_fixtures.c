/*
 * The COLO stream parser against real recordings from our patched QEMU 7.2
 * (tests/fixtures/colo/, see its README.md).  Each .stream is parsed whole,
 * in 1-byte chunks, in 4093-byte chunks and in pieces that end exactly at
 * the consistent points, and everything the parser reports is checked
 * against the layout in the matching .json, which tools/dev/colo-record
 * (an independent Python parser) wrote: machine type, RAM blocks, page and
 * zero-page counts per block for the bulk stream and per checkpoint, the
 * records of each checkpoint, section headers, COLO messages, the offsets
 * at which each of them is reported, and the device blobs byte for byte.
 * Each recording ends with one unanswered CHECKPOINT_REQUEST, which must
 * leave the parser inside an incomplete checkpoint.
 */
#include <CUnit/CUnit.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef FIXTURE_TIMING
#include <time.h>
#endif

#include "qemu/colo_stream.h"
#include "qemu/migration_writer.h"
#include "suites.h"

#ifndef FIXTURE_DIR
#define FIXTURE_DIR "../../tests/fixtures" /* from dom0-daemon/build */
#endif

#define FX_MAX_CKPT 8      /* checkpoints a fixture may hold */
#define FX_MAX_RECORDS 64  /* records kept per checkpoint */
#define FX_MAX_SECTIONS 32 /* ram section headers kept */
#define FX_MAX_MSGS 64     /* COLO messages kept */

struct fx_count {
	uint64_t pages, zeros;
};

struct fx_record {
	unsigned block;
	uint64_t addr;
	bool zero;
};

struct fx_event {
	uint32_t a;   /* section type, message */
	uint64_t b;   /* section id, message value */
	bool ckpt;    /* section inside a checkpoint */
	uint64_t off; /* colo_stream_offset() during the callback */
};

/* What the callbacks saw, checked against the JSON afterwards. */
struct fx {
	const uint8_t *file; /* the whole recording */
	size_t file_len;
	struct colo_stream *s;

	char machine[256];
	unsigned config_calls;
	uint64_t config_off;
	unsigned command_calls;
	uint16_t command;
	uint16_t command_len;
	uint64_t command_off;

	struct colo_ram_block blocks[COLO_STREAM_MAX_BLOCKS];
	size_t nblocks;
	unsigned cur; /* 0: bulk stream; k: inside checkpoint k */
	struct fx_count counts[FX_MAX_CKPT + 1][COLO_STREAM_MAX_BLOCKS];
	struct fx_record records[FX_MAX_CKPT + 1][FX_MAX_RECORDS];
	size_t nrecords[FX_MAX_CKPT + 1];
	unsigned bad_page_data, bad_fill, bad_page_offset;

	struct fx_event sections[FX_MAX_SECTIONS];
	size_t nsections;
	struct fx_event msgs[FX_MAX_MSGS];
	size_t nmsgs;

	uint64_t devblob_start; /* from the JSON */
	uint64_t devblob_got;
	unsigned devblob_bad, devblob_complete_calls;
	uint64_t devblob_total;
	uint64_t vmdesc_start; /* from the JSON */
	size_t vmdesc_len;
	unsigned vmdesc_calls, vmdesc_bad;
	unsigned bulk_calls;
	uint64_t bulk_off;
	bool bulk_boundary; /* IDLE during on_bulk_complete */

	uint64_t ckblob_start[FX_MAX_CKPT + 1]; /* from the JSON */
	uint64_t ckblob_got;
	unsigned ckblob_bad;
	unsigned ckpt_calls;
	uint64_t ckpt_seq[FX_MAX_CKPT + 1], ckpt_len[FX_MAX_CKPT + 1];
	uint64_t ckpt_off[FX_MAX_CKPT + 1];
	bool ckpt_boundary[FX_MAX_CKPT + 1];
};

/* ---- loading ----------------------------------------------------------- */

static uint8_t *load_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *data = NULL;
	long n;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0 &&
	    fseek(f, 0, SEEK_SET) == 0 && (data = malloc((size_t)n)) &&
	    fread(data, 1, (size_t)n, f) == (size_t)n) {
		*len = (size_t)n;
	} else {
		free(data);
		data = NULL;
	}
	fclose(f);
	return data;
}

struct fixture {
	uint8_t *data;
	size_t len;
	json_t *layout;
};

static bool fixture_load(struct fixture *fx, const char *name)
{
	char path[4096];
	json_error_t jerr;

	memset(fx, 0, sizeof(*fx));
	snprintf(path, sizeof(path), "%s/colo/%s.stream", FIXTURE_DIR, name);
	fx->data = load_file(path, &fx->len);
	if (!fx->data)
		fprintf(stderr, "cannot read %s\n", path);
	snprintf(path, sizeof(path), "%s/colo/%s.json", FIXTURE_DIR, name);
	fx->layout = json_load_file(path, 0, &jerr);
	if (!fx->layout)
		fprintf(stderr, "cannot load %s: %s\n", path, jerr.text);
	return fx->data && fx->layout;
}

static void fixture_free(struct fixture *fx)
{
	free(fx->data);
	json_decref(fx->layout);
}

/* The JSON's values; a missing or mistyped key fails the test. */
static json_t *jget(const json_t *obj, const char *key)
{
	json_t *v = json_object_get(obj, key);

	if (!v)
		fprintf(stderr, "fixture JSON lacks \"%s\"\n", key);
	CU_ASSERT_PTR_NOT_NULL_FATAL(v);
	return v;
}

static uint64_t jint(const json_t *obj, const char *key)
{
	json_t *v = jget(obj, key);

	CU_ASSERT_FATAL(json_is_integer(v) && json_integer_value(v) >= 0);
	return (uint64_t)json_integer_value(v);
}

/* An optional count: absent means 0 (per_block leaves out zero counts). */
static uint64_t jcount(const json_t *obj, const char *key)
{
	json_t *v = json_object_get(obj, key);

	if (!v)
		return 0;
	CU_ASSERT_FATAL(json_is_integer(v) && json_integer_value(v) >= 0);
	return (uint64_t)json_integer_value(v);
}

static const char *jstr(const json_t *obj, const char *key)
{
	json_t *v = jget(obj, key);

	CU_ASSERT_FATAL(json_is_string(v));
	return json_string_value(v);
}

static json_t *jarray(const json_t *obj, const char *key)
{
	json_t *v = jget(obj, key);

	CU_ASSERT_FATAL(json_is_array(v));
	return v;
}

/* ---- callbacks --------------------------------------------------------- */

static uint64_t now_off(const struct fx *r)
{
	return colo_stream_offset(r->s);
}

static int on_configuration(void *o, const char *machine)
{
	struct fx *r = o;

	snprintf(r->machine, sizeof(r->machine), "%s", machine);
	r->config_calls++;
	r->config_off = now_off(r);
	return 0;
}

static int on_command(void *o, uint16_t cmd, const uint8_t *data, uint16_t len)
{
	struct fx *r = o;

	r->command_calls++;
	r->command = cmd;
	r->command_len = len;
	r->command_off = now_off(r);
	return 0;
}

static int on_section(void *o, const struct colo_section *sec)
{
	struct fx *r = o;

	if (r->nsections < FX_MAX_SECTIONS)
		r->sections[r->nsections] = (struct fx_event){
			.a = sec->type,
			.b = sec->id,
			.ckpt = sec->checkpoint,
			.off = now_off(r),
		};
	r->nsections++;
	CU_ASSERT_STRING_EQUAL(sec->idstr, "ram");
	return 0;
}

static int on_ram_block(void *o, const struct colo_ram_block *b)
{
	struct fx *r = o;

	if (r->nblocks < COLO_STREAM_MAX_BLOCKS)
		r->blocks[r->nblocks++] = *b;
	return 0;
}

static void ram_record(struct fx *r, const struct colo_ram_block *b,
		       uint64_t addr, bool zero)
{
	if (b->index >= COLO_STREAM_MAX_BLOCKS || r->cur > FX_MAX_CKPT) {
		CU_FAIL("block index or checkpoint out of range");
		return;
	}
	if (addr % MIG_PAGE_SIZE || addr >= b->length)
		r->bad_page_offset++;
	if (zero)
		r->counts[r->cur][b->index].zeros++;
	else
		r->counts[r->cur][b->index].pages++;
	if (r->nrecords[r->cur] < FX_MAX_RECORDS)
		r->records[r->cur][r->nrecords[r->cur]] =
			(struct fx_record){ b->index, addr, zero };
	r->nrecords[r->cur]++;
}

/* The record ends where the parser is: its payload precedes that offset. */
static int on_page(void *o, const struct colo_ram_block *b, uint64_t off,
		   const uint8_t *data)
{
	struct fx *r = o;
	uint64_t end = now_off(r);

	ram_record(r, b, off, false);
	if (end < MIG_PAGE_SIZE || end > r->file_len ||
	    memcmp(data, r->file + end - MIG_PAGE_SIZE, MIG_PAGE_SIZE) != 0)
		r->bad_page_data++;
	return 0;
}

static int on_zero_page(void *o, const struct colo_ram_block *b, uint64_t off,
			uint8_t fill)
{
	struct fx *r = o;
	uint64_t end = now_off(r);

	ram_record(r, b, off, true);
	/* colo-record saw no nonzero fill in these recordings. */
	if (fill != 0 || end < 1 || end > r->file_len || r->file[end - 1] != fill)
		r->bad_fill++;
	return 0;
}

static int on_device_blob_chunk(void *o, const uint8_t *data, size_t len)
{
	struct fx *r = o;

	CU_ASSERT(len > 0);
	if (r->devblob_start + r->devblob_got + len > r->file_len ||
	    memcmp(data, r->file + r->devblob_start + r->devblob_got, len) != 0)
		r->devblob_bad++;
	r->devblob_got += len;
	return 0;
}

static int on_device_blob_complete(void *o, uint64_t total)
{
	struct fx *r = o;

	r->devblob_complete_calls++;
	r->devblob_total = total;
	return 0;
}

static int on_vmdescription(void *o, const char *json, size_t len)
{
	struct fx *r = o;

	r->vmdesc_calls++;
	r->vmdesc_len = len;
	if (r->vmdesc_start + len > r->file_len ||
	    memcmp(json, r->file + r->vmdesc_start, len) != 0)
		r->vmdesc_bad++;
	return 0;
}

static int on_bulk_complete(void *o)
{
	struct fx *r = o;

	r->bulk_calls++;
	r->bulk_off = now_off(r);
	r->bulk_boundary = colo_stream_at_boundary(r->s) &&
			   colo_stream_phase(r->s) == COLO_PHASE_IDLE;
	return 0;
}

static int on_colo_message(void *o, enum colo_message msg, uint64_t value)
{
	struct fx *r = o;

	if (msg == COLO_MSG_CHECKPOINT_REQUEST) {
		r->cur = (unsigned)colo_stream_checkpoints(r->s) + 1;
		r->ckblob_got = 0;
	}
	if (r->nmsgs < FX_MAX_MSGS)
		r->msgs[r->nmsgs] = (struct fx_event){
			.a = msg, .b = value, .off = now_off(r) };
	r->nmsgs++;
	return 0;
}

static int on_checkpoint_device_blob(void *o, const uint8_t *data, size_t len)
{
	struct fx *r = o;
	uint64_t at = r->cur <= FX_MAX_CKPT ? r->ckblob_start[r->cur] : 0;

	CU_ASSERT(len > 0);
	if (at == 0 || at + r->ckblob_got + len > r->file_len ||
	    memcmp(data, r->file + at + r->ckblob_got, len) != 0 ||
	    /* passed through as it arrives: consumed up to its end */
	    now_off(r) != at + r->ckblob_got + len)
		r->ckblob_bad++;
	r->ckblob_got += len;
	return 0;
}

static int on_checkpoint_complete(void *o, uint64_t seq, uint64_t len)
{
	struct fx *r = o;
	unsigned k = r->ckpt_calls++;

	if (k <= FX_MAX_CKPT) {
		r->ckpt_seq[k] = seq;
		r->ckpt_len[k] = len;
		r->ckpt_off[k] = now_off(r);
		r->ckpt_boundary[k] = colo_stream_at_boundary(r->s);
	}
	CU_ASSERT_EQUAL(len, r->ckblob_got);
	return 0;
}

static const struct colo_stream_callbacks fx_callbacks = {
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

/* ---- checks ------------------------------------------------------------ */

static int block_index(const struct fx *r, const char *name)
{
	for (size_t i = 0; i < r->nblocks; i++)
		if (strcmp(r->blocks[i].name, name) == 0)
			return (int)i;
	return -1;
}

static uint8_t section_type(const char *name)
{
	return strcmp(name, "START") == 0 ? MIG_SECTION_START :
	       strcmp(name, "PART") == 0  ? MIG_SECTION_PART :
	       strcmp(name, "END") == 0   ? MIG_SECTION_END :
					    0xff;
}

/*
 * per_block {name: {pages, zero_pages}} against counts[phase]; every block
 * the JSON names must be one the parser knows, and the totals must match.
 */
static void check_counts(const struct fx *r, unsigned phase,
			 const json_t *layout_part)
{
	const json_t *per = jget(layout_part, "per_block");
	const char *name;
	json_t *v;
	uint64_t pages = 0, zeros = 0;

	json_object_foreach((json_t *)per, name, v)
		CU_ASSERT(block_index(r, name) >= 0);
	for (size_t i = 0; i < r->nblocks; i++) {
		json_t *b = json_object_get(per, r->blocks[i].name);

		CU_ASSERT_EQUAL(r->counts[phase][i].pages, jcount(b, "pages"));
		CU_ASSERT_EQUAL(r->counts[phase][i].zeros, jcount(b, "zero_pages"));
		if (r->counts[phase][i].pages != jcount(b, "pages") ||
		    r->counts[phase][i].zeros != jcount(b, "zero_pages"))
			fprintf(stderr, "\n  phase %u block %s: %llu pages, %llu "
				"zero (json %llu, %llu)", phase, r->blocks[i].name,
				(unsigned long long)r->counts[phase][i].pages,
				(unsigned long long)r->counts[phase][i].zeros,
				(unsigned long long)jcount(b, "pages"),
				(unsigned long long)jcount(b, "zero_pages"));
		pages += r->counts[phase][i].pages;
		zeros += r->counts[phase][i].zeros;
	}
	CU_ASSERT_EQUAL(pages, jint(layout_part, "pages"));
	CU_ASSERT_EQUAL(zeros, jint(layout_part, "zero_pages"));
}

/* Checks one ram section header against a JSON ram_section_list entry. */
static void check_section(const struct fx *r, size_t k, const json_t *js,
			  bool ckpt, const json_t *ram_section)
{
	CU_ASSERT_FATAL(k < r->nsections && k < FX_MAX_SECTIONS);
	const struct fx_event *e = &r->sections[k];
	uint8_t type = section_type(jstr(js, "type"));
	/* type byte, be32 id; START adds u8 len, "ram", instance, version */
	uint64_t hdr = type == MIG_SECTION_START ? 1 + 4 + 1 + 3 + 4 + 4 : 1 + 4;

	CU_ASSERT_EQUAL(e->a, type);
	CU_ASSERT_EQUAL(e->b, jint(js, "id"));
	CU_ASSERT_EQUAL(e->b, jint(ram_section, "id"));
	CU_ASSERT_EQUAL(e->ckpt, ckpt);
	CU_ASSERT_EQUAL(e->off, jint(js, "offset") + hdr);
}

static void check_msg(const struct fx *r, size_t k, uint32_t msg,
		      uint64_t value, uint64_t off)
{
	CU_ASSERT_FATAL(k < r->nmsgs && k < FX_MAX_MSGS);
	CU_ASSERT_EQUAL(r->msgs[k].a, msg);
	CU_ASSERT_EQUAL(r->msgs[k].b, value);
	CU_ASSERT_EQUAL(r->msgs[k].off, off);
}

/* The parse of the whole recording, against the layout. */
static void check_parse(const struct fixture *f, const struct fx *r,
			struct colo_stream *s)
{
	const json_t *L = f->layout;
	const json_t *bulk = jget(L, "bulk");
	const json_t *ckpts = jarray(L, "checkpoints");
	size_t nckpt = json_array_size(ckpts);
	uint64_t completed_end = jint(L, "completed_end_offset");

	CU_ASSERT_EQUAL_FATAL(jint(L, "stream_bytes"), f->len);
	CU_ASSERT_EQUAL(jint(L, "trailing_bytes"), f->len - completed_end);
	CU_ASSERT_STRING_EQUAL(jstr(L, "trailing_head_hex"), "00000001");

	/* Configuration and the ENABLE_COLO command. */
	CU_ASSERT_EQUAL(r->config_calls, 1);
	CU_ASSERT_STRING_EQUAL(r->machine, jstr(L, "machine_type"));
	const json_t *conf = jget(bulk, "configuration");
	CU_ASSERT_STRING_EQUAL(r->machine, jstr(conf, "machine_type"));
	CU_ASSERT_EQUAL(r->config_off,
			jint(conf, "offset") + 1 + 4 + strlen(r->machine));
	const json_t *cmds = jarray(bulk, "commands");
	CU_ASSERT_EQUAL_FATAL(json_array_size(cmds), 1);
	CU_ASSERT_EQUAL(r->command_calls, 1);
	CU_ASSERT_EQUAL(r->command, jint(json_array_get(cmds, 0), "cmd"));
	CU_ASSERT_EQUAL(r->command, MIG_CMD_ENABLE_COLO);
	CU_ASSERT_EQUAL(r->command_len, jint(json_array_get(cmds, 0), "len"));
	CU_ASSERT_EQUAL(r->command_off, jint(json_array_get(cmds, 0), "end"));

	/* RAM blocks: callbacks and colo_stream_blocks() both. */
	const json_t *jblocks = jarray(bulk, "ram_blocks");
	size_t nb;
	const struct colo_ram_block *blocks = colo_stream_blocks(s, &nb);
	CU_ASSERT_EQUAL_FATAL(nb, json_array_size(jblocks));
	CU_ASSERT_EQUAL_FATAL(r->nblocks, nb);
	for (size_t i = 0; i < nb; i++) {
		const json_t *jb = json_array_get(jblocks, i);

		CU_ASSERT_STRING_EQUAL(blocks[i].name, jstr(jb, "name"));
		CU_ASSERT_EQUAL(blocks[i].length, jint(jb, "size"));
		CU_ASSERT_EQUAL(blocks[i].index, i);
		CU_ASSERT_STRING_EQUAL(r->blocks[i].name, jstr(jb, "name"));
		CU_ASSERT_EQUAL(r->blocks[i].length, jint(jb, "size"));
	}

	/* Pages: counts per block, payloads and offsets. */
	CU_ASSERT_EQUAL(r->bad_page_data, 0);
	CU_ASSERT_EQUAL(r->bad_fill, 0);
	CU_ASSERT_EQUAL(r->bad_page_offset, 0);
	check_counts(r, 0, bulk);

	/* ram sections: START, PART..., END in bulk, one END per checkpoint. */
	const json_t *ram_section = jget(bulk, "ram_section");
	const json_t *bulk_sections = jarray(bulk, "ram_section_list");
	size_t nbs = json_array_size(bulk_sections), k = 0;
	uint32_t ram_id = 0;
	CU_ASSERT_TRUE(colo_stream_ram_section_id(s, &ram_id));
	CU_ASSERT_EQUAL(ram_id, jint(ram_section, "id"));
	CU_ASSERT_EQUAL(jint(ram_section, "version"), MIG_RAM_SECTION_VERSION);
	CU_ASSERT_EQUAL(jint(bulk, "ram_sections"), nbs);
	for (size_t i = 0; i < nbs; i++)
		check_section(r, k++, json_array_get(bulk_sections, i), false,
			      ram_section);
	for (size_t c = 0; c < nckpt; c++) {
		const json_t *cs = jarray(json_array_get(ckpts, c), "ram_sections");

		for (size_t i = 0; i < json_array_size(cs); i++)
			check_section(r, k++, json_array_get(cs, i), true,
				      ram_section);
	}
	CU_ASSERT_EQUAL(r->nsections, k);

	/* The bulk device blob, VMDESCRIPTION and the end of the bulk stream. */
	uint64_t dev_start = jint(bulk, "device_start_offset");
	uint64_t eof_off = jint(bulk, "eof_offset");
	CU_ASSERT_EQUAL(jint(bulk, "device_bytes"), eof_off - dev_start);
	CU_ASSERT_EQUAL(r->devblob_complete_calls, 1);
	CU_ASSERT_EQUAL(r->devblob_total, jint(bulk, "device_bytes") + 1);
	CU_ASSERT_EQUAL(r->devblob_got, r->devblob_total);
	CU_ASSERT_EQUAL(r->devblob_bad, 0);
	CU_ASSERT_EQUAL(f->data[eof_off], MIG_EOF);
	CU_ASSERT_EQUAL(r->vmdesc_calls, 1);
	CU_ASSERT_EQUAL(r->vmdesc_len, jint(bulk, "vmdescription_len"));
	CU_ASSERT_EQUAL(r->vmdesc_bad, 0);
	CU_ASSERT_EQUAL(r->bulk_calls, 1);
	CU_ASSERT_EQUAL(r->bulk_off, jint(bulk, "end_offset"));
	CU_ASSERT_TRUE(r->bulk_boundary);
	CU_ASSERT_EQUAL(jint(bulk, "end_offset"), jint(L, "bulk_bytes"));

	/* Checkpoints. */
	CU_ASSERT_EQUAL_FATAL(nckpt, jint(L, "checkpoints_completed"));
	CU_ASSERT_FATAL(nckpt >= 1 && nckpt <= FX_MAX_CKPT);
	CU_ASSERT_EQUAL(colo_stream_checkpoints(s), nckpt);
	CU_ASSERT_EQUAL_FATAL(r->ckpt_calls, nckpt);
	CU_ASSERT_EQUAL(r->ckblob_bad, 0);
	CU_ASSERT_EQUAL_FATAL(r->nmsgs, 3 * nckpt + 1);
	for (size_t c = 0; c < nckpt; c++) {
		const json_t *jc = json_array_get(ckpts, c);
		uint64_t blob = jint(jc, "blob_size");

		CU_ASSERT_EQUAL(jint(jc, "index"), c + 1);
		check_counts(r, (unsigned)c + 1, jc);
		check_msg(r, 3 * c, COLO_MSG_CHECKPOINT_REQUEST, 0,
			  jint(jc, "request_offset") + 4);
		check_msg(r, 3 * c + 1, COLO_MSG_VMSTATE_SEND, 0,
			  jint(jc, "vmstate_send_offset") + 4);
		check_msg(r, 3 * c + 2, COLO_MSG_VMSTATE_SIZE, blob,
			  jint(jc, "vmstate_size_offset") + 4 + 8);
		CU_ASSERT_EQUAL(jint(jc, "blob_start"),
				jint(jc, "vmstate_size_offset") + 12);
		CU_ASSERT_EQUAL(r->ckpt_seq[c], c + 1);
		CU_ASSERT_EQUAL(r->ckpt_len[c], blob);
		CU_ASSERT_EQUAL(r->ckpt_off[c], jint(jc, "blob_end"));
		CU_ASSERT_TRUE(r->ckpt_boundary[c]);

		/* Each record, in order: block, page address, kind. */
		const json_t *recs = jarray(jc, "ram_records");
		size_t n = json_array_size(recs);
		CU_ASSERT_EQUAL(r->nrecords[c + 1], n);
		for (size_t i = 0; i < n && i < r->nrecords[c + 1] &&
				   i < FX_MAX_RECORDS; i++) {
			const json_t *jr = json_array_get(recs, i);
			const struct fx_record *got = &r->records[c + 1][i];

			CU_ASSERT_EQUAL(got->block,
					(unsigned)block_index(r, jstr(jr, "block")));
			CU_ASSERT_EQUAL(got->addr, jint(jr, "addr"));
			CU_ASSERT_EQUAL(got->zero,
					strcmp(jstr(jr, "kind"), "zero") == 0);
		}
	}
	CU_ASSERT_EQUAL(r->ckpt_off[nckpt - 1], completed_end);

	/* The unanswered CHECKPOINT_REQUEST: an incomplete checkpoint. */
	check_msg(r, 3 * nckpt, COLO_MSG_CHECKPOINT_REQUEST, 0, f->len);
	CU_ASSERT_EQUAL(r->nrecords[nckpt + 1], 0);
	CU_ASSERT_EQUAL(colo_stream_offset(s), f->len);
	CU_ASSERT_PTR_NULL(colo_stream_error(s));
	CU_ASSERT_EQUAL(colo_stream_phase(s), COLO_PHASE_CHECKPOINT);
	CU_ASSERT_FALSE(colo_stream_at_boundary(s));

	const char *err = NULL;
	char want[160];
	snprintf(want, sizeof(want), "truncated: stream ended at offset %zu "
		 "inside checkpoint %zu", f->len, nckpt + 1);
	CU_ASSERT_EQUAL(colo_stream_finish(s, &err), COLO_STREAM_ERROR);
	CU_ASSERT_STRING_EQUAL(err ? err : "", want);
	CU_ASSERT_EQUAL(colo_stream_phase(s), COLO_PHASE_FAILED);
	CU_ASSERT_EQUAL(colo_stream_checkpoints(s), nckpt);
}

/* ---- running ----------------------------------------------------------- */

static void fx_init(struct fx *r, const struct fixture *f)
{
	const json_t *bulk = jget(f->layout, "bulk");
	const json_t *ckpts = jarray(f->layout, "checkpoints");

	memset(r, 0, sizeof(*r));
	r->file = f->data;
	r->file_len = f->len;
	r->devblob_start = jint(bulk, "device_start_offset");
	/* 0x06, be32 length, then the JSON */
	r->vmdesc_start = jint(bulk, "vmdescription_offset") + 1 + 4;
	for (size_t c = 0; c < json_array_size(ckpts) && c < FX_MAX_CKPT; c++)
		r->ckblob_start[c + 1] =
			jint(json_array_get(ckpts, c), "blob_start");
}

static struct colo_stream *fx_parser(struct fx *r)
{
	struct colo_stream_callbacks cb = fx_callbacks;

	cb.opaque = r;
	r->s = colo_stream_new(&cb, NULL);
	CU_ASSERT_PTR_NOT_NULL_FATAL(r->s);
	return r->s;
}

/* Feeds [from, to) in pieces of `chunk` bytes (0: at once). */
static bool feed(struct colo_stream *s, const uint8_t *data, size_t from,
		 size_t to, size_t chunk)
{
	const char *err = NULL;

	for (size_t at = from; at < to;) {
		size_t n = chunk == 0 || to - at < chunk ? to - at : chunk;

		if (colo_stream_feed(s, data + at, n, &err) != COLO_STREAM_NEED_MORE) {
			fprintf(stderr, "\n  feed at %zu: %s\n", at, err);
			return false;
		}
		at += n;
	}
	return true;
}

/*
 * Loads a recording and allocates the recorder state for one test.  On
 * failure the test is failed and nothing is left allocated.
 */
static struct fx *begin_fixture_test(struct fixture *f, const char *name)
{
	struct fx *r = malloc(sizeof(*r));

	CU_ASSERT_PTR_NOT_NULL_FATAL(r);
	if (!fixture_load(f, name)) {
		CU_FAIL("fixture missing");
		fixture_free(f);
		free(r);
		return NULL;
	}
	return r;
}

static void run_fixture(const char *name, size_t chunk)
{
	struct fixture f;
	struct fx *r = begin_fixture_test(&f, name);

	if (!r)
		return;
#ifdef FIXTURE_TIMING
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
#endif
	fx_init(r, &f);
	struct colo_stream *s = fx_parser(r);
	CU_ASSERT_TRUE(feed(s, f.data, 0, f.len, chunk));
#ifdef FIXTURE_TIMING
	clock_gettime(CLOCK_MONOTONIC, &t1);
	fprintf(stderr, "\n  [%s chunk %zu: %.1f ms] ", name, chunk,
		(double)(t1.tv_sec - t0.tv_sec) * 1e3 +
			(double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
#endif
	check_parse(&f, r, s);
	colo_stream_free(s);
	fixture_free(&f);
	free(r);
}

/*
 * Pieces that end exactly at the bulk end and at each checkpoint's end:
 * at each the parser is at a boundary (finish would be clean), and just
 * before it is not.  A stream cut at the last completed checkpoint
 * finishes cleanly; the whole recording does not.
 */
static void run_boundaries(const char *name)
{
	struct fixture f;
	struct fx *r = begin_fixture_test(&f, name);

	if (!r)
		return;
	const json_t *ckpts = jarray(f.layout, "checkpoints");
	size_t nckpt = json_array_size(ckpts);
	uint64_t ends[FX_MAX_CKPT + 1];

	CU_ASSERT_FATAL(nckpt >= 1 && nckpt <= FX_MAX_CKPT);
	ends[0] = jint(jget(f.layout, "bulk"), "end_offset");
	for (size_t c = 0; c < nckpt; c++)
		ends[c + 1] = jint(json_array_get(ckpts, c), "blob_end");
	CU_ASSERT_EQUAL(ends[nckpt], jint(f.layout, "completed_end_offset"));

	fx_init(r, &f);
	struct colo_stream *s = fx_parser(r);
	size_t at = 0;
	for (size_t c = 0; c <= nckpt; c++) {
		CU_ASSERT_FATAL(ends[c] > at && ends[c] <= f.len);
		CU_ASSERT_FATAL(feed(s, f.data, at, ends[c] - 1, 0));
		CU_ASSERT_FALSE(colo_stream_at_boundary(s));
		CU_ASSERT_EQUAL(colo_stream_phase(s),
				c == 0 ? COLO_PHASE_BULK : COLO_PHASE_CHECKPOINT);
		CU_ASSERT_FATAL(feed(s, f.data, ends[c] - 1, ends[c], 0));
		CU_ASSERT_TRUE(colo_stream_at_boundary(s));
		CU_ASSERT_EQUAL(colo_stream_phase(s), COLO_PHASE_IDLE);
		CU_ASSERT_EQUAL(colo_stream_offset(s), ends[c]);
		CU_ASSERT_EQUAL(colo_stream_checkpoints(s), c);
		at = ends[c];
	}
	CU_ASSERT_FATAL(feed(s, f.data, at, f.len, 0));
	check_parse(&f, r, s);
	colo_stream_free(s);

	/* The peer hangs up right after the last completed checkpoint. */
	struct colo_stream *cut = colo_stream_new(NULL, NULL);
	const char *err = NULL;
	CU_ASSERT_PTR_NOT_NULL_FATAL(cut);
	CU_ASSERT_TRUE(feed(cut, f.data, 0, ends[nckpt], 0));
	CU_ASSERT_EQUAL(colo_stream_finish(cut, &err), 0);
	CU_ASSERT_PTR_NULL(colo_stream_error(cut));
	CU_ASSERT_EQUAL(colo_stream_checkpoints(cut), nckpt);
	colo_stream_free(cut);

	fixture_free(&f);
	free(r);
}

#define PC "tiny-pc-3ckpt"
#define Q35 "tiny-q35-2ckpt"

static void test_pc_whole(void) { run_fixture(PC, 0); }
static void test_pc_bytewise(void) { run_fixture(PC, 1); }
static void test_pc_4093(void) { run_fixture(PC, 4093); }
static void test_pc_boundaries(void) { run_boundaries(PC); }
static void test_q35_whole(void) { run_fixture(Q35, 0); }
static void test_q35_bytewise(void) { run_fixture(Q35, 1); }
static void test_q35_4093(void) { run_fixture(Q35, 4093); }
static void test_q35_boundaries(void) { run_boundaries(Q35); }

int register_colo_fixture_tests(void)
{
	CU_pSuite suite = CU_add_suite("colo_fixtures", NULL, NULL);

	if (!suite)
		return -1;
	if (!CU_add_test(suite, "pc recording, whole", test_pc_whole) ||
	    !CU_add_test(suite, "pc recording, 1-byte chunks", test_pc_bytewise) ||
	    !CU_add_test(suite, "pc recording, 4093-byte chunks", test_pc_4093) ||
	    !CU_add_test(suite, "pc recording, split at boundaries",
			 test_pc_boundaries) ||
	    !CU_add_test(suite, "q35 recording, whole", test_q35_whole) ||
	    !CU_add_test(suite, "q35 recording, 1-byte chunks",
			 test_q35_bytewise) ||
	    !CU_add_test(suite, "q35 recording, 4093-byte chunks", test_q35_4093) ||
	    !CU_add_test(suite, "q35 recording, split at boundaries",
			 test_q35_boundaries))
		return -1;
	return 0;
}
