/*
 * Whether QEMU has taken a client on each of its stream netdevs, read
 * from HMP's `info network` (QEMU's print_net_client: one line per net
 * client, "NAME: index=N,type=TYPE,INFO", NICs indented under their
 * peer).  A stream netdev's INFO is empty until QEMU accepted a
 * connection (net/stream.c sets it to the socket's URI then, and empties
 * it again when the client goes), or names why it failed.
 *
 * Why it matters (backup/failover.c): QEMU 7.2's stream netdev starts
 * listening asynchronously and, until that finishes, is neither "link
 * down" nor connected; a packet flushed to it then (the announcement
 * queued while an incoming migration loads, flushed when the VM starts)
 * dereferences its missing channel and QEMU segfaults.  A takeover
 * whose restore is small loads before that, so it waits for the accept.
 *
 * Pure text parsing, no I/O: fuzzed by tests/fuzz/fuzz_hmp_network.c.
 */
#ifndef REMUSDB_HMP_NETWORK_H
#define REMUSDB_HMP_NETWORK_H

#include <stddef.h>

enum hmp_streams {
	HMP_NO_STREAM,          /* no stream netdev listed: nothing to wait for */
	HMP_STREAMS_WAITING,    /* at least one has no client yet */
	HMP_STREAMS_CONNECTED,  /* every stream netdev has its client */
};

/* text: `info network`'s output, len bytes, no terminator needed. */
enum hmp_streams hmp_network_streams(const char *text, size_t len);

#endif
