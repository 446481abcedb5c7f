#!/usr/bin/env bash
# Builds the database guest: a Debian bookworm root filesystem image with
# PostgreSQL 15, MariaDB, qemu-guest-agent and a serial console, plus the
# kernel and initrd of linux-image-cloud-amd64, which QEMU boots directly.
# The product's guest parts arrive as the packages an operator installs
# (docs/packaging.md, "The guest's packages"), not as copied files:
#   remusdb-guest             the commit-protection module as DKMS source
#                             (DKMS builds it here, for the image's kernel,
#                             from the headers the image gets for it) and
#                             loaded at boot, the fork hook
#                             remusdb-clone-identity; built from debian/ with
#                             `dpkg-buildpackage -A` in a copy of the tree;
#   remusdb-postgresql-15-cp  the patched `postgres` and `mariadbd`
#   remusdb-mariadb-cp        (build-dbms.sh builds and caches them,
#                             build-dbms-deb.sh packages them), diverting
#                             Debian's.
# The lab's own parts stay here: tools/guest/src/rdb-dirty.c (the synthetic
# dirty-rate workload), rdb-cp-selftest.c and rdb-cp-echo.c (the module's
# selftests, and a line server that answers protected or not), built
# statically on the host into /usr/local/bin; the overlay (the lab's
# network unit, its PostgreSQL and MariaDB settings) and customize.sh (the
# bench database and the lab's replication users).
# Output: $REMUSDB_CACHE/guest/<key>/{rootfs.img,vmlinuz,initrd.img}, with
# <key> a hash of this recipe and of the packages' inputs (tools/guest/,
# debian/, the module's and the hook's sources, the DBMS patches and
# package recipe), so a changed program, module, hook or patch rebuilds the
# image, and $REMUSDB_CACHE/guest/current -> it, unless
# REMUSDB_GUEST_KEEP_CURRENT=1 (build a new image without moving it under
# the other users of the cache; REMUSDB_GUEST_DIR then selects it).
source "$(dirname "$0")/common.sh"

GUEST_DIR="$REPO_ROOT/tools/guest"
IMAGE_SIZE=2G
# linux-headers-cloud-amd64 (with dkms, which brings gcc and make) is
# what DKMS builds remusdb_cp against: the headers of the image's kernel.
PACKAGES=systemd-sysv,udev,kmod,iproute2,procps,netbase,less,linux-image-cloud-amd64,linux-headers-cloud-amd64,dkms,postgresql-15,mariadb-server,qemu-guest-agent,ca-certificates

# The module's and the hook's sources count, the READMEs do not.
key=$( { cat "$0" "$REPO_ROOT"/tools/setup/build-dbms{,-deb}.sh; echo "$PACKAGES $IMAGE_SIZE"
         find "$GUEST_DIR" "$REPO_ROOT/guest-clone" "$REPO_ROOT/tools/setup/dbms-deb" -type f | sort | xargs cat
         cat "$REPO_ROOT"/guest-kmod/{Kbuild,Makefile,remusdb_cp.c,remusdb_cp.h,remusdb_cp.modules-load.conf}
         cat "$REPO_ROOT"/debian/{changelog,control,copyright,rules,remusdb-guest.dkms}
         find "$REPO_ROOT/dbms-patches" -name '*.patch' | sort | xargs cat; } | sha256sum | cut -c1-16)
out="$REMUSDB_CACHE/guest/$key"
point_current() {
  if [[ ${REMUSDB_GUEST_KEEP_CURRENT:-0} == 1 ]]; then
    log "REMUSDB_GUEST_KEEP_CURRENT=1: guest/current left as it is; REMUSDB_GUEST_DIR=$out selects this image"
  else
    ln -sfn "$out" "$REMUSDB_CACHE/guest/current"
  fi
}
if [[ -s $out/rootfs.img && -s $out/vmlinuz && -s $out/initrd.img ]]; then
  point_current
  log "guest image already built ($out)"
  exit 0
fi

start=$(date +%s)
tmp="$REMUSDB_CACHE/guest/build-$key"
rm -rf "$tmp"; mkdir -p "$tmp/debs"
rootfs="$tmp/rootfs"

# The packages: the patched servers (cached, or several minutes, MariaDB
# about 20), then remusdb-guest from a copy of the tree as git sees it
# (dpkg-buildpackage writes next to the tree it builds).
for dbms in postgresql mariadb; do
  bash "$REPO_ROOT/tools/setup/build-dbms-deb.sh" "$dbms" "$tmp/debs" > /dev/null
