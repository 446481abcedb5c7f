/* The host side of a guest NIC: a tap on a bridge, via libnl (tap.h). */
#include "relay/tap.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <linux/if_tun.h>
#include <netlink/netlink.h>
#include <netlink/route/link.h>

#include "base/log.h"

static int open_tap_fd(struct tap *tap, const char *name)
{
	struct ifreq ifr;

	if (strlen(name) >= IFNAMSIZ) {
		log_error("tap name \"%s\" is longer than %d characters", name,
			  IFNAMSIZ - 1);
		return -1;
	}
	int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		log_error("tap %s: cannot open /dev/net/tun: %s", name,
			  strerror(errno));
		return -1;
	}
	memset(&ifr, 0, sizeof(ifr));
	/* No packet-information header: the stream carries bare Ethernet. */
	ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
	memcpy(ifr.ifr_name, name, strlen(name));
	if (ioctl(fd, TUNSETIFF, &ifr) < 0) {
		log_error("tap %s: TUNSETIFF failed: %s%s", name, strerror(errno),
			  errno == EBUSY ? " (is another process attached?)" :
			  errno == EPERM ? " (needs CAP_NET_ADMIN)" : "");
		close(fd);
		return -1;
	}
	tap->fd = fd;
	memcpy(tap->name, ifr.ifr_name, IFNAMSIZ);
	tap->name[IFNAMSIZ - 1] = '\0';
	return 0;
}

static int enslave_to_bridge(struct nl_sock *sock, struct rtnl_link *link,
			     const char *tap_name, const char *bridge)
{
	struct rtnl_link *master = NULL;
	int err = rtnl_link_get_kernel(sock, 0, bridge, &master);

	if (err < 0) {
		if (err == -NLE_OBJ_NOTFOUND || err == -NLE_NODEV)
			log_error("tap %s: bridge %s does not exist", tap_name,
				  bridge);
		else
			log_error("tap %s: cannot look up bridge %s: %s",
				  tap_name, bridge, nl_geterror(err));
		return -1;
	}
	const char *kind = rtnl_link_get_type(master);
	if (!kind || strcmp(kind, "bridge") != 0) {
		log_error("tap %s: %s is not a bridge (link type %s)", tap_name,
			  bridge, kind ? kind : "none");
		rtnl_link_put(master);
		return -1;
	}
	/* Also re-reads the link to confirm the kernel accepted the master. */
	err = rtnl_link_enslave(sock, master, link);
	rtnl_link_put(master);
	if (err < 0) {
		log_error("tap %s: cannot add to bridge %s: %s", tap_name,
			  bridge, nl_geterror(err));
		return -1;
	}
	return 0;
}

/* Applies an MTU (when mtu != 0) and/or IFF_UP (when up) to the link. */
static int change_link(struct nl_sock *sock, struct rtnl_link *link,
		       const char *tap_name, unsigned mtu, int up)
{
	struct rtnl_link *change = rtnl_link_alloc();

	if (!change) {
		log_error("tap %s: out of memory", tap_name);
		return -1;
	}
	if (up)
		rtnl_link_set_flags(change, IFF_UP);
	if (mtu)
		rtnl_link_set_mtu(change, mtu);
	int err = rtnl_link_change(sock, link, change, 0);
	rtnl_link_put(change);
	if (err < 0) {
		if (mtu)
			log_error("tap %s: cannot set MTU %u: %s", tap_name, mtu,
				  nl_geterror(err));
		else
			log_error("tap %s: cannot bring up: %s", tap_name,
				  nl_geterror(err));
		return -1;
	}
	return 0;
}

static int configure_link(const struct tap *tap, const char *bridge,
			  unsigned mtu)
{
	struct nl_sock *sock = nl_socket_alloc();
	struct rtnl_link *link = NULL;
	int rc = -1;

	if (!sock) {
		log_error("tap %s: cannot allocate netlink socket", tap->name);
		return -1;
	}
	int err = nl_connect(sock, NETLINK_ROUTE);
	if (err < 0) {
		log_error("tap %s: netlink connect failed: %s", tap->name,
			  nl_geterror(err));
		goto out;
	}
	err = rtnl_link_get_kernel(sock, 0, tap->name, &link);
	if (err < 0) {
		log_error("tap %s: cannot read link: %s", tap->name,
			  nl_geterror(err));
		goto out;
	}
	/*
	 * MTU before joining the bridge, so the bridge computes its own MTU
	 * from the final port MTU; up last, so no frame crosses a half-
	 * configured port.
	 */
	if (mtu && change_link(sock, link, tap->name, mtu, 0) < 0)
		goto out;
	if (bridge && bridge[0] &&
	    enslave_to_bridge(sock, link, tap->name, bridge) < 0)
		goto out;
	if (change_link(sock, link, tap->name, 0, 1) < 0)
		goto out;
	rc = 0;
out:
	if (link)
		rtnl_link_put(link);
	nl_socket_free(sock);
	return rc;
}

int tap_create(struct tap *tap, const char *name, const char *bridge,
	       unsigned mtu)
{
	tap->fd = -1;
	tap->name[0] = '\0';
	if (open_tap_fd(tap, name) < 0)
		return -1;
	if (configure_link(tap, bridge, mtu) < 0) {
		tap_destroy(tap);
		return -1;
	}
	log_info("tap %s up%s%s", tap->name, bridge && bridge[0] ? " on bridge " : "",
		 bridge && bridge[0] ? bridge : "");
	return 0;
}

void tap_destroy(struct tap *tap)
{
	if (tap->fd >= 0)
		close(tap->fd);
	tap->fd = -1;
}
