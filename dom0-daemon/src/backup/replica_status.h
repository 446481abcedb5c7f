/*
 * One replica's status object (replica_status.c).
 */
#ifndef REMUSDB_REPLICA_STATUS_H
#define REMUSDB_REPLICA_STATUS_H

#include <jansson.h>
#include <stdint.h>

struct heartbeat_link;
struct replica;

/*
 * hb: its primary's heartbeat link while connected, else NULL; now: the
 * monotonic clock (us) the status is taken at.  New reference, or NULL.
 */
json_t *replica_status_json(const struct replica *r, struct heartbeat_link *hb, int64_t now);

#endif
