/*
 * The checkpoint source over QEMU's COLO stream (colo_capture.c), end to
 * end on real sockets: a replayed recording of our patched QEMU
 * (tests/fixtures/colo/tiny-pc-3ckpt, see colo_replay.h) talks to the
 * source the way QEMU did, waiting for each COLO reply before it goes on,
 * and every event the source reports is checked against the recording's
 * layout JSON and bytes: the RAM layout, bulk page counts, the pages and
 * device state of each epoch byte for byte, event order, and statistics.
 * Then the ways it must fail or hold back: backpressure (REPLY held until
 * a kick), bulk flow control, truncated and malformed streams, a second
 * connection, the owner destroying it from inside its events, and the
 * QMP conversation against a scripted QMP server.
 */
#include <CUnit/CUnit.h>
#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/buffer.h"
#include "qemu/checkpoint_source.h"
#include "colo_replay.h"
#include "base/event_loop.h"
#include "qemu/migration_writer.h"
#include "qemu/qmp.h"
#include "suites.h"

#define FIXTURE "tiny-pc-3ckpt"
#define MAX_EPOCH 5        /* bulk + 3 checkpoints + the unanswered 4th */
#define MAX_CKPT_RECORDS 8 /* ram records kept per checkpoint */
#define TIMEOUT_MS 20000   /* generous: valgrind is slow */

struct ckpt_layout {
	uint64_t request, vmstate_send, blob_start, blob_end;
	uint64_t pages;
	size_t nrecords;
	uint64_t record_offset[MAX_CKPT_RECORDS], record_addr[MAX_CKPT_RECORDS];
};

/* What the owner of a source sees, plus knobs for how it behaves. */
struct rig {
	event_loop *loop;
	char dir[64];
	char path[128];
	struct colo_fixture fx;
	struct checkpoint_source *src;
	struct colo_replay qemu;

	/* from the layout JSON */
	uint64_t bulk_end, bulk_pages, bulk_zero_pages;
	unsigned nckpt;
	struct ckpt_layout ck[MAX_EPOCH];

	/* events */
	char order[128]; /* L layout, D bulk done, Bk begin, Ek end, F failed */
	unsigned layouts;
	char machine[64];
	uint32_t ram_id;
	size_t nblocks;
	struct colo_ram_block blocks[8];
	uint64_t pages[MAX_EPOCH], zeros[MAX_EPOCH];
	uint64_t open_epoch; /* begun and not ended, 0 if none */
	unsigned bad_page_epoch, bad_page_data, bad_device;
	uint64_t device_got[MAX_EPOCH];
	struct checkpoint_stats stats[MAX_EPOCH];
	unsigned ends;
	const char *state_in_begin[MAX_EPOCH];
	unsigned failed;
	char why[512];
	unsigned events_after_gone;
	bool gone;
	unsigned previous_migration_wait_ms; /* the source's config; 0: its default */

	/* behaviour */
	bool allow;                /* may_checkpoint's answer */
	unsigned may_calls;
	bool hold_after_epoch1;    /* allow = false once epoch 1 ended */
	bool pause_on_bulk_page;   /* set_bulk_paused(true) at the first bulk page */
	bool pause_in_checkpoint;  /* set_bulk_paused(true) in on_checkpoint_begin */
	bool destroy_on_failed;
	bool abandon_on_bulk_page; /* abandon + destroy from on_page */
};

/* ---- events ---------------------------------------------------------------- */

static void note(struct rig *t, const char *fmt, unsigned long long v)
{
	size_t len = strlen(t->order);

	if (t->gone)
		t->events_after_gone++;
	snprintf(t->order + len, sizeof(t->order) - len, fmt, v);
}

static void ev_layout(void *opaque, const char *machine_type, uint32_t ram_section_id,
		      const struct colo_ram_block *blocks, size_t count)
{
	struct rig *t = opaque;

	note(t, "L", 0);
	t->layouts++;
	snprintf(t->machine, sizeof(t->machine), "%s", machine_type);
	t->ram_id = ram_section_id;
	t->nblocks = count;
	for (size_t i = 0; i < count && i < 8; i++)
		t->blocks[i] = blocks[i];
}

/* A checkpoint page must be byte for byte the page of its record in the file. */
static bool page_matches(const struct rig *t, uint64_t epoch, uint64_t addr,
			 const uint8_t *data)
{
	const struct ckpt_layout *c = &t->ck[epoch];

	for (size_t i = 0; i < c->nrecords; i++)
		if (c->record_addr[i] == addr)
			return data && memcmp(data, t->fx.data + c->record_offset[i] + 8,
					      MIG_PAGE_SIZE) == 0;
	return false;
}

static void ev_page(void *opaque, uint64_t epoch, unsigned block, uint64_t page_index,
		    const uint8_t *data)
{
	struct rig *t = opaque;

	if (t->gone)
		t->events_after_gone++;
	if (epoch >= MAX_EPOCH || epoch != t->open_epoch || t->layouts != 1) {
		t->bad_page_epoch++;
		return;
	}
	if (data)
		t->pages[epoch]++;
	else
		t->zeros[epoch]++;
	if (epoch > 0 && (block != 0 || !page_matches(t, epoch, page_index * MIG_PAGE_SIZE, data)))
		t->bad_page_data++;
	if (epoch == 0 && t->pause_on_bulk_page && t->pages[0] + t->zeros[0] == 1)
		checkpoint_source_set_bulk_paused(t->src, true);
	if (epoch == 0 && t->abandon_on_bulk_page) {
		checkpoint_source_abandon(t->src);
		checkpoint_source_destroy(t->src);
		t->src = NULL;
		t->gone = true;
	}
}

static void ev_bulk_done(void *opaque)
{
	struct rig *t = opaque;

	note(t, "D", 0);
}

static void ev_begin(void *opaque, uint64_t epoch)
{
	struct rig *t = opaque;

	note(t, "B%llu", (unsigned long long)epoch);
	if (t->open_epoch != 0 || epoch >= MAX_EPOCH) {
		t->bad_page_epoch++;
		return;
	}
	t->open_epoch = epoch;
	t->state_in_begin[epoch] = checkpoint_source_state(t->src);
	if (t->pause_in_checkpoint)
		checkpoint_source_set_bulk_paused(t->src, true);
}

static void ev_device(void *opaque, uint64_t epoch, uint64_t total, uint64_t offset,
		      const uint8_t *d, size_t n)
{
	struct rig *t = opaque;
	const struct ckpt_layout *c;

	if (epoch >= MAX_EPOCH || epoch != t->open_epoch || epoch == 0) {
		t->bad_device++;
		return;
	}
	c = &t->ck[epoch];
	if (total != c->blob_end - c->blob_start || offset != t->device_got[epoch] ||
	    offset + n > total || memcmp(d, t->fx.data + c->blob_start + offset, n) != 0)
		t->bad_device++;
	t->device_got[epoch] += n;
}

