/*
 * The frame that tells a LAN's switches where a guest's MAC now lives: a
 * broadcast RARP request (RFC 903) from that MAC, the same announcement
 * QEMU's announce-self sends after a migration.  A pure codec; the
 * takeover sends it through the guest's relay (failover.c).
 */
#ifndef REMUSDB_RARP_ANNOUNCE_H
#define REMUSDB_RARP_ANNOUNCE_H

#include <stddef.h>
#include <stdint.h>

/* Ethernet's minimum frame without its FCS: the frame is padded to it. */
#define RARP_ANNOUNCE_LEN 60

/* "52:54:00:12:34:56" into mac: 0, or -1 when it is not such a MAC. */
int rarp_parse_mac(const char *text, uint8_t mac[6]);
/* Fills out with the announcement from mac; returns RARP_ANNOUNCE_LEN. */
size_t rarp_announce(const uint8_t mac[6], uint8_t out[RARP_ANNOUNCE_LEN]);

#endif
