/*
 * The host side of a guest NIC: a tap device (IFF_TAP | IFF_NO_PI) put on
 * a Linux bridge.  Link setup goes through libnl-route rather than hand-
 * built netlink messages or shelling out to ip(8): it is maintained, and
 * its errors name the cause.
 */
#ifndef REMUSDB_TAP_H
#define REMUSDB_TAP_H

#include <net/if.h>

struct tap {
	int fd;                /* non-blocking; -1 when closed */
	char name[IFNAMSIZ];   /* the kernel's name for the device */
};

/*
 * Creates the tap `name` (or attaches to an existing persistent one),
 * optionally sets its MTU (0 keeps the kernel's default), enslaves it to
 * `bridge` (NULL or "" for none) and brings it up.  Returns 0, or -1 with
 * the cause logged (for example a bridge that does not exist) and nothing
 * left behind.
 */
int tap_create(struct tap *tap, const char *name, const char *bridge,
	       unsigned mtu);

/*
 * Closes the fd.  A tap created by tap_create() is not persistent, so the
 * kernel deletes the device (and removes it from the bridge) right here.
 */
void tap_destroy(struct tap *tap);

#endif
