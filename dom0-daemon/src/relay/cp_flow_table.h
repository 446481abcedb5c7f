/*
 * Commit protection's table of the guest's TCP flows on the primary: how
 * many frames of each flow output commit holds right now, and each
 * flow's sequence position (for the fail-safe reset).
 *
 * Why per flow: an unmarked frame may leave at once, but not ahead of a
 * held frame of its own connection, or the client would see bytes out
 * of order (and TCP would hold them anyway, or worse, ack a gap).  So a
 * flow with held frames holds its later frames too, marked or not.
 */
#ifndef REMUSDB_CP_FLOW_TABLE_H
#define REMUSDB_CP_FLOW_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "relay/cp_flow_frame.h"

/*
 * What the primary's relay knows of one flow's sequence space, guest
 * side (RemusDB's fail-safe reset, issue 10): how far the guest has sent,
 * how far it had sent at the last checkpoint cut, and how far the relay
 * let bytes out.  The backup resets at failover every flow whose released
 * bytes or acknowledgements are ahead of the checkpoint it restores.
 */
struct cp_flow_seq {
	bool seen;             /* sent_end and ack are valid */
	bool cut_known;        /* cut_end is valid (a cut came after the first frame) */
	bool released_any;
	bool changed;          /* sent_end or ack moved since the last cut */
	bool ack_seen;         /* ack is valid (a frame with ACK set came) */
	bool cut_ack_known;    /* cut_ack is valid */
	uint32_t sent_end;     /* highest sequence end the guest sent */
	uint32_t ack;          /* the guest's last acknowledgement (its rcv_nxt, at most) */
	uint32_t cut_end;      /* sent_end at the last cut */
	uint32_t cut_ack;      /* ack at the last cut */
	uint32_t released_end; /* highest sequence end let out to the LAN */
	uint64_t last_epoch;   /* the open epoch of its last frame */
	uint8_t guest_mac[6], peer_mac[6];
};

struct cp_flow_table;

struct cp_flow_table *cp_flow_table_create(void);
void cp_flow_table_destroy(struct cp_flow_table *t); /* NULL is a no-op */
/* Frames of the flow held now (0 for an unknown flow). */
uint32_t cp_flow_table_held(const struct cp_flow_table *t, const struct cp_flow_key *k);
/* One more frame of the flow is held.  -1 when out of memory. */
int cp_flow_table_add(struct cp_flow_table *t, const struct cp_flow_key *k);
/* One frame of the flow left. */
void cp_flow_table_remove(struct cp_flow_table *t, const struct cp_flow_key *k);
/* Everything held was dropped (fencing): every flow is forgotten. */
void cp_flow_table_clear(struct cp_flow_table *t);
/* Flows with frames held now. */
size_t cp_flow_table_count(const struct cp_flow_table *t);
/* Flows known at all (held or tracked). */
size_t cp_flow_table_known(const struct cp_flow_table *t);

/* The flow's sequence state, created (zeroed) if new; NULL when out of memory. */
struct cp_flow_seq *cp_flow_table_seq(struct cp_flow_table *t, const struct cp_flow_key *k);
/* The flow's sequence state, or NULL for an unknown flow. */
struct cp_flow_seq *cp_flow_table_find_seq(const struct cp_flow_table *t,
					   const struct cp_flow_key *k);
/*
 * Calls fn for every known flow; a flow for which fn returns true is
 * forgotten unless frames of it are held.
 */
typedef bool (*cp_flow_table_visit)(void *opaque, const struct cp_flow_key *k,
				    struct cp_flow_seq *s);
void cp_flow_table_each(struct cp_flow_table *t, cp_flow_table_visit fn, void *opaque);

#endif
