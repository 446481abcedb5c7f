/*
 * Test helper: QEMU's side of an x-colo migration, replayed from a
 * recording in tests/fixtures/colo.  It connects to a checkpoint source's
 * socket and follows a script the way QEMU talks: send a byte range of the
 * recording, wait for the source's COLO reply, send the next range, ...
 *
 * Non-blocking and stepped by the test's own pump loop (colo_replay_run()
 * next to event_loop_run_once()), so a test needs no second thread and
 * can look at both ends between any two steps.
 */
#ifndef REMUSDB_TEST_COLO_REPLAY_H
#define REMUSDB_TEST_COLO_REPLAY_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define COLO_REPLAY_MAX_STEPS 64

enum colo_replay_kind { REPLAY_SEND, REPLAY_EXPECT, REPLAY_CLOSE };

struct colo_replay_step {
	enum colo_replay_kind kind;
	uint64_t from, to; /* SEND: bytes [from, to) of the recording */
	uint32_t message;  /* EXPECT: one be32 COLO message */
};

struct colo_replay {
	int fd; /* -1 when not connected */
	const uint8_t *data; /* the recording (borrowed) */
	size_t len;
	struct colo_replay_step steps[COLO_REPLAY_MAX_STEPS];
	size_t nsteps;
	size_t cur;        /* step being worked on */
	uint64_t sent;     /* SEND: next byte to write */
	uint8_t got[4];    /* EXPECT: bytes of the reply so far */
	size_t got_len;
	char error[256];   /* first problem; the script stops there */
};

/* A recording and its layout JSON (colo-record --layout). */
struct colo_fixture {
	uint8_t *data;
	size_t len;
	json_t *layout;
};

/* name: "tiny-pc-3ckpt".  Returns false (and prints why) if either is missing. */
bool colo_fixture_load(struct colo_fixture *fx, const char *name);
void colo_fixture_free(struct colo_fixture *fx);
/* An unsigned member of a JSON object; 0 if absent. */
uint64_t colo_json_u64(json_t *obj, const char *key);

void colo_replay_init(struct colo_replay *r, const uint8_t *data, size_t len);
/* Connects (non-blocking) to the source's socket; 0 or -1. */
int colo_replay_connect(struct colo_replay *r, const char *path);
void colo_replay_send(struct colo_replay *r, uint64_t from, uint64_t to);
void colo_replay_expect(struct colo_replay *r, uint32_t message);
void colo_replay_close_step(struct colo_replay *r);
/*
 * The conversation QEMU had while recording, from the layout JSON: the
 * bulk stream, READY, then per checkpoint (up to `checkpoints`) REQUEST,
 * REPLY, the rest of the checkpoint, RECEIVED, LOADED.
 */
void colo_replay_script_fixture(struct colo_replay *r, json_t *layout,
				unsigned checkpoints);

/* Does what it can without blocking.  True once the script ended or failed. */
bool colo_replay_run(struct colo_replay *r);
bool colo_replay_finished(const struct colo_replay *r);
/* Reads what the source sent: 1 if it closed the connection, 0 if not (yet). */
int colo_replay_peer_closed(struct colo_replay *r);
void colo_replay_disconnect(struct colo_replay *r);

#endif
