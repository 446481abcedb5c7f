/*
 * The backup's record of commit protection's flow positions
 * (cp_flow_msg.h): the committed one (each flow's position in the image
 * a takeover would restore), the open epoch's staged FLOW_STATE records,
 * and the FLOW_AHEAD notices.  At a takeover it names the flows to reset:
 * those the primary let bytes out of beyond their position at a cut no
 * older than the restored one.
 */
#ifndef REMUSDB_REPLICA_FLOWS_H
#define REMUSDB_REPLICA_FLOWS_H

#include <stddef.h>
#include <stdint.h>

#include "relay/cp_flow_reset.h"
#include "wire/cp_flow_msg.h"

struct replica_flows_stats {
	uint64_t committed_flows; /* now */
	uint64_t records;         /* FLOW_STATE records received */
	uint64_t ahead_notices;   /* FLOW_AHEAD received */
	uint64_t newest_ahead_epoch; /* the newest cut a FLOW_AHEAD named */
};

struct replica_flows;

struct replica_flows *replica_flows_create(void);
void replica_flows_destroy(struct replica_flows *rf); /* NULL is a no-op */
/* The open epoch's FLOW_STATE.  0, or -1 when out of memory. */
int replica_flows_stage(struct replica_flows *rf, const struct cp_flow_msg_state *s);
/* Epoch `epoch` was committed: its records become the committed positions.  0 or -1 (memory). */
int replica_flows_commit(struct replica_flows *rf, uint64_t epoch);
/* The open epoch was thrown away. */
void replica_flows_discard(struct replica_flows *rf);
/* 0, or -1 when out of memory. */
int replica_flows_ahead(struct replica_flows *rf, const struct cp_flow_msg_ahead *a);
/*
 * The flows a takeover that restores `committed` must reset, each given
 * to fn with the positions known of it, then every other committed flow
 * as one to verify (cp_flow_reset.h).  Returns how many to reset, with
 * *verify how many to verify, or -1 when fn failed.
 */
long replica_flows_to_reset(struct replica_flows *rf, uint64_t committed,
			    int (*fn)(void *opaque, const struct cp_flow_reset_target *t),
			    void *opaque, long *verify);
void replica_flows_get_stats(const struct replica_flows *rf, struct replica_flows_stats *out);

#endif
