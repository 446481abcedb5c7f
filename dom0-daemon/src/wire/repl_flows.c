/* FLOW_STATE and FLOW_AHEAD frames (repl_flows.h). */
#include "wire/repl_flows.h"

#include <errno.h>
#include <string.h>

#include "base/be.h"

#define KEY_SIZE 37 /* family, src 16, dst 16, sport, dport */

/*
 * A key is canonical: family 4 or 6, and an IPv4 key's unused address
 * bytes are zero, so that the same flow always hashes the same.
 */
static bool key_ok(const struct cp_flow_key *k)
{
	static const uint8_t zeros[12];

	if (k->family == 6)
		return true;
	return k->family == 4 && !memcmp(k->src + 4, zeros, 12) && !memcmp(k->dst + 4, zeros, 12);
}

static uint8_t *put_key(uint8_t *p, const struct cp_flow_key *k)
{
	p[0] = k->family;
	memcpy(p + 1, k->src, 16);
	memcpy(p + 17, k->dst, 16);
	store_be16(p + 33, k->sport);
	store_be16(p + 35, k->dport);
	return p + KEY_SIZE;
}

static const uint8_t *get_key(const uint8_t *p, struct cp_flow_key *k)
{
	memset(k, 0, sizeof(*k));
	k->family = p[0];
	memcpy(k->src, p + 1, 16);
	memcpy(k->dst, p + 17, 16);
	k->sport = load_be16(p + 33);
	k->dport = load_be16(p + 35);
	return p + KEY_SIZE;
}

int repl_put_flow_state(struct buffer *b, uint64_t epoch, const struct repl_flow_record *r,
			uint32_t count)
{
	if (count == 0 || count > REPL_FLOW_STATE_MAX_RECORDS) {
		errno = EINVAL;
		return -1;
	}
	for (uint32_t i = 0; i < count; i++) {
		if (!key_ok(&r[i].key) || (r[i].flags & ~REPL_FLOW_FORGET)) {
			errno = EINVAL;
			return -1;
		}
	}
	size_t length = REPL_FLOW_STATE_FIXED + (size_t)count * REPL_FLOW_RECORD_SIZE;
	uint8_t *p = repl_begin_frame(b, REPL_FLOW_STATE, length);
	if (!p)
		return -1;
	store_be64(p, epoch);
	store_be32(p + 8, count);
	p += REPL_FLOW_STATE_FIXED;
	for (uint32_t i = 0; i < count; i++) {
		p = put_key(p, &r[i].key);
		store_be32(p, r[i].sent_end);
		store_be32(p + 4, r[i].ack);
		memcpy(p + 8, r[i].guest_mac, 6);
		memcpy(p + 14, r[i].peer_mac, 6);
		p[20] = r[i].flags;
		p += 21;
	}
	buffer_commit(b, REPL_HEADER_SIZE + length);
	return 0;
}

int repl_put_flow_ahead(struct buffer *b, const struct repl_flow_ahead *a)
{
	if (!key_ok(&a->key)) {
		errno = EINVAL;
		return -1;
	}
	uint8_t *p = repl_begin_frame(b, REPL_FLOW_AHEAD, REPL_FLOW_AHEAD_SIZE);
	if (!p)
		return -1;
	store_be64(p, a->epoch);
	p = put_key(p + 8, &a->key);
	store_be32(p, a->released_end);
	memcpy(p + 4, a->guest_mac, 6);
	memcpy(p + 10, a->peer_mac, 6);
	buffer_commit(b, REPL_HEADER_SIZE + REPL_FLOW_AHEAD_SIZE);
	return 0;
}

static int fail(const char **err, const char *msg)
{
	if (err)
		*err = msg;
	return -1;
}

int repl_decode_flow_state(const struct repl_frame *f, struct repl_flow_state *out,
			   const char **err)
{
	if (f->type != REPL_FLOW_STATE || f->flags != 0)
		return fail(err, "FLOW_STATE: wrong frame type or flags");
	if (f->length < REPL_FLOW_STATE_FIXED + REPL_FLOW_RECORD_SIZE)
		return fail(err, "FLOW_STATE: shorter than one record");
	uint32_t count = load_be32(f->payload + 8);
	if (count == 0 || count > REPL_FLOW_STATE_MAX_RECORDS)
		return fail(err, "FLOW_STATE: record count 0 or over 65536");
	if (f->length != REPL_FLOW_STATE_FIXED + (uint64_t)count * REPL_FLOW_RECORD_SIZE)
		return fail(err, "FLOW_STATE: length does not match the record count");
	const uint8_t *p = f->payload + REPL_FLOW_STATE_FIXED;
	for (uint32_t i = 0; i < count; i++, p += REPL_FLOW_RECORD_SIZE) {
		struct cp_flow_key k;
		get_key(p, &k);
		if (!key_ok(&k))
			return fail(err, "FLOW_STATE: a record's flow key is malformed");
		if (p[KEY_SIZE + 20] & ~REPL_FLOW_FORGET)
			return fail(err, "FLOW_STATE: a record has unknown flags");
	}
	out->epoch = load_be64(f->payload);
	out->count = count;
	out->records = f->payload + REPL_FLOW_STATE_FIXED;
	return 0;
}

void repl_flow_state_record(const struct repl_flow_state *s, uint32_t i,
			    struct repl_flow_record *out)
{
	const uint8_t *p = get_key(s->records + (size_t)i * REPL_FLOW_RECORD_SIZE, &out->key);

	out->sent_end = load_be32(p);
	out->ack = load_be32(p + 4);
	memcpy(out->guest_mac, p + 8, 6);
	memcpy(out->peer_mac, p + 14, 6);
	out->flags = p[20];
}

int repl_decode_flow_ahead(const struct repl_frame *f, struct repl_flow_ahead *out,
			   const char **err)
{
	if (f->type != REPL_FLOW_AHEAD || f->flags != 0)
		return fail(err, "FLOW_AHEAD: wrong frame type or flags");
	if (f->length != REPL_FLOW_AHEAD_SIZE)
		return fail(err, "FLOW_AHEAD: payload is not 61 bytes");
	out->epoch = load_be64(f->payload);
	const uint8_t *p = get_key(f->payload + 8, &out->key);
	if (!key_ok(&out->key))
		return fail(err, "FLOW_AHEAD: the flow key is malformed");
	out->released_end = load_be32(p);
	memcpy(out->guest_mac, p + 4, 6);
	memcpy(out->peer_mac, p + 10, 6);
	return 0;
}
