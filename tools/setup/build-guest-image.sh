#!/usr/bin/env bash
# Builds the database guest: a Debian bookworm root filesystem image with
# PostgreSQL 15, MariaDB, qemu-guest-agent and a serial console, plus the
# kernel and initrd of linux-image-cloud-amd64, which QEMU boots directly.
# tools/guest/src/rdb-dirty.c (the synthetic dirty-rate workload) and
# rdb-cp-selftest.c and rdb-cp-echo.c (the commit-protection module's
# selftests, and a line server that answers protected or not) are built
# statically here on the host and installed in /usr/local/bin; the module
# itself (guest-kmod/) is built against the tree's kernel and loaded at
# boot (install-guest-kmod.sh).  PostgreSQL's `postgres` and MariaDB's
# `mariadbd` are replaced by the commit-protection patched builds of the
# same Debian versions (dbms-patches/; build-dbms.sh builds and caches
# them, install-dbms.sh installs them in the tree).
# Output: $REMUSDB_CACHE/guest/<key>/{rootfs.img,vmlinuz,initrd.img}, with
# <key> a hash of this recipe (tools/guest/, the module's sources and the
# DBMS patches included, so a changed program, module or patch rebuilds
# the image), and $REMUSDB_CACHE/guest/current -> it.
source "$(dirname "$0")/common.sh"

GUEST_DIR="$REPO_ROOT/tools/guest"
IMAGE_SIZE=2G
PACKAGES=systemd-sysv,udev,kmod,iproute2,procps,netbase,less,linux-image-cloud-amd64,postgresql-15,mariadb-server,qemu-guest-agent,ca-certificates

# The module's sources count, its README does not.
key=$( { cat "$0" "$REPO_ROOT"/tools/setup/{install,build}-{guest-kmod,dbms}.sh; echo "$PACKAGES $IMAGE_SIZE"
         find "$GUEST_DIR" -type f | sort | xargs cat
         cat "$REPO_ROOT"/guest-kmod/{Kbuild,remusdb_cp.c,remusdb_cp.h}
         find "$REPO_ROOT/dbms-patches" -name '*.patch' | sort | xargs cat; } | sha256sum | cut -c1-16)
out="$REMUSDB_CACHE/guest/$key"
if [[ -s $out/rootfs.img && -s $out/vmlinuz && -s $out/initrd.img ]]; then
  ln -sfn "$out" "$REMUSDB_CACHE/guest/current"
  log "guest image already built ($out)"
  exit 0
fi

# The patched servers first: cached, or several minutes (MariaDB about 20).
for dbms in postgresql mariadb; do
  bash "$REPO_ROOT/tools/setup/build-dbms.sh" "$dbms" > /dev/null
done

start=$(date +%s)
tmp="$REMUSDB_CACHE/guest/build-$key"
rm -rf "$tmp"; mkdir -p "$tmp"
rootfs="$tmp/rootfs"
log "building rdb-dirty (static)"
gcc -std=c11 -O2 -Wall -Wextra -Werror -static -o "$tmp/rdb-dirty" \
  "$GUEST_DIR/src/rdb-dirty.c" || die "rdb-dirty failed to build"
gcc -std=c11 -O2 -Wall -Wextra -Werror -static -I"$REPO_ROOT/guest-kmod" -o "$tmp/rdb-cp-selftest" \
  "$GUEST_DIR/src/rdb-cp-selftest.c" || die "rdb-cp-selftest failed to build"
gcc -std=c11 -O2 -Wall -Wextra -Werror -static -I"$REPO_ROOT/guest-kmod" -o "$tmp/rdb-cp-echo" \
  "$GUEST_DIR/src/rdb-cp-echo.c" || die "rdb-cp-echo failed to build"
log "building the guest root filesystem with mmdebstrap (a few minutes)"
# dpkg path excludes keep documentation out of the image; the customize
# script (tools/guest/customize.sh) configures networking, PostgreSQL and
# the bench database inside the tree before it becomes an image.
mmdebstrap --variant=minbase --mode=root --include="$PACKAGES" \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --customize-hook="copy-in $GUEST_DIR/overlay/. /" \
  --customize-hook="copy-in $tmp/rdb-dirty $tmp/rdb-cp-selftest $tmp/rdb-cp-echo /usr/local/bin" \
  --customize-hook="$REPO_ROOT/tools/setup/install-guest-kmod.sh \"\$1\"" \
  --customize-hook="$REPO_ROOT/tools/setup/install-dbms.sh \"\$1\"" \
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
ln -sfn "$out" "$REMUSDB_CACHE/guest/current"
log "guest image ready in $out ($(( $(date +%s) - start )) s, $(du -h --apparent-size "$out/rootfs.img" | cut -f1) apparent, $(du -h "$out/rootfs.img" | cut -f1) used)"
