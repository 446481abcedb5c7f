"""Integration tests run the real guest under the real (patched) QEMU in
the lab's namespaces.  One VM is started per module and shared.

db_vm and fresh_guest restore a saved guest (vm.start(..., from_saved=True)):
the same VM as a fresh boot would give, at the moment its PostgreSQL
first accepted connections, on a fresh copy of the disk it had then:
each start is a VM nobody else touched. The first start of a VM boots and
saves it; the saved guest is cached under $REMUSDB_CACHE across runs."""
from contextlib import contextmanager

import pytest

# remusdb comes from tools/lib: pyproject.toml's [tool.pytest.ini_options]
# puts it on the path.
from remusdb import paths
from remusdb.lab import netns, vm, witness


@pytest.fixture(scope="session")
def lab():
    netns.down()
    netns.up()
    witness.start(members=1)  # protection arbitrates through etcd
    yield netns
    netns.down()
    drop_disks_nobody_holds()


@pytest.fixture(scope="module", autouse=True)
def disks_dropped_after_each_module():
    """Each module's VM disks and backup replicas go when it ends, not
    only when the suite does: the suite's disks together (about 70 GB by
    2026-11-27) outgrew the free space of the machine CI runs on, and
    its last modules failed with ENOSPC. A module's own VMs are stopped
    by then; a disk a daemon still holds stays (see below)."""
    yield
    drop_disks_nobody_holds()


def drop_disks_nobody_holds():
    """Every test starts its VMs on fresh disks, so the suite's VM disks and
    backup replicas (1-2 GB each, about 60 GB for the whole suite) are
    removed at its end, but for those of a VM that a host's remusdbd still
    holds a definition of (a test that failed to clean up leaves one:
    its disk may be evidence, and that remusdbd may still use it)."""
    held = {d.stem for h in ("primary", "backup")
            for d in (paths.host_state_dir(h) / "vms").glob("*.json")}
    for f in [*(paths.vm_disk("x").parent.glob("*.img*")),
              *(paths.host_state_dir("backup") / "replicas").glob("*.img*")]:
        if f.name.split(".img", 1)[0] not in held:
            f.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def db_vm(lab):
    name = "itest"
    vm.start(name, "primary", from_saved=True, wait_timeout=400)
    yield {"name": name, "host": "primary", "ip": vm.DEFAULT_IP}
    vm.stop(name, "primary")


@contextmanager
def fresh_guest(name, backup_daemon=True):
    """A fresh guest `name` on the primary, restored from its saved guest
    (and the backup's remusdbd running, for protection), stopped
    everywhere afterwards."""
    from remusdb.drill.lab import stop_vm_everywhere
    stop_vm_everywhere(name)
    vm.start(name, "primary", from_saved=True, wait_timeout=400)
    if backup_daemon:
        vm.ensure_daemon("backup")
    try:
        yield name
    finally:
        stop_vm_everywhere(name)
