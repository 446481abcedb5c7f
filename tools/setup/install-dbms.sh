#!/usr/bin/env bash
# mmdebstrap customize hook (runs on the host with the guest tree as $1):
# installs the commit-protection patched servers that build-dbms.sh built
# over Debian's, with dpkg-divert so that Debian's binary stays beside it
# (postgres.debian, mariadbd.debian).  The patches are against the exact
# version the tree got; a tree with another version is an error, not a
# silent mismatch of server and support files.
source "$(dirname "$0")/common.sh"

root=${1:?usage: install-dbms.sh GUEST_TREE}

install_server() {  # PACKAGE BUILT_BINARY TARGET
  local pkg=$1 built=$2 target=$3 want have
  want=$(cat "$(dirname "$built")/version")
  have=$(chroot "$root" dpkg-query -W -f='${Version}' "$pkg")
  [[ $have == "$want" ]] \
    || die "the guest tree has $pkg $have, the patched server was built for $want (apt-get update on the host?)"
  chroot "$root" dpkg-divert --quiet --local --rename --divert "$target.debian" --add "$target"
  install -m 755 "$built" "$root$target"
  log "patched $(basename "$target") ($pkg $want) installed in the guest tree"
}

install_server postgresql-15 "$REMUSDB_CACHE/dbms/postgresql/current/postgres" \
  /usr/lib/postgresql/15/bin/postgres
install_server mariadb-server-core "$REMUSDB_CACHE/dbms/mariadb/current/mariadbd" \
  /usr/sbin/mariadbd
