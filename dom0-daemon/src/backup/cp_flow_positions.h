/*
 * The backup's record of commit protection's flow positions
 * (cp_flow_msg.h): the committed one (each flow's position in the image
 * a takeover would restore), the open epoch's staged FLOW_STATE records,
 * and the FLOW_AHEAD notices.  At a takeover it names the flows to reset:
 * those the primary let bytes out of beyond their position at a cut no
 * older than the restored one.
 */
#ifndef REMUSDB_CP_FLOW_POSITIONS_H
#define REMUSDB_CP_FLOW_POSITIONS_H

#include <stddef.h>
#include <stdint.h>

#include "relay/cp_flow_reset.h"
#include "wire/cp_flow_msg.h"

struct cp_flow_positions_stats {
	uint64_t committed_flows; /* now */
	uint64_t records;         /* FLOW_STATE records received */
	uint64_t ahead_notices;   /* FLOW_AHEAD received */
	uint64_t newest_ahead_epoch; /* the newest cut a FLOW_AHEAD named */
};

struct cp_flow_positions;

struct cp_flow_positions *cp_flow_positions_create(void);
void cp_flow_positions_destroy(struct cp_flow_positions *pos); /* NULL is a no-op */
/* The open epoch's FLOW_STATE.  0, or -1 when out of memory. */
int cp_flow_positions_stage(struct cp_flow_positions *pos, const struct cp_flow_msg_state *s);
/* Epoch `epoch` was committed: its records become the committed positions.  0 or -1 (memory). */
int cp_flow_positions_commit(struct cp_flow_positions *pos, uint64_t epoch);
/* The open epoch was thrown away. */
void cp_flow_positions_discard(struct cp_flow_positions *pos);
/* 0, or -1 when out of memory. */
int cp_flow_positions_ahead(struct cp_flow_positions *pos, const struct cp_flow_msg_ahead *a);
/*
 * The flows a takeover that restores `committed` must reset, each given
 * to fn with the positions known of it, then every other committed flow
 * as one to verify (cp_flow_reset.h).  Returns how many to reset, with
 * *verify how many to verify, or -1 when fn failed.
 */
long cp_flow_positions_to_reset(struct cp_flow_positions *pos, uint64_t committed,
				int (*fn)(void *opaque, const struct cp_flow_reset_target *t),
				void *opaque, long *verify);
void cp_flow_positions_get_stats(const struct cp_flow_positions *pos,
				 struct cp_flow_positions_stats *out);

#endif
