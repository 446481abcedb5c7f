/* The RARP announcement of a guest's MAC (rarp_announce.h). */
#include "relay/rarp_announce.h"

#include <stdio.h>
#include <string.h>

#include "base/be.h"

#define ETHERTYPE_RARP 0x8035
#define HTYPE_ETHERNET 1
#define PTYPE_IPV4 0x0800
#define OP_REVERSE_REQUEST 3

int rarp_parse_mac(const char *text, uint8_t mac[6])
{
	unsigned o[6];
	int end = -1;

	if (!text || sscanf(text, "%2x:%2x:%2x:%2x:%2x:%2x%n", &o[0], &o[1], &o[2], &o[3],
			    &o[4], &o[5], &end) != 6 || end != 17 || text[end])
		return -1;
	for (int i = 0; i < 6; i++)
		mac[i] = (uint8_t)o[i];
	return 0;
}

size_t rarp_announce(const uint8_t mac[6], uint8_t out[RARP_ANNOUNCE_LEN])
{
	memset(out, 0, RARP_ANNOUNCE_LEN);
	memset(out, 0xff, 6);                  /* to everyone */
	memcpy(out + 6, mac, 6);               /* from the guest: switches learn its port */
	store_be16(out + 12, ETHERTYPE_RARP);
	store_be16(out + 14, HTYPE_ETHERNET);
	store_be16(out + 16, PTYPE_IPV4);
	out[18] = 6;                           /* hardware address length */
	out[19] = 4;                           /* protocol address length */
	store_be16(out + 20, OP_REVERSE_REQUEST);
	memcpy(out + 22, mac, 6);              /* sender's hardware address */
	memcpy(out + 32, mac, 6);              /* target's: its own (protocol addresses 0) */
	return RARP_ANNOUNCE_LEN;
}
