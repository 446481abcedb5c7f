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

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/event_loop.h"

struct net_relay_stats {
	uint64_t frames_to_guest;   /* tap -> stream */
	uint64_t bytes_to_guest;
	uint64_t frames_from_guest; /* stream -> tap */
	uint64_t bytes_from_guest;
	uint64_t frames_dropped;    /* e.g. tap full, or stream not connected */
	uint64_t connects;          /* successful connections to QEMU */
	uint64_t quarantine_dropped; /* frames dropped, either way, in quarantine */
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
/*
 * The caller knows QEMU listens now (e.g. its -incoming socket answered,
 * which QEMU opens after its netdevs): connect the guest's NIC at once
 * instead of at the next reconnect poll, up to RECONNECT_DELAY_MS later,
 * while the guest's frames would go nowhere.  Nothing happens while
 * connected; a failed attempt polls on as before.
 */
void net_relay_connect_now(struct net_relay *relay);
/*
 * Output commit: when set, every frame from the guest is offered to hook
 * first; a hook that returns nonzero took it (and will send it later
 * with net_relay_send_to_lan, or drop it).  NULL restores pass-through.
 */
typedef int (*net_relay_output_hook)(void *opaque, const uint8_t *frame, uint32_t len);
void net_relay_set_output_hook(struct net_relay *relay, net_relay_output_hook hook,
			       void *opaque);
/* Whether hook/opaque is the output hook now (so that its owner may clear it). */
bool net_relay_output_hook_is(const struct net_relay *relay, net_relay_output_hook hook,
			      const void *opaque);
/*
 * The same for frames from the LAN to the guest: a hook that returns
 * nonzero took the frame (the takeover's flow reset drops frames of the
 * flows it resets).  NULL restores pass-through.
 */
void net_relay_set_input_hook(struct net_relay *relay, net_relay_output_hook hook,
			      void *opaque);
bool net_relay_input_hook_is(const struct net_relay *relay, net_relay_output_hook hook,
			     const void *opaque);
/* Sends a guest frame to the LAN now.  0, or -1 if the tap refused it (counted). */
int net_relay_send_to_lan(struct net_relay *relay, const uint8_t *frame, size_t len);
/* Queues a frame for the guest now.  0, or -1 if it was dropped (counted). */
int net_relay_send_to_guest(struct net_relay *relay, const uint8_t *frame, size_t len);
void net_relay_get_stats(const struct net_relay *relay,
			 struct net_relay_stats *out);

/*
 * Quarantine (a fork's clone until it has its own identity): every frame
 * from the guest and from the LAN is dropped and counted.
 */
void net_relay_set_quarantine(struct net_relay *relay, bool on);
bool net_relay_quarantined(const struct net_relay *relay);
/*
 * While quarantined, lets through the clone's new identity only: from the
 * guest, frames with this source MAC and IPv4 (or ARP sender) address;
 * from the LAN, frames to this MAC or to a group address.  So the clone
 * can reach the parent for its WAL the moment it has re-identified, while
 * nothing it sends as the parent (its sessions' last segments, ARP) ever
 * leaves.  net_relay_set_quarantine() clears it.
 */
void net_relay_admit_identity(struct net_relay *relay, const uint8_t mac[6],
			      const uint8_t ipv4[4]);
/* "off", "identity" (admitted only) or "all". */
const char *net_relay_quarantine_mode(const struct net_relay *relay);

#endif
