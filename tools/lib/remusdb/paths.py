"""Where things live. Builds are cached outside the repository; runtime
state (sockets, logs, VM disks) lives under /run and /var/lib."""
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
CACHE = Path(os.environ.get("REMUSDB_CACHE", "/var/cache/remusdb"))
RUN = Path(os.environ.get("REMUSDB_RUN", "/run/remusdb"))
STATE = Path(os.environ.get("REMUSDB_STATE", "/var/lib/remusdb"))

# Run from the repository: the daemon's build and the checkout's tools/;
# installed (this file in PREFIX/lib/python3/dist-packages/remusdb/, or
# PREFIX/lib/python3.X/site-packages/remusdb/): PREFIX/sbin/remusdbd and
# the console scripts in PREFIX/bin.
INSTALLED = not (REPO / "dom0-daemon" / "src").is_dir()
PREFIX = Path(__file__).resolve().parents[4]
REMUSDBD = (PREFIX / "sbin" / "remusdbd" if INSTALLED
            else REPO / "dom0-daemon" / "build" / "remusdbd")
COMMANDS = PREFIX / "bin" if INSTALLED else REPO / "tools"
# The cluster file (remusdb.cluster), unless --cluster or $REMUSDB_CLUSTER
# names another: installed, the operator's in /etc; from a checkout, the
# one in its runtime directory, where a development cluster started from
# the checkout writes its own (a checkout must not act on the cluster a
# machine it runs on may belong to).
CLUSTER_FILE = (Path("/etc/remusdb/cluster.yml") if INSTALLED else RUN / "cluster.yml")
# QEMU's firmware comes from Debian's packages: our build installs no blobs.
QEMU_FIRMWARE_DIRS = ["/usr/share/qemu", "/usr/share/seabios", "/usr/lib/ipxe/qemu"]


# Where the remusdb-qemu package puts the patched QEMU (debian/rules).
PACKAGED_QEMU = Path("/usr/lib/remusdb/qemu/bin/qemu-system-x86_64")


def qemu_binary() -> Path:
    """The patched QEMU: REMUSDB_QEMU if set; installed, the remusdb-qemu
    package's; in a checkout, the build of tools/setup/build-qemu.sh (the
    lab tests what the checkout builds, not what happens to be installed)."""
    override = os.environ.get("REMUSDB_QEMU")
    if override:
        return Path(override)
    if INSTALLED:
        return PACKAGED_QEMU
    return CACHE / "qemu" / "current" / "bin" / "qemu-system-x86_64"


def guest_dir() -> Path:
    """The guest image the VMs boot: the last one built (the cache's
    `current`), unless REMUSDB_GUEST_DIR names another build's directory
    (to test an image without moving `current` under the other users of
    the cache)."""
    override = os.environ.get("REMUSDB_GUEST_DIR")
    if override:
        return Path(override)
    return CACHE / "guest" / "current"


def host_run_dir(host: str) -> Path:
    return RUN / host


def host_state_dir(host: str) -> Path:
    return STATE / host


def vm_run_dir(host: str, vm: str) -> Path:
    return RUN / host / "vms" / vm


def vm_disk(vm: str) -> Path:
    return STATE / "disks" / f"{vm}.img"


def control_socket(host: str) -> Path:
    return RUN / host / "remusdbd.sock"
