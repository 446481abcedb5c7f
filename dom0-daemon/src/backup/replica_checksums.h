/*
 * image-checksums: the backup half of checking that its image equals the
 * guest's memory at a checkpoint (protection.h, hold-checkpoint, is the
 * primary half).  The XXH3-64 of every page of one RAM block of the
 * committed image is written to a file, big-endian, page after page.
 *
 * A 1 GiB block is 262144 pages, ~70 ms of hashing: it is done a slice
 * per loop turn so that heartbeats and frames are never kept waiting, and
 * it fails (never reports a mixed image) if an epoch commits meanwhile.
 */
#ifndef REMUSDB_REPLICA_CHECKSUMS_H
#define REMUSDB_REPLICA_CHECKSUMS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

struct replica;

struct replica_checksums {
	enum { SUMS_IDLE, SUMS_RUNNING, SUMS_DONE, SUMS_FAILED } state;
	int fd;
	unsigned block;
	char block_name[64];
	uint64_t epoch;   /* the committed epoch the checksums are of */
	uint64_t next, pages;
	long long timer;
	char path[256];
	char error[256];
};

void replica_checksums_init(struct replica_checksums *c);
/* Starts writing block `block_name`'s checksums to path; 0, or -1 with err. */
int replica_checksums_start(struct replica *r, const char *block_name, const char *path,
			    char *err, size_t errlen);
/* Stops a running job (the replica goes away). */
void replica_checksums_stop(struct replica *r);
/* Status: image_checksums. */
json_t *replica_checksums_json(const struct replica *r);

#endif
