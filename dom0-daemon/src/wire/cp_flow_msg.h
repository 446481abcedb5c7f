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
#ifndef REMUSDB_CP_FLOW_MSG_H
#define REMUSDB_CP_FLOW_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buffer.h"
#include "relay/cp_flow_frame.h"
#include "wire/repl_proto.h"

#define CP_FLOW_MSG_FORGET 0x01 /* FLOW_STATE: the primary stopped tracking the flow */
#define CP_FLOW_MSG_RECORD_SIZE 58
#define CP_FLOW_MSG_STATE_FIXED 12 /* be64 epoch, be32 count */
#define CP_FLOW_MSG_STATE_MAX_RECORDS 65536
#define CP_FLOW_MSG_AHEAD_SIZE 61

struct cp_flow_msg_record {
	struct cp_flow_key key; /* as the guest sends: src is the guest */
	uint32_t sent_end;
	uint32_t ack;
	uint8_t guest_mac[6], peer_mac[6];
	uint8_t flags;          /* CP_FLOW_MSG_FORGET or 0 */
};

struct cp_flow_msg_state {
	uint64_t epoch;
	uint32_t count;
	const uint8_t *records; /* count * CP_FLOW_MSG_RECORD_SIZE, validated */
};

struct cp_flow_msg_ahead {
	uint64_t epoch;         /* the last cut when the bytes left */
	struct cp_flow_key key;
	uint32_t released_end;
	uint8_t guest_mac[6], peer_mac[6];
};

/* 0, or -1 with errno EINVAL (count 0 or too many, a bad key) or ENOMEM; b unchanged then. */
int cp_flow_msg_put_state(struct buffer *b, uint64_t epoch, const struct cp_flow_msg_record *r,
			  uint32_t count);
int cp_flow_msg_put_ahead(struct buffer *b, const struct cp_flow_msg_ahead *a);

int cp_flow_msg_decode_state(const struct repl_frame *f, struct cp_flow_msg_state *out,
			     const char **err);
/* Record i (< count) of a decoded FLOW_STATE. */
void cp_flow_msg_state_record(const struct cp_flow_msg_state *s, uint32_t i,
			      struct cp_flow_msg_record *out);
int cp_flow_msg_decode_ahead(const struct repl_frame *f, struct cp_flow_msg_ahead *out,
			     const char **err);

#endif
