#!/usr/bin/env bash
# mmdebstrap customize hook (runs on the host with the guest tree as $1):
# builds remusdb_cp.ko for the kernel the tree just got
# (build-guest-kmod.sh) and installs it so that the guest loads it at
# boot.  The header for the DBMS patches goes to /usr/local/include.
source "$(dirname "$0")/common.sh"

root=${1:?usage: install-guest-kmod.sh GUEST_TREE}
releases=("$root"/lib/modules/*)
[[ ${#releases[@]} -eq 1 && -d ${releases[0]} ]] \
  || die "expected one kernel in the guest tree, found: ${releases[*]}"
release=$(basename "${releases[0]}")
ko=$(bash "$(dirname "$0")/build-guest-kmod.sh" "$release" | tail -1)
install -D -m 644 "$ko" "$root/lib/modules/$release/updates/remusdb_cp.ko"
chroot "$root" depmod "$release"
echo remusdb_cp > "$root/etc/modules-load.d/remusdb_cp.conf"
install -D -m 644 "$REPO_ROOT/guest-kmod/remusdb_cp.h" "$root/usr/local/include/remusdb_cp.h"
log "remusdb_cp installed in the guest tree for $release (loaded at boot)"
