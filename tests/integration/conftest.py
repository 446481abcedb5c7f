"""Integration tests boot the real guest under the real (patched) QEMU in
the lab's namespaces.  One VM is booted per module and shared."""
from contextlib import contextmanager

import pytest

# remusdb comes from tools/lib: pyproject.toml's [tool.pytest.ini_options]
# puts it on the path.
from remusdb.lab import netns, vm, witness


@pytest.fixture(scope="session")
def lab():
    netns.down()
    netns.up()
    witness.start(members=1)  # protection arbitrates through etcd
    yield netns
    netns.down()


@pytest.fixture(scope="module")
def db_vm(lab):
    name = "itest"
    vm.start(name, "primary", fresh=True, wait_timeout=400)
    yield {"name": name, "host": "primary", "ip": vm.DEFAULT_IP}
    vm.stop(name, "primary")


@contextmanager
def fresh_guest(name, backup_daemon=True):
    """A freshly booted guest `name` on the primary (and the backup's
    remusdbd running, for protection), stopped everywhere afterwards."""
    from remusdb.drill.lab import stop_vm_everywhere
    stop_vm_everywhere(name)
    vm.start(name, "primary", fresh=True, wait_timeout=400)
    if backup_daemon:
        vm.ensure_daemon("backup")
    try:
        yield name
    finally:
        stop_vm_everywhere(name)