done
log "building remusdb-guest (dpkg-buildpackage -A)"
mkdir -p "$tmp/pkg/src"
(cd "$REPO_ROOT" && git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$tmp/pkg/src") \
  || die "could not copy the tree to build remusdb-guest"
(cd "$tmp/pkg/src" && dpkg-buildpackage -us -uc -A > "$tmp/pkg/build.log" 2>&1) \
  || { tail -20 "$tmp/pkg/build.log"; die "remusdb-guest did not build (log: $tmp/pkg/build.log)"; }
mv "$tmp"/pkg/remusdb-guest_*_all.deb "$tmp/debs/"
rm -rf "$tmp/pkg"
debs=("$tmp"/debs/*.deb)
[[ ${#debs[@]} -eq 3 ]] || die "expected 3 packages in $tmp/debs, found: ${debs[*]}"
log "building rdb-dirty (static)"
gcc -std=c11 -O2 -Wall -Wextra -Werror -static -o "$tmp/rdb-dirty" \
  "$GUEST_DIR/src/rdb-dirty.c" || die "rdb-dirty failed to build"
gcc -std=c11 -O2 -Wall -Wextra -Werror -static -I"$REPO_ROOT/guest-kmod" -o "$tmp/rdb-cp-selftest" \
  "$GUEST_DIR/src/rdb-cp-selftest.c" || die "rdb-cp-selftest failed to build"
gcc -std=c11 -O2 -Wall -Wextra -Werror -static -I"$REPO_ROOT/guest-kmod" -o "$tmp/rdb-cp-echo" \
  "$GUEST_DIR/src/rdb-cp-echo.c" || die "rdb-cp-echo failed to build"
log "building the guest root filesystem with mmdebstrap (a few minutes)"
# dpkg path excludes keep documentation out of the image; the packages'
# files go in through mmdebstrap's file-mirror-automount hooks (apt installs
# them with their dependencies, and their maintainer scripts run: the
# diversions, DKMS's build); check-guest-packages.sh fails the build if DKMS did not
# build and install the module for the image's kernel; the customize
# script (tools/guest/customize.sh) configures networking, PostgreSQL and
# the bench database inside the tree before it becomes an image.
include="$PACKAGES$(printf ',%s' "${debs[@]}")"
mmdebstrap --variant=minbase --mode=root --include="$include" \
  --hook-dir=/usr/share/mmdebstrap/hooks/file-mirror-automount \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --customize-hook="copy-in $GUEST_DIR/overlay/. /" \
  --customize-hook="copy-in $tmp/rdb-dirty $tmp/rdb-cp-selftest $tmp/rdb-cp-echo /usr/local/bin" \
  --customize-hook="$REPO_ROOT/tools/setup/check-guest-packages.sh \"\$1\"" \
  --customize-hook="$GUEST_DIR/customize.sh \"\$1\"" \
  bookworm "$rootfs" http://deb.debian.org/debian > "$tmp/mmdebstrap.log" 2>&1 \
  || { tail -30 "$tmp/mmdebstrap.log"; die "mmdebstrap failed (log: $tmp/mmdebstrap.log)"; }

kernel=$(ls "$rootfs"/boot/vmlinuz-* | sort -V | tail -1)
initrd=$(ls "$rootfs"/boot/initrd.img-* | sort -V | tail -1)
[[ -f $kernel && -f $initrd ]] || die "kernel or initrd missing in the guest tree"
cp "$kernel" "$tmp/vmlinuz"; cp "$initrd" "$tmp/initrd.img"
basename "$kernel" | sed 's/^vmlinuz-//' > "$tmp/kernel-version"

log "creating the ext4 image ($IMAGE_SIZE, sparse)"
truncate -s "$IMAGE_SIZE" "$tmp/rootfs.img"
mkfs.ext4 -q -L rdb-root -d "$rootfs" "$tmp/rootfs.img" || die "mkfs.ext4 failed"
rm -rf "$rootfs"
mkdir -p "$(dirname "$out")"; rm -rf "$out"; mv "$tmp" "$out"
point_current
log "guest image ready in $out ($(( $(date +%s) - start )) s, $(du -h --apparent-size "$out/rootfs.img" | cut -f1) apparent, $(du -h "$out/rootfs.img" | cut -f1) used)"