static void ev_end(void *opaque, const struct checkpoint_stats *st)
{
	struct rig *t = opaque;

	note(t, "E%llu", (unsigned long long)st->epoch);
	if (st->epoch != t->open_epoch || st->epoch >= MAX_EPOCH) {
		t->bad_page_epoch++;
		return;
	}
	t->stats[st->epoch] = *st;
	t->ends++;
	t->open_epoch = 0;
	if (t->hold_after_epoch1 && st->epoch == 1)
		t->allow = false;
}

static void ev_failed(void *opaque, const char *why)
{
	struct rig *t = opaque;

	note(t, "F", 0);
	t->failed++;
	snprintf(t->why, sizeof(t->why), "%s", why);
	if (t->destroy_on_failed) {
		checkpoint_source_destroy(t->src);
		t->src = NULL;
		t->gone = true;
	}
}

static bool ev_may(void *opaque)
{
	struct rig *t = opaque;

	t->may_calls++;
	return t->allow;
}

/* ---- the rig --------------------------------------------------------------- */

static void read_layout(struct rig *t)
{
	json_t *bulk = json_object_get(t->fx.layout, "bulk");
	json_t *ckpts = json_object_get(t->fx.layout, "checkpoints");

	t->bulk_end = colo_json_u64(bulk, "end_offset");
	t->bulk_pages = colo_json_u64(bulk, "pages");
	t->bulk_zero_pages = colo_json_u64(bulk, "zero_pages");
	t->nckpt = (unsigned)json_array_size(ckpts);
	for (unsigned i = 0; i < t->nckpt && i + 1 < MAX_EPOCH; i++) {
		json_t *c = json_array_get(ckpts, i), *records;
		struct ckpt_layout *l = &t->ck[i + 1];

		l->request = colo_json_u64(c, "request_offset");
		l->vmstate_send = colo_json_u64(c, "vmstate_send_offset");
		l->blob_start = colo_json_u64(c, "blob_start");
		l->blob_end = colo_json_u64(c, "blob_end");
		l->pages = colo_json_u64(c, "pages");
		records = json_object_get(c, "ram_records");
		for (size_t r = 0; r < json_array_size(records) && r < MAX_CKPT_RECORDS; r++) {
			l->record_offset[r] = colo_json_u64(json_array_get(records, r), "offset");
			l->record_addr[r] = colo_json_u64(json_array_get(records, r), "addr");
			l->nrecords++;
		}
	}
}

static const struct checkpoint_source_events rig_events = {
	.on_ram_layout = ev_layout,
	.on_page = ev_page,
	.on_bulk_done = ev_bulk_done,
	.on_checkpoint_begin = ev_begin,
	.on_device_chunk = ev_device,
	.on_checkpoint_end = ev_end,
	.on_failed = ev_failed,
	.may_checkpoint = ev_may,
};

static struct checkpoint_source *rig_open_source(struct rig *t, struct qmp_client *qmp)
{
	struct checkpoint_source_events ev = rig_events;
	struct checkpoint_source_config cfg = {
		.vm_name = "capt",
		.listen_path = t->path,
		.interval_ms = 100,
		.qmp = qmp,
		.bulk_high_water = 1 << 20,
		.previous_migration_wait_ms = t->previous_migration_wait_ms,
	};
	char err[256] = "";

	ev.opaque = t;
	t->src = checkpoint_source_open(t->loop, &cfg, &ev, err, sizeof(err));
	if (!t->src)
		fprintf(stderr, "checkpoint_source_open: %s\n", err);
	return t->src;
}

/* Loop, fixture, a private socket directory, and a source without QMP if asked. */
static bool rig_setup(struct rig *t, bool open_source)
{
	memset(t, 0, sizeof(*t));
	t->allow = true;
	colo_replay_init(&t->qemu, NULL, 0);
	snprintf(t->dir, sizeof(t->dir), "/tmp/colo-capture-XXXXXX");
	if (!mkdtemp(t->dir))
		return false;
	snprintf(t->path, sizeof(t->path), "%s/migrate.sock", t->dir);
	t->loop = event_loop_create();
	if (!t->loop || !colo_fixture_load(&t->fx, FIXTURE))
		return false;
	read_layout(t);
	colo_replay_init(&t->qemu, t->fx.data, t->fx.len);
	if (open_source && !rig_open_source(t, NULL))
		return false;
	return true;
}

static void rig_teardown(struct rig *t)
{
	char qmp_path[160];

	checkpoint_source_destroy(t->src);
	colo_replay_disconnect(&t->qemu);
	event_loop_destroy(t->loop);
	colo_fixture_free(&t->fx);
	unlink(t->path);
	snprintf(qmp_path, sizeof(qmp_path), "%s/qmp.sock", t->dir);
	unlink(qmp_path);
	rmdir(t->dir);
}

typedef bool (*rig_cond)(struct rig *t);

/* Runs both ends until cond holds; false after timeout_ms. */
static bool pump_until(struct rig *t, rig_cond cond, int timeout_ms)
{
	int64_t until = monotonic_ms() + timeout_ms;

	while (!cond(t)) {
		if (monotonic_ms() > until)
			return false;
		if (t->qemu.fd >= 0)
			colo_replay_run(&t->qemu);
		event_loop_run_once(t->loop, 2);
	}
	return true;
}

static bool never(struct rig *t)
{
	return false;
}

static void pump_for(struct rig *t, int ms)
{
	pump_until(t, never, ms);
}

static bool replay_finished(struct rig *t)
{
	return colo_replay_finished(&t->qemu);
}

static bool has_failed(struct rig *t)
{
	return t->failed > 0;
}

static bool is_held(struct rig *t)
{
	return t->src && strcmp(checkpoint_source_state(t->src), "held") == 0;
}

static bool peer_closed(struct rig *t)
{
	return colo_replay_peer_closed(&t->qemu) == 1;
}

#define ASSERT_CONTAINS(haystack, needle)                                      \
	do {                                                                   \
		CU_ASSERT_PTR_NOT_NULL(strstr((haystack), (needle)));          \
		if (!strstr((haystack), (needle)))                             \
			fprintf(stderr, "\n  '%s' not in '%s'\n", (needle),    \
				(haystack));                                   \
	} while (0)

