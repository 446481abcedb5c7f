/*
 * What both replication roles take from the daemon's configuration:
 * who we are, where things live, the shared key, the witness, and the
 * failure-detection timings (docs/protocol.md explains the trade-off).
 */
#ifndef REMUSDB_REPL_SETTINGS_H
#define REMUSDB_REPL_SETTINGS_H

#include <stddef.h>
#include <stdint.h>

#include "repl_auth.h"
#include "witness.h"

struct repl_settings {
	const char *host;          /* this host's name: the etcd owner value */
	const char *run_dir;       /* VM run dirs: <run_dir>/vms/<vm> */
	const char *state_dir;     /* disk replicas: <state_dir>/replicas */
	const char *fence_command; /* "" = none */
	uint8_t psk[REPL_PSK_MAX];
	size_t psk_len;            /* 0: no key configured */
	char psk_error[256];       /* why there is none */
	struct witness_config witness; /* endpoints "" = no witness */
	unsigned heartbeat_ms;
	unsigned peer_timeout_ms;
	unsigned max_inflight;
};

#endif
