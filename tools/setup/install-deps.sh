#!/usr/bin/env bash
# Installs the Debian packages the project builds and runs with, and enables
# deb-src for the main archive (the QEMU, PostgreSQL and MariaDB source
# packages come from there).
# Idempotent: a stamp keyed by the package list skips apt when nothing changed.
source "$(dirname "$0")/common.sh"

PACKAGES=(
  # QEMU build (see ARCHITECTURE.md section 7) and source unpacking
  build-essential pkg-config dpkg-dev libglib2.0-dev libpixman-1-dev ninja-build
  meson flex bison libfdt-dev zlib1g-dev python3-venv
  # QEMU runtime firmware: x86 boots with SeaBIOS, NICs need iPXE option ROMs
  seabios ipxe-qemu qemu-system-data
  # VM fork: qemu-img makes the clones' qcow2 overlays (our QEMU is built without tools)
  qemu-utils
  # remusdbd: JSON (QMP, control socket), compression, checksums, netlink
  libjansson-dev liblz4-dev libxxhash-dev libnl-3-dev libnl-route-3-dev
  libssl-dev libcurl4-openssl-dev etcd-server etcd-client
  # remusdbd's HTTP endpoint (/metrics, health checks) and the test that scrapes it
  libmicrohttpd-dev prometheus
  # tests: unit tests, sanitizers' runtime, leak checks, fuzzing
  libcunit1-dev valgrind clang libclang-rt-14-dev
  # the daemon's objects compiled once per machine, not once per clone
  ccache
  # the patched DBMS servers (build-dbms.sh): Debian's configure steps and
  # what their options need.  PostgreSQL 15:
  debhelper dh-autoreconf autoconf gettext libicu-dev libkrb5-dev libldap2-dev
  libpam0g-dev libperl-dev libreadline-dev libselinux1-dev libsystemd-dev
  libxml2-dev libxslt1-dev libzstd-dev llvm-dev clang python3-dev
  systemtap-sdt-dev tcl-dev uuid-dev libipc-run-perl
  # MariaDB 10.11 (mariadbd only):
  cmake lsb-release libaio-dev libbz2-dev libfmt-dev liblzma-dev liblzo2-dev
  libncurses-dev libnuma-dev libpcre2-dev libpmem-dev libsnappy-dev liburing-dev
  libedit-dev
  # lab, guest image and workload
  iproute2 iputils-ping mmdebstrap e2fsprogs postgresql-client-15 socat nftables
  # the forked clones' read pool (tools/lib/remusdb/read_pool.py)
  haproxy
  # nbdinfo and nbdcopy: libnbd's clients, against remusdbd's NBD block
  # status (tests/integration/test_nbd_block_status.py)
  libnbd-bin
  # packaging (make install, the Debian package, docs/packaging.md): man
  # pages from docs/man/*.md, lintian, the unit files' sd_notify (libsystemd,
  # listed above) and `remusdb protect --config FILE` (YAML); dh-dkms for
  # remusdb-guest's DKMS maintainer scripts (debian/rules, the guest image)
  pandoc lintian fakeroot man-db python3-yaml dh-dkms
  # libvirt-managed VMs (docs/libvirt.md, tests/integration/test_libvirt.py):
  # Debian's libvirt 9.0 with its QEMU driver and virsh; -system creates the
  # libvirt-qemu user a root libvirtd needs even when qemu.conf runs QEMU
  # as root (its defaults are resolved before qemu.conf is read)
  libvirt-daemon-system libvirt-clients
  # the CLI reaches other hosts' remusdbd through ssh (remusdb.cluster); the
  # lab runs an sshd in each host namespace to test that path
  openssh-client openssh-server
  python3 python3-matplotlib python3-pytest python3-psycopg2 python3-xxhash
  python3-pymysql
  # the remusdb Python package (pyproject.toml): `make install` and the
  # Debian package install it with pip and the system's setuptools, offline
  python3-pip python3-setuptools
)

stamp="$REMUSDB_CACHE/deps.$(printf '%s\n' "${PACKAGES[@]}" | sha256sum | cut -c1-16).stamp"

src_list=/etc/apt/sources.list.d/remusdb-src.sources
if ! grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/ && ! grep -qs '^deb-src' /etc/apt/sources.list; then
  log "enabling deb-src for the Debian main archive ($src_list)"
  cat > "$src_list" <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  rm -f "$stamp"
fi

if [[ -f $stamp ]]; then
  log "Debian packages already installed"
  exit 0
fi
log "installing Debian packages"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
touch "$stamp"
log "Debian packages installed"