/* Everything the source said about epochs 0..n, against the recording. */
static void check_epochs(struct rig *t, unsigned n)
{
	CU_ASSERT_EQUAL(t->layouts, 1);
	CU_ASSERT_STRING_EQUAL(t->machine, "pc-i440fx-7.2");
	CU_ASSERT_EQUAL(t->ram_id, 2);
	CU_ASSERT_EQUAL(t->nblocks, 6);
	CU_ASSERT_STRING_EQUAL(t->blocks[0].name, "pc.ram");
	CU_ASSERT_EQUAL(t->blocks[0].length, 16u << 20);
	CU_ASSERT_STRING_EQUAL(t->blocks[5].name, "/rom@etc/acpi/rsdp");
	CU_ASSERT_EQUAL(t->blocks[5].index, 5);
	CU_ASSERT_EQUAL(t->pages[0], t->bulk_pages);
	CU_ASSERT_EQUAL(t->zeros[0], t->bulk_zero_pages);
	CU_ASSERT_EQUAL(t->pages[0], 123);
	CU_ASSERT_EQUAL(t->zeros[0], 4292);
	CU_ASSERT_EQUAL(t->bad_page_epoch, 0);
	CU_ASSERT_EQUAL(t->bad_page_data, 0);
	CU_ASSERT_EQUAL(t->bad_device, 0);
	CU_ASSERT_EQUAL(t->ends, n);
	for (unsigned k = 1; k <= n; k++) {
		const struct checkpoint_stats *st = &t->stats[k];
		const struct ckpt_layout *c = &t->ck[k];

		CU_ASSERT_EQUAL(st->epoch, k);
		CU_ASSERT_EQUAL(st->pages, c->pages);
		CU_ASSERT_EQUAL(st->pages, 4);
		CU_ASSERT_EQUAL(t->pages[k], 4);
		CU_ASSERT_EQUAL(st->zero_pages, 0);
		CU_ASSERT_EQUAL(st->device_bytes, c->blob_end - c->blob_start);
		CU_ASSERT_EQUAL(st->device_bytes, 12889);
		CU_ASSERT_EQUAL(t->device_got[k], st->device_bytes);
		CU_ASSERT_EQUAL(st->stream_bytes, c->blob_end - c->request);
		CU_ASSERT(st->pause_us >= 0 && st->pause_us < 10 * 1000 * 1000);
		CU_ASSERT(st->request_wait_us >= 0 && st->request_wait_us < 10 * 1000 * 1000);
		CU_ASSERT_PTR_NOT_NULL(t->state_in_begin[k]);
		if (t->state_in_begin[k])
			CU_ASSERT_STRING_EQUAL(t->state_in_begin[k], "checkpoint");
	}
}

/* ---- tests -------------------------------------------------------------------- */

static void test_replays_three_checkpoints(void)
{
	struct rig t;

	CU_ASSERT_FATAL(rig_setup(&t, true));
	CU_ASSERT_STRING_EQUAL(checkpoint_source_state(t.src), "waiting-for-qemu");
	CU_ASSERT_EQUAL(t.nckpt, 3);
	CU_ASSERT_EQUAL_FATAL(colo_replay_connect(&t.qemu, t.path), 0);
	colo_replay_script_fixture(&t.qemu, t.fx.layout, 3);
	CU_ASSERT(pump_until(&t, replay_finished, TIMEOUT_MS));
	CU_ASSERT_STRING_EQUAL(t.qemu.error, "");
	CU_ASSERT_EQUAL(t.failed, 0);
	CU_ASSERT_STRING_EQUAL(t.order, "LDB1E1B2E2B3E3");
	check_epochs(&t, 3);
	CU_ASSERT_EQUAL(t.may_calls, 3);
	CU_ASSERT_STRING_EQUAL(checkpoint_source_state(t.src), "running");
	CU_ASSERT_EQUAL(checkpoint_source_epoch(t.src), 3);
	CU_ASSERT_EQUAL(checkpoint_source_stream_offset(t.src), t.ck[3].blob_end);
	CU_ASSERT_PTR_NULL(checkpoint_source_error(t.src));

	/* QEMU goes away between checkpoints: a clean end, still a failure. */
	colo_replay_disconnect(&t.qemu);
	CU_ASSERT(pump_until(&t, has_failed, TIMEOUT_MS));
	CU_ASSERT_EQUAL(t.failed, 1);
	ASSERT_CONTAINS(t.why, "QEMU closed the checkpoint stream at offset 743445");
	ASSERT_CONTAINS(t.why, "at a checkpoint boundary, after checkpoint 3");
	CU_ASSERT_STRING_EQUAL(checkpoint_source_state(t.src), "failed");
	CU_ASSERT_PTR_NOT_NULL(checkpoint_source_error(t.src));
	/* The socket went with it: a new source may take the path. */
	CU_ASSERT_EQUAL(access(t.path, F_OK), -1);
	checkpoint_source_abandon(t.src); /* no QMP: nothing to send */
	CU_ASSERT_STRING_EQUAL(checkpoint_source_state(t.src), "abandoned");
	CU_ASSERT_EQUAL(t.failed, 1);
	rig_teardown(&t);
}

/*
 * The pause's two parts: QEMU stopping the VM (REPLY -> VMSTATE_SEND) and
 * its device save and dirty-bitmap sync (VMSTATE_SEND -> the first page).
 * Checkpoint 1 waits before its VMSTATE_SEND, checkpoint 2 after it: each
 * delay must land in its own part, not in the other.
 */
#define PART_DELAY_MS 200

static void replay_checkpoint_in_two(struct rig *t, unsigned k, bool delay_after_send)
{
	uint64_t request = t->ck[k].request, send = t->ck[k].vmstate_send;

	colo_replay_send(&t->qemu, request, request + 4);
	colo_replay_expect(&t->qemu, COLO_MSG_CHECKPOINT_REPLY);
	if (delay_after_send)
		colo_replay_send(&t->qemu, send, send + 4);
	CU_ASSERT(pump_until(t, replay_finished, TIMEOUT_MS));
	pump_for(t, PART_DELAY_MS);
	colo_replay_send(&t->qemu, delay_after_send ? send + 4 : send, t->ck[k].blob_end);
	colo_replay_expect(&t->qemu, COLO_MSG_VMSTATE_RECEIVED);
	colo_replay_expect(&t->qemu, COLO_MSG_VMSTATE_LOADED);
	CU_ASSERT(pump_until(t, replay_finished, TIMEOUT_MS));
}

static void test_pause_parts(void)
{
	struct rig t;
	const int64_t delay_us = PART_DELAY_MS * 1000;

	CU_ASSERT_FATAL(rig_setup(&t, true));
	CU_ASSERT_EQUAL_FATAL(colo_replay_connect(&t.qemu, t.path), 0);
	colo_replay_send(&t.qemu, 0, t.bulk_end);
	colo_replay_expect(&t.qemu, COLO_MSG_CHECKPOINT_READY);
	replay_checkpoint_in_two(&t, 1, false);
	replay_checkpoint_in_two(&t, 2, true);
	CU_ASSERT_STRING_EQUAL(t.qemu.error, "");
	CU_ASSERT_EQUAL_FATAL(t.ends, 2);
	const struct checkpoint_stats *stop = &t.stats[1], *sync = &t.stats[2];

	CU_ASSERT(stop->stop_us >= delay_us - 20000);
	CU_ASSERT(stop->sync_us >= 0 && stop->sync_us < stop->stop_us);
	CU_ASSERT(sync->sync_us >= delay_us - 20000);
	CU_ASSERT(sync->stop_us >= 0 && sync->stop_us < sync->sync_us);
	for (unsigned k = 1; k <= 2; k++)
		CU_ASSERT(t.stats[k].stop_us + t.stats[k].sync_us <= t.stats[k].pause_us);
	rig_teardown(&t);
}

