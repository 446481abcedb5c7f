#!/usr/bin/env bash
# Builds the commit-protection patched DBMS servers for the guest image:
# `postgres` from Debian's postgresql-15 source package and `mariadbd`
# from Debian's mariadb source package, each with its patch series from
# dbms-patches/ applied on top of Debian's.
#
#   build-dbms.sh postgresql|mariadb
#
# The version is the one the guest image installs: mmdebstrap takes the
# binary packages from bookworm's main archive only, so we take that
# suite's version (never a security upload, whose tarballs can 404 on the
# main mirror), and install-dbms.sh checks the guest tree has exactly it.
# Configuration is Debian's own (debian/rules's configure step, so the
# same options, paths and hardening flags); only the server binary is
# built.  The result goes to $REMUSDB_CACHE/dbms/<name>/<key>/, with <key>
# a hash of the version, the patches, this script and the module header;
# a second run prints the cached path at once.  Prints the binary's path
# on its last line.
source "$(dirname "$0")/common.sh"

which=${1:?usage: build-dbms.sh postgresql|mariadb}
case $which in
  postgresql) srcpkg=postgresql-15; binpkg=postgresql-15; patches=postgresql-15; binary=postgres ;;
  mariadb)    srcpkg=mariadb; binpkg=mariadb-server-core; patches=mariadb-10.11; binary=mariadbd ;;
  *) die "unknown DBMS '$which' (postgresql or mariadb)" ;;
esac
PATCH_DIR="$REPO_ROOT/dbms-patches/$patches"
HEADER="$REPO_ROOT/guest-kmod/remusdb_cp.h"

# The version in the suite "bookworm" itself (not -security, not -updates).
version=$(apt-cache madison "$binpkg" | awk -F' *[|] *' '!v && $3 ~ / bookworm\/main .*Packages/ {v = $2} END {print v}')
[[ -n $version ]] || die "apt knows no $binpkg in bookworm/main (run apt-get update)"
# (Not a pipe into grep -q: with pipefail, apt-cache's SIGPIPE would fail it.)
grep -Fqx "Version: $version" <<< "$(apt-cache showsrc "$srcpkg")" \
  || die "no $srcpkg $version source package known to apt (is deb-src enabled? tools/setup/install-deps.sh)"

shopt -s nullglob
patch_files=("$PATCH_DIR"/*.patch)
[[ ${#patch_files[@]} -gt 0 ]] || die "no patches in $PATCH_DIR"
key=$( { echo "$which $version"; cat "$0" "$HEADER" "${patch_files[@]}"; } | sha256sum | cut -c1-16)
out="$REMUSDB_CACHE/dbms/$which/$key"
if [[ -x $out/$binary && -s $out/version ]]; then
  ln -sfn "$out" "$REMUSDB_CACHE/dbms/$which/current"
  log "patched $binary ($srcpkg $version) already built ($out)"
  echo "$out/$binary"
  exit 0
fi

src_root="$REMUSDB_CACHE/dbms-src"
dsc="$src_root/${srcpkg}_${version#*:}.dsc"
mkdir -p "$src_root"
if [[ ! -s $dsc ]]; then
  log "downloading Debian source package $srcpkg=$version"
  (cd "$src_root" && apt-get source --download-only -qq "$srcpkg=$version" >/dev/null 2>&1) \
    || die "could not download $srcpkg=$version"
fi

start=$SECONDS
work="$REMUSDB_CACHE/dbms-build-$which-$key"
rm -rf "$work"; mkdir -p "$work"
log "unpacking $srcpkg $version with Debian's patch series"
dpkg-source -x "$dsc" "$work/src" > "$work/unpack.log" 2>&1 \
  || { tail -20 "$work/unpack.log"; die "dpkg-source could not unpack $dsc"; }
cd "$work/src"
for p in "${patch_files[@]}"; do
  log "  applying dbms-patches/$patches/$(basename "$p")"
  patch -p1 -s --forward < "$p" || die "$(basename "$p") does not apply to $srcpkg $version"
done

build_postgresql() {
  # Debian's build regenerates configure first (debhelper compat 13 runs
  # dh_autoreconf); the shipped configure rejects --runstatedir.
  log "configuring as Debian does (dh_autoreconf, debian/rules override_dh_auto_configure)"
  { dh_autoreconf && debian/rules override_dh_auto_configure; } > "$work/configure.log" 2>&1 \
    || { tail -30 "$work/configure.log"; die "configure failed (log: $work/configure.log)"; }
  # The header goes into the build tree's include directory, so that no
  # compiler flag differs from Debian's (pg_config reports them).
  cp "$HEADER" build/src/include/remusdb_cp.h
  log "building postgres (only the server binary; several minutes)"
  # MAKELEVEL=0 makes src/backend generate its headers, as Debian's
  # build-arch does.  with_llvm=no skips the LLVM bitcode used for JIT
  # inlining: the image keeps Debian's, and the server binary is the same.
  MAKELEVEL=0 make -C build/src/backend -j"$(nproc)" with_llvm=no all > "$work/build.log" 2>&1 \
    || { grep -m5 -E 'error:|\*\*\*' "$work/build.log"; die "postgres build failed (log: $work/build.log)"; }
  built=build/src/backend/postgres
}

build_mariadb() {
  # Debian's debian/rules configure step (its cmake options, hardening
  # flags, -DDEB=Debian); CMAKEFLAGS from the environment is appended to.
  # The system libfmt avoids a download, and plugins that are built only
  # as modules are switched off: mariadbd does not link them and we build
  # nothing else.
  # One line: a newline in CMAKEFLAGS would end the recipe's cmake command
  # there and drop Debian's options after it (-DDEB=Debian among them).
  local flags=(-DWITH_LIBFMT=system -DPLUGIN_ROCKSDB=NO -DPLUGIN_MROONGA=NO -DPLUGIN_SPIDER=NO
               -DPLUGIN_CONNECT=NO -DPLUGIN_OQGRAPH=NO -DPLUGIN_S3=NO -DPLUGIN_TOKUDB=NO)
  log "configuring as Debian does (debian/rules override_dh_auto_configure)"
  CMAKEFLAGS="${flags[*]}" debian/rules override_dh_auto_configure > "$work/configure.log" 2>&1 \
    || { tail -30 "$work/configure.log"; die "cmake failed (log: $work/configure.log)"; }
  # Debian's layout puts the data directory, sockets and plugins where the
  # package's configuration expects them.
  grep -qx 'INSTALL_LAYOUT:STRING=DEB' builddir/CMakeCache.txt \
    || die "cmake did not take Debian's options (no DEB layout; log: $work/configure.log)"
  cp "$HEADER" include/remusdb_cp.h
  log "building mariadbd (only the server binary; takes about 20 minutes on 2 cores)"
  make -C builddir -j"$(nproc)" mariadbd > "$work/build.log" 2>&1 \
    || { grep -m5 -E 'error:|\*\*\*' "$work/build.log"; die "mariadbd build failed (log: $work/build.log)"; }
  built=builddir/sql/mariadbd
}

"build_$which"
[[ -x $built ]] || die "$built was not built"
mkdir -p "$work/out"
# Debian ships the server stripped (debug symbols go to a -dbgsym package).
strip --strip-debug -o "$work/out/$binary" "$built"
echo "$version" > "$work/out/version"
mkdir -p "$(dirname "$out")"; rm -rf "$out"; mv "$work/out" "$out"
ln -sfn "$out" "$REMUSDB_CACHE/dbms/$which/current"
cd / && rm -rf "$work"
log "patched $binary ($srcpkg $version) built in $((SECONDS - start)) s: $out"
echo "$out/$binary"
