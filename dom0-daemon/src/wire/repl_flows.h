/*
 * The two replication frames of commit protection's fail-safe reset
 * (issue 10; docs/protocol.md, "FLOW_STATE and FLOW_AHEAD"):
 *
 * FLOW_STATE (covered by the epoch digest, staged and committed with its
 * epoch): for the flows whose state moved during epoch N, how far the
 * guest had sent (and acknowledged) when checkpoint N was cut.  The
 * backup thus knows every TCP flow's sequence position in the image it
 * would restore.
 *
 * FLOW_AHEAD (not covered, acted on at once): the primary let out bytes
 * of a flow beyond its position at cut N, bytes that only a checkpoint
 * after N contains.  A backup that restores N or earlier must reset
 * that flow, since its client has seen output the restored guest never
 * produced.
 *
 * Pure functions over buffers, like repl_proto.h, whose framing they use.
 */
#ifndef REMUSDB_REPL_FLOWS_H
#define REMUSDB_REPL_FLOWS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buffer.h"
#include "relay/cp_flow_frame.h"
#include "wire/repl_proto.h"

#define REPL_FLOW_FORGET 0x01 /* FLOW_STATE: the primary stopped tracking the flow */
#define REPL_FLOW_RECORD_SIZE 58
#define REPL_FLOW_STATE_FIXED 12 /* be64 epoch, be32 count */
#define REPL_FLOW_STATE_MAX_RECORDS 65536
#define REPL_FLOW_AHEAD_SIZE 61

struct repl_flow_record {
	struct cp_flow_key key; /* as the guest sends: src is the guest */
	uint32_t sent_end;
	uint32_t ack;
	uint8_t guest_mac[6], peer_mac[6];
	uint8_t flags;          /* REPL_FLOW_FORGET or 0 */
};

struct repl_flow_state {
	uint64_t epoch;
	uint32_t count;
	const uint8_t *records; /* count * REPL_FLOW_RECORD_SIZE, validated */
};

struct repl_flow_ahead {
	uint64_t epoch;         /* the last cut when the bytes left */
	struct cp_flow_key key;
	uint32_t released_end;
	uint8_t guest_mac[6], peer_mac[6];
};

/* 0, or -1 with errno EINVAL (count 0 or too many, a bad key) or ENOMEM; b unchanged then. */
int repl_put_flow_state(struct buffer *b, uint64_t epoch, const struct repl_flow_record *r,
			uint32_t count);
int repl_put_flow_ahead(struct buffer *b, const struct repl_flow_ahead *a);

int repl_decode_flow_state(const struct repl_frame *f, struct repl_flow_state *out,
			   const char **err);
/* Record i (< count) of a decoded FLOW_STATE. */
void repl_flow_state_record(const struct repl_flow_state *s, uint32_t i,
			    struct repl_flow_record *out);
int repl_decode_flow_ahead(const struct repl_frame *f, struct repl_flow_ahead *out,
			   const char **err);

#endif