static void test_backpressure_holds_reply_until_kick(void)
{
	struct rig t;

	CU_ASSERT_FATAL(rig_setup(&t, true));
	t.hold_after_epoch1 = true;
	CU_ASSERT_EQUAL_FATAL(colo_replay_connect(&t.qemu, t.path), 0);
	colo_replay_script_fixture(&t.qemu, t.fx.layout, 3);
	CU_ASSERT_FATAL(pump_until(&t, is_held, TIMEOUT_MS));
	CU_ASSERT_EQUAL(checkpoint_source_epoch(t.src), 1);

	/* Held: QEMU still waits for the REPLY of checkpoint 2. */
	pump_for(&t, 150);
	CU_ASSERT_STRING_EQUAL(checkpoint_source_state(t.src), "held");
	CU_ASSERT_EQUAL(t.qemu.steps[t.qemu.cur].kind, REPLAY_EXPECT);
	CU_ASSERT_EQUAL(t.qemu.steps[t.qemu.cur].message, COLO_MSG_CHECKPOINT_REPLY);
	CU_ASSERT_EQUAL(t.qemu.got_len, 0);
	CU_ASSERT_STRING_EQUAL(t.order, "LDB1E1");

	/* A kick while the owner still says no changes nothing. */
	unsigned asked = t.may_calls;
	checkpoint_source_kick(t.src);
	CU_ASSERT_EQUAL(t.may_calls, asked + 1);
	pump_for(&t, 20);
	CU_ASSERT_EQUAL(t.qemu.got_len, 0);
	CU_ASSERT_STRING_EQUAL(checkpoint_source_state(t.src), "held");

	t.allow = true;
	checkpoint_source_kick(t.src);
	CU_ASSERT(pump_until(&t, replay_finished, TIMEOUT_MS));
	CU_ASSERT_STRING_EQUAL(t.qemu.error, "");
	CU_ASSERT_STRING_EQUAL(t.order, "LDB1E1B2E2B3E3");
	check_epochs(&t, 3);
	CU_ASSERT(t.stats[2].request_wait_us >= 150 * 1000);
	CU_ASSERT(t.stats[3].request_wait_us < t.stats[2].request_wait_us);

	/* Not held: a kick is a no-op. */
	asked = t.may_calls;
	checkpoint_source_kick(t.src);
	CU_ASSERT_EQUAL(t.may_calls, asked);

	/* The never-answered 4th REQUEST of the recording, held, then QEMU dies. */
	t.allow = false;
	colo_replay_send(&t.qemu, t.ck[3].blob_end, t.fx.len);
	CU_ASSERT(pump_until(&t, is_held, TIMEOUT_MS));
	colo_replay_disconnect(&t.qemu);
	CU_ASSERT(pump_until(&t, has_failed, TIMEOUT_MS));
	ASSERT_CONTAINS(t.why, "QEMU closed the checkpoint stream at offset 743449");
	ASSERT_CONTAINS(t.why, "inside checkpoint 4");
	rig_teardown(&t);
}

static bool first_checkpoint_ended(struct rig *t)
{
	return t->ends >= 1;
}

/*
 * hold-checkpoint: QEMU gets VMSTATE_RECEIVED but not LOADED (so it keeps
 * the VM stopped) until the release; the checkpoint is reported ended as
 * usual, and the next ones run normally.
 */
static void test_hold_keeps_loaded_until_release(void)
{
	struct rig t;

	CU_ASSERT_FATAL(rig_setup(&t, true));
	CU_ASSERT_EQUAL(checkpoint_source_hold_next(t.src), 0);
	CU_ASSERT_EQUAL(checkpoint_source_hold_next(t.src), -1); /* one at a time */
	CU_ASSERT_EQUAL_FATAL(colo_replay_connect(&t.qemu, t.path), 0);
	colo_replay_script_fixture(&t.qemu, t.fx.layout, 3);
	CU_ASSERT_FATAL(pump_until(&t, first_checkpoint_ended, TIMEOUT_MS));
	pump_for(&t, 150);
	CU_ASSERT_EQUAL(checkpoint_source_held_epoch(t.src), 1);
	CU_ASSERT_STRING_EQUAL(t.order, "LDB1E1");
	CU_ASSERT_EQUAL(t.qemu.steps[t.qemu.cur].kind, REPLAY_EXPECT);
	CU_ASSERT_EQUAL(t.qemu.steps[t.qemu.cur].message, COLO_MSG_VMSTATE_LOADED);
	CU_ASSERT_EQUAL(checkpoint_source_hold_next(t.src), -1); /* held already */

	checkpoint_source_release(t.src);
	CU_ASSERT_EQUAL(checkpoint_source_held_epoch(t.src), 0);
	CU_ASSERT(pump_until(&t, replay_finished, TIMEOUT_MS));
	CU_ASSERT_STRING_EQUAL(t.qemu.error, "");
	CU_ASSERT_STRING_EQUAL(t.order, "LDB1E1B2E2B3E3");
	check_epochs(&t, 3);
	/* The held checkpoint's LOADED did not go with its end: no time for it. */
	CU_ASSERT_EQUAL(t.stats[1].loaded_wall_us, 0);
	CU_ASSERT(t.stats[2].loaded_wall_us > 0 && t.stats[2].loaded_wall_us <= wall_clock_us());
	CU_ASSERT(t.stats[3].loaded_wall_us >= t.stats[2].loaded_wall_us);
	checkpoint_source_release(t.src); /* nothing held: a no-op */
	rig_teardown(&t);
}

static bool bulk_pages_stuck(struct rig *t)
{
	return t->pages[0] + t->zeros[0] > 0;
}

static void test_bulk_pause_stops_reading(void)
{
	struct rig t;

	CU_ASSERT_FATAL(rig_setup(&t, true));
	t.pause_on_bulk_page = true;
	t.pause_in_checkpoint = true; /* must be ignored: the VM is stopped */
	CU_ASSERT_EQUAL_FATAL(colo_replay_connect(&t.qemu, t.path), 0);
	colo_replay_script_fixture(&t.qemu, t.fx.layout, 3);
	CU_ASSERT_FATAL(pump_until(&t, bulk_pages_stuck, TIMEOUT_MS));
	pump_for(&t, 50);
	uint64_t offset = checkpoint_source_stream_offset(t.src);
	uint64_t seen = t.pages[0] + t.zeros[0];
	pump_for(&t, 200);
	CU_ASSERT_STRING_EQUAL(checkpoint_source_state(t.src), "bulk");
	CU_ASSERT_EQUAL(checkpoint_source_stream_offset(t.src), offset);
	CU_ASSERT_EQUAL(t.pages[0] + t.zeros[0], seen);
	/* At most one chunk (a quarter of the 1 MiB high water) went in. */
	CU_ASSERT(offset <= 256 * 1024);
	CU_ASSERT(offset < t.bulk_end);

	t.pause_on_bulk_page = false;
	checkpoint_source_set_bulk_paused(t.src, false);
	CU_ASSERT(pump_until(&t, replay_finished, TIMEOUT_MS));
	CU_ASSERT_STRING_EQUAL(t.qemu.error, "");
	CU_ASSERT_STRING_EQUAL(t.order, "LDB1E1B2E2B3E3");
	check_epochs(&t, 3);
	rig_teardown(&t);
}

