/*
 * The lazy restore of a takeover, --restore lazy (lazy_restore.c): QEMU
 * gets the device state and runs at once; the image is served by
 * postcopy while it runs.
 */
#ifndef REMUSDB_LAZY_RESTORE_H
#define REMUSDB_LAZY_RESTORE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "fork/postcopy_source.h"

struct replica;

struct replica_lazy_restore {
	struct postcopy_fork *fork;
	struct postcopy_session *session;
	long long end_timer;
	int64_t done_us;
	bool ok;
	bool fell_back;            /* QEMU failed it before the guest did anything: eager */
	struct postcopy_session_stats stats;
};

/* This takeover restores lazily (--restore lazy, and no fall back yet). */
bool lazy_restore_wanted(const struct replica *r);
/* fd: connected to QEMU's -incoming, ours from now on. */
void lazy_restore_start(struct replica *r, int fd);
/* Pages are still being served: the image must stay. */
bool lazy_restore_serving(const struct replica *r);
/* Ends a lazy restore still serving pages; no-op otherwise. */
void lazy_restore_stop(struct replica *r);
/* Status: the failover's "restore" and "lazy" (qemu_spawned_us: when QEMU started). */
void lazy_restore_status(const struct replica *r, json_t *failover, int64_t qemu_spawned_us);

#endif
