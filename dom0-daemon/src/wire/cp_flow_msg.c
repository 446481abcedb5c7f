/*
 * FLOW_STATE and FLOW_AHEAD frames (cp_flow_msg.h).  Their fixed fields,
 * FLOW_STATE's records included, are declared in repl_fields.h; what is
 * left here is the rules that span fields (a canonical key) and the
 * record list.
 */
#include "wire/cp_flow_msg.h"

#include <errno.h>
#include <string.h>

#include "wire/repl_fields.h"
#include "wire/repl_proto_internal.h"

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

int cp_flow_msg_put_state(struct buffer *b, uint64_t epoch, const struct cp_flow_msg_record *r,
			  uint32_t count)
{
	const struct cp_flow_msg_state hdr = { .epoch = epoch, .count = count };

	/* The count first: the loop below trusts it. */
	if (repl_fields_check(&repl_flow_state_layout, &hdr) < 0)
		return repl_invalid();
	for (uint32_t i = 0; i < count; i++)
		if (!key_ok(&r[i].key) || repl_fields_check(&repl_flow_record_layout, &r[i]) < 0)
			return repl_invalid();
	size_t tail = (size_t)count * CP_FLOW_MSG_RECORD_SIZE;
	uint8_t *p = repl_begin_fields(b, &repl_flow_state_layout, &hdr, tail);
	if (!p)
		return -1;
	for (uint32_t i = 0; i < count; i++, p += CP_FLOW_MSG_RECORD_SIZE)
		repl_fields_store(&repl_flow_record_layout, p, &r[i]);
	repl_end_frame(b, CP_FLOW_MSG_STATE_FIXED + tail);
	return 0;
}

int cp_flow_msg_put_ahead(struct buffer *b, const struct cp_flow_msg_ahead *a)
{
	if (!key_ok(&a->key))
		return repl_invalid();
	return repl_put_fields(b, &repl_flow_ahead_layout, a);
}

int cp_flow_msg_decode_state(const struct repl_frame *f, struct cp_flow_msg_state *out,
			     const char **err)
{
	struct cp_flow_msg_state hdr;

	if (f->type != REPL_FLOW_STATE || f->flags != 0)
		return repl_fail(err, "FLOW_STATE: wrong frame type or flags");
	if (f->length < CP_FLOW_MSG_STATE_FIXED + CP_FLOW_MSG_RECORD_SIZE)
		return repl_fail(err, "FLOW_STATE: shorter than one record");
	if (repl_fields_load(&repl_flow_state_layout, f->payload, &hdr, err) < 0)
		return -1;
	if (f->length != CP_FLOW_MSG_STATE_FIXED + (uint64_t)hdr.count * CP_FLOW_MSG_RECORD_SIZE)
		return repl_fail(err, "FLOW_STATE: length does not match the record count");
	const uint8_t *p = f->payload + CP_FLOW_MSG_STATE_FIXED;
	for (uint32_t i = 0; i < hdr.count; i++, p += CP_FLOW_MSG_RECORD_SIZE) {
		struct cp_flow_msg_record r;

		memset(&r, 0, sizeof(r));
		if (repl_fields_load(&repl_flow_record_layout, p, &r, err) < 0)
			return -1;
		if (!key_ok(&r.key))
			return repl_fail(err, "FLOW_STATE: a record's flow key is malformed");
	}
	out->epoch = hdr.epoch;
	out->count = hdr.count;
	out->records = f->payload + CP_FLOW_MSG_STATE_FIXED;
	return 0;
}

void cp_flow_msg_state_record(const struct cp_flow_msg_state *s, uint32_t i,
			      struct cp_flow_msg_record *out)
{
	/* Zeroed first: the key's padding too, so that equal keys compare equal. */
	memset(out, 0, sizeof(*out));
	repl_fields_load(&repl_flow_record_layout, s->records + (size_t)i * CP_FLOW_MSG_RECORD_SIZE,
			 out, NULL);
}

int cp_flow_msg_decode_ahead(const struct repl_frame *f, struct cp_flow_msg_ahead *out,
			     const char **err)
{
	if (f->type != REPL_FLOW_AHEAD || f->flags != 0)
		return repl_fail(err, "FLOW_AHEAD: wrong frame type or flags");
	if (f->length != CP_FLOW_MSG_AHEAD_SIZE)
		return repl_fail(err, "FLOW_AHEAD: payload is not 61 bytes");
	memset(out, 0, sizeof(*out));
	if (repl_fields_load(&repl_flow_ahead_layout, f->payload, out, err) < 0)
		return -1;
	if (!key_ok(&out->key))
		return repl_fail(err, "FLOW_AHEAD: the flow key is malformed");
	return 0;
}