static void expect_failure(struct rig *t, const char *needle)
{
	CU_ASSERT(pump_until(t, has_failed, TIMEOUT_MS));
	CU_ASSERT_EQUAL(t->failed, 1);
	ASSERT_CONTAINS(t->why, needle);
	if (t->src)
		CU_ASSERT_STRING_EQUAL(checkpoint_source_state(t->src), "failed");
	/* The source hung up on QEMU. */
	CU_ASSERT(pump_until(t, peer_closed, TIMEOUT_MS));
}

static void test_truncated_checkpoint_fails(void)
{
	struct rig t;
	char needle[96];

	CU_ASSERT_FATAL(rig_setup(&t, true));
	CU_ASSERT_EQUAL_FATAL(colo_replay_connect(&t.qemu, t.path), 0);
	colo_replay_send(&t.qemu, 0, t.bulk_end);
	colo_replay_expect(&t.qemu, COLO_MSG_CHECKPOINT_READY);
	colo_replay_send(&t.qemu, t.ck[1].request, t.ck[1].request + 4);
	colo_replay_expect(&t.qemu, COLO_MSG_CHECKPOINT_REPLY);
	colo_replay_send(&t.qemu, t.ck[1].vmstate_send, t.ck[1].vmstate_send + 1000);
	colo_replay_close_step(&t.qemu);
	CU_ASSERT(pump_until(&t, has_failed, TIMEOUT_MS));
	CU_ASSERT_STRING_EQUAL(t.qemu.error, "");
	snprintf(needle, sizeof(needle), "QEMU closed the checkpoint stream at offset %llu",
		 (unsigned long long)t.ck[1].vmstate_send + 1000);
	ASSERT_CONTAINS(t.why, needle);
	ASSERT_CONTAINS(t.why, "truncated");
	ASSERT_CONTAINS(t.why, "inside checkpoint 1");
	CU_ASSERT_STRING_EQUAL(t.order, "LDB1F");
	CU_ASSERT_EQUAL(t.ends, 0);
	CU_ASSERT_STRING_EQUAL(checkpoint_source_state(t.src), "failed");
	CU_ASSERT_EQUAL(checkpoint_source_epoch(t.src), 0);
	rig_teardown(&t);
}

static void test_truncated_bulk_fails(void)
{
	struct rig t;

	CU_ASSERT_FATAL(rig_setup(&t, true));
	CU_ASSERT_EQUAL_FATAL(colo_replay_connect(&t.qemu, t.path), 0);
	colo_replay_send(&t.qemu, 0, 100000);
	colo_replay_close_step(&t.qemu);
	CU_ASSERT(pump_until(&t, has_failed, TIMEOUT_MS));
	ASSERT_CONTAINS(t.why, "QEMU closed the checkpoint stream at offset 100000");
	ASSERT_CONTAINS(t.why, "in the bulk migration");
	CU_ASSERT_EQUAL(t.failed, 1);
	rig_teardown(&t);
}

static void test_garbage_fails(void)
{
	static const char http[] = "GET / HTTP/1.1\r\nHost: remusdbd\r\n\r\n";
	struct rig t;

	CU_ASSERT_FATAL(rig_setup(&t, true));
	t.qemu.data = (const uint8_t *)http;
	t.qemu.len = sizeof(http) - 1;
	CU_ASSERT_EQUAL_FATAL(colo_replay_connect(&t.qemu, t.path), 0);
	colo_replay_send(&t.qemu, 0, t.qemu.len);
	expect_failure(&t, "QEMU's checkpoint stream is malformed: bad magic");
	CU_ASSERT_EQUAL(t.layouts, 0);
	rig_teardown(&t);
}

static void test_unknown_colo_message_fails(void)
{
	static const uint8_t seven[4] = { 0, 0, 0, 7 };
	struct rig t;

	CU_ASSERT_FATAL(rig_setup(&t, true));
	CU_ASSERT_EQUAL_FATAL(colo_replay_connect(&t.qemu, t.path), 0);
	colo_replay_script_fixture(&t.qemu, t.fx.layout, 0);
	CU_ASSERT(pump_until(&t, replay_finished, TIMEOUT_MS));
	CU_ASSERT_STRING_EQUAL(t.order, "LD");
	CU_ASSERT_EQUAL(write(t.qemu.fd, seven, 4), 4);
	expect_failure(&t, "unknown COLO message 7");
	rig_teardown(&t);
}

static void test_vmstate_send_while_held_fails(void)
{
	struct rig t;

	CU_ASSERT_FATAL(rig_setup(&t, true));
	t.allow = false;
	CU_ASSERT_EQUAL_FATAL(colo_replay_connect(&t.qemu, t.path), 0);
	colo_replay_send(&t.qemu, 0, t.bulk_end);
	colo_replay_expect(&t.qemu, COLO_MSG_CHECKPOINT_READY);
	colo_replay_send(&t.qemu, t.ck[1].request, t.ck[1].vmstate_send + 4);
	expect_failure(&t, "before our CHECKPOINT_REPLY");
	CU_ASSERT_STRING_EQUAL(t.order, "LDF");
	rig_teardown(&t);
}

/* A stream of our own: one ZERO record whose fill byte is not 0. */
static void test_nonzero_fill_fails(void)
{
	static const struct migw_ram_block block = { "pc.ram", 1 << 20 };
	struct buffer b;
	struct rig t;

	CU_ASSERT_FATAL(rig_setup(&t, true));
	buffer_init(&b);
	CU_ASSERT_EQUAL(migw_header(&b), 0);
	CU_ASSERT_EQUAL(migw_configuration(&b, "pc-i440fx-7.2"), 0);
	CU_ASSERT_EQUAL(migw_section_start(&b, MIG_SECTION_START, 2, "ram", 0, 4), 0);
	CU_ASSERT_EQUAL(migw_ram_mem_size(&b, &block, 1), 0);
	CU_ASSERT_EQUAL(migw_ram_zero(&b, "pc.ram", 0x3000, 0x5a), 0);
	t.qemu.data = buffer_head(&b);
	t.qemu.len = buffer_len(&b);
	CU_ASSERT_EQUAL_FATAL(colo_replay_connect(&t.qemu, t.path), 0);
	colo_replay_send(&t.qemu, 0, t.qemu.len);
	expect_failure(&t, "ZERO page record with fill byte 0x5a");
	ASSERT_CONTAINS(t.why, "pc.ram");
	/* The layout came (it precedes the first page); the bad page did not. */
	CU_ASSERT_EQUAL(t.layouts, 1);
	CU_ASSERT_EQUAL(t.zeros[0], 0);
	rig_teardown(&t);
	buffer_free(&b);
}

