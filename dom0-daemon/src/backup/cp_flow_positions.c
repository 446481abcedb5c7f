/* Flow positions on the backup (cp_flow_positions.h). */
#include "backup/cp_flow_positions.h"

#include <stdlib.h>
#include <string.h>

#include "relay/cp_flow_table.h"

/*
 * The committed positions reuse the primary's flow table: seen/sent_end/
 * ack are the position at the last committed cut; released_any/
 * released_end and ahead_epoch (below, per flow) come from FLOW_AHEAD.
 */
struct ahead {
	struct cp_flow_key key;
	uint64_t epoch; /* the newest cut it named */
};

struct cp_flow_positions {
	struct cp_flow_table *committed;
	struct cp_flow_msg_record *staged;
	size_t staged_count, staged_cap;
	struct ahead *aheads;
	size_t ahead_count, ahead_cap;
	struct cp_flow_positions_stats stats;
};

struct cp_flow_positions *cp_flow_positions_create(void)
{
	struct cp_flow_positions *pos = calloc(1, sizeof(*pos));

	if (!pos)
		return NULL;
	pos->committed = cp_flow_table_create();
	if (!pos->committed) {
		free(pos);
		return NULL;
	}
	return pos;
}

void cp_flow_positions_destroy(struct cp_flow_positions *pos)
{
	if (!pos)
		return;
	cp_flow_table_destroy(pos->committed);
	free(pos->staged);
	free(pos->aheads);
	free(pos);
}

static int grow(void **array, size_t *cap, size_t need, size_t size)
{
	if (need <= *cap)
		return 0;
	size_t n = *cap ? *cap : 64;
	while (n < need)
		n *= 2;
	void *grown = realloc(*array, n * size);
	if (!grown)
		return -1;
	*array = grown;
	*cap = n;
	return 0;
}

int cp_flow_positions_stage(struct cp_flow_positions *pos, const struct cp_flow_msg_state *s)
{
	if (grow((void **)&pos->staged, &pos->staged_cap, pos->staged_count + s->count,
		 sizeof(*pos->staged)) < 0)
		return -1;
	for (uint32_t i = 0; i < s->count; i++)
		cp_flow_msg_state_record(s, i, &pos->staged[pos->staged_count++]);
	pos->stats.records += s->count;
	return 0;
}

/* FORGET cleared `seen`; a flow a notice named stays for the takeover. */
static bool forget_marked(void *opaque, const struct cp_flow_key *k, struct cp_flow_seq *s)
{
	return !s->seen && !s->released_any;
}

int cp_flow_positions_commit(struct cp_flow_positions *pos, uint64_t epoch)
{
	bool forgets = false;

	for (size_t i = 0; i < pos->staged_count; i++) {
		const struct cp_flow_msg_record *r = &pos->staged[i];
		struct cp_flow_seq *s = cp_flow_table_seq(pos->committed, &r->key);
		if (!s)
			return -1;
		if (r->flags & CP_FLOW_MSG_FORGET) {
			s->seen = false;
			forgets = true;
			continue;
		}
		s->seen = true;
		s->sent_end = r->sent_end;
		s->ack = r->ack;
		memcpy(s->guest_mac, r->guest_mac, 6);
		memcpy(s->peer_mac, r->peer_mac, 6);
	}
	pos->staged_count = 0;
	/* A notice of a cut older than the committed one can no longer cause a reset. */
	size_t kept = 0;
	for (size_t i = 0; i < pos->ahead_count; i++)
		if (pos->aheads[i].epoch >= epoch)
			pos->aheads[kept++] = pos->aheads[i];
	pos->ahead_count = kept;
	if (forgets)
		cp_flow_table_each(pos->committed, forget_marked, NULL);
	pos->stats.committed_flows = cp_flow_table_known(pos->committed);
	return 0;
}

void cp_flow_positions_discard(struct cp_flow_positions *pos)
{
	pos->staged_count = 0;
}

