/*
 * Network relay between a guest NIC and the lab LAN.
 *
 * QEMU runs the NIC as `-netdev stream,server=on,addr.type=unix,...`: QEMU
 * listens and remusdbd connects.  That direction matters: QEMU re-accepts
 * after a disconnect, so a restarted remusdbd simply connects again and the
 * guest keeps its NIC.  Frames on the stream are be32 length + Ethernet
 * frame (net_frame.h).  The other side is a tap device that remusdbd creates
 * and enslaves to the host's bridge.
 */
#ifndef REMUSDB_NET_RELAY_H
#define REMUSDB_NET_RELAY_H

#include <stdint.h>

#include "event_loop.h"

struct net_relay_stats {
	uint64_t frames_to_guest;   /* tap -> stream */
	uint64_t bytes_to_guest;
	uint64_t frames_from_guest; /* stream -> tap */
	uint64_t bytes_from_guest;
	uint64_t frames_dropped;    /* e.g. tap full, or stream not connected */
	uint64_t connects;          /* successful connections to QEMU */
	int connected;              /* currently connected to QEMU */
};

struct net_relay_config {
	const char *vm_name;       /* for log lines */
	const char *stream_socket; /* QEMU's listening unix socket */
	const char *tap_name;      /* created if missing */
	const char *bridge;        /* tap is enslaved here; NULL/"" = none */
	unsigned mtu;              /* tap MTU; 0 keeps the kernel default */
};

struct net_relay;

/* Creates the tap (up, on the bridge) and starts connecting. NULL on error (logged). */
struct net_relay *net_relay_create(event_loop *loop,
				   const struct net_relay_config *config);
void net_relay_destroy(struct net_relay *relay);
void net_relay_get_stats(const struct net_relay *relay,
			 struct net_relay_stats *out);

#endif
