#!/usr/bin/env bash
# Builds guest-kmod/remusdb_cp.ko for one guest kernel release, e.g.
#   tools/setup/build-guest-kmod.sh 6.1.0-50-cloud-amd64 [OUT_DIR]
# Debian's linux-headers-<release> package (and the common headers and
# kbuild tools of the same source version) are downloaded once and
# unpacked under $REMUSDB_CACHE/kernel-headers/<release>; nothing is
# installed on the host, whose own kernel is a different one.  The module
# lands in OUT_DIR (default $REMUSDB_CACHE/guest-kmod/<release>-<key>),
# with <key> a hash of the module's sources, and its path is printed.
source "$(dirname "$0")/common.sh"

release=${1:?usage: build-guest-kmod.sh KERNEL_RELEASE [OUT_DIR]}
[[ $release =~ ^[0-9][0-9a-z.+~-]*$ ]] || die "not a kernel release: $release"
key=$(cat "$REPO_ROOT"/guest-kmod/{Kbuild,Makefile,remusdb_cp.c,remusdb_cp.h} "$0" | sha256sum | cut -c1-16)
out=${2:-$REMUSDB_CACHE/guest-kmod/$release-$key}
if [[ -s $out/remusdb_cp.ko ]]; then
  echo "$out/remusdb_cp.ko"
  exit 0
fi

hdr="$REMUSDB_CACHE/kernel-headers/$release"
tree="$hdr/root/usr/src/linux-headers-$release"
if [[ ! -s $hdr/.complete ]]; then
  pkg="linux-headers-$release"
  # The version of the source package that built this release, from the
  # main archive: the guest image is built from it, and the newest
  # security versions' files can be missing on the mirror.
  version=$(apt-cache madison "$pkg" | awk -F'|' '$3 ~ /bookworm\/main/ && $3 !~ /security/ {gsub(/ /,"",$2); print $2; exit}')
  [[ -n $version ]] || die "no $pkg in the bookworm main archive (apt-get update?)"
  common=$(apt-cache show "$pkg=$version" | sed -n 's/^Depends:.*\(linux-headers-[0-9.-]*-common\).*/\1/p' | head -1)
  [[ -n $common ]] || die "cannot tell the common headers package of $pkg $version"
  log "fetching $pkg, $common and linux-kbuild-6.1 at $version"
  rm -rf "$hdr"; mkdir -p "$hdr/debs"
  (cd "$hdr/debs" && apt-get download -q "$pkg=$version" "$common=$version" \
      "linux-kbuild-6.1=$version" >/dev/null 2>&1) \
    || die "apt-get download of the guest kernel headers ($version) failed"
  for deb in "$hdr"/debs/*.deb; do dpkg-deb -x "$deb" "$hdr/root"; done
  # The packages name their common half by absolute path: point it here.
  sed -i "s#/usr/src/#$hdr/root/usr/src/#" "$tree/Makefile"
  echo "$version" > "$hdr/.complete"
fi

build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
cp "$REPO_ROOT"/guest-kmod/{Kbuild,remusdb_cp.c,remusdb_cp.h} "$build/"
make -s -C "$tree" M="$build" modules > "$build/make.log" 2>&1 \
  || { cat "$build/make.log" >&2; die "remusdb_cp failed to build against $release"; }
grep -E 'warning|error' "$build/make.log" | grep -v 'Skipping BTF' >&2 \
  && die "remusdb_cp built with warnings against $release (see above)"
mkdir -p "$out"
cp "$build/remusdb_cp.ko" "$out/"
log "built remusdb_cp.ko for $release"
echo "$out/remusdb_cp.ko"
