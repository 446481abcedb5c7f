#!/usr/bin/env bash
# mmdebstrap customize hook (runs on the host with the guest tree as $1):
# the image build stops here unless the tree has the guest's packages
# installed (remusdb-guest, remusdb-postgresql-15-cp, remusdb-mariadb-cp),
# their diversions in place, and remusdb_cp built and installed by DKMS
# for the tree's one kernel.  A package whose maintainer script failed
# stops apt already; this catches a DKMS build that was skipped (no
# headers for that kernel) and says why.
source "$(dirname "$0")/common.sh"

root=${1:?usage: check-guest-packages.sh GUEST_TREE}
in_guest() { chroot "$root" "$@"; }
releases=("$root"/lib/modules/*)
[[ ${#releases[@]} -eq 1 && -d ${releases[0]} ]] \
  || die "expected one kernel in the guest tree, found: ${releases[*]}"
release=$(basename "${releases[0]}")

for pkg in remusdb-guest remusdb-postgresql-15-cp remusdb-mariadb-cp; do
  status=$(in_guest dpkg-query -W -f='${db:Status-Abbrev} ${Version}' "$pkg" 2>/dev/null) \
    || die "$pkg is not installed in the guest tree"
  [[ $status == "ii "* ]] || die "$pkg is not installed cleanly in the guest tree: $status"
  log "$pkg ${status#ii  } installed in the guest tree"
done
for target in /usr/lib/postgresql/15/bin/postgres /usr/sbin/mariadbd; do
  in_guest dpkg-divert --listpackage "$target" | grep -q '^remusdb-' \
    || die "$target is not diverted by a remusdb package in the guest tree"
done

version=$(in_guest dpkg-query -W -f='${Version}' remusdb-guest)
ko="/lib/modules/$release/updates/dkms/remusdb_cp.ko"
if ! in_guest dkms status -m remusdb-cp -v "${version%%-*}" -k "$release" | grep -q ': installed' \
   || [[ ! -s $root$ko ]]; then
  in_guest dkms status >&2 || true
  cat "$root/var/lib/dkms/remusdb-cp/${version%%-*}/build/make.log" >&2 2>/dev/null || true
  die "DKMS did not build and install remusdb_cp for $release in the guest tree"
fi
in_guest modinfo -k "$release" -F vermagic remusdb_cp | grep -q "^$release " \
  || die "$ko is not built for $release"
log "remusdb_cp built by DKMS for $release ($ko)"