int cp_flow_positions_ahead(struct cp_flow_positions *pos, const struct cp_flow_msg_ahead *a)
{
	struct ahead *x = NULL;

	pos->stats.ahead_notices++;
	if (a->epoch > pos->stats.newest_ahead_epoch)
		pos->stats.newest_ahead_epoch = a->epoch;
	for (size_t i = 0; i < pos->ahead_count; i++)
		if (!memcmp(&pos->aheads[i].key, &a->key, sizeof(a->key)))
			x = &pos->aheads[i];
	if (!x) {
		if (grow((void **)&pos->aheads, &pos->ahead_cap, pos->ahead_count + 1,
			 sizeof(*pos->aheads)) < 0)
			return -1;
		x = &pos->aheads[pos->ahead_count++];
		x->key = a->key;
		x->epoch = a->epoch;
	}
	if (a->epoch > x->epoch)
		x->epoch = a->epoch;
	/* The client's position and the MACs go with the flow's committed state. */
	struct cp_flow_seq *s = cp_flow_table_seq(pos->committed, &a->key);
	if (!s)
		return -1;
	if (!s->released_any || cp_flow_frame_seq_after(a->released_end, s->released_end))
		s->released_end = a->released_end;
	s->released_any = true;
	if (!s->seen) {
		memcpy(s->guest_mac, a->guest_mac, 6);
		memcpy(s->peer_mac, a->peer_mac, 6);
	}
	return 0;
}

static bool named_by_notice(const struct cp_flow_positions *pos, const struct cp_flow_key *k,
			    uint64_t committed)
{
	for (size_t i = 0; i < pos->ahead_count; i++)
		if (pos->aheads[i].epoch >= committed &&
		    !memcmp(&pos->aheads[i].key, k, sizeof(*k)))
			return true;
	return false;
}

struct verify_walk {
	const struct cp_flow_positions *pos;
	uint64_t committed;
	int (*fn)(void *opaque, const struct cp_flow_reset_target *t);
	void *opaque;
	long n;
	bool failed;
};

/* A committed flow no notice names: verified against the client (cp_flow_reset.h). */
static bool visit_verify(void *opaque, const struct cp_flow_key *k, struct cp_flow_seq *s)
{
	struct verify_walk *w = opaque;

	if (w->failed || !s->seen || named_by_notice(w->pos, k, w->committed))
		return false;
	struct cp_flow_reset_target t = { .key = *k, .verify = true, .cut_end = s->sent_end,
				       .guest_seq_known = true, .guest_seq = s->ack };
	memcpy(t.guest_mac, s->guest_mac, 6);
	memcpy(t.peer_mac, s->peer_mac, 6);
	if (w->fn(w->opaque, &t) < 0)
		w->failed = true;
	else
		w->n++;
	return false;
}

long cp_flow_positions_to_reset(struct cp_flow_positions *pos, uint64_t committed,
				int (*fn)(void *opaque, const struct cp_flow_reset_target *t),
				void *opaque, long *verify)
{
	long n = 0;
	struct verify_walk w = { .pos = pos, .committed = committed, .fn = fn, .opaque = opaque };

	for (size_t i = 0; i < pos->ahead_count; i++) {
		const struct ahead *x = &pos->aheads[i];
		/*
		 * Bytes released after cut E exist only in checkpoints after
		 * E: restoring E or older leaves the client ahead.
		 */
		if (x->epoch < committed)
			continue;
		const struct cp_flow_seq *s = cp_flow_table_find_seq(pos->committed, &x->key);
		struct cp_flow_reset_target t = { .key = x->key };
		if (s) {
			memcpy(t.guest_mac, s->guest_mac, 6);
			memcpy(t.peer_mac, s->peer_mac, 6);
			t.client_seq_known = s->released_any;
			t.client_seq = s->released_end;
			t.guest_seq_known = s->seen;
			t.guest_seq = s->ack;
		}
		if (fn(opaque, &t) < 0)
			return -1;
		n++;
	}
	cp_flow_table_each(pos->committed, visit_verify, &w);
	if (w.failed)
		return -1;
	*verify = w.n;
	return n;
}

void cp_flow_positions_get_stats(const struct cp_flow_positions *pos,
				 struct cp_flow_positions_stats *out)
{
	*out = pos->stats;
	out->committed_flows = cp_flow_table_known(pos->committed);
}
