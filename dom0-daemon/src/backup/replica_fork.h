/*
 * A fork of a protected VM from its committed image (replica_fork.c): the
 * replica's half.
 */
#ifndef REMUSDB_REPLICA_FORK_H
#define REMUSDB_REPLICA_FORK_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

struct replica;
struct vm_fork;

struct replica_fork_link {
	struct vm_fork *vm_fork;
	/* When the recently-committed pages it pushes first last rotated. */
	int64_t recent_rotated_us;
	/* The image's write-back into its memfds after a fork (ram_image.h), a slice a turn. */
	long long converge_timer;
	int64_t converge_started_us;
	uint64_t converge_pages;
};

/* Before and after each commit: the fork's disk snapshot, the recent pages. */
void replica_fork_before_commit(struct replica *r);
void replica_fork_after_commit(struct replica *r);
/* The taken-over VM's export writes the disk replica from now on. */
void replica_fork_taken_over(struct replica *r);
/* The replica goes (freed): its fork with it. */
void replica_fork_end(struct replica *r);
bool replica_fork_exists(const struct replica *r);
/* Status: the fork's, or NULL when there is none. */
json_t *replica_fork_json(const struct replica *r);

#endif
