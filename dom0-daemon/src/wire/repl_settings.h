/*
 * What both replication roles take from the daemon's configuration:
 * who we are, where things live, the shared key, the witness, and the
 * failure-detection timings (docs/protocol.md explains the trade-off).
 */
#ifndef REMUSDB_REPL_SETTINGS_H
#define REMUSDB_REPL_SETTINGS_H

#include <stddef.h>
#include <stdint.h>

#include "wire/repl_auth.h"
#include "witness/witness.h"

/*
 * Until the backup holds a complete replica (initial disk and RAM copy),
 * nothing can be taken over, so detecting a dead peer fast buys nothing,
 * while a false alarm throws the whole copy away.  And that phase is the
 * one in which both daemons move hundreds of MiB through one thread and a
 * peer can go quiet for longer than a heartbeat timeout tuned for steady
 * checkpointing.  So silence ends it only after this long.
 */
#define REPL_SYNC_PEER_TIMEOUT_MS 10000

/*
 * Heartbeat datagrams decide whether a peer lives (heartbeat.h).  A TCP
 * stream on which nothing at all arrived for this long ends the link
 * even while datagrams flow: both daemons live, but the stream is stuck.
 */
#define REPL_STREAM_SILENCE_MS 10000

struct heartbeat_service;

struct repl_settings {
	const char *host;          /* this host's name: the etcd owner value */
	const char *run_dir;       /* VM run dirs: <run_dir>/vms/<vm> */
	const char *state_dir;     /* disk replicas: <state_dir>/replicas */
	const char *fence_command; /* "" = none */
	bool unsafe_no_flow_reset; /* DEBUG negative control: takeovers reset no flow */
	bool restore_lazy;         /* takeover by postcopy from the image (--restore lazy) */
	bool restore_shared;       /* takeover's QEMU maps the image's main RAM (--restore shared) */
	uint64_t memory_limit;     /* bytes the replicas here may take together (--memory-limit); 0: no limit */
	uint8_t psk[REPL_PSK_MAX];
	size_t psk_len;            /* 0: no key configured */
	char psk_error[256];       /* why there is none */
	struct witness_config witness; /* endpoints "" = no witness */
	unsigned heartbeat_ms;
	unsigned peer_timeout_ms;
	unsigned max_inflight;
	unsigned pause_boost;      /* nice levels for a pausing QEMU (primary/pause_boost.h); 0: none */
	size_t read_index_bytes;   /* disk read tracking index per protected VM */
	uint64_t compress_cache_bytes; /* ASC's cache per protected VM; 0: by percent */
	unsigned compress_cache_percent; /* of guest RAM when no size is set (1-100) */
	unsigned replica_retire_s; /* an idle replica leaves status after this long; 0: never */
	unsigned handshake_timeout_ms; /* an unauthenticated primary is dropped after this; 0: 5 s */
	/* A primary tries a lost backup again (primary/protection_reprotect.c). */
	bool reprotect;
	unsigned reprotect_first_ms, reprotect_max_ms;
	/* The daemon's heartbeat thread (heartbeat.h); every link's liveness comes from it. */
	struct heartbeat_service *heartbeats;
};

/* The silence that ends a replication link, by whether its copy is complete. */
static inline unsigned repl_peer_timeout_ms(const struct repl_settings *s, int copy_complete)
{
	if (copy_complete || s->peer_timeout_ms >= REPL_SYNC_PEER_TIMEOUT_MS)
		return s->peer_timeout_ms;
	return REPL_SYNC_PEER_TIMEOUT_MS;
}

#endif
