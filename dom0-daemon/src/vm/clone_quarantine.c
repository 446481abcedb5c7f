/*
 * A fork's clone starts quarantined: its NIC relay lets nothing onto the
 * LAN, since it wakes with its parent's MAC and addresses.  Its new
 * identity may be let through first (vm_admit_identity), then the whole
 * clone (vm_release_quarantine, remembered in its definition).  The
 * watch on its postcopy resume is clone_watch.c.
 */
#include <stdio.h>

#include "base/log.h"
#include "relay/net_relay.h"
#include "vm/vm_internal.h"
#include "vm/vm_store.h"

int vm_admit_identity(struct vm *vm, const char *mac, const char *ipv4, char *err,
		      size_t errlen)
{
	unsigned m[6], a[4];
	uint8_t mb[6], ab[4];
	int end = 0;

	if (!vm->nic || !net_relay_quarantined(vm->nic)) {
		snprintf(err, errlen, "vm %s is not quarantined", vm->def.name);
		return -1;
	}
	if (sscanf(mac, "%2x:%2x:%2x:%2x:%2x:%2x%n", &m[0], &m[1], &m[2], &m[3], &m[4],
		   &m[5], &end) != 6 || mac[end] || (m[0] & 1)) {
		snprintf(err, errlen, "'%.40s' is not a unicast MAC address", mac);
		return -1;
	}
	end = 0;
	if (sscanf(ipv4, "%3u.%3u.%3u.%3u%n", &a[0], &a[1], &a[2], &a[3], &end) != 4 ||
	    ipv4[end] || a[0] > 255 || a[1] > 255 || a[2] > 255 || a[3] > 255) {
		snprintf(err, errlen, "'%.40s' is not an IPv4 address", ipv4);
		return -1;
	}
	for (int i = 0; i < 6; i++)
		mb[i] = (uint8_t)m[i];
	for (int i = 0; i < 4; i++)
		ab[i] = (uint8_t)a[i];
	net_relay_admit_identity(vm->nic, mb, ab);
	return 0;
}

int vm_release_quarantine(struct vm *vm, char *err, size_t errlen)
{
	if (!vm->nic || !net_relay_quarantined(vm->nic)) {
		snprintf(err, errlen, "vm %s is not quarantined", vm->def.name);
		return -1;
	}
	net_relay_set_quarantine(vm->nic, false);
	/* Remembered, so that a restarted daemon does not cut it off again. */
	snprintf(vm->def.clone_released, sizeof(vm->def.clone_released), "1");
	if (vm_store_save(vm->registry->vms_dir, &vm->def, err, errlen) < 0)
		log_warn("vm %s: released, but not persisted (%s): a restarted remusdbd "
			 "would quarantine it again", vm->def.name, err);
	return 0;
}