static void test_second_connection_refused(void)
{
	struct rig t;
	struct colo_replay intruder;

	CU_ASSERT_FATAL(rig_setup(&t, true));
	CU_ASSERT_EQUAL_FATAL(colo_replay_connect(&t.qemu, t.path), 0);
	colo_replay_script_fixture(&t.qemu, t.fx.layout, 3);
	CU_ASSERT_FATAL(pump_until(&t, bulk_pages_stuck, TIMEOUT_MS));

	colo_replay_init(&intruder, NULL, 0);
	CU_ASSERT_EQUAL_FATAL(colo_replay_connect(&intruder, t.path), 0);
	int64_t until = monotonic_ms() + TIMEOUT_MS;
	while (colo_replay_peer_closed(&intruder) == 0 && monotonic_ms() < until)
		event_loop_run_once(t.loop, 2);
	CU_ASSERT_EQUAL(colo_replay_peer_closed(&intruder), 1);
	colo_replay_disconnect(&intruder);

	/* The first connection goes on undisturbed. */
	CU_ASSERT(pump_until(&t, replay_finished, TIMEOUT_MS));
	CU_ASSERT_STRING_EQUAL(t.qemu.error, "");
	CU_ASSERT_EQUAL(t.failed, 0);
	check_epochs(&t, 3);
	rig_teardown(&t);
}

static void test_owner_destroys_inside_events(void)
{
	struct rig t;

	/* From on_failed, as protection.c does. */
	CU_ASSERT_FATAL(rig_setup(&t, true));
	t.destroy_on_failed = true;
	CU_ASSERT_EQUAL_FATAL(colo_replay_connect(&t.qemu, t.path), 0);
	colo_replay_send(&t.qemu, 0, 100000);
	colo_replay_close_step(&t.qemu);
	CU_ASSERT(pump_until(&t, has_failed, TIMEOUT_MS));
	CU_ASSERT_PTR_NULL(t.src);
	pump_for(&t, 20);
	CU_ASSERT_EQUAL(t.failed, 1);
	rig_teardown(&t);

	/* From on_page in the middle of a chunk: nothing more is reported. */
	CU_ASSERT_FATAL(rig_setup(&t, true));
	t.abandon_on_bulk_page = true;
	CU_ASSERT_EQUAL_FATAL(colo_replay_connect(&t.qemu, t.path), 0);
	colo_replay_script_fixture(&t.qemu, t.fx.layout, 3);
	CU_ASSERT(pump_until(&t, replay_finished, TIMEOUT_MS));
	/* QEMU's side stopped: the source hung up on it. */
	CU_ASSERT_NOT_EQUAL(t.qemu.error[0], '\0');
	CU_ASSERT_PTR_NULL(t.src);
	CU_ASSERT_EQUAL(t.pages[0] + t.zeros[0], 1);
	CU_ASSERT_EQUAL(t.events_after_gone, 0);
	CU_ASSERT_EQUAL(t.failed, 0);
	CU_ASSERT_EQUAL(access(t.path, F_OK), -1);
	rig_teardown(&t);
}

static void test_open_rejects_bad_config(void)
{
	event_loop *loop = event_loop_create();
	char dir[] = "/tmp/colo-capture-XXXXXX", path[96], err[256];
	struct checkpoint_source_config cfg = { .vm_name = "capt", .interval_ms = 10 };

	CU_ASSERT_FATAL(loop && mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/not-a-socket", dir);
	cfg.listen_path = path;
	err[0] = '\0';
	CU_ASSERT_PTR_NULL(checkpoint_source_open(loop, &cfg, NULL, err, sizeof(err)));
	ASSERT_CONTAINS(err, "10 ms is outside 25..500");

	cfg.interval_ms = 50;
	cfg.listen_path = "";
	CU_ASSERT_PTR_NULL(checkpoint_source_open(loop, &cfg, NULL, err, sizeof(err)));
	ASSERT_CONTAINS(err, "no socket path");

	/* A regular file where the socket should go is not replaced. */
	FILE *f = fopen(path, "w");
	CU_ASSERT_PTR_NOT_NULL_FATAL(f);
	fclose(f);
	cfg.listen_path = path;
	CU_ASSERT_PTR_NULL(checkpoint_source_open(loop, &cfg, NULL, err, sizeof(err)));
	ASSERT_CONTAINS(err, "is not a socket");
	unlink(path);
	rmdir(dir);
	event_loop_destroy(loop);
}

/* ---- QMP, against a scripted QMP server ------------------------------------- */

#define GREETING                                                              \
	"{\"QMP\": {\"version\": {\"qemu\": {\"micro\": 22, \"minor\": 2, "    \
	"\"major\": 7}, \"package\": \"\"}, \"capabilities\": [\"oob\"]}}\r\n"

struct qmp_peer {
	char path[100];
	int listen_fd, fd;
	char in[8192];
	size_t in_len;
};

static bool qmp_peer_listen(struct rig *t, struct qmp_peer *q)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };

	q->fd = -1;
	q->in_len = 0;
	snprintf(q->path, sizeof(q->path), "%s/qmp.sock", t->dir);
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", q->path);
	q->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	return q->listen_fd >= 0 &&
	       bind(q->listen_fd, (struct sockaddr *)&addr, sizeof(addr)) == 0 &&
	       listen(q->listen_fd, 4) == 0;
}

static void qmp_peer_close(struct qmp_peer *q)
{
	if (q->fd >= 0)
		close(q->fd);
	if (q->listen_fd >= 0)
		close(q->listen_fd);
	q->fd = q->listen_fd = -1;
}

/* Next line the client sent, parsed; NULL after timeout_ms without one. */
static json_t *qmp_peer_read(struct rig *t, struct qmp_peer *q, int timeout_ms)
{
	int64_t until = monotonic_ms() + timeout_ms;

	for (;;) {
		char *nl = memchr(q->in, '\n', q->in_len);
		if (nl) {
			size_t line = (size_t)(nl - q->in) + 1;
			json_t *msg = json_loadb(q->in, line, 0, NULL);
			memmove(q->in, q->in + line, q->in_len - line);
			q->in_len -= line;
			return msg;
		}
		if (monotonic_ms() >= until)
			return NULL;
		if (t->qemu.fd >= 0)
			colo_replay_run(&t->qemu);
		event_loop_run_once(t->loop, 2);
		ssize_t n = recv(q->fd, q->in + q->in_len, sizeof(q->in) - q->in_len,
				 MSG_DONTWAIT);
		if (n > 0)
			q->in_len += (size_t)n;
	}
}

static void qmp_peer_send(struct qmp_peer *q, const char *text)
{
	size_t len = strlen(text);

	CU_ASSERT_EQUAL(write(q->fd, text, len), (ssize_t)len);
}

static void qmp_peer_reply(struct qmp_peer *q, json_int_t id, const char *body)
{
	char line[512];

	snprintf(line, sizeof(line), "{%s, \"id\": %" JSON_INTEGER_FORMAT "}\r\n", body, id);
	qmp_peer_send(q, line);
}

