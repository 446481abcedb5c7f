/* QEMU's side of an x-colo migration, replayed from a recording; see colo_replay.h. */
#include "colo_replay.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "qemu/migration_writer.h"
#include "base/unix_socket.h"

#ifndef FIXTURE_DIR
#define FIXTURE_DIR "../../tests/fixtures" /* from dom0-daemon/build */
#endif

/* Small writes: the source sees the stream in many pieces, as from QEMU. */
#define WRITE_PIECE (64 * 1024)

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

bool colo_fixture_load(struct colo_fixture *fx, const char *name)
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

void colo_fixture_free(struct colo_fixture *fx)
{
	free(fx->data);
	json_decref(fx->layout);
	memset(fx, 0, sizeof(*fx));
}

uint64_t colo_json_u64(json_t *obj, const char *key)
{
	json_t *v = json_object_get(obj, key);

	return json_is_integer(v) && json_integer_value(v) >= 0 ?
		       (uint64_t)json_integer_value(v) : 0;
}

void colo_replay_init(struct colo_replay *r, const uint8_t *data, size_t len)
{
	memset(r, 0, sizeof(*r));
	r->fd = -1;
	r->data = data;
	r->len = len;
}

int colo_replay_connect(struct colo_replay *r, const char *path)
{
	r->fd = unix_connect(path);
	return r->fd < 0 ? -1 : 0;
}

static struct colo_replay_step *add_step(struct colo_replay *r)
{
	if (r->nsteps == COLO_REPLAY_MAX_STEPS) {
		snprintf(r->error, sizeof(r->error), "script longer than %d steps",
			 COLO_REPLAY_MAX_STEPS);
		return NULL;
	}
	struct colo_replay_step *s = &r->steps[r->nsteps++];
	memset(s, 0, sizeof(*s));
	return s;
}

void colo_replay_send(struct colo_replay *r, uint64_t from, uint64_t to)
{
	struct colo_replay_step *s = add_step(r);

	if (!s)
		return;
	if (from > to || to > r->len)
		snprintf(r->error, sizeof(r->error), "bad range [%llu, %llu)",
			 (unsigned long long)from, (unsigned long long)to);
	s->kind = REPLAY_SEND;
	s->from = from;
	s->to = to;
	if (r->nsteps == 1)
		r->sent = from;
}

void colo_replay_expect(struct colo_replay *r, uint32_t message)
{
	struct colo_replay_step *s = add_step(r);

	if (s) {
		s->kind = REPLAY_EXPECT;
		s->message = message;
	}
}

void colo_replay_close_step(struct colo_replay *r)
{
	struct colo_replay_step *s = add_step(r);

	if (s)
		s->kind = REPLAY_CLOSE;
}

void colo_replay_script_fixture(struct colo_replay *r, json_t *layout,
				unsigned checkpoints)
{
	json_t *ckpts = json_object_get(layout, "checkpoints");

	colo_replay_send(r, 0, colo_json_u64(json_object_get(layout, "bulk"),
					     "end_offset"));
	colo_replay_expect(r, COLO_MSG_CHECKPOINT_READY);
	for (unsigned i = 0; i < checkpoints && i < json_array_size(ckpts); i++) {
		json_t *c = json_array_get(ckpts, i);
		uint64_t request = colo_json_u64(c, "request_offset");

		colo_replay_send(r, request, request + 4);
		colo_replay_expect(r, COLO_MSG_CHECKPOINT_REPLY);
		colo_replay_send(r, colo_json_u64(c, "vmstate_send_offset"),
				 colo_json_u64(c, "blob_end"));
		colo_replay_expect(r, COLO_MSG_VMSTATE_RECEIVED);
		colo_replay_expect(r, COLO_MSG_VMSTATE_LOADED);
	}
}

bool colo_replay_finished(const struct colo_replay *r)
{
	return r->error[0] || r->cur >= r->nsteps;
}

/* Moves to the next step; a SEND starts at its own range. */
static void next_step(struct colo_replay *r)
{
	r->cur++;
	r->got_len = 0;
	if (r->cur < r->nsteps && r->steps[r->cur].kind == REPLAY_SEND)
		r->sent = r->steps[r->cur].from;
}

/* Returns true if the step is done. */
static bool run_send(struct colo_replay *r, const struct colo_replay_step *s)
{
	while (r->sent < s->to) {
		size_t n = s->to - r->sent < WRITE_PIECE ? (size_t)(s->to - r->sent) :
							      WRITE_PIECE;
		ssize_t w = send(r->fd, r->data + r->sent, n, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
				return false;
			snprintf(r->error, sizeof(r->error), "sending at %llu: %s",
				 (unsigned long long)r->sent, strerror(errno));
			return false;
		}
		r->sent += (uint64_t)w;
	}
	return true;
}

static bool run_expect(struct colo_replay *r, const struct colo_replay_step *s)
{
	while (r->got_len < sizeof(r->got)) {
		ssize_t n = recv(r->fd, r->got + r->got_len, sizeof(r->got) - r->got_len,
				 MSG_DONTWAIT);
		if (n == 0) {
			snprintf(r->error, sizeof(r->error), "the source closed the "
				 "connection while QEMU waited for %s",
				 colo_message_name(s->message));
			return false;
		}
		if (n < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
				snprintf(r->error, sizeof(r->error), "receiving: %s",
					 strerror(errno));
			return false;
		}
		r->got_len += (size_t)n;
	}
	if (load_be32(r->got) != s->message) {
		snprintf(r->error, sizeof(r->error), "expected %s, got 0x%08x",
			 colo_message_name(s->message), load_be32(r->got));
		return false;
	}
	return true;
}

bool colo_replay_run(struct colo_replay *r)
{
	while (!colo_replay_finished(r)) {
		const struct colo_replay_step *s = &r->steps[r->cur];
		bool done;

		if (s->kind == REPLAY_CLOSE) {
			colo_replay_disconnect(r);
			done = true;
		} else if (r->fd < 0) {
			snprintf(r->error, sizeof(r->error), "not connected");
			return true;
		} else if (s->kind == REPLAY_SEND) {
			done = run_send(r, s);
		} else {
			done = run_expect(r, s);
		}
		if (!done)
			return colo_replay_finished(r);
		next_step(r);
	}
	return true;
}

int colo_replay_peer_closed(struct colo_replay *r)
{
	uint8_t byte;

	if (r->fd < 0)
		return 1;
	for (;;) {
		ssize_t n = recv(r->fd, &byte, 1, MSG_DONTWAIT);
		if (n == 0)
			return 1;
		if (n < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : 1;
	}
}

void colo_replay_disconnect(struct colo_replay *r)
{
	if (r->fd >= 0)
		close(r->fd);
	r->fd = -1;
}
