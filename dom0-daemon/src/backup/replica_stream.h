/*
 * One configured session's frames (replica_stream.c): VM_CONFIG creates
 * the replica; RAM layout, pages, device state and disk frames are
 * staged; each EPOCH_END is checked against its digest, committed in one
 * call and acknowledged.
 */
#ifndef REMUSDB_REPLICA_STREAM_H
#define REMUSDB_REPLICA_STREAM_H

#include <stdbool.h>

#include "wire/repl_proto.h"

struct replica;
struct session;

/* What the stream keeps between frames. */
struct replica_stream_state {
	struct repl_digest digest; /* of the covered frames since the last EPOCH_END */
	bool bulk_done;            /* EPOCH_END 0 seen: no more unstaged pages */
};

/* 0, or -1 when out of memory. */
int replica_stream_init(struct replica *r);
void replica_stream_free(struct replica *r);
/* VM_CONFIG: validated, then the replica is created (or refused as busy). */
int replica_on_vm_config(struct session *ss, const struct repl_frame *f);
/* One frame of a configured session but BYE (the session's end); <0 ends it. */
int replica_on_frame(struct session *ss, const struct repl_frame *f);

#endif
