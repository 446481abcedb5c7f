/*
 * A takeover's flow resets (cp_flow_takeover.c), wired to the VM's relay on
 * this host, and the flows' status.
 */
#ifndef REMUSDB_CP_FLOW_TAKEOVER_H
#define REMUSDB_CP_FLOW_TAKEOVER_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "relay/cp_flow_reset.h"

struct replica;

struct cp_flow_takeover {
	struct cp_flow_reset *engine;
	struct cp_flow_reset_stats stats; /* kept when the engine ends */
	bool done;
	long long timer;
	int ticks;
	int64_t started_us;
};

/* The VM's relay exists here: reset the flows that must be, client side first. */
void cp_flow_takeover_begin(struct replica *r);
/* The restored guest runs: its side of the resets. */
void cp_flow_takeover_guest_running(struct replica *r);
/* The relay back to pass-through (also at shutdown). */
void cp_flow_takeover_end(struct replica *r);
/* Status: flows. */
json_t *cp_flow_takeover_json(const struct replica *r);

#endif
