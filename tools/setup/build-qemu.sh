#!/usr/bin/env bash
# Builds QEMU 7.2 from Debian's source package with Debian's patch series and
# then ours (hypervisor-patches/qemu-7.2/series), for x86_64-softmmu only.
# The result is installed under $REMUSDB_CACHE/qemu/<key>/ where <key> hashes
# the source version, our patches and this script, so a rebuild happens only
# when one of them changes. $REMUSDB_CACHE/qemu/current points at the build.
source "$(dirname "$0")/common.sh"

PATCH_DIR="$REPO_ROOT/hypervisor-patches/qemu-7.2"
CONFIGURE_FLAGS=(
  --target-list=x86_64-softmmu --enable-replication --disable-install-blobs
  --disable-docs --disable-werror --disable-tools --disable-gtk --disable-sdl
  --disable-vnc --disable-spice --disable-opengl --disable-xen
  --disable-debug-info
)

# Only the main archive's version: the newest security tarballs can 404.
version=$(apt-cache showsrc qemu | awk '/^Version: 1:7\.2/{print $2}' | sort -V | tail -1)
[[ -n $version ]] || die "no qemu 7.2 source package known to apt (is deb-src enabled?)"

key=$( { echo "$version"; echo "${CONFIGURE_FLAGS[*]}"; cat "$0";
         while read -r p; do [[ -z $p || $p == \#* ]] || cat "$PATCH_DIR/$p"; done < "$PATCH_DIR/series"; } \
       | sha256sum | cut -c1-16)
prefix="$REMUSDB_CACHE/qemu/$key"
if [[ -x $prefix/bin/qemu-system-x86_64 ]]; then
  ln -sfn "$prefix" "$REMUSDB_CACHE/qemu/current"
  log "patched QEMU $version already built ($prefix)"
  exit 0
fi

src_root="$REMUSDB_CACHE/qemu-src"
mkdir -p "$src_root"
if ! ls "$src_root"/qemu_*.dsc >/dev/null 2>&1 || ! ls "$src_root"/qemu_"${version#*:}".dsc >/dev/null 2>&1; then
  log "downloading Debian source package qemu=$version"
  (cd "$src_root" && apt-get source --download-only -qq "qemu=$version" >/dev/null)
fi

work="$REMUSDB_CACHE/qemu-build-$key"
rm -rf "$work"
mkdir -p "$work"
log "unpacking and applying Debian's patch series"
# dpkg-source applies debian/patches/series (format 3.0 quilt) on unpack.
dpkg-source -x "$src_root/qemu_${version#*:}.dsc" "$work/src" > "$work/unpack.log" 2>&1 \
  || { tail -20 "$work/unpack.log"; die "dpkg-source could not unpack qemu $version"; }
cd "$work/src"
[[ -s .pc/applied-patches ]] || die "Debian's patch series was not applied"
log "applying hypervisor-patches/qemu-7.2"
while read -r p; do
  [[ -z $p || $p == \#* ]] && continue
  log "  $p"
  patch -p1 -s --forward < "$PATCH_DIR/$p" || die "patch $p does not apply"
done < "$PATCH_DIR/series"

# The dfsg tarball drops the edk2 firmware blobs that meson wants to unpack.
# x86 boots with SeaBIOS, so empty stand-ins are enough to configure.
for f in $(sed -n "s/.*'\(edk2-[^']*\.fd\)'.*/\1/p" pc-bios/meson.build | sort -u); do
  [[ -e pc-bios/$f.bz2 ]] || : | bzip2 > "pc-bios/$f.bz2"
done

log "configuring and building (x86_64-softmmu; takes several minutes)"
mkdir -p build && cd build
../configure --prefix="$prefix" "${CONFIGURE_FLAGS[@]}" > "$work/configure.log" 2>&1 \
  || { tail -30 "$work/configure.log"; die "QEMU configure failed (log: $work/configure.log)"; }
make -j"$(nproc)" > "$work/build.log" 2>&1 \
  || { tail -40 "$work/build.log"; die "QEMU build failed (log: $work/build.log)"; }
make install > "$work/install.log" 2>&1 || die "QEMU install failed"
ln -sfn "$prefix" "$REMUSDB_CACHE/qemu/current"
cd / && rm -rf "$work"
log "patched QEMU $version installed in $prefix"