/* Reads the next command, checks its name; its id (or -1), its arguments in *args. */
static json_int_t qmp_peer_expect(struct rig *t, struct qmp_peer *q, const char *command,
				  json_t **args)
{
	json_t *msg = qmp_peer_read(t, q, TIMEOUT_MS);
	const char *execute = json_string_value(json_object_get(msg, "execute"));
	json_int_t id = json_integer_value(json_object_get(msg, "id"));

	CU_ASSERT_PTR_NOT_NULL(execute);
	if (!execute || strcmp(execute, command) != 0) {
		fprintf(stderr, "\n  expected QMP %s, got %s\n", command,
			execute ? execute : "nothing");
		CU_FAIL("unexpected QMP command");
		id = -1;
	}
	if (args)
		*args = json_incref(json_object_get(msg, "arguments"));
	json_decref(msg);
	return id;
}

/* The QMP client connects, gets the greeting and negotiates. */
static struct qmp_client *qmp_peer_connect(struct rig *t, struct qmp_peer *q)
{
	struct qmp_client *qmp = qmp_client_create(t->loop, q->path, NULL, NULL);
	struct pollfd pfd = { .fd = q->listen_fd, .events = POLLIN };
	int64_t until = monotonic_ms() + TIMEOUT_MS;

	while (qmp && monotonic_ms() < until && poll(&pfd, 1, 0) != 1)
		event_loop_run_once(t->loop, 5);
	q->fd = accept4(q->listen_fd, NULL, NULL, SOCK_CLOEXEC);
	if (!qmp || q->fd < 0)
		return qmp;
	qmp_peer_send(q, GREETING);
	json_int_t id = qmp_peer_expect(t, q, "qmp_capabilities", NULL);
	qmp_peer_reply(q, id, "\"return\": {}");
	return qmp;
}

/*
 * A rig whose source has a QMP client connected to the scripted peer q
 * (the QMP tests' common start), the source waiting wait_ms for a
 * previous migration (0: its default).  Fails the test when any part
 * cannot be made.
 */
static struct qmp_client *qmp_rig_open(struct rig *t, struct qmp_peer *q, unsigned wait_ms)
{
	CU_ASSERT_FATAL(rig_setup(t, false));
	t->previous_migration_wait_ms = wait_ms;
	CU_ASSERT_FATAL(qmp_peer_listen(t, q));
	struct qmp_client *qmp = qmp_peer_connect(t, q);
	CU_ASSERT_PTR_NOT_NULL_FATAL(qmp);
	CU_ASSERT_PTR_NOT_NULL_FATAL(rig_open_source(t, qmp));
	return qmp;
}

static void qmp_rig_close(struct rig *t, struct qmp_peer *q, struct qmp_client *qmp)
{
	qmp_client_destroy(qmp);
	qmp_peer_close(q);
	rig_teardown(t);
}

/*
 * The source, not failed, goes away before QEMU answers command id; the
 * late reply must be harmless.  Then the rig closes.
 */
static void end_before_the_reply(struct rig *t, struct qmp_peer *q, struct qmp_client *qmp,
				 json_int_t id)
{
	CU_ASSERT_EQUAL(t->failed, 0);
	checkpoint_source_destroy(t->src);
	t->src = NULL;
	qmp_peer_reply(q, id, "\"return\": {}");
	pump_for(t, 50);
	qmp_rig_close(t, q, qmp);
}

/* The source's first look: query-yank, answered with instances (a JSON list). */
static void answer_yank(struct rig *t, struct qmp_peer *q, const char *instances)
{
	char body[256];
	json_int_t id = qmp_peer_expect(t, q, "query-yank", NULL);

	snprintf(body, sizeof(body), "\"return\": %s", instances);
	qmp_peer_reply(q, id, body);
}

static void test_qmp_starts_colo_and_lost_heartbeat_ends_it(void)
{
	struct rig t;
	struct qmp_peer q;
	json_t *args = NULL;
	char uri[200];

	struct qmp_client *qmp = qmp_rig_open(&t, &q, 0);

	answer_yank(&t, &q, "[{\"type\": \"chardev\", \"id\": \"serial0\"}]");
	json_int_t id = qmp_peer_expect(&t, &q, "migrate-set-capabilities", &args);
	json_t *caps = json_object_get(args, "capabilities");
	CU_ASSERT_EQUAL(json_array_size(caps), 2);
	bool colo_on = false, return_path_off = false;
	for (size_t i = 0; i < json_array_size(caps); i++) {
		json_t *c = json_array_get(caps, i);
		const char *name = json_string_value(json_object_get(c, "capability"));
		json_t *state = json_object_get(c, "state");

		if (name && strcmp(name, "x-colo") == 0)
			colo_on = json_is_true(state);
		if (name && strcmp(name, "return-path") == 0)
			return_path_off = json_is_false(state);
	}
	CU_ASSERT(colo_on);
	CU_ASSERT(return_path_off);
	json_decref(args);
	/* Nothing else goes out before QEMU accepted the capabilities. */
	CU_ASSERT_PTR_NULL(qmp_peer_read(&t, &q, 100));
	qmp_peer_reply(&q, id, "\"return\": {}");

	id = qmp_peer_expect(&t, &q, "migrate-set-parameters", &args);
	CU_ASSERT_EQUAL(json_integer_value(json_object_get(args, "x-checkpoint-delay")), 100);
	json_decref(args);
	qmp_peer_reply(&q, id, "\"return\": {}");

	id = qmp_peer_expect(&t, &q, "migrate", &args);
	snprintf(uri, sizeof(uri), "unix:%s", t.path);
	CU_ASSERT_STRING_EQUAL(json_string_value(json_object_get(args, "uri")), uri);
	json_decref(args);
	qmp_peer_reply(&q, id, "\"return\": {}");

	/* "QEMU" connects as the migrate command told it to. */
	CU_ASSERT_STRING_EQUAL(checkpoint_source_state(t.src), "waiting-for-qemu");
	CU_ASSERT_EQUAL_FATAL(colo_replay_connect(&t.qemu, t.path), 0);
	colo_replay_script_fixture(&t.qemu, t.fx.layout, 1);
	CU_ASSERT(pump_until(&t, replay_finished, TIMEOUT_MS));
	CU_ASSERT_STRING_EQUAL(t.qemu.error, "");
	CU_ASSERT_EQUAL(checkpoint_source_epoch(t.src), 1);

	checkpoint_source_abandon(t.src);
	CU_ASSERT_STRING_EQUAL(checkpoint_source_state(t.src), "abandoned");
	id = qmp_peer_expect(&t, &q, "x-colo-lost-heartbeat", NULL);
	CU_ASSERT(pump_until(&t, peer_closed, TIMEOUT_MS));
	/* The source may go before QEMU answers. */
	checkpoint_source_destroy(t.src);
	t.src = NULL;
	qmp_peer_reply(&q, id, "\"return\": {}");
	pump_for(&t, 50);
	CU_ASSERT_EQUAL(t.failed, 0);
	qmp_rig_close(&t, &q, qmp);
}

