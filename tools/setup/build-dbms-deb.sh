#!/usr/bin/env bash
# Packages a commit-protection patched server that build-dbms.sh built
# (and cached) as a Debian binary package, with dpkg-deb:
#
#   build-dbms-deb.sh postgresql|mariadb OUT_DIR
#
#   remusdb-postgresql-15-cp  /usr/lib/postgresql/15/bin/postgres
#   remusdb-mariadb-cp        /usr/sbin/mariadbd
#
# The package diverts Debian's binary (preinst, postrm: dbms-deb/) and
# depends on exactly the Debian package version the server was built from
# (the build's `version` file).  Its version is that version plus
# +remusdb<project version> (debian/changelog).  The copyright file is
# Debian's, from the source package the build used.  Prints the .deb's
# path on its last line.
source "$(dirname "$0")/common.sh"

which=${1:?usage: build-dbms-deb.sh postgresql|mariadb OUT_DIR}
out_dir=${2:?usage: build-dbms-deb.sh postgresql|mariadb OUT_DIR}
case $which in
  postgresql) package=remusdb-postgresql-15-cp; srcpkg=postgresql-15; debpkg=postgresql-15
              binary=postgres; target=/usr/lib/postgresql/15/bin/postgres
              dbms="PostgreSQL 15"; patches=postgresql-15 ;;
  mariadb)    package=remusdb-mariadb-cp; srcpkg=mariadb; debpkg=mariadb-server-core
              binary=mariadbd; target=/usr/sbin/mariadbd
              dbms="MariaDB 10.11"; patches=mariadb-10.11 ;;
  *) die "unknown DBMS '$which' (postgresql or mariadb)" ;;
esac
RECIPE="$REPO_ROOT/tools/setup/dbms-deb"

built=$(bash "$REPO_ROOT/tools/setup/build-dbms.sh" "$which" | tail -1)
[[ -x $built ]] || die "build-dbms.sh $which gave no server binary"
debver=$(cat "$(dirname "$built")/version")
project=$(dpkg-parsechangelog -l "$REPO_ROOT/debian/changelog" -S Version)
version="$debver+remusdb$project"
debian_tar=("$REMUSDB_CACHE"/dbms-src/"${srcpkg}_${debver#*:}".debian.tar.*)
[[ -f ${debian_tar[0]} ]] || die "no Debian source of $srcpkg $debver in $REMUSDB_CACHE/dbms-src (build-dbms.sh downloads it)"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root="$stage/root"
doc="$root/usr/share/doc/$package"
install -d "$root/DEBIAN" "$doc" "$root$(dirname "$target")"
# As dh_strip does: the build keeps its symbol table, a package does not.
strip --remove-section=.comment --remove-section=.note --strip-unneeded \
  -o "$root$target" "$built"
chmod 755 "$root$target"
tar -xOf "${debian_tar[0]}" debian/copyright > "$doc/copyright" \
  || die "no debian/copyright in ${debian_tar[0]}"
# The build's date, not today's: the same build gives the same package.
export SOURCE_DATE_EPOCH
SOURCE_DATE_EPOCH=$(stat -c %Y "$built")
{ echo "$package ($version) bookworm; urgency=medium"
  echo
  echo "  * $srcpkg $debver with dbms-patches/$patches."
  echo
  echo " -- RemusDB-KVM developers <dev@remusdb-kvm.invalid>  $(date -R -u -d "@$SOURCE_DATE_EPOCH")"
} > "$doc/changelog.Debian"
gzip -9n "$doc/changelog.Debian"
# The libraries the binary links, as dh_shlibdeps finds them (it wants a
# debian/control naming the package).
mkdir -p "$stage/debian"
printf 'Source: %s\n\nPackage: %s\nArchitecture: amd64\n' "$package" "$package" > "$stage/debian/control"
shlibs=$(cd "$stage" && dpkg-shlibdeps -O "root$target" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
[[ -n $shlibs ]] || die "dpkg-shlibdeps found no libraries for $target"
fill() {
  sed -e "s|@PACKAGE@|$package|g" -e "s|@VERSION@|$version|g" -e "s|@TARGET@|$target|g" \
      -e "s|@DEBIAN_PACKAGE@|$debpkg|g" -e "s|@DEBIAN_VERSION@|$debver|g" \
      -e "s|@DBMS@|$dbms|g" -e "s|@BINARY@|$binary|g" -e "s|@PATCHES@|$patches|g" -e "s|@SHLIBS@|$shlibs|g" \
      -e "s|@SIZE@|$(du -sk --exclude=DEBIAN "$root" | cut -f1)|g" "$1"
}
fill "$RECIPE/control.in" > "$root/DEBIAN/control"
for script in preinst postrm; do
  fill "$RECIPE/$script.in" > "$root/DEBIAN/$script"
  chmod 755 "$root/DEBIAN/$script"
done
(cd "$root" && find usr -type f -printf '%P\n' | sort | sed 's|^|usr/|' | xargs md5sum) > "$root/DEBIAN/md5sums"
find "$root" -type d -exec chmod 755 {} +
mkdir -p "$out_dir"
deb="$out_dir/${package}_${version#*:}_amd64.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" > /dev/null \
  || die "dpkg-deb could not build $package"
log "packaged $package $version: $deb"
echo "$deb"
