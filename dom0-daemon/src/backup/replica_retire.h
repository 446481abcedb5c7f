/*
 * Retiring idle replicas (replica_retire.c): when and why.
 */
#ifndef REMUSDB_REPLICA_RETIRE_H
#define REMUSDB_REPLICA_RETIRE_H

#include <jansson.h>
#include <stdint.h>

#include "base/event_loop.h"

struct replica;

struct replica_retirement {
	int64_t idle_since_us; /* 0 while in use */
};

/* The server's timer (data: the server), retiring idle replicas. */
long replica_retire_tick(event_loop *loop, long long id, void *data);
/* Status: when it goes by itself ({idle_s, retired_in_s}) or null. */
json_t *replica_retire_json(const struct replica *r);

#endif