static void test_qmp_error_fails_with_qemu_text(void)
{
	struct rig t;
	struct qmp_peer q;

	struct qmp_client *qmp = qmp_rig_open(&t, &q, 0);

	answer_yank(&t, &q, "[]");
	json_int_t id = qmp_peer_expect(&t, &q, "migrate-set-capabilities", NULL);
	qmp_peer_reply(&q, id, "\"error\": {\"class\": \"GenericError\", \"desc\": "
		       "\"There's a migration process in progress\"}");
	CU_ASSERT(pump_until(&t, has_failed, TIMEOUT_MS));
	ASSERT_CONTAINS(t.why, "migrate-set-capabilities");
	ASSERT_CONTAINS(t.why, "There's a migration process in progress");
	CU_ASSERT_STRING_EQUAL(checkpoint_source_state(t.src), "failed");
	CU_ASSERT_EQUAL(access(t.path, F_OK), -1);

	/* No migration was started: abandoning must not touch QEMU's COLO. */
	checkpoint_source_abandon(t.src);
	CU_ASSERT_PTR_NULL(qmp_peer_read(&t, &q, 150));
	CU_ASSERT_EQUAL(t.failed, 1);
	qmp_rig_close(&t, &q, qmp);
}

static void test_qmp_reply_after_destroy_is_harmless(void)
{
	struct rig t;
	struct qmp_peer q;

	struct qmp_client *qmp = qmp_rig_open(&t, &q, 0);
	answer_yank(&t, &q, "[]");
	json_int_t id = qmp_peer_expect(&t, &q, "migrate-set-capabilities", NULL);
	checkpoint_source_destroy(t.src);
	t.src = NULL;
	qmp_peer_reply(&q, id, "\"return\": {}");
	/* The chain stopped with the source: no parameters, no migrate. */
	CU_ASSERT_PTR_NULL(qmp_peer_read(&t, &q, 150));
	CU_ASSERT_EQUAL(t.failed, 0);
	qmp_rig_close(&t, &q, qmp);
}

/*
 * QEMU's previous migration still holds its yank instance (its COLO
 * thread still leaving): no migrate-set-capabilities until it is gone,
 * or the migrate would fail and leave QEMU 7.2 stuck in SETUP.
 */
static void test_qmp_waits_for_the_previous_migration(void)
{
	struct rig t;
	struct qmp_peer q;
	const char *previous = "[{\"type\": \"migration\"}, {\"type\": \"chardev\", "
			       "\"id\": \"serial0\"}]";

	struct qmp_client *qmp = qmp_rig_open(&t, &q, 0);

	answer_yank(&t, &q, previous);
	answer_yank(&t, &q, previous); /* it looks again, and nothing else goes out */
	answer_yank(&t, &q, "[]");
	json_int_t id = qmp_peer_expect(&t, &q, "migrate-set-capabilities", NULL);
	qmp_peer_reply(&q, id, "\"return\": {}");
	id = qmp_peer_expect(&t, &q, "migrate-set-parameters", NULL);
	end_before_the_reply(&t, &q, qmp, id);
}

/* One that never ends: the source fails with what it saw, never migrating. */
static void test_qmp_gives_up_on_a_previous_migration_that_stays(void)
{
	struct rig t;
	struct qmp_peer q;
	unsigned looks = 0;

	struct qmp_client *qmp = qmp_rig_open(&t, &q, 350);

	while (!t.failed && looks < 20) {
		answer_yank(&t, &q, "[{\"type\": \"migration\"}]");
		looks++;
		pump_for(&t, 20);
	}
	CU_ASSERT(pump_until(&t, has_failed, TIMEOUT_MS));
	CU_ASSERT(looks >= 3 && looks <= 6);
	ASSERT_CONTAINS(t.why, "previous migration has not ended after 350 ms");
	ASSERT_CONTAINS(t.why, "restart its QEMU");
	CU_ASSERT_STRING_EQUAL(checkpoint_source_state(t.src), "failed");
	/* Nothing was started, so nothing is left. */
	CU_ASSERT_PTR_NULL(qmp_peer_read(&t, &q, 150));
	checkpoint_source_abandon(t.src);
	CU_ASSERT_PTR_NULL(qmp_peer_read(&t, &q, 100));
	qmp_rig_close(&t, &q, qmp);
}

/* A QEMU without query-yank: the migration starts as before. */
static void test_qmp_without_query_yank_migrates(void)
{
	struct rig t;
	struct qmp_peer q;

	struct qmp_client *qmp = qmp_rig_open(&t, &q, 0);

	json_int_t id = qmp_peer_expect(&t, &q, "query-yank", NULL);
	qmp_peer_reply(&q, id, "\"error\": {\"class\": \"CommandNotFound\", \"desc\": "
		       "\"The command query-yank has not been found\"}");
	id = qmp_peer_expect(&t, &q, "migrate-set-capabilities", NULL);
	end_before_the_reply(&t, &q, qmp, id);
}

int register_colo_capture_tests(void)
{
	CU_pSuite suite = CU_add_suite("colo_capture", NULL, NULL);

	if (!suite)
		return -1;
	if (!CU_add_test(suite, "replays 3 recorded checkpoints", test_replays_three_checkpoints) ||
	    !CU_add_test(suite, "a hold keeps LOADED until the release",
			 test_hold_keeps_loaded_until_release) ||
	    !CU_add_test(suite, "the pause's parts: stop, then sync", test_pause_parts) ||
	    !CU_add_test(suite, "backpressure holds REPLY until kick",
			 test_backpressure_holds_reply_until_kick) ||
	    !CU_add_test(suite, "bulk pause stops reading", test_bulk_pause_stops_reading) ||
	    !CU_add_test(suite, "truncated checkpoint fails", test_truncated_checkpoint_fails) ||
	    !CU_add_test(suite, "truncated bulk fails", test_truncated_bulk_fails) ||
	    !CU_add_test(suite, "garbage fails", test_garbage_fails) ||
	    !CU_add_test(suite, "unknown COLO message fails", test_unknown_colo_message_fails) ||
	    !CU_add_test(suite, "VMSTATE_SEND while held fails",
			 test_vmstate_send_while_held_fails) ||
	    !CU_add_test(suite, "nonzero ZERO fill fails", test_nonzero_fill_fails) ||
	    !CU_add_test(suite, "second connection refused", test_second_connection_refused) ||
	    !CU_add_test(suite, "owner destroys inside events", test_owner_destroys_inside_events) ||
	    !CU_add_test(suite, "open rejects bad config", test_open_rejects_bad_config) ||
	    !CU_add_test(suite, "QMP starts COLO, lost-heartbeat ends it",
			 test_qmp_starts_colo_and_lost_heartbeat_ends_it) ||
	    !CU_add_test(suite, "QMP error fails with QEMU's text",
			 test_qmp_error_fails_with_qemu_text) ||
	    !CU_add_test(suite, "QMP reply after destroy is harmless",
			 test_qmp_reply_after_destroy_is_harmless) ||
	    !CU_add_test(suite, "QMP waits for QEMU's previous migration",
			 test_qmp_waits_for_the_previous_migration) ||
	    !CU_add_test(suite, "QMP gives up on a previous migration that stays",
			 test_qmp_gives_up_on_a_previous_migration_that_stays) ||
	    !CU_add_test(suite, "QMP without query-yank migrates",
			 test_qmp_without_query_yank_migrates))
		return -1;
	return 0;
}
